"""B11 "faces" (issue 27 calls it B10; B10 is already the failover benchmark): the faces
of one server, measured in the same run on loopback.

- cancel -> terminal seen by the client, p50/p99, per face: the websocket channel
  (``run.cancel`` sent -> the terminal ``event`` frame read) and SSE (``POST
  /runs/{id}/cancel`` sent -> the terminal ``run.updated`` read on the run's event
  stream). Target (issue 27): every face's p99 <= 2x the websocket's, same run.
- deltas/s to 100 SSE subscribers: one run streaming text deltas, every delta to each
  of 100 event streams; the figure counts deliveries (deltas x subscribers) per second.

A face is one function ``async def cancel_<face>(served, n) -> list[float]`` (seconds
from the cancel sent to the terminal seen, one per sample) listed in :data:`CANCEL_FACES`:
the A2A face adds ``CancelTask`` answered, AG-UI ``RUN_FINISHED cancelled``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

import trio_agents as ta
from trio_agents.control import Limits, connect, open_control_server
from trio_agents.faces import HttpApp, HttpLimits, http_app, serve_http
from trio_agents.models import ScriptedModel, Turn

from ._common import Baselines, Figure, percentile

TOKEN = "bench-token"
AUTH = {TOKEN: "bench"}
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


@ta.function_tool
async def _wait_forever() -> str:
    """Wait until cancelled."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def _agents(deltas: int) -> dict[str, ta.Agent]:
    blocked = ScriptedModel([], default=Turn(tool_calls=[("_wait_forever", {})]))
    talk = ScriptedModel([], default=Turn(text=[f"w{i} " for i in range(deltas)]))
    return {
        "blocked": ta.Agent(name="blocked", model=blocked, tools=[_wait_forever]),
        "talker": ta.Agent(name="talker", model=talk),
    }


@attrs.frozen
class Served:
    """One server: the websocket channel and the HTTP faces of its host."""

    ws_url: str
    http_base: str
    app: HttpApp


@asynccontextmanager
async def _serving(deltas: int) -> AsyncIterator[Served]:
    # Starts back to back: the start rate (a guard against clients) is not measured here.
    limits = Limits(start_rate=10_000, start_burst=10_000, max_runs_per_principal=1000)
    async with open_control_server(_agents(deltas), auth=AUTH, limits=limits) as server:
        app = http_app(server.host, auth=AUTH, limits=HttpLimits(max_streams_per_principal=4096))
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            yield Served(f"ws://127.0.0.1:{server.port}/", f"http://127.0.0.1:{port}", app)
            nursery.cancel_scope.cancel()


async def _sse(response: httpx.Response) -> AsyncGenerator[dict[str, Any]]:
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            yield json.loads(line[6:])


async def cancel_websocket(served: Served, n: int) -> list[float]:
    """``run.cancel`` sent -> the terminal event read, over the websocket channel."""
    samples = []
    async with connect(served.ws_url, token=TOKEN) as client:
        for _ in range(n):
            run = await client.start("blocked", "go")
            events = run.events()
            async for event in events:
                if isinstance(event, ta.ToolStarted):
                    break
            start = time.perf_counter()
            await run.cancel("bench")
            async for event in events:
                if isinstance(event, ta.RunUpdated) and event.status.is_terminal:
                    break
            samples.append(time.perf_counter() - start)
    return samples


async def cancel_sse(served: Served, n: int) -> list[float]:
    """``POST /runs/{id}/cancel`` sent -> the terminal ``run.updated`` read on the SSE
    stream (the cancel goes on a second connection, as a browser's would)."""
    samples = []
    async with httpx.AsyncClient(base_url=served.http_base, headers=HEADERS, timeout=None) as http:
        for _ in range(n):
            started = await http.post("/runs", json={"agent": "blocked", "input": "go"})
            run_id = started.json()["run_id"]
            async with http.stream("GET", f"/runs/{run_id}/events") as stream:
                reading = _sse(stream)
                async for data in reading:
                    if data["event"]["type"] == "tool.started":
                        break
                start = time.perf_counter()
                await http.post(f"/runs/{run_id}/cancel", json={"reason": "bench"})
                # Read to the end (the stream ends after the terminal update): leaving
                # httpx's line iterator mid-way leaves its generators to the collector.
                async for data in reading:
                    event = data["event"]
                    if event["type"] == "run.updated" and event["status"] == "cancelled":
                        samples.append(time.perf_counter() - start)
    return samples


CANCEL_FACES: tuple[tuple[str, Callable[[Served, int], Awaitable[list[float]]]], ...] = (
    ("websocket", cancel_websocket),
    ("sse", cancel_sse),
    # ("a2a", cancel_a2a), ("agui", cancel_agui): one line per face.
)


async def deltas_to_subscribers(served: Served, subscribers: int) -> tuple[int, float]:
    """Deliveries (deltas x subscribers) and the seconds they took."""
    pool = httpx.Limits(max_connections=subscribers + 4, max_keepalive_connections=0)
    async with httpx.AsyncClient(
        base_url=served.http_base, headers=HEADERS, timeout=None, limits=pool
    ) as http:
        # The run starts behind a session held by a blocked run, so every subscriber is
        # attached before its first delta.
        first = await http.post(
            "/runs", json={"agent": "blocked", "input": "go", "session_id": "s"}
        )
        run = await http.post(
            "/runs",
            json={"agent": "talker", "input": "go", "session_id": "s", "on_busy": "enqueue"},
        )
        run_id = run.json()["run_id"]
        counts: list[int] = []

        async def subscriber() -> None:
            got = 0
            async with http.stream("GET", f"/runs/{run_id}/events") as stream:
                async for data in _sse(stream):
                    got += data["event"]["type"] == "response.text.delta"
            counts.append(got)

        async with trio.open_nursery() as nursery:
            for _ in range(subscribers):
                nursery.start_soon(subscriber)
            while served.app.statistics().streams < subscribers:  # noqa: ASYNC110
                await trio.sleep(0.01)
            start = time.perf_counter()
            await http.post(f"/runs/{first.json()['run_id']}/cancel")
        wall = time.perf_counter() - start
    return sum(counts), wall


async def bench_b11(base: Baselines, *, samples: int, deltas: int) -> list[Figure]:
    """B11: the faces' cancel latencies and SSE fan-out (see the module docstring)."""
    figures: list[Figure] = []
    async with _serving(deltas) as served:
        results = {name: await measure(served, samples) for name, measure in CANCEL_FACES}
        ws_p99 = percentile(results["websocket"], 99)
        for name, values in results.items():
            p99 = percentile(values, 99)
            figures.append(
                Figure(
                    f"B11.cancel_to_terminal.{name}",
                    p99 * 1e3,
                    "ms p99",
                    target=None if name == "websocket" else 2 * ws_p99 * 1e3,
                    note=f"cancel sent -> terminal seen by the client over {name} (loopback)",
                    extra={
                        "n": len(values),
                        "p50_ms": round(percentile(values, 50) * 1e3, 3),
                        "ratio_to_websocket_p99": round(p99 / ws_p99, 2),
                    },
                )
            )
        delivered, wall = await deltas_to_subscribers(served, 100)
        figures.append(
            Figure(
                "B11.sse_deltas_per_s.s100",
                delivered / wall,
                "deltas/s",
                note="text deltas delivered to 100 SSE subscribers of one run, per second",
                extra={"deliveries": delivered, "deltas": deltas, "wall_s": round(wall, 3)},
            )
        )
    _ = base
    return figures
