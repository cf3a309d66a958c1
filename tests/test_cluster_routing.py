"""A cluster of nodes in one process: ops from any node reach the run's owner."""

from __future__ import annotations

import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn

from .cluster_support import client, node


def agents(model: ta.Model, tools: list[ta.Tool]) -> dict[str, ta.Agent]:
    return {"a": ta.Agent(name="a", instructions="", model=model, tools=tools)}


async def test_smoke_cancel_from_another_node(pg_dsn: str) -> None:
    gate = trio.Event()

    @ta.function_tool
    async def wait() -> str:
        """Wait."""
        await gate.wait()
        return "done"

    model = ScriptedModel([Turn(tool_calls=[("wait", {})]), "finished"])
    async with trio.open_nursery() as nursery:
        async with node(nursery, agents(model, [wait]), pg_dsn, "A") as a, node(
            nursery, agents(model, [wait]), pg_dsn, "B"
        ) as b:
            async with client(a.url) as ca, client(b.url) as cb:
                ack = await ca.ok("run.start", agent="a", input="hi", subscribe="all")
                run_id = ack["run_id"]
                await ca.wait_event(run_id, lambda e: e["type"] == "tool.started")
                got = await cb.ok("run.get", run_id=run_id)
                assert got["run"]["run_id"] == run_id
                await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
                await cb.ok("run.cancel", run_id=run_id, reason="stop")
                done = await ca.wait_terminal(run_id)
                assert done["event"]["status"] == "cancelled"
                assert done["event"]["reason"] == "stop"
                remote = await cb.wait_terminal(run_id)
                assert remote == done
                assert cb.events[run_id] == ca.events[run_id]
        nursery.cancel_scope.cancel()
