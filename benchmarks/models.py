"""M1 and M2, the benchmarks of issue 39 (models in production, DESIGN §21).

- **M1, FallbackModel on the happy path.** What a request costs through
  ``FallbackModel(primary, backup)`` when the primary answers, minus the same request on
  the primary alone: an in-process model streaming ``DELTAS`` text deltas, usage and a
  finish (no I/O, so the figure is the wrapper's own cost), best of ``repeats``
  interleaved rounds, per request in microseconds and in units of one bare checkpoint.
  Target (issue 39): at most 2 % of W2 (a 2-turn tool run), both measured here: W2's
  wall time in the same process (``x_w2``), and, under callgrind, instructions per
  request against W2's instructions per run (``M1.instructions_per_request``).
- **M2, a concurrency limit under load.** ``runs`` runs start at once on one
  ``ScriptedModel`` whose every answer takes ``hold`` seconds, behind
  ``RateLimit(concurrency=50)``: the wall time against the ideal
  ``ceil(runs / 50) * hold`` (the ratio is the limiter's and the runs' overhead), and
  the latency of cancelling a run that waits for its slot, from ``cancel()`` to its
  terminal result, p50/p99 over ``cancels`` waiting runs (real clock). Targets: wall
  time within 5 % of the ideal, the cancel's p99 at most 1 ms.

``python -m benchmarks.models`` prints the figures (``--quick``: tiny sizes).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Final, final

import trio
import trio.testing

import trio_agents as ta
from trio_agents.models import (
    FallbackModel,
    Finish,
    ModelEvent,
    ModelRequest,
    RateLimit,
    ScriptedModel,
    TextDelta,
    Turn,
    Usage,
)

from ._common import Baselines, Figure, measure_baselines, percentile
from ._models import EventStream

__all__ = ["M1_SIZES", "bench_m1", "bench_m2", "m1_workload"]

DELTAS: Final = 10
CONCURRENCY: Final = 50
W2_SHARE: Final = 0.02  # M1's target: 2 % of W2
M2_WALL: Final = 1.05  # M2's: within 5 % of the ideal schedule
M2_CANCEL_MS: Final = 1.0  # and a waiting run's cancel within 1 ms (p99)
M1_SIZES: Final = (200, 1_200)
"""callgrind's (small n, large n) requests, as ``benchmarks.instructions.SIZES``."""
REQUEST: Final = ModelRequest("", (ta.UserMessage("hi"),))


# What each in-process request streams: DELTAS text deltas, a usage and a finish.
_EVENTS: Final[tuple[ModelEvent, ...]] = (
    *(TextDelta("x") for _ in range(DELTAS)),
    Usage(10, DELTAS),
    Finish("stop"),
)


@final
class _Answering:
    """A stateless in-process model (every request gets the same answer)."""

    model = "in-process"

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        del request
        return EventStream(_EVENTS)


async def _requests(model: object, n: int) -> float:
    """Seconds per request of ``n`` sequential requests, each read to the end."""
    stream = model.stream  # type: ignore[attr-defined]
    started = time.perf_counter()
    for _ in range(n):
        async with stream(REQUEST) as events:
            async for _event in events:
                pass
    return (time.perf_counter() - started) / n


async def m1_workload(mode: str, n: int) -> None:
    """What a callgrind child runs for M1 (``benchmarks.instructions``): warm-up
    requests, then ``n`` through the primary alone (``m1_bare``) or through
    ``FallbackModel(primary, backup)`` (``m1_fallback``)."""
    plain = _Answering()
    model: object = plain if mode == "m1_bare" else FallbackModel(plain, _Answering())
    await _requests(model, 100)
    await _requests(model, n)


def _instructions() -> tuple[float, float] | None:
    """(M1's instructions per request, W2's per run), or None without valgrind."""
    from concurrent.futures import ThreadPoolExecutor

    from .instructions import callgrind_available, count

    if not callgrind_available():
        return None
    # Two children at a time (2 cores); counts do not depend on load.
    with ThreadPoolExecutor(max_workers=2) as pool:
        bare = pool.submit(count, "m1_bare", M1_SIZES)
        through = pool.submit(count, "m1_fallback", M1_SIZES)
        w2 = pool.submit(count, "w2")
        return through.result() - bare.result(), w2.result()


