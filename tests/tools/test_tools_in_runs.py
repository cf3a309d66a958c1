"""Tools inside runs (DESIGN.md §5, §7): kinds of tool under cancel, limits, approval."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.helpers import collect
from tests.support.tools_processes import wait_until_group_dead
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import MemorySession
from trio_agents.testing import check_events


async def started(run: ta.Run, count: int = 1) -> None:
    seen = 0
    async for event in run.events():
        if isinstance(event, ta.ToolStarted):
            seen += 1
            if seen == count:
                return


async def status_reached(run: ta.Run, status: str) -> ta.RunUpdated:
    async for update in run.updated:
        if update.status == status:
            return update
    raise AssertionError(f"run ended without reaching {status}")


async def test_sync_tool_that_ignores_cancel_is_abandoned_and_its_result_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    release = threading.Event()
    returned = threading.Event()

    @ta.function_tool
    def stubborn() -> str:
        """Ignores ctx.cancelled."""
        release.wait(30)
        returned.set()
        return "late"

    model = ScriptedModel([Turn(tool_calls=[("stubborn", {})])])
    async with ta.open_run(ta.Agent(name="t", model=model, tools=[stubborn]), "go") as run:
        await started(run)
        run.cancel("stop")
        result = await run.wait()  # ends at once; the thread is still blocked
    assert not returned.is_set()
    release.set()
    await trio.to_thread.run_sync(returned.wait, 30)
    assert result.status == "cancelled"
    outputs = [i.output for i in result.conversation if isinstance(i, ta.ToolResult)]
    assert outputs == ["cancelled: stop"]
    assert run.result is result  # the late return changed nothing


async def test_subprocess_tool_dies_with_the_run(tmp_path: Path) -> None:
    """Real processes, so a real clock (bounded): the process group is gone after."""
    marker = tmp_path / "pgid"
    os.mkfifo(marker)  # reading it waits (in a thread) for the shell's echo: no polling

    @ta.function_tool
    async def spawn(ctx: ta.ToolContext) -> str:
        """Spawn a process group that would run for an hour."""
        await ctx.run_process(["sh", "-c", f"echo $$ > {marker}; sleep 3600 & wait"])
        return "unreachable"

    model = ScriptedModel([Turn(tool_calls=[("spawn", {})])])
    with trio.fail_after(20):
        async with ta.open_run(ta.Agent(name="t", model=model, tools=[spawn]), "go") as run:
            await started(run)
            pgid = int(await trio.to_thread.run_sync(marker.read_text, abandon_on_cancel=True))
            run.cancel("stop")
    assert run.result is not None
    assert run.result.status == "cancelled"
    # SIGKILL was sent to the group; the kernel finishes each death a moment later, so
    # wait for it (on a pidfd: an event, not a poll), bounded by a hang guard.
    await wait_until_group_dead(pgid)


async def test_tool_timeout_becomes_an_error_result(autojump_clock: trio.testing.MockClock) -> None:
    @ta.function_tool(timeout=2)
    async def slow() -> str:
        """Too slow."""
        await trio.sleep(10)
        return "never"

    model = ScriptedModel([Turn(tool_calls=[("slow", {})]), "moved on"])
    result = await ta.run(ta.Agent(name="t", model=model, tools=[slow]), "go")
    assert result.status == "completed"
    error = next(i for i in result.conversation if isinstance(i, ta.ToolResult))
    assert (error.status, error.output) == ("error", "timed out after 2 s")


async def test_concurrency_limit_is_respected(autojump_clock: trio.testing.MockClock) -> None:
    running = 0
    peak = 0

    @ta.function_tool
    async def work(n: int) -> int:
        """Some work."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(1)
        running -= 1
        return n

    calls = [("work", {"n": i}) for i in range(10)]
    model = ScriptedModel([Turn(tool_calls=calls), "done"])
    start = trio.current_time()
    result = await ta.run(
        ta.Agent(name="t", model=model, tools=[work]), "go", max_concurrent_tools=3
    )
    assert peak == 3
    assert trio.current_time() - start == pytest.approx(4)  # ceil(10 / 3) rounds of 1 s
    outputs = sorted(int(i.output) for i in result.conversation if isinstance(i, ta.ToolResult))
    assert outputs == list(range(10))


async def test_progress_events(autojump_clock: trio.testing.MockClock) -> None:
    @ta.function_tool
    async def crunch(ctx: ta.ToolContext, n: int) -> str:
        """Report progress."""
        for i in range(n):
            ctx.progress(f"step {i}", step=i)
            await trio.sleep(0.1)
        return "crunched"

    @ta.function_tool
    def crunch_in_thread(ctx: ta.ToolContext) -> str:
        """Report progress from a thread."""
        ctx.progress("from a thread", where="thread")
        return "ok"

    model = ScriptedModel(
        [Turn(tool_calls=[("crunch", {"n": 3}), ("crunch_in_thread", {})]), "done"]
    )
    agent = ta.Agent(name="t", model=model, tools=[crunch, crunch_in_thread])
    async with ta.open_run(agent, "go") as run:
        pass
    events = await collect(run)
    progress = [e for e in events if isinstance(e, ta.ToolProgress)]
    assert sorted((p.message, dict(p.data)) for p in progress) == [
        ("from a thread", {"where": "thread"}),
        ("step 0", {"step": 0}),
        ("step 1", {"step": 1}),
        ("step 2", {"step": 2}),
    ]
    assert progress[0].to_json()["type"] == "tool.progress"
    assert run.result is not None
    check_events(run.result, events).raise_for_violations()


