"""Instruction counts for W1 and W2 (``valgrind --tool=callgrind``), beside one bare
``checkpoint()``.

Wall time on a shared 2-core machine swings 2-3x between runs; the number of machine
instructions a piece of Python executes does not (to well under 1 %), so before/after
claims use these. Each workload runs in a child process under callgrind twice, with a
small and a large count ``n`` and identical warm-up; the difference of the two totals
divided by the difference of the counts is the cost of one unit, free of the start-up,
import and warm-up costs that both children share.

``python -m benchmarks.instructions`` prints the figures; ``make bench`` includes them
when valgrind is installed (``.ci/valgrind.sh`` installs it, as root, if missing).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import trio

import trio_agents as ta

from ._common import Figure

__all__ = ["bench_instructions", "callgrind_available", "count"]

ROOT = Path(__file__).resolve().parent.parent
# (small n, large n) per mode: large enough that the difference dwarfs the noise of
# start-up (a few thousand instructions), small enough for callgrind's ~50x slowdown.
SIZES: dict[str, tuple[int, int]] = {
    "checkpoint": (1_000, 11_000),
    "w1_model": (200, 2_200),
    "w1_run": (200, 2_200),
    # W1's floor (a bare writer building the public event, a bare per-event reader)
    # and the same through Trio's own memory channel: no run in either.
    "w1_floor": (200, 2_200),
    "w1_channel": (200, 2_200),
    "w1_fanout": (50, 250),
    "w2": (10, 60),
    "w1_http_model": (200, 2_200),
    "w1_http_run": (200, 2_200),
    # The same with readers of run.events().batches() (every ready event in one step).
    "w1_fanout_batch": (50, 250),
    "w1_http_batch_run": (200, 2_200),
    "w1_http_fanout": (50, 250),
    "w1_http_fanout_batch": (50, 250),
}


# The W1 workloads that drain one stream of n deltas, by the benchmarks.core function.
_STREAMS: dict[str, str] = {
    "w1_model": "model_stream_cost",
    "w1_run": "stream_overhead",
    "w1_floor": "floor_stream_cost",
    "w1_channel": "channel_stream_cost",
}


async def _workload(mode: str, n: int) -> None:
    from . import core

    if mode == "checkpoint":
        checkpoint = trio.lowlevel.checkpoint
        for _ in range(100):
            await checkpoint()
        for _ in range(n):
            await checkpoint()
    elif mode in _STREAMS:
        # One 50-delta stream to warm up, then the measured one (the same in both
        # children but for n).
        drain = getattr(core, _STREAMS[mode])
        await drain(50)
        await drain(n)
    elif mode == "w1_fanout":
        await core.stream_fanout(10, 10)
        await core.stream_fanout(n, 10)
    elif mode == "w2":
        await core.tool_turn(3)
        # What B2 times is the run alone: build every agent and script first, and
        # always as many as the larger child runs, so the difference is runs only.
        agents = [core.tool_turn_agent() for _ in range(SIZES["w2"][1])]
        for agent in agents[:n]:
            result = await ta.run(agent, "1 + 2?")
            assert result.final_output == "3", result
    elif mode == "w1_fanout_batch":
        await core.stream_fanout(10, 10, batches=True)
        await core.stream_fanout(n, 10, batches=True)
    elif mode.startswith("w1_http_"):
        from .latency import LoopbackServer

        drains: dict[str, Callable[[str, int], Awaitable[None]]] = {
            "w1_http_model": core.http_stream_cost,
            "w1_http_run": core.http_stream_overhead,
            "w1_http_batch_run": functools.partial(core.http_stream_overhead, batches=True),
            "w1_http_fanout": functools.partial(core.http_stream_overhead, subscribers=10),
            "w1_http_fanout_batch": functools.partial(
                core.http_stream_overhead, subscribers=10, batches=True
            ),
        }
        drain = drains[mode]
        async with LoopbackServer.running() as server:
            await drain(server.base_url, 50)
            await drain(server.base_url, n)
    elif mode.startswith("b9_"):
        from .tree import b9_workload

        await b9_workload(mode, n)
    elif mode.startswith("m1_"):
        from .models import m1_workload

        await m1_workload(mode, n)
    else:  # pragma: no cover
        raise ValueError(mode)


def callgrind_available() -> bool:
    return shutil.which("valgrind") is not None


def _total(mode: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "benchmarks.instructions",
                "--child",
                mode,
                str(n),
            ],
            cwd=ROOT,
            capture_output=True,
            check=True,
            # str hashes are salted per process: fix the seed so set and dict work is the
            # same in both children and across runs.
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no instruction total in callgrind's output for {mode}")


def count(mode: str, sizes: tuple[int, int] | None = None) -> float:
    """Instructions per unit of ``mode`` (per checkpoint, delta, delivery or run)."""
    small, large = sizes or SIZES[mode]
    return (_total(mode, large) - _total(mode, small)) / (large - small)


def bench_instructions(*, quick: bool = False) -> list[Figure]:
    """The W1/W2 instruction figures, each also in units of one bare checkpoint."""
    if not callgrind_available():
        return [
            Figure(
                "I.unavailable",
                float("nan"),
                "",
                note="valgrind is not installed: no instruction counts in this run",
            )
        ]
    scale = 10 if quick else 1
    # Two children at a time (the machine has 2 cores); counts do not depend on load.
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            mode: pool.submit(count, mode, (small // scale or 1, large // scale))
            for mode, (small, large) in SIZES.items()
        }
        counts = {mode: future.result() for mode, future in futures.items()}
    ckpt = counts["checkpoint"]
    deliveries_per_delta = 10  # w1_fanout: 10 subscribers
    overhead = counts["w1_run"] - counts["w1_model"]
    floor = counts["w1_floor"] - counts["w1_model"]
    channel = counts["w1_channel"] - counts["w1_model"]
    http_overhead = counts["w1_http_run"] - counts["w1_http_model"]
    fanout = (counts["w1_fanout"] - counts["w1_model"]) / deliveries_per_delta
    fanout_batch = (counts["w1_fanout_batch"] - counts["w1_model"]) / deliveries_per_delta
    http_batch = counts["w1_http_batch_run"] - counts["w1_http_model"]
    http_fanout = (counts["w1_http_fanout"] - counts["w1_http_model"]) / deliveries_per_delta
    http_fanout_batch = (
        counts["w1_http_fanout_batch"] - counts["w1_http_model"]
    ) / deliveries_per_delta

    def figure(name: str, value: float, note: str, target: float | None = None) -> Figure:
        return Figure(
            f"I.{name}",
            value,
            "instr",
            target=None if target is None else target * ckpt,
            note=note,
            extra={"x_checkpoint": round(value / ckpt, 3)},
        )

    return [
        figure("checkpoint", ckpt, "one bare trio.lowlevel.checkpoint() (the unit)"),
        figure("w1_model_per_delta", counts["w1_model"], "draining ScriptedModel.stream directly"),
        figure(
            "w1_overhead_per_delta",
            overhead,
            "W1: run with one events() reader, minus the model's own cost",
            0.5,
        ),
        figure(
            "w1_floor_per_delta",
            floor,
            "W1's floor, no run: a bare writer building each delta's ResponseTextDelta into"
            " a list beside a bare per-event reader (Trio's receive protocol), minus the model",
        ),
        figure(
            "w1_run_over_floor_per_delta",
            overhead - floor,
            "W1 minus its floor: what the run itself adds per delta",
        ),
        figure(
            "w1_channel_per_delta",
            channel,
            "W1's shape through Trio's own unbounded memory channel, no run, minus the model",
        ),
        figure(
            "w1_per_delivered_event",
            fanout,
            "W1: 10 events() readers, (run - model) / deliveries",
            0.2,
        ),
        figure("w2_per_run", counts["w2"], "W2: one 2-turn tool run, model included", 40),
        figure(
            "w1_http_model_per_delta",
            counts["w1_http_model"],
            "draining OpenAIChatModel.stream over loopback HTTP directly",
        ),
        figure(
            "w1_http_overhead_per_delta",
            http_overhead,
            "W1 over loopback HTTP (many deltas per socket read): run with one events()"
            " reader, minus the model's own cost",
            0.5,
        ),
        figure(
            "w1_batch_per_delivered_event",
            fanout_batch,
            "W1: 10 events().batches() readers, (run - model) / deliveries",
            0.2,
        ),
        figure(
            "w1_http_batch_overhead_per_delta",
            http_batch,
            "W1 over loopback HTTP: run with one events().batches() reader, minus the"
            " model's own cost",
            0.5,
        ),
        figure(
            "w1_http_per_delivered_event",
            http_fanout,
            "W1 over loopback HTTP: 10 events() readers, (run - model) / deliveries",
            0.2,
        ),
        figure(
            "w1_http_batch_per_delivered_event",
            http_fanout_batch,
            "W1 over loopback HTTP: 10 events().batches() readers, (run - model) / deliveries",
            0.2,
        ),
    ]


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        trio.run(_workload, sys.argv[2], int(sys.argv[3]))
        return
    for figure in bench_instructions(quick="--quick" in sys.argv):
        print(json.dumps(figure.to_json()))


if __name__ == "__main__":
    main()
