"""Shared pieces of the benchmarks: figures, percentiles, baselines, the environment."""

from __future__ import annotations

import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs
import trio

__all__ = [
    "Baselines",
    "Figure",
    "environment",
    "measure_baselines",
    "median",
    "percentile",
]

HERE = Path(__file__).resolve().parent


@attrs.frozen
class Figure:
    """One reported number.

    ``value`` is in ``unit``; ``target`` (same unit) is the goal, None when the figure is
    informational; ``lower_is_better`` decides how ``meets`` is computed. ``extra``
    holds supporting numbers (p50/p99, counts, ratios to the baselines).
    """

    bench: str
    value: float
    unit: str
    target: float | None = None
    note: str = ""
    extra: dict[str, Any] = attrs.field(factory=dict)

    @property
    def meets(self) -> bool | None:
        """Whether the target is met (None without a target)."""
        if self.target is None or math.isnan(self.value):
            return None
        return self.value <= self.target

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "bench": self.bench,
            "value": round(self.value, 4),
            "unit": self.unit,
            "target": self.target,
            "meets": self.meets,
        }
        if self.note:
            data["note"] = self.note
        data.update(self.extra)
        return data


@attrs.frozen
class Baselines:
    """The Trio floor, measured in the same process as the figures it scales: seconds
    per bare memory-channel send+receive, per bare checkpoint, and the p50/p99 of a bare
    scope cancel -> nursery exit (seen by another task), GC on."""

    hop: float
    checkpoint: float
    cancel_p50: float = math.nan
    cancel_p99: float = math.nan

    def ratios(self, seconds: float) -> dict[str, float]:
        """``seconds`` expressed in baseline units (how many hops / checkpoints)."""
        return {
            "x_hop": round(seconds / self.hop, 3),
            "x_checkpoint": round(seconds / self.checkpoint, 3),
        }

    def cancel_ratio(self, p99: float) -> dict[str, float]:
        """A p99 latency in multiples of the bare scope-cancel p99."""
        return {"x_cancel_p99": round(p99 / self.cancel_p99, 3)}


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


async def channel_hop(n: int) -> float:
    """Seconds per send+receive over a bare memory channel (capacity 1)."""
    send, receive = trio.open_memory_channel[int](1)
    async with send, receive:
        start = time.perf_counter()
        for i in range(n):
            await send.send(i)
            await receive.receive()
        return (time.perf_counter() - start) / n


async def bare_checkpoint(n: int) -> float:
    """Seconds per bare ``trio.lowlevel.checkpoint()``."""
    checkpoint = trio.lowlevel.checkpoint
    start = time.perf_counter()
    for _ in range(n):
        await checkpoint()
    return (time.perf_counter() - start) / n


async def scope_cancel_exit(n: int) -> list[float]:
    """Seconds from ``CancelScope.cancel()`` to another task seeing the nursery inside
    that scope exited, one child blocked in ``sleep_forever`` (the shape of a run
    cancelled from outside: the floor for W4/W5). GC stays on."""
    samples: list[float] = []
    for _ in range(n):
        scope = trio.CancelScope()
        exited = trio.Event()
        async with trio.open_nursery() as outer:
            await outer.start(_cancel_target, scope, exited)
            await trio.lowlevel.checkpoint()
            start = time.perf_counter()
            scope.cancel()
            await exited.wait()
            samples.append(time.perf_counter() - start)
    return samples


async def _cancel_target(
    scope: trio.CancelScope, exited: trio.Event, *, task_status: trio.TaskStatus[None]
) -> None:
    with scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(_sleeper)
            task_status.started()
    exited.set()


async def _sleeper(task_status: trio.TaskStatus[None]) -> None:
    task_status.started()
    await trio.sleep_forever()


async def measure_baselines(n: int = 20_000, repeats: int = 5) -> Baselines:
    hop = median([await channel_hop(n) for _ in range(repeats)])
    checkpoint = median([await bare_checkpoint(n) for _ in range(repeats)])
    cancels = await scope_cancel_exit(max(50, n // 10))
    return Baselines(
        hop=hop,
        checkpoint=checkpoint,
        cancel_p50=percentile(cancels, 50),
        cancel_p99=percentile(cancels, 99),
    )


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "-"


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=HERE,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "-"
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "trio_agents"],
        cwd=HERE.parent,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return out.stdout.strip() + ("+dirty" if dirty else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "-"


def environment() -> dict[str, Any]:
    """The machine, Python and package versions the figures were measured with."""
    return {
        "machine": f"{_cpu_model()}, {os.cpu_count()} CPUs, {platform.machine()}",
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {sys.version.split()[0]}",
        "packages": {
            name: _version(name) for name in ("trio-agents", "trio", "httpx", "attrs", "httpcore")
        },
        "commit": _git_commit(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
