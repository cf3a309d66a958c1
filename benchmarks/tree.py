"""Run trees (issue 25, DESIGN §17): B8 tree cancel, B9 child-run overhead, F1 fan-out
memory.

- **B8**: a tree of 1 root + 3 children + 9 grandchildren (``Agent.as_tool`` at each
  level), every grandchild in a tool sleeping an hour; ``cancel()`` of the root until a
  ``run.updated`` reader sees the root's terminal update, which comes after every other
  node's (bottom-up repair; checked after each tree). Beside it, in the same process and
  interleaved tree / single run, a single run's cancel → terminal in the same state (its
  tool sleeping), so the ratio of the two p99s is free of the machine's load.
- **B9**: a 2-turn run whose tool is ``agent.as_tool()`` of a 1-turn agent ("a tree"),
  against the same work done as a plain tool plus a separate top-level run of the
  1-turn agent ("separate"): instructions per unit under callgrind
  (``benchmarks.instructions.count``), and wall time in-process (interleaved).
- **F1**: one root whose only turn makes 100 ``as_tool`` calls, every child blocked in
  its tool; Python memory (tracemalloc) and GC-tracked objects per in-flight child,
  against a top-level run blocked in the same tool (the ``benchmarks/objects.py``
  method), in one process.

Every model is in-process and stateless (``benchmarks/_models.py``) except B9's, which
are fresh ``ScriptedModel`` scripts as in B2/W2.
"""

from __future__ import annotations

import cProfile
import functools
import gc
import pstats
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import Any

import trio
import trio.testing

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn

from ._common import Baselines, Figure, median, percentile
from ._models import CallsThenAnswer, ToolThenAnswer
from .latency import GCPasses

__all__ = [
    "B9_SIZES",
    "b9_workload",
    "bench_b8",
    "bench_b9",
    "bench_f1",
    "cancel_tree_agent",
    "fanout_memory",
]

BRANCHES = 3  # children per node of B8's tree (3 children, 9 grandchildren)
TREE_FACTOR = 3  # B8 target: tree p99 <= 3x the single run's p99, same process
SEPARATE_FACTOR = 1.2  # B9 target: a tree's instructions <= 1.2x the two separate runs'
MEMORY_FACTOR = 1.5  # F1 target: memory per in-flight child <= 1.5x a top-level run's


@ta.function_tool
async def nap() -> str:
    """Sleep for an hour."""
    await trio.sleep(3600)
    return "rested"


_BLOCKED = [0]  # how many calls of blocked() / the plain leaf are in flight


@ta.function_tool
async def blocked() -> str:
    """Wait until cancelled."""
    _BLOCKED[0] += 1
    try:
        await trio.sleep_forever()
    finally:
        _BLOCKED[0] -= 1
    raise AssertionError("unreachable")  # pragma: no cover


# ------------------------------------------------------------------------------- B8


def cancel_tree_agent() -> ta.Agent:
    """B8's root: 3 ``mid`` children, each with 3 ``leaf`` children napping."""
    leaf = ta.Agent(name="leaf", model=ToolThenAnswer("nap", {}), tools=[nap])
    mid = ta.Agent(
        name="mid",
        model=CallsThenAnswer([("leaf", {"input": f"part {i}"}) for i in range(BRANCHES)], "ok"),
        tools=[leaf.as_tool()],
    )
    return ta.Agent(
        name="root",
        model=CallsThenAnswer([("mid", {"input": f"topic {i}"}) for i in range(BRANCHES)], "ok"),
        tools=[mid.as_tool()],
    )


def _single_agent() -> ta.Agent:
    return ta.Agent(name="single", model=ToolThenAnswer("nap", {}), tools=[nap])


def _nodes(run: ta.Run) -> list[ta.Run]:
    every = [run]
    for child in run.children:
        every.extend(_nodes(child))
    return every


async def _all_napping(run: ta.Run, naps: int) -> None:
    """Wait until ``naps`` runs of ``run``'s tree are in their ``nap`` tool."""
    seen = 0
    cursor = run.events(tree=True) if naps > 1 else run.events()
    async for event in cursor:
        if isinstance(event, ta.ToolStarted) and event.name == "nap":
            seen += 1
            if seen == naps:
                return
    raise RuntimeError("the run ended before every leaf was in its tool")


