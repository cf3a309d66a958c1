"""What a run costs, counted (issue 43): the CI smoke test of the benchmarks' counts.

Instruction counts (callgrind, ``benchmarks/instructions.py``) take minutes per figure,
so the suite pins the counts that stand for them and that no machine load moves:
Python calls (every call a ``sys.setprofile`` hook sees, C functions included) and
task steps from ``cancel()`` to the terminal update, and the objects one in-flight run
holds. Each band is the figure measured when it was set plus a margin for Trio's
random batch order; a change that makes the path dearer fails here, with the figure
to compare against ``benchmarks/RESULTS.md``. A deliberate change of cost (or a new
Trio or CPython) moves the band, with the reason in the commit.
"""

from __future__ import annotations

import collections
import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import trio
import trio.testing

import trio_agents as ta
from benchmarks._models import ToolThenAnswer
from benchmarks.tree import BRANCHES, cancel_tree_agent


@ta.function_tool
async def nap() -> str:
    """Sleep for an hour."""
    await trio.sleep(3600)
    return "rested"  # pragma: no cover - always cancelled


def _napper() -> ta.Agent:
    # A stateless model (any number of runs, at once): first a call of nap, then the
    # answer.
    return ta.Agent(name="napper", model=ToolThenAnswer("nap", {}), tools=[nap])


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.on = False
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.on:
            self.count += 1


@contextmanager
def _counting_calls(counter: list[int]) -> Iterator[Callable[[bool], None]]:
    """A switch for a ``sys.setprofile`` hook that counts calls into ``counter[0]``."""

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" or event == "c_call":
            counter[0] += 1

    def switch(on: bool) -> None:
        sys.setprofile(hook if on else None)

    try:
        yield switch
    finally:
        sys.setprofile(None)


async def _cancel_costs(agent: ta.Agent, tool_starts: int) -> tuple[int, int]:
    """(Python calls, task steps) from ``cancel()`` of a run whose tools are all started
    to its terminal update seen by another task."""
    calls = [0]
    steps = _Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        with _counting_calls(calls) as counting:
            async with ta.open_run(agent, "go") as run:
                started = 0
                async for event in run.events(tree=True):
                    if isinstance(event, ta.ToolStarted) and event.name == "nap":
                        started += 1
                        if started == tool_starts:
                            break
                async with trio.open_nursery() as nursery:

                    async def watch() -> None:
                        async for update in run.updated:
                            if update.status.is_terminal:
                                counting(False)
                                steps.on = False

                    nursery.start_soon(watch)
                    await trio.testing.wait_all_tasks_blocked()
                    steps.on = True
                    counting(True)
                    run.cancel("enough")
    finally:
        trio.lowlevel.remove_instrument(steps)
    assert run.result is not None
    assert run.result.status == "cancelled"
    return calls[0], steps.count


async def _median_costs(agent: ta.Agent, tool_starts: int) -> tuple[int, int]:
    await _cancel_costs(agent, tool_starts)  # warm-up: imports, caches
    samples = [await _cancel_costs(agent, tool_starts) for _ in range(5)]
    calls = sorted(c for c, _ in samples)[2]
    steps = sorted(s for _, s in samples)[2]
    return calls, steps


# The bands: a median of 5 moves by about 1 % with Trio's batch order (the tree's
# counts come in two modes, about 50 calls apart), so 5 % above the figure catches a
# regression of a few calls per run of the tree, and both figures of the round before.
_BAND = 1.05


async def test_a_single_run_cancel_stays_within_its_call_and_step_band() -> None:
    # B8's single run: one run in a tool, cancelled. Set 2026-11-29 (issue 43 round 2,
    # trio 0.35, CPython 3.11): 373 calls (419 before the per-node cuts of B8), 3 task
    # steps (the run's, the watcher's, ours).
    calls, steps = await _median_costs(_napper(), 1)
    assert calls <= 373 * _BAND, f"{calls} calls from cancel() to the terminal update (was 373)"
    assert steps <= 3 + 2, f"{steps} task steps from cancel() to the terminal update (was 3)"


async def test_a_tree_cancel_stays_within_its_call_band() -> None:
    # B8's 13-run tree: a root calling three children, each calling three napping
    # leaves. Set 2026-11-29 (issue 43 round 2): 4,225 calls (5,376-5,444 before the
    # per-node cuts; 5,520 before the round's second part), 15-16 task steps. Of the
    # 4,225, Trio's own tree of 13 tasks and scopes is about 1,930 (benchmarks/notes.md).
    calls, steps = await _median_costs(cancel_tree_agent(), BRANCHES**2)
    assert calls <= 4_225 * _BAND, f"{calls} calls to cancel a 13-run tree (was 4,225)"
    assert steps <= 15 + 4, f"{steps} task steps to cancel a 13-run tree (was 15-16)"


