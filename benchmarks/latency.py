"""B4 (cancel latency) and B5 (steering latency) on the real clock.

``OpenAIChatModel`` talks HTTP to a loopback SSE server that runs in a subprocess
(:mod:`benchmarks._server`), so the server's work never competes with the measured
process for its scheduler or its GIL. Times are ``time.monotonic()`` in both processes
(``CLOCK_MONOTONIC``, one clock for the whole machine).
"""

from __future__ import annotations

import gc
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal, TypeAlias

import httpx
import trio
import trio.testing

import trio_agents as ta
from trio_agents.models._openai import OpenAIChatModel
from trio_agents.sessions import MemorySession, Session
from trio_agents.sessions._sqlite import SQLiteSession

from ._common import Baselines, Figure, _cancel_target, percentile

__all__ = ["CANCEL_KINDS", "LoopbackServer", "bench_b4", "bench_b5"]

Kind: TypeAlias = Literal[
    "mid_stream", "mid_async_tool", "mid_sync_tool", "awaiting_approval", "thread"
]
CANCEL_KINDS: tuple[Kind, ...] = (
    "mid_stream",
    "mid_async_tool",
    "mid_sync_tool",
    "awaiting_approval",
    "thread",
)
HOLD_DELTAS = 5
WARMUP = 20