async def _one_cancel(
    agent: ta.Agent, naps: int, marker: str, profile: cProfile.Profile | None = None
) -> tuple[float, float]:
    """One run (a tree when ``naps`` > 1) cancelled with every leaf in its tool:
    (t_cancel, t_root_terminal_seen). ``profile`` is enabled from just before
    ``cancel()`` until the terminal update is seen (it counts the cancel path's calls)."""
    t_terminal = 0.0
    async with ta.open_run(agent, marker) as run:
        await _all_napping(run, naps)
        statuses = aiter(run.updated)
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal t_terminal
                async for update in statuses:
                    if update.status.is_terminal:
                        t_terminal = time.monotonic()
                        if profile is not None:
                            profile.disable()

            nursery.start_soon(watch)
            await trio.lowlevel.checkpoint()  # the watcher is parked on the log now
            if profile is not None:
                profile.enable()
            t0 = time.monotonic()
            run.cancel("bench")
    nodes = _nodes(run)
    expected = 1 + (BRANCHES + BRANCHES**2 if naps > 1 else 0)
    assert len(nodes) == expected, (len(nodes), expected)
    for node in nodes:
        assert node.result is not None, node
        assert node.result.status == "cancelled", node.result
    return t0, t_terminal


def _summary(
    values: list[float], passes: GCPasses, marks: list[tuple[float, float]]
) -> dict[str, Any]:
    clean = [t1 - t0 for t0, t1 in marks if not passes.hit(t0, t1)]
    return {
        "n": len(values),
        "p50_ms": round(percentile(values, 50) * 1e3, 4),
        "max_ms": round(max(values) * 1e3, 3),
        "cancels_with_gc": len(values) - len(clean),
        "p99_without_gc_ms": round(percentile(clean, 99) * 1e3, 4) if clean else None,
    }


async def bench_b8(base: Baselines, *, trees: int, warmup: int, profiled: int = 20) -> list[Figure]:
    """``trees`` trees and as many single runs, interleaved, after ``warmup`` of each;
    then ``profiled`` of each under cProfile for the calls on the cancel path."""
    tree_agent, single_agent = cancel_tree_agent(), _single_agent()
    tree_marks: list[tuple[float, float]] = []
    single_marks: list[tuple[float, float]] = []
    passes = GCPasses()
    with passes:
        for i in range(warmup + trees):
            tree = await _one_cancel(tree_agent, BRANCHES**2, f"tree {i}")
            single = await _one_cancel(single_agent, 1, f"single {i}")
            if i >= warmup:
                tree_marks.append(tree)
                single_marks.append(single)
    # Python calls on the cancel path (cProfile, after the timed cancels): unlike the
    # times, a count that does not move with the machine's load.
    calls = {}
    for label, agent, naps in (("tree", tree_agent, BRANCHES**2), ("single", single_agent, 1)):
        profile = cProfile.Profile()
        for i in range(profiled):
            await _one_cancel(agent, naps, f"profiled {label} {i}", profile)
        calls[label] = pstats.Stats(profile).total_calls / profiled  # type: ignore[attr-defined]
    tree_values = [t1 - t0 for t0, t1 in tree_marks]
    single_values = [t1 - t0 for t0, t1 in single_marks]
    tree_p99, single_p99 = percentile(tree_values, 99), percentile(single_values, 99)
    runs = 1 + BRANCHES + BRANCHES**2
    return [
        Figure(
            "B8.tree_cancel_to_terminal",
            tree_p99 * 1e3,
            "ms p99",
            target=TREE_FACTOR * single_p99 * 1e3,
            note=f"cancel() of the root of a {runs}-run as_tool tree (9 leaves in a tool"
            " sleeping 1 h) -> the root's terminal run.updated seen, every run cancelled"
            f" (target {TREE_FACTOR}x the single-run p99 of the same process)",
            extra={
                **_summary(tree_values, passes, tree_marks),
                "x_single_p99": round(tree_p99 / single_p99, 3),
                "x_single_p50": round(
                    percentile(tree_values, 50) / percentile(single_values, 50), 3
                ),
                "calls_per_cancel": round(calls["tree"], 1),
                "x_single_calls": round(calls["tree"] / calls["single"], 3),
                **base.ratios(tree_p99),
                **base.cancel_ratio(tree_p99),
            },
        ),
        Figure(
            "B8.single_cancel_to_terminal",
            single_p99 * 1e3,
            "ms p99",
            note="the same for one top-level run in a tool sleeping 1 h, interleaved with"
            " the trees",
            extra={
                **_summary(single_values, passes, single_marks),
                "calls_per_cancel": round(calls["single"], 1),
                **base.ratios(single_p99),
                **base.cancel_ratio(single_p99),
            },
        ),
    ]