@ta.function_tool
async def blocked() -> str:
    """Wait until cancelled."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


def _types() -> collections.Counter[str]:
    gc.collect()
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


async def test_an_in_flight_run_holds_at_most_its_band_of_objects() -> None:
    # W3 (10 KB per concurrent run): GC-tracked objects per run blocked in its tool,
    # counted as benchmarks/objects.py does. 69 before issue 43's second round; 63
    # since the log's parking lot, the run's done event and the inbox's set of queued
    # call ids are made only when something uses them; 48 since the conversation
    # checker keeps one dict made at the first call, Answers runs the tools itself
    # (no partial), an async tool that takes no context gets none, new_items is a
    # slice of the conversation, and the run's lists and dicts most runs never fill
    # are made on first use (benchmarks/RESULTS.md, "Issue 43, third part").
    agent = ta.Agent(name="w3", model=ToolThenAnswer("blocked", {}), tools=[blocked])
    runs = 200

    async def in_flight(count: int) -> collections.Counter[str]:
        async with trio.open_nursery() as nursery:
            for i in range(count):
                nursery.start_soon(ta.run, agent, f"run {i}")
            await trio.testing.wait_all_tasks_blocked()
            grown = _types()
            nursery.cancel_scope.cancel()
        return grown

    await in_flight(20)  # warm-up: imports, caches
    before = _types()
    grown = await in_flight(runs) - before
    per_run = sum(grown.values()) / runs
    top = {kind: count / runs for kind, count in grown.most_common(8)}
    assert per_run <= 49.5, f"{per_run} GC-tracked objects per in-flight run (was 48): {top}"


@ta.output_guardrail(stream=True)
def _passes(run: ta.Run, text: str) -> bool:
    return False


async def _streamed_run_costs(deltas: int, *, gated: bool = False) -> tuple[int, int]:
    """(Python calls, task steps) of a whole run that streams ``deltas`` deltas to one
    ``events()`` reader (W1's shape), reader included; through one no-op streaming
    guardrail (a plain function) if ``gated``."""
    agent = ta.Agent(
        name="w1",
        model=ta.models.ScriptedModel([ta.models.Turn(text=["x"] * deltas)]),
        output_guardrails=[_passes] if gated else [],
    )
    calls = [0]
    steps = _Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        with _counting_calls(calls) as counting:
            steps.on = True
            counting(True)
            async with ta.open_run(agent, "go") as run:
                async for _ in run.events():
                    pass
            counting(False)
            steps.on = False
    finally:
        trio.lowlevel.remove_instrument(steps)
    return calls[0], steps.count


async def test_a_streamed_delta_stays_within_its_call_and_step_band() -> None:
    # W1 (benchmarks/instructions.py's I.w1_run_over_floor_per_delta): the calls and task
    # steps one more streamed delta costs, the model's and the reader's included (the
    # difference of a 300- and a 100-delta run, so the run's start and end cancel out).
    # Set 2026-11-29 (issue 43, fifth part): 86 calls (85.6-86.3 over runs; the
    # instrument counting steps is itself called at every step) and 2 task steps per
    # delta: the model's own loop 1, the reader 1, Trio's floor for a per-event reader.
    # 89.8-90.0 before the log built the delta itself and the cursor took it inline, so
    # the band is 2 % (Trio's batch order moves this figure by under 1 %).
    await _streamed_run_costs(20)  # warm-up: imports, caches
    small_calls, small_steps = await _streamed_run_costs(100)
    large_calls, large_steps = await _streamed_run_costs(300)
    calls = (large_calls - small_calls) / 200
    steps = (large_steps - small_steps) / 200
    assert calls <= 86 * 1.02, f"{calls} calls per streamed delta (was 86)"
    assert steps <= 2.02, f"{steps} task steps per streamed delta (was 2)"


async def test_a_gated_streamed_delta_stays_within_its_call_and_step_band() -> None:
    # The same through one no-op streaming guardrail, a plain function checked inline
    # (PI.w1_gated_per_delta): the gate adds its push() and the guardrail's call, and
    # no task step. Set 2026-11-30 (issue 43, sixth part): 88 calls (87.6-88.5 over
    # runs; 89.1-89.7 before push() kept what it reads at hand and a plain gate stopped
    # opening a side nursery), 2 % as the band above.
    await _streamed_run_costs(20, gated=True)  # warm-up: imports, caches
    small_calls, small_steps = await _streamed_run_costs(100, gated=True)
    large_calls, large_steps = await _streamed_run_costs(300, gated=True)
    calls = (large_calls - small_calls) / 200
    steps = (large_steps - small_steps) / 200
    assert calls <= 88 * 1.02, f"{calls} calls per gated streamed delta (was 88)"
    assert steps <= 2.02, f"{steps} task steps per gated streamed delta (was 2)"