# -------------------------------------------------------------------- approval


@ta.function_tool(needs_approval=True)
async def delete_file(path: str) -> str:
    """Delete a file (needs a human's OK)."""
    return f"deleted {path}"


@ta.function_tool(needs_approval=lambda args: args["amount"] > 100)
async def pay(amount: int) -> str:
    """Pay; large amounts need approval."""
    return f"paid {amount}"


@ta.function_tool
async def harmless() -> str:
    """Needs no approval."""
    await trio.sleep(1)
    return "harmless done"


def approval_agent(model: ta.Model) -> ta.Agent:
    return ta.Agent(name="a", model=model, tools=[delete_file, pay, harmless])


async def test_approve_and_reject(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(
        [
            Turn(
                tool_calls=[
                    ta.ToolCall("d1", "delete_file", '{"path": "/tmp/a"}'),
                    ta.ToolCall("p1", "pay", '{"amount": 500}'),
                    ta.ToolCall("p2", "pay", '{"amount": 5}'),
                    ta.ToolCall("h1", "harmless", "{}"),
                ]
            ),
            "done",
        ]
    )
    async with ta.open_run(approval_agent(model), "go") as run:
        update = await status_reached(run, "awaiting_approval")
        assert update.detail == {"pending": ["d1", "p1"]}
        assert run.statistics().pending_approvals == ("d1", "p1")
        # the calls that need no approval proceed meanwhile
        await trio.sleep(5)
        assert run.status == "awaiting_approval"
        run.approve("d1")
        with pytest.raises(ta.UnknownCallError):
            run.approve("d1")  # already answered
        with pytest.raises(ta.UnknownCallError):
            run.reject("nope")
        run.reject("p1", message="too expensive")
    result = run.result
    assert result is not None
    assert result.status == "completed"
    outputs = {i.call_id: i for i in result.conversation if isinstance(i, ta.ToolResult)}
    assert outputs["d1"] == ta.ToolResult("d1", "deleted /tmp/a")
    assert outputs["p1"].status == "error"
    assert "too expensive" in outputs["p1"].output
    assert outputs["p2"].output == "paid 5"
    assert outputs["h1"].output == "harmless done"
    events = await collect(run)
    statuses = [e.status.value for e in events if isinstance(e, ta.RunUpdated)]
    assert statuses == ["queued", "running", "awaiting_approval", "running", "completed"]
    # harmless and p2 finished while approval was pending
    order = [e.call_id for e in events if isinstance(e, ta.ToolFinished)]
    assert order.index("h1") < order.index("d1")
    check_events(result, events).raise_for_violations()


async def test_approval_from_another_thread(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(
        [Turn(tool_calls=[ta.ToolCall("d1", "delete_file", '{"path": "x"}')]), "ok"]
    )
    async with ta.open_run(approval_agent(model), "go") as run:
        await status_reached(run, "awaiting_approval")
        await trio.to_thread.run_sync(run.approve, "d1")
    assert run.result is not None
    assert run.result.final_output == "ok"


async def test_cancel_while_awaiting_approval_then_session_reuse(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = MemorySession("s")
    model = ScriptedModel(
        [Turn(tool_calls=[ta.ToolCall("d1", "delete_file", '{"path": "x"}')]), "fresh answer"]
    )
    agent = approval_agent(model)
    async with ta.open_run(agent, "go", session=session) as run:
        await status_reached(run, "awaiting_approval")
        run.cancel("user left")
    result = run.result
    assert result is not None
    assert result.status == "cancelled"
    assert result.conversation[-1] == ta.ToolResult(
        "d1", "cancelled: user left", status="cancelled"
    )
    events = await collect(run)
    assert not [e for e in events if isinstance(e, ta.ToolStarted)]
    with pytest.raises(ta.RunClosedError):
        run.approve("d1")
    second = await ta.run(agent, "again", session=session)
    assert second.status == "completed"
    assert ta.conversation_problems(model.requests[-1].items) == []
    assert second.final_output == "fresh answer"


async def test_invalid_arguments_skip_approval(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("p", "pay", '{"amount": "lots"}')]), "ok"])
    async with ta.open_run(approval_agent(model), "go") as run:
        pass
    assert run.result is not None
    result = next(i for i in run.result.conversation if isinstance(i, ta.ToolResult))
    assert result.status == "error"
    assert "$.amount" in result.output