# ------------------------------------------------------------------------------- B9


@ta.function_tool
async def helper(input: str) -> str:
    """The plain-tool stand-in for the ``helper`` agent (same name and schema)."""
    return "3"


def _helper_agent() -> ta.Agent:
    return ta.Agent(name="helper", model=ScriptedModel(["3"]))


def _caller(tool: ta.Tool) -> ta.Agent:
    model = ScriptedModel([Turn(tool_calls=[("helper", {"input": "1 + 2?"})]), "3"])
    return ta.Agent(name="b9", model=model, tools=[tool])


def _tree_unit() -> Callable[[], Awaitable[None]]:
    root = _caller(_helper_agent().as_tool())

    async def one() -> None:
        result = await ta.run(root, "1 + 2?")
        assert result.final_output == "3", result
        assert result.tree_usage != result.usage, result  # the child ran

    return one


def _separate_unit() -> Callable[[], Awaitable[None]]:
    root, alone = _caller(helper), _helper_agent()

    async def one() -> None:
        result = await ta.run(root, "1 + 2?")
        assert result.final_output == "3", result
        result = await ta.run(alone, "1 + 2?")
        assert result.final_output == "3", result

    return one


_UNITS = {"b9_tree": _tree_unit, "b9_separate": _separate_unit}
# callgrind's (small n, large n), as benchmarks.instructions.SIZES: a unit is 2-3 runs.
B9_SIZES = (10, 60)


async def b9_workload(mode: str, n: int, *, largest: int = B9_SIZES[1]) -> None:
    """What a callgrind child runs for B9 (``benchmarks.instructions``): three warm-up
    units, then ``n``. Scripts are built first, always ``largest`` of them, so the
    difference of two children is the units' runs only (as for W2)."""
    for unit in [_UNITS[mode]() for _ in range(3)]:
        await unit()
    units = [_UNITS[mode]() for _ in range(largest)]
    for unit in units[:n]:
        await unit()


async def _wall(units: int, repeats: int) -> tuple[float, float]:
    """Seconds per tree and per separate pair, median of ``repeats``, interleaved."""
    trees: list[float] = []
    separate: list[float] = []
    for _ in range(repeats):
        for kind, samples in (("b9_tree", trees), ("b9_separate", separate)):
            made = [_UNITS[kind]() for _ in range(units)]
            start = time.perf_counter()
            for unit in made:
                await unit()
            samples.append((time.perf_counter() - start) / units)
    return median(trees), median(separate)


def _instructions() -> tuple[float, float] | None:
    from .instructions import callgrind_available, count

    if not callgrind_available():
        return None
    from concurrent.futures import ThreadPoolExecutor

    # Two children at a time (2 cores); counts do not depend on load.
    with ThreadPoolExecutor(max_workers=2) as pool:
        tree = pool.submit(count, "b9_tree", B9_SIZES)
        separate = pool.submit(count, "b9_separate", B9_SIZES)
        return tree.result(), separate.result()


async def bench_b9(base: Baselines, *, units: int, repeats: int, callgrind: bool) -> list[Figure]:
    tree_s, separate_s = await _wall(units, repeats)
    figures = [
        Figure(
            "B9.wall_per_tree",
            tree_s * 1e3,
            "ms",
            note="a 2-turn run whose tool is as_tool() of a 1-turn agent, in-process"
            f" ({units} sequential, median of {repeats}, interleaved with the separate runs)",
            extra={
                "separate_ms": round(separate_s * 1e3, 4),
                "x_separate": round(tree_s / separate_s, 3),
                **base.ratios(tree_s),
            },
        )
    ]
    counts = await trio.to_thread.run_sync(_instructions) if callgrind else None
    if callgrind and counts is None:
        figures.append(
            Figure(
                "B9.unavailable",
                float("nan"),
                "",
                note="valgrind is not installed: no instruction counts in this run",
            )
        )
    if counts is not None:
        tree, separate = counts
        figures.append(
            Figure(
                "B9.instructions_per_tree",
                tree,
                "instr",
                target=SEPARATE_FACTOR * separate,
                note="callgrind: a 2-turn run whose tool is as_tool() of a 1-turn agent,"
                " vs a 2-turn run with a plain tool plus a separate 1-turn top-level run"
                f" (target {SEPARATE_FACTOR}x those two)",
                extra={
                    "separate_instr": round(separate),
                    "x_separate": round(tree / separate, 3),
                    "child_overhead_instr": round(tree - separate),
                },
            )
        )
    return figures


