"""Hypothesis against a live server: garbage frames and random op sequences.

Every frame gets exactly one answer (``ack`` or ``error``, echoing a readable id), the
server never crashes, and a bystander client on the same server is unaffected.
"""

from __future__ import annotations

import json
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.control_support import answer, raw_client, serving
from trio_agents.control import ERROR_CODES, connect
from trio_agents.models import ScriptedModel, Turn

OPS = [
    "run.start",
    "run.cancel",
    "run.inject",
    "run.withdraw",
    "run.approve",
    "run.reject",
    "run.subscribe",
    "run.unsubscribe",
    "run.get",
    "runs.list",
    "session.cancel",
    "session.fork",
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)

field_values = st.one_of(
    json_values,
    st.sampled_from(
        [
            "$run",
            "a",
            "missing",
            "s1",
            "s2",
            "all",
            "status",
            "cancel",
            "continue",
            "interrupt",
            "enqueue",
            "now",
            "when_idle",
            "after_turn",
            [{"role": "user", "content": "hi"}],
            [{"role": "tool"}],
            0,
            1,
            -1,
        ]
    ),
)

field_names = st.sampled_from(
    [
        "agent",
        "input",
        "session_id",
        "on_disconnect",
        "on_busy",
        "subscribe",
        "run_id",
        "reason",
        "mode",
        "items",
        "when",
        "injection_id",
        "call_id",
        "message",
        "from_seq",
        "events",
        "bogus",
    ]
)

request_dicts = st.fixed_dictionaries(
    {"op": st.sampled_from([*OPS, "run.explode", ""]) | st.text(max_size=8)},
    optional={"id": st.text(max_size=8) | st.integers() | json_values},
).flatmap(
    lambda base: st.dictionaries(field_names, field_values, max_size=5).map(
        lambda extra: {**base, **extra}
    )
)

valid_starts = st.fixed_dictionaries(
    {
        "id": st.text(min_size=1, max_size=6),
        "op": st.just("run.start"),
        "agent": st.just("a"),
        "input": st.just("hi"),
    },
    optional={
        "session_id": st.sampled_from(["s1", "s2"]),
        "on_busy": st.sampled_from(["reject", "interrupt", "enqueue"]),
        "subscribe": st.sampled_from(["all", "status"]),
    },
)

frames = st.one_of(
    st.text(max_size=40),
    st.binary(max_size=40),
    json_values.map(json.dumps),
    request_dicts,
    valid_starts,
)


def _readable_id(frame: Any) -> Any:
    if not isinstance(frame, dict):
        return None
    try:  # NaN/Infinity make the whole frame invalid JSON: no id can be trusted
        json.dumps(frame, allow_nan=False)
    except ValueError:
        return None
    value = frame.get("id")
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    if isinstance(value, str) and len(value) > 256:
        return None
    if isinstance(value, int) and abs(value) >= 2**53:
        return None
    return value


async def _fuzz(sequence: list[Any]) -> None:
    model = ScriptedModel([], default=Turn(text="ok then", delay=0.002))
    agent = ta.Agent(name="a", instructions="", model=model)
    with trio.fail_after(30):
        async with (
            serving({"a": agent}) as (server, url),
            connect(url, token="tok-bob") as bystander,
        ):
            witness = await bystander.start("a", "watch me", session_id="s1")
            last_run = "run_missing"
            async with raw_client(url) as ws:
                for frame in sequence:
                    if isinstance(frame, dict):
                        frame = {k: (last_run if v == "$run" else v) for k, v in frame.items()}
                        payload: str | bytes = json.dumps(frame)
                    else:
                        payload = frame
                    await ws.send_message(payload)
                    reply = await answer(ws)
                    assert reply["type"] in ("ack", "error"), reply
                    assert reply["id"] == _readable_id(frame), (frame, reply)
                    if reply["type"] == "error":
                        assert reply["code"] in ERROR_CODES
                        assert reply["code"] != "internal", reply
                    elif "run_id" in reply:
                        last_run = reply["run_id"]
                # the fuzzed connection still works
                await ws.send_message(json.dumps({"id": "last", "op": "runs.list"}))
                assert (await answer(ws))["type"] == "ack"
            # the bystander (another principal) never noticed
            assert (await witness.wait()).status == "completed"
            assert [r.run_id for r in await bystander.list_runs()] == [witness.id]
            assert server.statistics().connections >= 1


@settings(max_examples=60)
@given(sequence=st.lists(frames, min_size=1, max_size=8))
def test_garbage_and_op_sequences_are_always_answered(sequence: list[Any]) -> None:
    trio.run(_fuzz, sequence)