class LoopbackServer:
    """The :mod:`benchmarks._server` subprocess: ``async with LoopbackServer.running()``."""

    def __init__(self) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks._server"],
            cwd=Path(__file__).resolve().parent.parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        self.port = int(self._process.stdout.readline())
        self.base_url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Close its stdin (it exits on EOF) and reap it; kill it if it hangs."""
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()

    @classmethod
    @asynccontextmanager
    async def running(cls) -> AsyncIterator[LoopbackServer]:
        """Start the server (off the Trio thread: it blocks), stop it on exit."""
        server = await trio.to_thread.run_sync(cls)
        try:
            yield server
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(server.stop)

    async def stats(self) -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
            response = await client.get(f"{self.base_url}/stats")
            data: dict[str, Any] = response.json()
            return data


@ta.function_tool
async def nap() -> str:
    """Sleep for an hour (async)."""
    await trio.sleep(3600)
    return "rested"


@ta.function_tool
def nap_sync(ctx: ta.ToolContext) -> str:
    """Sleep for up to a minute in a thread, leaving early once cancelled."""
    ctx.cancelled.wait(60)
    return "rested"


@ta.function_tool(needs_approval=True)
async def guarded() -> str:
    """A tool that needs approval."""
    return "ran"


_MODEL_FOR: dict[Kind, str] = {
    "mid_stream": f"hold:{HOLD_DELTAS}",
    "thread": f"hold:{HOLD_DELTAS}",
    "mid_async_tool": "tool:nap",
    "mid_sync_tool": "tool:nap_sync",
    "awaiting_approval": "tool:guarded",
}


async def _reach(run: ta.Run, kind: Kind) -> None:
    """Wait until the run is in the state ``kind`` cancels from."""
    deltas = 0
    async for event in run.events():
        if kind in ("mid_stream", "thread"):
            if event.type == "response.text.delta":
                deltas += 1
                if deltas == HOLD_DELTAS:
                    return
        elif kind == "awaiting_approval":
            if isinstance(event, ta.RunUpdated) and event.status == "awaiting_approval":
                return
        elif event.type == "tool.started":
            return
    raise RuntimeError(f"run ended before reaching {kind}")


def _cancel_from_thread(run: ta.Run) -> float:
    t0 = time.monotonic()
    run.cancel("bench")
    return t0


async def _one_cancel(
    agent: ta.Agent, kind: Kind, marker: str, session: Session | None
) -> tuple[float, float]:
    """One run cancelled from state ``kind``: (t_cancel, t_terminal_seen)."""
    t_terminal = 0.0
    async with ta.open_run(agent, marker, session=session) as run:
        await _reach(run, kind)
        statuses = aiter(run.updated)
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                nonlocal t_terminal
                async for update in statuses:
                    if update.status.is_terminal:
                        t_terminal = time.monotonic()

            nursery.start_soon(watch)
            await trio.lowlevel.checkpoint()  # the watcher is parked on the log now
            if kind == "thread":
                t0 = await trio.to_thread.run_sync(_cancel_from_thread, run)
            else:
                t0 = time.monotonic()
                run.cancel("bench")
    assert run.result is not None
    assert run.result.status == "cancelled", run.result
    return t0, t_terminal


SessionKind: TypeAlias = Literal["memory", "sqlite"]


class GCPasses:
    """The cyclic collector's passes, as ``(generation, start, stop)`` on
    ``time.monotonic()``, recorded with ``gc.callbacks`` while the block runs: a cancel
    whose window holds one paid for the collector, any other slow one for the OS."""

    def __init__(self) -> None:
        self.passes: list[tuple[int, float, float]] = []
        self._start = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.monotonic()
        else:
            self.passes.append((int(info["generation"]), self._start, time.monotonic()))

    def __enter__(self) -> GCPasses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def hit(self, t0: float, t1: float) -> bool:
        """Whether a pass overlapped ``[t0, t1]``."""
        return any(start <= t1 and stop >= t0 for _, start, stop in self.passes)


async def _cancel_series(
    server: LoopbackServer,
    client: httpx.AsyncClient,
    kind: Kind,
    session_kind: SessionKind,
    runs: int,
    db: Path,
    warmup: int,
) -> dict[str, Any]:
    model = OpenAIChatModel(
        _MODEL_FOR[kind], base_url=server.base_url, client=client, max_retries=0
    )
    agent = ta.Agent(name="b4", model=model, tools=[nap, nap_sync, guarded])
    marks: list[tuple[str, float, float]] = []
    passes = GCPasses()
    with passes:
        await _cancels(agent, kind, session_kind, runs, db, warmup, marks)
    latencies = [t1 - t0 for _, t0, t1 in marks]
    clean = [t1 - t0 for _, t0, t1 in marks if not passes.hit(t0, t1)]
    closes: list[float] = []
    if kind in ("mid_stream", "thread"):
        stats = await server.stats()
        conn_of = {r["first"]: r["conn"] for r in stats["requests"]}
        closed = stats["closed"]
        for marker, t0, _ in marks:
            conn = str(conn_of[marker])
            if conn in closed:
                closes.append(closed[conn] - t0)
    gc_info = {
        "gc_passes": len(passes.passes),
        "gc_full_passes": sum(1 for g, _, _ in passes.passes if g == 2),
        "gc_ms": round(sum(stop - start for _, start, stop in passes.passes) * 1e3, 2),
        "cancels_with_gc": len(latencies) - len(clean),
        "p99_without_gc_ms": round(percentile(clean, 99) * 1e3, 4) if clean else None,
    }
    return {"latency": latencies, "close": closes, "gc": gc_info}


async def _cancels(
    agent: ta.Agent,
    kind: Kind,
    session_kind: SessionKind,
    runs: int,
    db: Path,
    warmup: int,
    marks: list[tuple[str, float, float]],
) -> None:
    for i in range(warmup + runs):
        marker = f"{kind}-{session_kind}-{i}"
        if session_kind == "sqlite":
            async with SQLiteSession(db, session_id=marker) as sqlite:
                t0, t1 = await _one_cancel(agent, kind, marker, sqlite)
        else:
            t0, t1 = await _one_cancel(agent, kind, marker, MemorySession())
        if i >= warmup:
            marks.append((marker, t0, t1))


async def thread_scope_cancel_exit(n: int) -> list[float]:
    """Trio's own floor for a cancel from another thread: the bare scope cancel of
    ``baselines.scope_cancel_exit`` (one child in ``sleep_forever`` inside a nursery
    inside the scope), asked for from a worker thread with
    ``TrioToken.run_sync_soon(scope.cancel)`` — what ``Run.cancel`` does off the run's
    thread — timed from the thread's call to another task seeing the nursery exited."""
    token = trio.lowlevel.current_trio_token()
    samples: list[float] = []

    def cancel_soon(scope: trio.CancelScope) -> float:
        t0 = time.perf_counter()
        token.run_sync_soon(scope.cancel)
        return t0

    for _ in range(n):
        scope = trio.CancelScope()
        exited = trio.Event()
        async with trio.open_nursery() as outer:
            await outer.start(_cancel_target, scope, exited)
            await trio.lowlevel.checkpoint()
            t0 = await trio.to_thread.run_sync(cancel_soon, scope)
            await exited.wait()
            samples.append(time.perf_counter() - t0)
    return samples


