"""The cluster under hostile input (issue 30): no client frame can take a node down,
wedge its writer, or leave another run stuck.

Real node processes (tests/support/process_cluster.py) on the suite's real PostgreSQL, driven
by a raw JSON client (tests/support/cluster_support.py), so every frame is exactly what an
attacker could send: NUL and lone surrogates (valid JSON, ``"\\u0000"``,
``"\\ud800"``) in every string field of every op, directly on a run's owner and routed
through another node; 1 MB strings; deep JSON. The policy (docs/protocol.md): a string
holding NUL or a lone surrogate is refused with ``invalid_request`` wherever it is in a
request (PostgreSQL can store neither in text), anything else is stored faithfully,
and the node, its writer and every other run go on.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_support import Client, client, node
from tests.support.process_cluster import Cluster, open_cluster
from trio_agents.cluster._db import ClusterDown
from trio_agents.cluster._storable import storable, storable_json
from trio_agents.models import ScriptedModel, Turn

BOUND: Final = 90.0  # a hang guard per test
BAD: Final = ("a\x00b", "a\ud800b", "\udfff", "\x00")


def _text(event: dict[str, Any]) -> str:
    return str(event.get("text", ""))


async def _start_held(c: Client, tag: str, **fields: Any) -> str:
    """A streaming run that blocks (after ``alpha beta``) until the ``stream`` gate."""
    answer = await c.ok("run.start", agent="worker", input=f"stream #{tag}", **fields)
    run_id = str(answer["run_id"])
    await c.ok("run.subscribe", run_id=run_id)
    await c.wait_event(run_id, lambda e: _text(e) == "beta ")
    return run_id


async def _answered(c: Client, request_id: str | None) -> None:
    """Wait for the answer to a frame sent raw (``Client.read`` wakes ``changed``)."""
    while request_id not in c.answers:
        await c.changed.wait()


async def _refused(c: Client, op: str, **fields: Any) -> None:
    answer = await c.request(op, **fields)
    assert answer["type"] == "error", (op, fields, answer)
    assert answer["code"] == "invalid_request", (op, fields, answer)


async def _hostile_frames(c: Client, run_id: str, awaiting: str) -> None:
    """Every string field of every op, with each bad string."""
    for bad in BAD:
        await _refused(c, "run.cancel", run_id=run_id, reason=bad)
        await _refused(c, "run.cancel", run_id=bad)
        await _refused(c, "session.cancel", session_id=bad)
        await _refused(c, "session.cancel", session_id="s-held", reason=bad)
        await _refused(c, "run.start", agent="worker", input=bad)
        await _refused(c, "run.start", agent="worker", input=[{"type": "user", "content": bad}])
        await _refused(c, "run.start", agent=bad, input="hi")
        await _refused(c, "run.start", agent="worker", input="hi", session_id=bad)
        await _refused(c, "run.inject", run_id=run_id, items=bad)
        await _refused(c, "run.inject", run_id=bad, items="note x")
        await _refused(c, "run.withdraw", run_id=run_id, injection_id=bad)
        await _refused(c, "run.approve", run_id=awaiting, call_id=bad)
        await _refused(c, "run.approve", run_id=awaiting, call_id="call_delete_1", message=bad)
        await _refused(c, "run.reject", run_id=awaiting, call_id="call_delete_1", message=bad)
        await _refused(c, "run.reject", run_id=bad, call_id="call_delete_1")
        await _refused(c, "run.subscribe", run_id=bad)
        await _refused(c, "run.unsubscribe", run_id=bad)
        await _refused(c, "run.get", run_id=bad)
        answer = await c.request("runs.list", **{bad: 1})
        assert answer["code"] == "invalid_request", answer
    # A request id holding one is refused too (echoed as sent: JSON escapes it).
    await c.ws.send_message(json.dumps({"id": "x\ud800", "op": "runs.list"}))
    await _answered(c, "x\ud800")
    assert c.answers.pop("x\ud800")["code"] == "invalid_request"
    # Deep JSON: too deep for the parser, or deep where a string or items are due.
    await c.ws.send_message("[" * 100_000 + "]" * 100_000)
    await c.ws.send_message('{"id": "deep", "op": "runs.list", "x": ' + "[" * 100_000)
    await _answered(c, None)
    assert c.answers.pop(None)["code"] == "invalid_json"
    deep: Any = "hi"
    for _ in range(900):
        deep = [deep]
    await _refused(c, "run.inject", run_id=run_id, items=deep)
    await _refused(c, "run.cancel", run_id=run_id, reason=deep)


async def test_hostile_strings_are_refused_and_every_run_goes_on(pg_dsn: str) -> None:
    """NUL and lone surrogates in every field, sent to the runs' owner and to another
    node (routed), are refused with ``invalid_request``: the owner stays up (a reason
    with a lone surrogate used to make its writer raise and shut it down; one with NUL
    wedged every later flush of the node; the same in a run's input made approvals
    answer ``internal``), and its runs, held meanwhile, all complete and are persisted."""
    async with open_cluster(pg_dsn, 2, lease_ttl=10.0) as cluster:
        with trio.fail_after(BOUND):
            owner, other = cluster.alive()
            async with client(owner.url, cluster.token) as a, client(other.url, cluster.token) as b:
                bystander = await _start_held(a, "by")
                victim = await _start_held(a, "vi", session_id="s-held")
                answer = await a.ok("run.start", agent="worker", input="delete #ap")
                awaiting = str(answer["run_id"])
                await a.ok("run.subscribe", run_id=awaiting)
                await a.wait_status(awaiting, "awaiting_approval")
                await _hostile_frames(a, victim, awaiting)  # on the owner
                await _hostile_frames(b, victim, awaiting)  # routed through another node
                # A 1 MB string is stored faithfully, routed (its command's args and
                # its event are too big for a NOTIFY payload: read from the table).
                big = "note " + ("\u00e9\U0001f600" + "x" * 82) * 10_000  # 1 MB as JSON
                await b.ok("run.inject", run_id=bystander, items=big)
                assert owner.running, owner.output()
                # Both nodes still serve and persist: the approval is applied, the
                # held runs finish, and the other node reads every run's end.
                await b.ok("run.approve", run_id=awaiting, call_id="call_delete_1")
                await a.ok("run.cancel", run_id=victim, reason="plain")
                cluster.open_gate("stream")
                for run_id in (bystander, awaiting):
                    terminal = await a.wait_terminal(run_id)
                    assert terminal["event"]["status"] == "completed", terminal
                await a.wait_terminal(victim)
                for run_id, status in (
                    (bystander, "completed"),
                    (awaiting, "completed"),
                    (victim, "cancelled"),
                ):
                    await b.ok("run.subscribe", run_id=run_id, from_seq=1)
                    terminal = await b.wait_terminal(run_id)
                    assert terminal["event"]["status"] == status, terminal
                    assert b.seqs(run_id) == list(range(1, len(b.seqs(run_id)) + 1))
                injected = [
                    frame["event"]
                    for frame in b.events[bystander]
                    if frame["event"]["type"] == "inbox.injected"
                ]
                assert [event["items"][0]["content"] for event in injected] == [big]
            assert owner.running, cluster.output()
            assert other.running, cluster.output()
    _no_encoding_errors(cluster)


def _no_encoding_errors(cluster: Cluster) -> None:
    crashes = ("UnicodeEncodeError", "cannot contain NUL", "Unicode escape", "surrogate")
    for one in cluster.nodes.values():
        assert not [line for line in one.stderr if any(c in line for c in crashes)], one.output()


# -- the cluster's storage on its own: values no client sent -----------------------------


def _storage_agents() -> dict[str, ta.Agent]:
    @ta.function_tool
    async def report(ctx: ta.ToolContext) -> str:
        """Report progress with data nested too deeply to encode as JSON."""
        deep: Any = "x"
        for _ in range(5000):
            deep = {"d": deep}
        ctx.progress("deep", blob=deep)
        await trio.lowlevel.checkpoint()
        return "reported"

    @ta.function_tool
    async def raw(ctx: ta.ToolContext) -> str:
        """Report progress with data that is not JSON."""
        ctx.progress("raw", blob=b"\x00\xff")
        await trio.lowlevel.checkpoint()
        return "reported"

    def agent(model: ta.Model, tools: list[ta.Tool] | None = None) -> ta.Agent:
        return ta.Agent(name="a", instructions="", model=model, tools=tools or [])

    return {
        # A provider's error message holding NUL and a lone surrogate: the run's
        # failure reason (a text column of its row).
        "failing": agent(ScriptedModel([Turn(fail="provider said a\x00b\ud800c")])),
        "deep": agent(
            ScriptedModel([Turn(tool_calls=[("report", {})]), Turn(text="after")]), [report]
        ),
        "raw": agent(ScriptedModel([Turn(tool_calls=[("raw", {})]), Turn(text="after")]), [raw]),
        "plain": agent(ScriptedModel([Turn(text="fine a\x00b")], default=Turn(text="fine"))),
    }


async def test_values_the_database_refuses_never_stop_the_writer(pg_dsn: str) -> None:
    """A failure reason holding NUL and a lone surrogate (from a model provider, no
    client involved) is stored (the event faithfully, the row's ``reason`` column with
    U+FFFD); it used to wedge every later flush of the node (NUL) or crash it (a lone
    surrogate). Progress data that is not JSON is stored as the control channel sends
    it (``repr``); it used to crash the node's writer. An event that cannot be stored at
    all (progress data too deep to encode) ends only its own run ``failed``; the node's
    other runs are persisted."""
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, _storage_agents(), pg_dsn, "A") as a,
            node(nursery, _storage_agents(), pg_dsn, "B") as b,
            client(a.url) as ca,
            client(b.url) as cb,
        ):
            with trio.fail_after(BOUND):
                failing = str(await ca.start_run(agent="failing", input="hi"))
                deep = str(await ca.start_run(agent="deep", input="hi"))
                raw = str(await ca.start_run(agent="raw", input="hi"))
                plain = str(await ca.start_run(agent="plain", input="hi"))
                ended: dict[str, dict[str, Any]] = {}
                for run_id in (failing, deep, raw, plain):  # read from the log, on node B
                    await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
                    ended[run_id] = (await cb.wait_terminal(run_id))["event"]
                    assert cb.seqs(run_id) == list(range(1, len(cb.seqs(run_id)) + 1))
                assert ended[failing]["status"] == "failed"
                assert "provider said a\x00b" in ended[failing]["reason"]
                info = (await cb.ok("run.get", run_id=failing))["run"]
                assert "provider said a\ufffdb" in info["reason"]
                assert not re.search("[\x00\ud800-\udfff]", info["reason"])
                assert ended[deep]["status"] == "failed"
                assert "could not be stored" in ended[deep]["reason"]
                assert ended[plain]["status"] == "completed"
                # Data that is not JSON is stored as the control channel sends it.
                assert ended[raw]["status"] == "completed"
                (progress,) = [
                    frame["event"]
                    for frame in cb.events[raw]
                    if frame["event"]["type"] == "tool.progress"
                ]
                assert progress["data"] == {"blob": repr(b"\x00\xff")}
                texts = [
                    frame["event"]["item"]["content"]
                    for frame in cb.events[plain]
                    if frame["event"]["type"] == "run.item"
                    and frame["event"]["item"].get("role") == "assistant"
                ]
                assert texts == ["fine a\x00b"]  # stored faithfully (escaped JSON)
                # The node goes on: a new run on it is persisted.
                again = str(await ca.start_run(agent="plain", input="hi"))
                await cb.ok("run.subscribe", run_id=again, from_seq=1)
                assert (await cb.wait_terminal(again))["event"]["status"] == "completed"
        nursery.cancel_scope.cancel()


def test_storable_replaces_what_postgresql_text_cannot_hold() -> None:
    assert storable("a\x00b\ud800c\udfff\U0001f600") == "a\ufffdb\ufffdc\ufffd\U0001f600"
    assert storable(None) is None
    value = {"k\x00": ["\ud800", 1, None, {"x": "ok"}], "n": 2.5}
    assert storable_json(value) == {"k\ufffd": ["\ufffd", 1, None, {"x": "ok"}], "n": 2.5}


async def test_a_call_id_the_database_refuses_is_not_retried(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model's call id holding NUL cannot be recorded as started (the ``before_tool``
    barrier): the tool does not run and the model reads the error at once. The barrier
    used to retry the refused insert for 30 s, as if the database were down."""
    executed: list[str] = []

    @ta.function_tool
    async def tick(ctx: ta.ToolContext) -> str:
        """Record an execution."""
        executed.append(ctx.call_id)
        await trio.lowlevel.checkpoint()
        return "ticked"

    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("c\x00", "tick", "{}")]), "after"])
    agents = {"a": ta.Agent(name="a", instructions="", model=model, tools=[tick])}
    async with trio.open_nursery() as nursery:
        async with node(nursery, agents, pg_dsn, "A") as a, client(a.url) as ca:
            refusals: list[ClusterDown] = []
            real_call = a.cluster._node.db.call

            async def call(fn: Any) -> Any:
                try:
                    return await real_call(fn)
                except ClusterDown as exc:
                    if isinstance(exc.__cause__, psycopg.DataError):
                        refusals.append(exc)
                    raise

            monkeypatch.setattr(a.cluster._node.db, "call", call)
            with trio.fail_after(BOUND):
                run_id = str(await ca.start_run(agent="a", input="hi"))
                await ca.ok("run.subscribe", run_id=run_id, from_seq=1)
                assert (await ca.wait_terminal(run_id))["event"]["status"] == "completed"
            results = [
                frame["event"]["item"]
                for frame in ca.events[run_id]
                if frame["event"]["type"] == "run.item"
                and frame["event"]["item"]["type"] == "function_call_output"
            ]
            assert [(r["call_id"], r.get("status")) for r in results] == [("c\x00", "error")]
            assert executed == []
            assert len(refusals) == 1  # refused once, not retried
        nursery.cancel_scope.cancel()