async def bench_m1(
    base: Baselines, *, requests: int, repeats: int, callgrind: bool = False
) -> list[Figure]:
    """M1: FallbackModel's cost per request when the primary answers, against W2."""
    from .core import tool_turn

    plain = _Answering()
    wrapped = FallbackModel(plain, _Answering())
    bare: list[float] = []
    through: list[float] = []
    runs: list[float] = []
    for _ in range(repeats):  # interleaved, best of each: the machine's noise is shared
        bare.append(await _requests(plain, requests))
        through.append(await _requests(wrapped, requests))
        runs.append(await tool_turn(max(requests // 50, 3)))
    overhead = min(through) - min(bare)
    w2 = min(runs)
    figures = [
        Figure(
            "M1.fallback_overhead_per_request",
            overhead * 1e6,
            "us",
            target=W2_SHARE * w2 * 1e6,
            note=(
                f"FallbackModel(primary, backup), primary answers: {DELTAS} deltas + usage +"
                f" finish, in-process model; minus the primary alone (best of {repeats},"
                f" {requests} requests each); target {W2_SHARE:.0%} of W2 timed here"
            ),
            extra={
                **base.ratios(overhead),
                "bare_us": round(min(bare) * 1e6, 3),
                "through_us": round(min(through) * 1e6, 3),
                "x_bare_request": round(overhead / min(bare), 4),
                "w2_us": round(w2 * 1e6, 3),
                "x_w2": round(overhead / w2, 4),
            },
        )
    ]
    counts = await trio.to_thread.run_sync(_instructions) if callgrind else None
    if counts is not None:
        per_request, w2_instr = counts
        figures.append(
            Figure(
                "M1.instructions_per_request",
                per_request,
                "instr",
                target=W2_SHARE * w2_instr,
                note=(
                    "callgrind: a request through FallbackModel(primary, backup) minus the"
                    f" primary alone; target {W2_SHARE:.0%} of W2's instructions per run"
                ),
                extra={"w2_instr": round(w2_instr), "x_w2": round(per_request / w2_instr, 4)},
            )
        )
    return figures


async def bench_m2(
    base: Baselines, *, runs: int, hold: float, cancels: int, concurrency: int = CONCURRENCY
) -> list[Figure]:
    """M2: ``runs`` runs through a ``concurrency`` limit; cancels of waiting runs."""
    limit = RateLimit(concurrency=concurrency)
    model = ScriptedModel([], default=Turn("ok", delay=hold), rate_limit=limit)
    agent = ta.Agent(name="m2", model=model)
    results: list[ta.RunResult] = []

    async def one() -> None:
        results.append(await ta.run(agent, "hi"))

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(runs):
            nursery.start_soon(one)
    wall = time.perf_counter() - started
    completed = sum(result.status == "completed" for result in results)
    if completed != runs:
        raise RuntimeError(f"M2: {completed} of {runs} runs completed")
    # The same runs answering at once, without a limit: their own cost, which is what
    # the wall time adds to the ideal on a machine this busy.
    free = ta.Agent(name="m2-free", model=ScriptedModel([], default=Turn("ok")))
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(runs):
            nursery.start_soon(ta.run, free, "hi")
    unlimited = time.perf_counter() - started
    latencies = await _cancel_waiting(cancels, concurrency)
    ideal = math.ceil(runs / concurrency) * hold
    p99 = percentile(latencies, 99)
    return [
        Figure(
            "M2.wall_vs_ideal",
            wall / ideal,
            "x ideal",
            target=M2_WALL,
            note=(
                f"{runs} runs at once through RateLimit(concurrency={concurrency}), each"
                f" model call holding {hold * 1e3:g} ms (ScriptedModel); ideal"
                f" ceil(runs/{concurrency}) * hold = {ideal:g} s"
            ),
            extra={
                "wall_s": round(wall, 4),
                "ideal_s": ideal,
                "runs_alone_s": round(unlimited, 4),
                "x_ideal_plus_runs": round(wall / (ideal + unlimited), 4),
            },
        ),
        Figure(
            "M2.cancel_waiting_run",
            p99 * 1e3,
            "ms p99",
            target=M2_CANCEL_MS,
            note=(
                f"cancel() of a run waiting for its slot -> its terminal result; {cancels}"
                f" runs queued behind {concurrency} that hold their slots, cancelled one by one"
            ),
            extra={
                "p50_ms": round(percentile(latencies, 50) * 1e3, 4),
                **base.cancel_ratio(p99),
            },
        ),
    ]


async def _cancel_waiting(cancels: int, concurrency: int) -> list[float]:
    """Seconds from ``cancel()`` to the terminal result, for ``cancels`` runs that wait
    for a slot behind ``concurrency`` runs holding theirs (their answer never ends)."""
    limit = RateLimit(concurrency=concurrency)
    model = ScriptedModel([], default=Turn(["x", "y"], delay=3600), rate_limit=limit)
    agent = ta.Agent(name="m2-waiting", model=model)
    latencies: list[float] = []

    async def one(task_status: trio.TaskStatus[ta.Run]) -> None:
        async with ta.open_run(agent, "hi") as run:
            task_status.started(run)
            await run.wait()

    async with trio.open_nursery() as nursery:
        holders = [await nursery.start(one) for _ in range(concurrency)]
        waiting = [await nursery.start(one) for _ in range(cancels)]
        await trio.testing.wait_all_tasks_blocked()
        if limit.waiting != cancels:
            raise RuntimeError(f"M2: {limit.waiting} runs wait for a slot, not {cancels}")
        for run in waiting:
            at = time.perf_counter()
            run.cancel("bench")
            result = await run.wait()
            latencies.append(time.perf_counter() - at)
            if result.status != "cancelled":
                raise RuntimeError(f"M2: a waiting run ended {result.status}")
        for run in holders:
            run.cancel("bench done")
    return latencies


async def _main(quick: bool) -> None:
    base = await measure_baselines(n=500 if quick else 20_000, repeats=1 if quick else 5)
    figures = await bench_m1(base, requests=20 if quick else 5000, repeats=1 if quick else 5)
    figures += await bench_m2(
        base,
        runs=20 if quick else 1000,
        hold=0.01 if quick else 0.05,
        cancels=3 if quick else 200,
        concurrency=5 if quick else CONCURRENCY,
    )
    for figure in figures:
        print(figure.to_json(), flush=True)


if __name__ == "__main__":
    trio.run(_main, "--quick" in sys.argv[1:])
