"""A run's own token usage and cost in its record (``RunInfo.usage``): ``GET /runs/{id}``,
the websocket's ``run.get`` and ``runs.list``, and the control client's decoding, on a
real server (loopback websocket and HTTP); the record's JSON refuses hostile usage."""

from __future__ import annotations

from contextlib import aclosing
from decimal import Decimal
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.control_support import ask, raw_client
from tests.support.http_support import client, messages, serving, start, wait_forever
from trio_agents.control import RunInfo, connect
from trio_agents.models import ScriptedModel, Turn

# As in test_http_rest.py: a client leaving an SSE stream early abandons httpx's body
# generators, which Trio then warns about when they are collected.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)\._[^']*' was garbage collected:ResourceWarning"
)

# Costs no float can hold exactly: a sum that went through a float would show it.
ROOT_CALL = ta.Usage(100, 7, "root-model", cache_read_tokens=40, cost=Decimal("0.000123"))
CHILD_CALL = ta.Usage(50, 3, "child-model", cache_write_tokens=10, cost=Decimal("0.0000071"))


def priced_tree() -> dict[str, ta.Agent]:
    """A root that calls a child agent as a tool; every model call is priced."""
    child = ta.Agent(
        name="child",
        model=ScriptedModel(
            [Turn(text="child done", usage=CHILD_CALL), Turn(text="x", usage=CHILD_CALL)]
        ),
    )
    root = ta.Agent(
        name="root",
        model=ScriptedModel(
            [
                Turn(tool_calls=[("child", {"input": "go"})], usage=ROOT_CALL),
                Turn(text="ok", usage=ROOT_CALL),
            ]
        ),
        tools=[child.as_tool(name="child")],
    )
    return {"root": root}


ROOT_JSON = {
    "input_tokens": 200,
    "output_tokens": 14,
    "model": "root-model",
    "cache_read_tokens": 80,
    "cost": "0.000246",
}
CHILD_JSON = {
    "input_tokens": 50,
    "output_tokens": 3,
    "model": "child-model",
    "cache_write_tokens": 10,
    "cost": "0.0000071",
}


async def _finished(http: Any, run_id: str) -> None:
    """Read the run's status stream until its terminal update."""
    statuses = f"/runs/{run_id}/events?events=status"
    async with http.stream("GET", statuses) as stream, aclosing(messages(stream)) as got:
        async for message in got:
            if message.data["event"]["status"] in ("completed", "failed", "cancelled"):
                assert message.data["event"]["status"] == "completed", message.data
                return


async def test_rest_and_websocket_records_carry_each_runs_own_exact_usage() -> None:
    with trio.fail_after(30):
        async with serving(priced_tree()) as served, client(served.base) as alice:
            run_id = await start(alice, "root")
            await _finished(alice, run_id)
            record = (await alice.get(f"/runs/{run_id}")).json()["run"]
            assert record["usage"] == ROOT_JSON  # its own: the child's is on the child's
            (child_id,) = record["children"]
            child = (await alice.get(f"/runs/{child_id}")).json()["run"]
            assert child["usage"] == CHILD_JSON
            listed = (await alice.get("/runs")).json()["runs"]
            assert [run["usage"] for run in listed] == [ROOT_JSON]
            async with raw_client(served.ws_url) as ws:
                got = await ask(ws, {"id": "1", "op": "run.get", "run_id": run_id})
                assert got["run"]["usage"] == ROOT_JSON
                got = await ask(ws, {"id": "2", "op": "run.get", "run_id": child_id})
                assert got["run"]["usage"] == CHILD_JSON
                got = await ask(ws, {"id": "3", "op": "runs.list", "all": True})
                assert [run["usage"] for run in got["runs"]] == [ROOT_JSON, CHILD_JSON]
            # The control client decodes it exactly; the tree's total is the nodes' sum.
            async with connect(served.ws_url, token="tok-alice") as control:
                infos = await control.list_runs(all=True)
            root_info, child_info = infos
            assert root_info.usage == ROOT_CALL + ROOT_CALL
            assert child_info.usage == CHILD_CALL
            total = root_info.usage + child_info.usage
            assert total.cost == Decimal("0.0002531")


def _waiting_agent() -> ta.Agent:
    """One priced model call, then a tool that never returns: a live run has usage."""
    model = ScriptedModel([], default=Turn(tool_calls=[("wait_forever", {})], usage=ROOT_CALL))
    return ta.Agent(name="waiter", model=model, tools=[wait_forever])


async def test_a_live_runs_record_carries_what_it_used_so_far() -> None:
    with trio.fail_after(30):
        async with serving({"waiter": _waiting_agent()}) as served, client(served.base) as alice:
            run_id = await start(alice, "waiter")
            events = f"/runs/{run_id}/events"
            async with alice.stream("GET", events) as stream, aclosing(messages(stream)) as got:
                async for message in got:
                    if message.data["event"].get("type") == "tool.started":
                        break
            record = (await alice.get(f"/runs/{run_id}")).json()["run"]
            assert record["status"] == "running"
            assert record["usage"] == {
                "input_tokens": 100,
                "output_tokens": 7,
                "model": "root-model",
                "cache_read_tokens": 40,
                "cost": "0.000123",
            }
            await alice.post(f"/runs/{run_id}/cancel")


def test_a_record_without_usage_leaves_the_field_out() -> None:
    info = RunInfo(
        run_id="r", agent="a", session_id=None, status=ta.RunStatus.COMPLETED, reason=None, seq=3
    )
    assert "usage" not in info.to_json()
    assert RunInfo.from_json(info.to_json()) == info
    assert RunInfo.from_json({**info.to_json(), "usage": None}) == info


def _record(usage: Any) -> dict[str, Any]:
    info = RunInfo(
        run_id="r", agent="a", session_id=None, status=ta.RunStatus.COMPLETED, reason=None, seq=3
    )
    return {**info.to_json(), "usage": usage}


def test_usage_round_trips_exactly() -> None:
    usage = ta.Usage(3, 4, "m", cache_read_tokens=0, cache_write_tokens=2, cost=Decimal("1E-12"))
    info = RunInfo.from_json(_record(usage.to_json()))
    assert info.usage == usage
    assert info.to_json()["usage"] == usage.to_json()
    assert RunInfo.from_json(_record({"input_tokens": 1, "output_tokens": 2})).usage == ta.Usage(
        1, 2
    )


@pytest.mark.parametrize(
    "usage",
    [
        [1, 2],
        "lots",
        {"input_tokens": -1, "output_tokens": 0},
        {"input_tokens": 1.5, "output_tokens": 0},
        {"input_tokens": True, "output_tokens": 0},
        {"input_tokens": "1", "output_tokens": 0},
        {"input_tokens": 1, "output_tokens": 0, "cache_read_tokens": -2},
        {"input_tokens": 1, "output_tokens": 0, "cache_write_tokens": 0.5},
        {"input_tokens": 1, "output_tokens": 0, "model": 7},
        {"input_tokens": 1, "output_tokens": 0, "cost": 0.1},  # a float is not exact
        {"input_tokens": 1, "output_tokens": 0, "cost": "NaN"},
        {"input_tokens": 1, "output_tokens": 0, "cost": "Infinity"},
        {"input_tokens": 1, "output_tokens": 0, "cost": "-0.01"},
        {"input_tokens": 1, "output_tokens": 0, "cost": "a dollar"},
        {"input_tokens": 1, "output_tokens": 0, "cost": "1" * 1000},
    ],
)
def test_hostile_usage_is_refused(usage: Any) -> None:
    with pytest.raises(ValueError, match="malformed run info"):
        RunInfo.from_json(_record(usage))
