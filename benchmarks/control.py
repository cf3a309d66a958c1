"""B6: the control channel over a real loopback socket (``trio_agents.control``).

The server and its clients share one process and one Trio loop (so CPU figures are
server + client); every frame crosses a real TCP socket on 127.0.0.1. The agent
answers at once (``ScriptedModel``), so the figures are the channel's own cost:

- ``round_trip``: ``run.start`` (with ``subscribe="all"``) sent → terminal event
  received, sequential runs on one connection (p50/p99);
- ``runs_per_s.cN``: N connections each starting and awaiting runs back to back;
  CPU per run from ``time.process_time()``;
- ``cancel_ack`` / ``cancel_to_terminal``: a run blocked in a tool; ``run.cancel``
  sent → its ack, and → the terminal ``cancelled`` event (p50/p99);
- ``rss_per_10k_retained`` and ``start_rate_flat``: finished runs piling up (all
  retained); RSS growth scaled to 10k runs, and the runs/s of the last batch over the
  first (1.0 = ``run.start`` costs the same with every retained run).
"""

from __future__ import annotations

import math
import resource
import time
from pathlib import Path

import trio

import trio_agents as ta
from trio_agents.control import Limits, connect, open_control_server
from trio_agents.models import ScriptedModel, Turn

from ._common import Baselines, Figure, median, percentile

__all__ = ["bench_b6"]

TOKEN = "bench"


@ta.function_tool
async def _wait_forever() -> str:
    """Block until cancelled."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def _agents() -> dict[str, ta.Agent]:
    quick = ta.Agent(name="quick", model=ScriptedModel([], default=Turn(text="ok")))
    blocked = ta.Agent(
        name="blocked",
        model=ScriptedModel([], default=Turn(tool_calls=[("_wait_forever", {})])),
        tools=[_wait_forever],
    )
    return {"quick": quick, "blocked": blocked}


def _limits() -> Limits:
    # Out of the way: the benchmark measures the channel, not the guard rails.
    return Limits(
        max_runs_per_principal=10_000,
        start_rate=1e9,
        start_burst=10**9,
        retain_finished=3600.0,
        max_retained_bytes_per_principal=1 << 40,
        max_subscriptions_per_connection=10_000,
        ping_interval=None,
    )


def _rss_kb() -> int:
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _ms(values: list[float], q: float) -> float:
    return round(percentile(values, q) * 1e3, 4)


async def bench_b6(
    base: Baselines,
    *,
    runs: int,
    connections: tuple[int, ...] = (1, 10, 100),
    cancels: int,
    retained: int,
    batches: int = 5,
) -> list[Figure]:
    figures: list[Figure] = []
    async with open_control_server(_agents(), auth={TOKEN: "p"}, limits=_limits()) as server:
        url = f"ws://127.0.0.1:{server.port}/"

        # round trip, sequential, one connection
        async with connect(url, token=TOKEN) as client:
            for _ in range(3):  # warm-up
                await (await client.start("quick", "hi")).wait()
            trips = []
            for _ in range(runs):
                start = time.perf_counter()
                run = await client.start("quick", "hi")
                await run.wait()
                trips.append(time.perf_counter() - start)
        p99 = percentile(trips, 99)
        figures.append(
            Figure(
                "B6.round_trip",
                p99 * 1e3,
                "ms p99",
                note="run.start sent -> terminal event received, loopback websocket",
                extra={"n": runs, "p50_ms": _ms(trips, 50), **base.ratios(median(trips))},
            )
        )

        # throughput over 1, 10, 100 connections
        for count in connections:
            per_connection = max(1, runs // count)

            async def worker(n: int = per_connection) -> None:
                async with connect(url, token=TOKEN) as client:
                    for _ in range(n):
                        await (await client.start("quick", "hi")).wait()

            cpu, wall = time.process_time(), time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(worker)
            wall = time.perf_counter() - wall
            cpu = time.process_time() - cpu
            total = per_connection * count
            figures.append(
                Figure(
                    f"B6.runs_per_s.c{count}",
                    total / wall,
                    "runs/s",
                    note=f"{count} connection(s), runs back to back on each",
                    extra={
                        "n": total,
                        "cpu_us_per_run": round(cpu / total * 1e6, 1),
                        "note_cpu": "server+client, one process",
                    },
                )
            )

        # cancel: ack and terminal
        acks, terminals = [], []
        async with connect(url, token=TOKEN) as client:
            for _ in range(cancels):
                run = await client.start("blocked", "go")
                async for event in run.events():
                    if isinstance(event, ta.ToolStarted):
                        break
                start = time.perf_counter()
                await run.cancel("bench")
                acked = time.perf_counter()
                await run.wait()
                done = time.perf_counter()
                acks.append(acked - start)
                terminals.append(done - start)
        for name, values, note in (
            ("cancel_ack", acks, "run.cancel sent -> ack received (run blocked in a tool)"),
            ("cancel_to_terminal", terminals, "run.cancel sent -> terminal event received"),
        ):
            figures.append(
                Figure(
                    f"B6.{name}",
                    percentile(values, 99) * 1e3,
                    "ms p99",
                    note=note,
                    extra={"n": cancels, "p50_ms": _ms(values, 50)},
                )
            )

        # retained runs: RSS and run.start cost as they pile up
        before = _rss_kb()
        rates = []
        per_batch = max(1, retained // batches)
        async with connect(url, token=TOKEN) as client:
            for _ in range(batches):
                wall = time.perf_counter()
                for _ in range(per_batch):
                    await (await client.start("quick", "hi", subscribe=None)).wait()
                rates.append(per_batch / (time.perf_counter() - wall))
        grown_kb = max(0, _rss_kb() - before)
        retained_now = server.statistics().retained_runs
    total = per_batch * batches
    figures.append(
        Figure(
            "B6.rss_per_10k_retained",
            grown_kb / 1024 * 10_000 / total,
            "MB",
            note="VmRSS growth while finished runs pile up (all retained), scaled to 10k",
            extra={"n": total, "retained_at_end": retained_now},
        )
    )
    flat = rates[-1] / rates[0] if rates[0] else math.nan
    figures.append(
        Figure(
            "B6.start_rate_flat",
            flat,
            "ratio",
            note="runs/s of the last batch / the first, as retained runs pile up",
            extra={
                "batches": batches,
                "first_runs_per_s": round(rates[0], 1),
                "last_runs_per_s": round(rates[-1], 1),
            },
        )
    )
    return figures