async def bare_stream_cancel(
    server: LoopbackServer, client: httpx.AsyncClient, marker: str, after: int = HOLD_DELTAS
) -> float:
    """One raw ``httpx`` stream of the loopback ``hold:5`` response, read line by line
    (``async with client.stream``, ``aiter_lines``: httpx as documented, nothing of
    ours); once it has seen its ``after``-th delta and is blocked in its next socket
    read (where B4's runs and P2's trips find their model streams), its cancel scope is
    cancelled. A cancel that lands in a read unwinds httpx's generators through their
    own handlers (one between two reads would leave them to the collector). Returns the
    ``time.monotonic()`` of the cancel; the server's stats hold the close of the
    connection whose request carried ``marker``."""
    body = {
        "model": f"hold:{HOLD_DELTAS}",
        "stream": True,
        "messages": [{"role": "user", "content": marker}],
    }
    url = f"{server.base_url}/chat/completions"
    reached = trio.Event()
    scope = trio.CancelScope()

    async def read() -> None:
        with scope:
            async with client.stream("POST", url, json=body) as response:
                deltas = 0
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        deltas += 1
                        if deltas == after:
                            reached.set()
        if not scope.cancelled_caught:
            raise RuntimeError("the held response ended before it was cancelled")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await reached.wait()
        await trio.testing.wait_all_tasks_blocked()
        t0 = time.monotonic()
        scope.cancel()
    return t0


async def closes_after(server: LoopbackServer, marks: dict[str, float]) -> list[float]:
    """For each request (by its marker): when the server saw its connection closed,
    minus its mark (the cancel, the trip)."""
    stats = await server.stats()
    conn_of = {r["first"]: str(r["conn"]) for r in stats["requests"]}
    closed = stats["closed"]
    return [
        closed[conn_of[marker]] - t0
        for marker, t0 in marks.items()
        if marker in conn_of and conn_of[marker] in closed
    ]


async def bare_stream_cancels(
    server: LoopbackServer, client: httpx.AsyncClient, n: int, warmup: int = WARMUP
) -> tuple[list[float], list[float]]:
    """W5's floor with nothing of ours: :func:`bare_stream_cancel` ``n`` times, at the
    point B4 cancels its runs. Returns the latencies to the scope's exit (httpx's
    unwinding and Trio's) and to the server seeing the connection closed (the kernel's
    close and the server process's wake-up too)."""
    exits: list[float] = []
    marks: dict[str, float] = {}
    for i in range(warmup + n):
        marker = f"bare-{i}"
        t0 = await bare_stream_cancel(server, client, marker)
        t1 = time.monotonic()
        if i >= warmup:
            exits.append(t1 - t0)
            marks[marker] = t0
    return exits, await closes_after(server, marks)


# W4/W5 (and cancel from another thread, and the server-side socket close): p99 at most
# this many times the bare scope-cancel p99 measured in the same process, GC on.
CANCEL_FLOOR_FACTOR = 4


