"""TT: time travel (issue 41, DESIGN §23): the fork of a large session, and what
``record_requests`` costs.

The issue calls the fork benchmark "F1", a name issue 25's fan-out memory row already
holds (``F1.memory_per_child``): here it is the ``TT`` workload (``--only TT``), its
figures ``TT.fork_10000.*``.

- ``TT.fork_10000.sqlite`` / ``.postgres``: ``await session.fork(new_id)`` of a session
  holding 10,000 items (a realistic mix, see :func:`conversation`: user messages,
  assistant text, tool calls and their results, 300 bytes each on average), copying
  all of them, until it returns (the fork's one transaction committed); median and p99
  of the repeats, each into a new id, and the CPU time per fork (``cpu_ms``: this
  process's, plus the PostgreSQL server processes', from ``/proc``: a figure the
  machine's load moves far less than the wall time). ``.at_half``: the same at
  ``at=5000``. SQLite: a
  file in a temporary directory (WAL, ``synchronous=NORMAL``, the defaults).
  PostgreSQL: a throwaway server (``tests/support/pg_support.py``, ``fsync=off``,
  ``synchronous_commit=on``, as B7) on loopback.
- ``TT.record_requests_off_events``: ``model.request`` events in a W2 run (a two-turn
  tool run, two model calls) without the option: must be 0.
- ``TT.record_requests_off_cost``: what the option costs a run that does not use it:
  the one test of ``options.record_requests`` made per model call (``_turns.py``),
  timed alone, times W2's two calls, as a share of W2 timed in the same process.
- ``TT.record_requests_on_per_request``: W2 with ``record_requests=True`` minus W2
  without it, per recorded request (best of interleaved rounds).
"""

from __future__ import annotations

import os
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

import trio_agents as ta
from trio_agents import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from trio_agents._options import RunOptions
from trio_agents.sessions import SQLiteSession

from ._common import Baselines, Figure, median, percentile
from .core import tool_turn_agent

__all__ = ["bench_tt", "conversation"]

TARGET_MS = 50.0


def conversation(n: int) -> list[Item]:
    """``n`` items as an agent's session holds them: a user message, an assistant's
    text with a tool call, its result, the answer; texts of 100-500 bytes, tool
    outputs of up to 600."""
    items: list[Item] = []
    turn = 0
    while len(items) < n:
        call = f"call_{turn}"
        items += [
            UserMessage(f"question {turn}: " + "q" * (100 + turn % 200)),
            AssistantMessage("looking it up " + "a" * (50 + turn % 100)),
            ToolCall(call, "search", '{"query": "' + "s" * (20 + turn % 40) + '"}'),
            ToolResult(call, "result " + "r" * (100 + turn % 500)),
            AssistantMessage(f"answer {turn}: " + "t" * (200 + turn % 300)),
        ]
        turn += 1
    return items[:n]


def _server_cpu(data_dir: Path | None) -> float:
    """CPU seconds used so far by a PostgreSQL server's processes (the postmaster, whose
    pid is the first line of ``postmaster.pid``, and its children), from ``/proc``; 0.0
    without a server (SQLite runs in this process: its CPU is ``process_time``)."""
    if data_dir is None:
        return 0.0
    postmaster = int((data_dir / "postmaster.pid").read_text().split()[0])
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        # After the command: state, ppid, ... utime and stime are fields 14 and 15.
        if int(entry.name) == postmaster or int(fields[1]) == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / tick


async def _timed_forks(
    source: Any, prefix: str, at: int | None, repeats: int, server: Path | None
) -> tuple[list[float], float]:
    """Wall seconds of each fork, and the CPU seconds per fork: this process's (the
    SQLite work, the driver) plus the database server's."""
    samples: list[float] = []
    cpu_before = time.process_time() + _server_cpu(server)
    for n in range(repeats):
        start = time.perf_counter()
        fork = await source.fork(f"{prefix}{n}", at=at)
        samples.append(time.perf_counter() - start)
        await fork.aclose()
    cpu = time.process_time() + _server_cpu(server) - cpu_before
    return samples, cpu / repeats


