"""``Run.usage``, ``Run.tree_usage`` and ``Run.turn_usage`` while a tree of runs works:
each run's own usage so far, the subtree's (live children included) and the current
model call's; exact, and equal to the result's once terminal."""

from __future__ import annotations

from decimal import Decimal

import trio
import trio.testing

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn

ROOT_CALL = ta.Usage(100, 10, cost=Decimal("0.0001"))
CHILD_CALL = ta.Usage(7, 3, cost=Decimal("0.0000003"))


async def test_usage_and_tree_usage_while_a_child_runs_and_after() -> None:
    release = trio.Event()

    @ta.function_tool
    async def hold() -> str:
        """Wait for the test."""
        await release.wait()
        return "held"

    child = ta.Agent(
        name="child",
        model=ScriptedModel(
            [Turn(tool_calls=[("hold", {})], usage=CHILD_CALL), Turn("done", usage=CHILD_CALL)]
        ),
        tools=[hold],
    )
    root = ta.Agent(
        name="root",
        model=ScriptedModel(
            [
                Turn(tool_calls=[("child", {"input": "go"})], usage=ROOT_CALL),
                Turn("ok", usage=ROOT_CALL),
            ]
        ),
        tools=[child.as_tool(name="child")],
    )
    with trio.fail_after(10):
        async with ta.open_run(root, "go") as run:
            await trio.testing.wait_all_tasks_blocked()
            (live,) = run.children
            assert live.status == "running"
            # The child waits in its tool after one call: counted live in the root's
            # tree_usage, not in the root's own usage.
            assert run.usage == ROOT_CALL
            assert run.turn_usage == ROOT_CALL
            assert live.usage == live.tree_usage == live.turn_usage == CHILD_CALL
            assert run.tree_usage == ROOT_CALL + CHILD_CALL
            release.set()
            result = await run.wait()
    assert result.status == "completed", result.reason
    assert run.usage == result.usage == ROOT_CALL + ROOT_CALL
    assert run.tree_usage == result.tree_usage
    assert result.tree_usage is not None
    assert result.tree_usage.cost == Decimal("0.0002006")
    assert live.tree_usage == live.usage == CHILD_CALL + CHILD_CALL