def _latency_figures(
    name: str,
    values: list[float],
    target_ms: float | None,
    note: str,
    base: Baselines,
    more: dict[str, Any] | None = None,
) -> list[Figure]:
    p50, p99 = percentile(values, 50), percentile(values, 99)
    extra = {
        "n": len(values),
        "p50_ms": round(p50 * 1e3, 4),
        "max_ms": round(max(values) * 1e3, 3),
        **(more or {}),
    }
    return [
        Figure(
            name,
            p99 * 1e3,
            "ms p99",
            target=target_ms,
            note=note,
            extra={**extra, **base.ratios(p99), **base.cancel_ratio(p99)},
        )
    ]


async def bench_b4(
    base: Baselines,
    *,
    runs: int,
    sessions: tuple[SessionKind, ...] = ("memory", "sqlite"),
    warmup: int = WARMUP,
) -> list[Figure]:
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as tmp:
        async with LoopbackServer.running() as server, httpx.AsyncClient() as client:
            for session_kind in sessions:
                for kind in CANCEL_KINDS:
                    series = await _cancel_series(
                        server, client, kind, session_kind, runs, Path(tmp) / "b4.db", warmup
                    )
                    target = None
                    if session_kind == "memory":
                        target = CANCEL_FLOOR_FACTOR * base.cancel_p99 * 1e3
                    if kind == "mid_stream" and session_kind == sessions[0]:
                        # W5's floor: httpx, Trio and the kernel alone, same server.
                        exits, closes = await bare_stream_cancels(server, client, runs)
                        figures += _latency_figures(
                            "B4.bare_httpx_cancel_exit",
                            exits,
                            None,
                            "a raw httpx stream of the same response cancelled mid-stream"
                            " -> its scope exited: httpx's and Trio's floor for W5",
                            base,
                        )
                        figures += _latency_figures(
                            "B4.bare_httpx_socket_closed",
                            closes,
                            None,
                            "the same -> the server sees the connection closed",
                            base,
                        )
                    if kind == "thread" and session_kind == sessions[0]:
                        # Trio's own share of the thread hop, in the same process.
                        figures += _latency_figures(
                            "B4.bare_thread_scope_cancel",
                            await thread_scope_cancel_exit(runs),
                            None,
                            "bare scope cancel asked for from a worker thread"
                            " (TrioToken.run_sync_soon) -> the nursery inside seen exited:"
                            " Trio's floor for 'cancel from another thread'",
                            base,
                        )
                    figures += _latency_figures(
                        f"B4.cancel_{kind}.{session_kind}",
                        series["latency"],
                        target,
                        f"cancel() -> terminal run.updated seen, {session_kind} session",
                        base,
                        series["gc"],
                    )
                    if series["close"]:
                        figures += _latency_figures(
                            f"B4.socket_closed_{kind}.{session_kind}",
                            series["close"],
                            target,
                            "cancel() -> the server sees the connection closed",
                            base,
                        )
    return figures


async def _one_steer(agent: ta.Agent, marker: str) -> float:
    async with ta.open_run(agent, marker, session=MemorySession()) as run:
        await _reach(run, "mid_stream")
        t0 = time.monotonic()
        run.inject([{"role": "user", "content": f"steer {marker}"}], when="now")
    assert run.result is not None
    assert run.result.final_output == "ok", run.result
    return t0


async def bench_b5(base: Baselines, *, runs: int, warmup: int = WARMUP) -> list[Figure]:
    async with LoopbackServer.running() as server, httpx.AsyncClient() as client:
        model = OpenAIChatModel(
            f"hold:{HOLD_DELTAS}", base_url=server.base_url, client=client, max_retries=0
        )
        agent = ta.Agent(name="b5", model=model)
        starts = {}
        for i in range(warmup + runs):
            marker = f"b5-{i}"
            t0 = await _one_steer(agent, marker)
            if i >= warmup:
                starts[f"steer {marker}"] = t0
        stats = await server.stats()
    arrivals = {r["last"]: r["t"] for r in stats["requests"] if r["last"] in starts}
    values = [arrivals[key] - t0 for key, t0 in starts.items()]
    return _latency_figures(
        "B5.steer_now_to_next_request",
        values,
        1.0,
        'inject(when="now") mid-stream -> the next model request reaches the server',
        base,
    )
