"""B3: many concurrent tool-turn runs in one process (``python -m benchmarks.concurrency N``).

Each measurement runs in a fresh subprocess, so the resident-set figures are clean: the
child warms up, notes its RSS, resets the kernel's peak-RSS mark, runs ``N`` concurrent
2-turn runs whose tool sleeps 50 ms, and prints one JSON object (wall time, peak RSS
growth, and tracemalloc's peak from a second, traced pass).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import trio

import trio_agents as ta

from ._common import Baselines, Figure, median
from ._models import ToolThenAnswer

__all__ = ["bench_b3", "measure"]

TOOL_SLEEP = 0.05


@ta.function_tool
async def slow_add(a: int, b: int) -> int:
    """Add two integers, slowly."""
    await trio.sleep(TOOL_SLEEP)
    return a + b


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False if not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


async def _run_many(agent: ta.Agent, n: int) -> float:
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(ta.run, agent, f"run {i}")
    return time.perf_counter() - start


async def measure(n: int) -> dict[str, Any]:
    agent = ta.Agent(
        name="b3", model=ToolThenAnswer("slow_add", {"a": 1, "b": 2}), tools=[slow_add]
    )
    await _run_many(agent, min(n, 100))  # warm-up: imports, caches, the allocator
    gc.collect()
    rss_before = _status_kb("VmRSS")
    reset = _reset_peak()
    wall = await _run_many(agent, n)
    peak = _status_kb("VmHWM")
    gc.collect()
    tracemalloc.start()
    await _run_many(agent, n)
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "n": n,
        "wall_s": wall,
        "rss_before_kb": rss_before,
        "peak_rss_kb": peak,
        "peak_reset": reset,
        "rss_growth_kb": peak - rss_before,
        "tracemalloc_peak_kb": traced_peak / 1024,
    }


def _child(n: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.concurrency", str(n)],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


# W3 targets: per concurrent run, 40 checkpoints of wall time and 10 KB of RSS.
WALL_CHECKPOINTS_PER_RUN = 40
KB_PER_RUN = 10


def bench_b3(base: Baselines, *, sizes: tuple[int, ...], repeats: int) -> list[Figure]:
    """``sizes``: how many concurrent runs, one measurement (subprocess) each."""
    figures = []
    for n in sizes:
        wall_target = WALL_CHECKPOINTS_PER_RUN * base.checkpoint * n
        mb_target = KB_PER_RUN * n / 1024
        samples = [_child(n) for _ in range(repeats)]
        wall = median([s["wall_s"] for s in samples])
        growth_kb = median([s["rss_growth_kb"] for s in samples])
        traced_kb = median([s["tracemalloc_peak_kb"] for s in samples])
        common = {"n": n, "repeats": repeats}
        figures += [
            Figure(
                f"B3.wall_{n}_concurrent",
                wall,
                "s",
                target=wall_target,
                note=f"W3: {n} concurrent 2-turn runs, tool sleeps {TOOL_SLEEP * 1e3:g} ms"
                f" (target {WALL_CHECKPOINTS_PER_RUN} checkpoints per run)",
                extra={
                    **common,
                    "checkpoints_per_run": round(wall / n / base.checkpoint, 1),
                    "wall_minus_sleep_per_run_us": round((wall - TOOL_SLEEP) / n * 1e6, 2),
                },
            ),
            Figure(
                f"B3.peak_rss_growth_{n}_concurrent",
                growth_kb / 1024,
                "MB",
                target=mb_target,
                note="W3: VmHWM after - VmRSS before (peak mark reset), fresh subprocess"
                f" (target {KB_PER_RUN} KB per run)",
                extra={**common, "kb_per_run": round(growth_kb / n, 2)},
            ),
            Figure(
                f"B3.tracemalloc_peak_per_run_{n}",
                traced_kb / n,
                "KB",
                note="tracemalloc peak / in-flight runs (Python allocations only)",
                extra=common,
            ),
        ]
    return figures


if __name__ == "__main__":
    print(json.dumps(trio.run(measure, int(sys.argv[1]))))
