"""Run trees (DESIGN §17): what waits for approval below a run stays shown on it when
one of its children ends (``Run._child_ended`` recomputes it only when something waits
below; benchmark B8)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.core_trees import researcher, root_calling, run_events, tool_turn
from trio_agents.models import ScriptedModel, Turn

pytestmark = pytest.mark.trio


@ta.function_tool(needs_approval=True)
async def erase(path: str) -> str:
    """Erase a file (needs approval)."""
    return f"erased {path}"


async def test_a_child_ending_keeps_a_siblings_waiting_approval_on_the_parent(
    autojump_clock: Any,
) -> None:
    # A child ends while its sibling waits for approval: the parent still shows the
    # sibling's call (the ended child's end recomputes what waits below, B8's guard).
    asker = researcher("asker", tool_turn(("erase", {"path": "/tmp/x"})), "erased", tools=[erase])
    quick = researcher("quick", Turn("quick done", delay=5))
    root = root_calling(asker, quick)
    async with ta.open_run(root, "go") as run:
        await trio.sleep(100)
        done = next(c for c in run.children if c.agent.name == "quick")
        waiting = next(c for c in run.children if c.agent.name == "asker")
        assert done.result is not None
        assert done.result.status == "completed"
        assert run.status == "awaiting_approval"
        current = run.updated.current
        assert current.detail == {
            "pending": [],
            "waiting": [
                {
                    "run_id": waiting.id,
                    "call_id": "call_1_0",
                    "name": "erase",
                    "arguments": '{"path": "/tmp/x"}',
                }
            ],
        }
        waiting.approve("call_1_0")
    assert run.result is not None
    assert run.result.status == "completed"
    statuses = [u.status for u in await run_events(run) if isinstance(u, ta.RunUpdated)]
    assert statuses == ["queued", "running", "awaiting_approval", "running", "completed"]


async def test_a_child_ending_with_nothing_waiting_below_leaves_the_parent_alone(
    autojump_clock: Any,
) -> None:
    # The parent waits for approval of its own call while a child runs and ends with
    # nothing waiting: the parent's status and detail stay as they were, no update.
    quick = researcher("quick", Turn("quick done", delay=5))
    root = ta.Agent(
        name="root",
        model=ScriptedModel(
            [tool_turn(("erase", {"path": "/tmp/y"}), ("quick", {"input": "b"})), "root done"]
        ),
        tools=[erase, quick.as_tool()],
    )
    async with ta.open_run(root, "go") as run:
        await trio.sleep(100)
        (child,) = run.children
        assert child.result is not None
        assert child.result.status == "completed"
        assert run.status == "awaiting_approval"
        assert run.updated.current.detail == {"pending": ["call_1_0"]}
        run.approve("call_1_0")
    assert run.result is not None
    assert run.result.status == "completed"
    statuses = [u.status for u in await run_events(run) if isinstance(u, ta.RunUpdated)]
    assert statuses == ["queued", "running", "awaiting_approval", "running", "completed"]
    kinds = [(e.type, getattr(e, "status", None)) for e in await run_events(run)]
    assert kinds.index(("run.child", "completed")) < kinds.index(("run.updated", "running"), 2)
