"""Run policies in a cluster (DESIGN §18): a run's ``run.start`` limits are persisted
with its row, so the node that takes it over runs it with the same limits, and the
server's ``context`` hook supplies its context again there (``info.resumed``)."""

from __future__ import annotations

from typing import Any

import trio

import trio_agents as ta
from tests.support.cluster_support import client, node
from trio_agents.control import RunStartInfo
from trio_agents.models import ScriptedModel, Turn


async def test_a_takeover_resumes_with_the_same_limits_and_a_fresh_context(pg_dsn: str) -> None:
    started: list[str] = []
    contexts: list[tuple[str, str, RunStartInfo]] = []
    forever = trio.Event()

    @ta.function_tool(idempotent=True)
    async def fetch(ctx: ta.ToolContext[str]) -> str:
        """Fetch (safe to repeat)."""
        started.append(f"{ctx.call_id}@{ctx.context}")
        if len(started) == 1:
            await forever.wait()
        return "fetched"

    def hook_of(node_id: str) -> Any:
        def context(principal: str, info: RunStartInfo) -> str:
            contexts.append((node_id, principal, info))
            return node_id

        return context

    model = ScriptedModel(
        [
            Turn(tool_calls=[ta.ToolCall("f1", "fetch", "{}")]),
            Turn(tool_calls=[ta.ToolCall("f2", "fetch", "{}"), ta.ToolCall("f3", "fetch", "{}")]),
            "done",
        ]
    )

    def agents() -> dict[str, ta.Agent]:
        return {"a": ta.Agent(name="a", instructions="", model=model, tools=[fetch])}

    # A lease of an hour: only the hand-over moves the run within the test's bound.
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, agents(), pg_dsn, "A", lease_ttl=3600.0, context=hook_of("A")) as a,
            node(nursery, agents(), pg_dsn, "B", lease_ttl=3600.0, context=hook_of("B")) as b,
            client(a.url) as ca,
            client(b.url) as cb,
        ):
            run_id = await ca.start_run(
                agent="a", input="go", session_id="s", subscribe="all", limits={"tool_calls": 1}
            )
            await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
            await cb.wait_event(run_id, lambda e: e["type"] == "tool.started")
            with trio.fail_after(30):
                await a.stop()
            done = await cb.wait_terminal(run_id)
        nursery.cancel_scope.cancel()
    event = done["event"]
    assert event["status"] == "failed", done
    assert event["reason"].startswith("usage limit: tool_calls ")
    assert event["detail"]["limits"]["tool_calls"]["limit"] == 1
    # The budget spent on A stays spent (DESIGN §12, issue 36 item 14): the idempotent
    # f1, run again on B, would be a second tool call of one allowed, so B never starts
    # it; that the resumed attempt had B's context shows in `contexts` below.
    assert started == ["f1@A"]
    [(first, principal, info), (second, _, resumed)] = contexts
    assert (first, principal, info.resumed, info.run_id) == ("A", "alice", False, run_id)
    assert (second, resumed.resumed, resumed.run_id, resumed.input) == ("B", True, run_id, ())
    assert info.limits == resumed.limits == ta.UsageLimits(tool_calls=1)


async def test_a_start_placed_on_another_node_keeps_its_limits_and_gets_that_nodes_context(
    pg_dsn: str,
) -> None:
    gate = trio.Event()
    contexts: list[tuple[str, RunStartInfo]] = []

    @ta.function_tool
    async def wait(ctx: ta.ToolContext[str]) -> str:
        """Wait for the gate (the first run), or answer (the placed one)."""
        if ctx.context == "A":
            await gate.wait()
        return ctx.context

    def hook_of(node_id: str) -> Any:
        def context(principal: str, info: RunStartInfo) -> str:
            contexts.append((node_id, info))
            return node_id

        return context

    model = ScriptedModel([], default=Turn(tool_calls=[("wait", {})]))

    def agents() -> dict[str, ta.Agent]:
        return {"a": ta.Agent(name="a", instructions="", model=model, tools=[wait])}

    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, agents(), pg_dsn, "A", max_runs=1, context=hook_of("A")) as a,
            node(nursery, agents(), pg_dsn, "B", max_runs=1, context=hook_of("B")),
            client(a.url) as ca,
        ):
            held = await ca.start_until_tool(agent="a", input="hold")
            # A is full: this start is placed on B, its limits with it.
            placed = await ca.start_run(
                agent="a", input="go", subscribe="all", limits={"requests": 2}
            )
            done = await ca.wait_terminal(placed)
            gate.set()
            await ca.wait_terminal(held)
        nursery.cancel_scope.cancel()
    event = done["event"]
    assert (event["status"], event["reason"]) == ("failed", "usage limit: requests 3/2")
    assert [(node_id, info.run_id) for node_id, info in contexts] == [("A", held), ("B", placed)]
    assert contexts[1][1].limits == ta.UsageLimits(requests=2)