# ------------------------------------------------------------------------------- F1


def _fanout_agents(children: int) -> tuple[ta.Agent, ta.Agent, ta.Agent]:
    """(a top-level run's agent, the fan-out root, the root with a plain tool instead)."""
    leaf = ta.Agent(name="leaf", model=ToolThenAnswer("blocked", {}), tools=[blocked])

    @ta.function_tool(name="leaf")
    async def plain_leaf(input: str) -> str:
        """The plain-tool stand-in for the leaf agent: blocked until cancelled."""
        _BLOCKED[0] += 1
        try:
            await trio.sleep_forever()
        finally:
            _BLOCKED[0] -= 1
        raise AssertionError("unreachable")  # pragma: no cover

    calls = [("leaf", {"input": f"task {i}"}) for i in range(children)]
    root = ta.Agent(name="root", model=CallsThenAnswer(calls, "ok"), tools=[leaf.as_tool()])
    plain = ta.Agent(name="root", model=CallsThenAnswer(calls, "ok"), tools=[plain_leaf])
    return leaf, root, plain


async def _in_flight(agent: ta.Agent, runs: int, blocked_calls: int) -> tuple[int, int]:
    """Start ``runs`` top-level runs of ``agent``, wait until every task is blocked
    (``blocked_calls`` tools in all): (tracemalloc bytes, GC-tracked objects) they hold;
    then cancel them. Every turn's calls run at once (``max_concurrent_tools``)."""
    gc.collect()
    before = len(gc.get_objects())
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        async with trio.open_nursery() as nursery:
            for i in range(runs):
                nursery.start_soon(
                    functools.partial(
                        ta.run,
                        agent,
                        f"run {i}",
                        max_concurrent_tools=max(1, blocked_calls // runs),
                    )
                )
            await trio.testing.wait_all_tasks_blocked()
            current, _ = tracemalloc.get_traced_memory()
            assert _BLOCKED[0] == blocked_calls, (_BLOCKED[0], blocked_calls)
            gc.collect()
            objects = len(gc.get_objects()) - before
            nursery.cancel_scope.cancel()
    finally:
        tracemalloc.stop()
    return current - base, objects


async def fanout_memory(children: int, trees: int) -> dict[str, Any]:
    """Memory per in-flight child of ``trees`` roots with ``children`` children each,
    per top-level run (as many), and of the roots with a plain tool instead."""
    leaf, root, plain = _fanout_agents(children)
    for agent, runs, calls in ((leaf, 10, 10), (root, 1, children), (plain, 1, children)):
        await _in_flight(agent, runs, calls)  # warm-up
    total = children * trees
    top_bytes, top_objects = await _in_flight(leaf, total, total)
    tree_bytes, tree_objects = await _in_flight(root, trees, total)
    plain_bytes, plain_objects = await _in_flight(plain, trees, total)
    return {
        "children": children,
        "trees": trees,
        "top_level_kb": top_bytes / 1024 / total,
        "child_kb": tree_bytes / 1024 / total,
        "child_marginal_kb": (tree_bytes - plain_bytes) / 1024 / total,
        "top_level_objects": top_objects / total,
        "child_objects": tree_objects / total,
        "child_marginal_objects": (tree_objects - plain_objects) / total,
    }


async def bench_f1(base: Baselines, *, children: int, trees: int) -> list[Figure]:
    m = await fanout_memory(children, trees)
    ratio = m["child_kb"] / m["top_level_kb"]
    return [
        Figure(
            "F1.memory_per_child",
            m["child_kb"],
            "KB",
            target=MEMORY_FACTOR * m["top_level_kb"],
            note=f"tracemalloc per in-flight child: {trees} root(s), each making {children}"
            " as_tool calls in one turn, every child blocked in its tool; root and its calls"
            f" included (target {MEMORY_FACTOR}x a top-level run blocked in the same tool)",
            extra={
                "top_level_kb": round(m["top_level_kb"], 3),
                "x_top_level": round(ratio, 3),
                "child_marginal_kb": round(m["child_marginal_kb"], 3),
                "child_objects": round(m["child_objects"], 2),
                "top_level_objects": round(m["top_level_objects"], 2),
                "child_marginal_objects": round(m["child_marginal_objects"], 2),
            },
        )
    ]