def _figure(
    name: str, timed: tuple[list[float], float], items: int, note: str, load: str
) -> Figure:
    samples, cpu = timed
    ms = [s * 1e3 for s in samples]
    return Figure(
        name,
        median(ms),
        "ms",
        target=TARGET_MS,
        note=note,
        extra={
            "n": len(ms),
            "p99_ms": round(percentile(ms, 99), 2),
            "min_ms": round(min(ms), 2),
            "cpu_ms": round(cpu * 1e3, 2),
            "items": items,
            "load": load,
        },
    )


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def _fork_figures(
    kind: str, open_source: Callable[[], Any], items: int, repeats: int, server: Path | None
) -> list[Figure]:
    figures: list[Figure] = []
    async with open_source() as source:
        batch = conversation(items)
        for start in range(0, items, 1000):
            await source.add_items(batch[start : start + 1000])
        await _timed_forks(source, "warm", None, 1, server)
        load = _load()
        whole = await _timed_forks(source, "all", None, repeats, server)
        half = await _timed_forks(source, "half", items // 2, repeats, server)
    what = f"session.fork() of a {items}-item session ({kind})"
    figures.append(_figure(f"TT.fork_{items}.{kind}", whole, items, f"{what}, every item", load))
    figures.append(
        _figure(
            f"TT.fork_{items}.{kind}.at_half", half, items // 2, f"{what}, at={items // 2}", load
        )
    )
    return figures


async def _w2(record: bool) -> tuple[float, int]:
    """One W2 run (B2's shape): its seconds and its ``model.request`` events."""
    agent = tool_turn_agent()
    start = time.perf_counter()
    async with ta.open_run(agent, "1 + 2?", record_requests=record) as run:
        pass
    elapsed = time.perf_counter() - start
    assert run.result is not None
    assert run.result.final_output == "3", run.result
    recorded = [e async for e in run.events() if isinstance(e, ta.ModelRequestEvent)]
    return elapsed, len(recorded)


async def _w2_round(record: bool, runs: int) -> tuple[float, int]:
    total, events = 0.0, 0
    for _ in range(runs):
        elapsed, count = await _w2(record)
        total += elapsed
        events += count
    return total / runs, events


async def _record_requests_figures(base: Baselines, runs: int, rounds: int) -> list[Figure]:
    off: list[float] = []
    on: list[float] = []
    off_events = on_events = 0
    for _ in range(rounds):  # interleaved: one load for both
        seconds, events = await _w2_round(False, runs)
        off.append(seconds)
        off_events += events
        seconds, events = await _w2_round(True, runs)
        on.append(seconds)
        on_events += events
    w2 = min(off)
    per_request = (min(on) - w2) / 2  # W2 makes two model calls
    # The off path: one attribute test per model call (`if state.options.record_requests`).
    options = RunOptions()
    loops = 200_000
    check = min(
        timeit.repeat(
            "options.record_requests", globals={"options": options}, number=loops, repeat=5
        )
    )
    off_cost = 2 * check / loops
    return [
        Figure(
            "TT.record_requests_off_events",
            off_events,
            "events",
            target=0,
            note=f"model.request events in {rounds * runs} W2 runs without record_requests",
            extra={"runs": rounds * runs, "events_with_option_on": on_events},
        ),
        Figure(
            "TT.record_requests_off_cost",
            off_cost / w2 * 100,
            "% of W2",
            target=1.0,
            note="the off path (one test of options.record_requests per model call, timed"
            " alone, x2 calls) over W2 timed here",
            extra={"off_path_ns_per_run": round(off_cost * 1e9, 1), "w2_us": round(w2 * 1e6, 1)},
        ),
        Figure(
            "TT.record_requests_on_per_request",
            per_request * 1e6,
            "us",
            note=f"W2 with record_requests=True minus without, per recorded request (best of"
            f" {rounds} interleaved rounds of {runs} runs)",
            extra={
                "w2_on_us": round(min(on) * 1e6, 1),
                "w2_off_us": round(w2 * 1e6, 1),
                "x_w2": round(per_request / w2, 4),
                **base.ratios(per_request),
            },
        ),
    ]


async def bench_tt(
    base: Baselines, *, items: int = 10_000, repeats: int = 15, runs: int = 200, rounds: int = 5
) -> list[Figure]:
    """TT (see the module docstring). Needs PostgreSQL (``initdb``) for its PostgreSQL
    rows, and the postgres extra."""
    from tests.support.pg_support import PostgresServer, find_bin_dir
    from trio_agents.sessions import PostgresSession

    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "sessions.db")
        figures += await _fork_figures(
            "sqlite", lambda: SQLiteSession(path, "source"), items, repeats, None
        )
    server = PostgresServer(find_bin_dir(), synchronous_commit=True)
    await trio.to_thread.run_sync(server.start)
    try:
        dsn = await trio.to_thread.run_sync(server.create_database)
        figures += await _fork_figures(
            "postgres", lambda: PostgresSession(dsn, "source"), items, repeats, server.data_dir
        )
    finally:
        await trio.to_thread.run_sync(server.stop)
    figures += await _record_requests_figures(base, runs, rounds)
    return figures
