"""What a finished run leaves to the garbage collector (issue 43, B8): counted, never
timed. An object in a reference cycle outlives its last use until a collector pass
finds it, and every such object makes the passes that run during later cancels longer."""

from __future__ import annotations

import collections
import gc
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

import trio

import trio_agents as ta
from tests.support.core_trees import researcher, root_calling, tool_turn


@ta.function_tool
async def nap() -> str:
    """Sleep for an hour."""
    await trio.sleep(3600)
    return "rested"  # pragma: no cover - always cancelled


@contextmanager
def _collector_off() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was_enabled:
            gc.enable()


async def _cyclic_garbage(work: Callable[[], Awaitable[None]]) -> collections.Counter[str]:
    """The types of the objects ``work`` left in reference cycles (found by a collector
    pass after it, with the collector off meanwhile so none is collected early)."""
    with _collector_off():
        await work()  # once first: lazily made, long-lived objects are not garbage
        gc.collect()
        await work()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return collections.Counter(type(o).__name__ for o in gc.garbage)


# What an exception's traceback keeps alive: every frame it passed through, each with
# its locals (runs, states, tasks).
_FRAMES = {"frame", "traceback", "coroutine", "Task", "Cancelled", "ExceptionGroup"}


def _napper(name: str) -> ta.Agent:
    return researcher(name, tool_turn(("nap", {})), "never", tools=[nap])


async def _cancel_when_napping(run: ta.Run, naps: int) -> None:
    seen = 0
    async for event in run.events(tree=True):
        if isinstance(event, ta.ToolStarted) and event.name == "nap":
            seen += 1
            if seen == naps:
                run.cancel("enough")


async def test_a_run_cancelled_from_outside_leaves_no_frames_in_cycles() -> None:
    async def work() -> None:
        with trio.CancelScope() as scope:
            async with ta.open_run(_napper("solo"), "go") as run:
                async for event in run.events():
                    if isinstance(event, ta.ToolStarted):
                        scope.cancel()  # an outer scope: the run re-raises its Cancelled
        assert run.result is not None
        assert run.result.reason == "parent cancelled"

    garbage = await _cyclic_garbage(work)
    # The run's frame held the Cancelled it re-raised, whose traceback held the frame.
    # (What is left is ScriptedModel's own: it keeps every request it was sent, and a
    # request holds its run's callback, so a fresh agent's model is in a cycle with it.)
    assert not _FRAMES & set(garbage), garbage.most_common(10)
    assert "RunState" not in garbage or "ModelRequest" in garbage


async def test_a_cancelled_tree_leaves_no_frames_or_tracebacks_in_cycles() -> None:
    async def work() -> None:
        # A fresh script each time: root -> mid -> two leaves napping in a tool.
        mid = root_calling(_napper("leaf_a"), _napper("leaf_b"), input="go")
        root = root_calling(ta.Agent(name="mid", model=mid.model, tools=mid.tools), input="go")
        async with ta.open_run(root, "go") as run:
            await _cancel_when_napping(run, 2)
        assert run.result is not None
        assert run.result.status == "cancelled"
        assert [c.result.status for c in run.children if c.result] == ["cancelled"]

    garbage = await _cyclic_garbage(work)
    # Each child's Cancelled passed up through its run's frame; none may keep its
    # traceback's frames (every task's, tool's and run's) alive in a cycle.
    assert not _FRAMES & set(garbage), garbage.most_common(10)
