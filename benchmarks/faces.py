"""B11 "faces" (issue 27 calls it B10; B10 is already the failover benchmark): the faces
of one server, measured in the same run on loopback.

- cancel -> terminal seen by the client, p50/p99, per face: the websocket channel
  (``run.cancel`` sent -> the terminal ``event`` frame read) and SSE (``POST
  /runs/{id}/cancel`` sent -> the terminal ``run.updated`` read on the run's event
  stream). Target (issue 27): every face's p99 <= 2x the websocket's, same run.
- cancel -> terminal for A2A (``CancelTask`` sent -> its answer, which comes after the
  terminal update) and AG-UI (REST cancel sent -> ``RUN_FINISHED`` cancelled read).
- cancel -> the call's end for MCP (issue 40): the official ``mcp`` client over
  Streamable HTTP, ``notifications/cancelled`` sent -> the run's terminal update read
  on its REST event stream (the SDK never answers a cancelled request, so the client's
  own ``call_tool`` ends at once, before the server did anything: not a measure).
- deltas/s to 100 SSE subscribers: one run streaming text deltas, every delta to each
  of 100 event streams; the figure counts deliveries (deltas x subscribers) per second.
  The subscribers are raw sockets counting deltas in the bytes (100 httpx clients in the
  server's process cost more than the server: 260/s measured that way).

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
import httpx2
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

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

            async def cancel(run_id: str = run_id) -> None:
                await http.post(f"/runs/{run_id}/cancel", json={"reason": "bench"})

            elapsed = await _cancel_seen_on_stream(http, run_id, cancel)
            if elapsed:
                samples.append(elapsed)
    return samples


async def _cancel_seen_on_stream(
    http: httpx.AsyncClient, run_id: str, cancel: Callable[[], Awaitable[None]]
) -> float:
    """Follow the run's REST event stream until it is inside its tool, then ``cancel``
    it: the seconds until its terminal ``run.updated`` (cancelled) is read, 0.0 if it
    never ended cancelled. The stream is read to its end (it ends after the terminal
    update): leaving httpx's line iterator mid-way leaves its generators to the
    collector."""
    elapsed = 0.0
    async with http.stream("GET", f"/runs/{run_id}/events") as stream:
        reading = _sse(stream)
        async for data in reading:
            if data["event"]["type"] == "tool.started":
                break
        start = time.perf_counter()
        await cancel()
        async for data in reading:
            event = data["event"]
            if event["type"] == "run.updated" and event["status"] == "cancelled":
                elapsed = time.perf_counter() - start
    return elapsed


async def _rpc(http: httpx.AsyncClient, method: str, params: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    answer = (await http.post("/a2a", json=body)).json()
    assert "result" in answer, answer
    return dict(answer["result"])


async def cancel_a2a(served: Served, n: int) -> list[float]:
    """A2A ``CancelTask`` sent -> its answer (the canceled task) read: the face answers
    only after the run's terminal update. The run is seen inside its tool on its REST
    event stream (as in :func:`cancel_sse`), so the sample is the cancel alone."""
    samples = []
    async with httpx.AsyncClient(base_url=served.http_base, headers=HEADERS, timeout=None) as http:
        for _ in range(n):
            message = {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "go"}]}
            started = await _rpc(
                http,
                "SendMessage",
                {
                    "message": message,
                    "configuration": {"returnImmediately": True},
                    "metadata": {"agent": "blocked"},
                },
            )
            run_id = started["task"]["id"]
            async with http.stream("GET", f"/runs/{run_id}/events") as stream:
                reading = _sse(stream)
                async for data in reading:
                    if data["event"]["type"] == "tool.started":
                        break
                start = time.perf_counter()
                task = await _rpc(http, "CancelTask", {"id": run_id})
                samples.append(time.perf_counter() - start)
                assert task["status"]["state"] == "TASK_STATE_CANCELED", task
                async for _ in reading:  # to its end (see cancel_sse)
                    pass
    return samples


async def cancel_agui(served: Served, n: int) -> list[float]:
    """``POST /runs/{id}/cancel`` sent -> the AG-UI stream's ``RUN_FINISHED`` (outcome
    ``cancelled``) read (AG-UI has no cancel request of its own: a stop button backed by
    the REST route, the run id from ``RUN_STARTED``'s metadata)."""
    samples = []
    async with httpx.AsyncClient(base_url=served.http_base, headers=HEADERS, timeout=None) as http:
        for number in range(n):
            body = {
                "threadId": f"t{number}",
                "runId": f"ag{number}",
                "messages": [{"id": "m", "role": "user", "content": "go"}],
            }
            async with http.stream("POST", "/ag-ui/blocked", json=body) as stream:
                run_id = ""
                start = 0.0
                async for event in _sse(stream):
                    if event["type"] == "RUN_STARTED":
                        run_id = event["metadata"]["trio-agents"]["run_id"]
                    elif event["type"] == "TOOL_CALL_END":
                        start = time.perf_counter()
                        await http.post(f"/runs/{run_id}/cancel", json={"reason": "bench"})
                    elif event["type"] == "RUN_FINISHED":
                        samples.append(time.perf_counter() - start)
                        assert event.get("outcome") == {"type": "cancelled"}, event
    return samples


async def _running_run(http: httpx.AsyncClient, agent: str) -> str:
    """The one running run of ``agent`` (the benchmark's runs before it are over)."""
    runs = (await http.get("/runs")).json()["runs"]
    (run_id,) = [r["run_id"] for r in runs if r["agent"] == agent and r["status"] == "running"]
    return str(run_id)


async def _mcp_cancel_once(mcp: Client, http: httpx.AsyncClient) -> float:
    """One call of ``blocked`` cancelled once its tool runs: the seconds from the
    cancel to the terminal update read on the run's event stream."""
    queued = trio.Event()
    call = trio.CancelScope()

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        queued.set()  # the run exists (its first progress is "queued")

    async def calling() -> None:
        with call:
            await mcp.call_tool("blocked", {"input": "go"}, progress_callback=progress)

    async def cancel() -> None:
        call.cancel()  # the client sends notifications/cancelled

    async with trio.open_nursery() as nursery:
        nursery.start_soon(calling)
        await queued.wait()
        run_id = await _running_run(http, "blocked")
        elapsed = await _cancel_seen_on_stream(http, run_id, cancel)
    assert elapsed > 0, "the run did not end cancelled"
    return elapsed


async def cancel_mcp(served: Served, n: int) -> list[float]:
    """MCP ``notifications/cancelled`` sent -> the run's terminal ``run.updated``
    (cancelled) read on its REST event stream.

    The official client on one MCP session (the handshake era, ``mode="legacy"``: its
    cancel is ``notifications/cancelled``; on 2026-07-28 it closes the call's HTTP
    stream instead). The SDK never answers a cancelled request and its ``call_tool``
    returns as soon as the notice is sent, so the end the client can see is the run's
    terminal update, read on the channel :func:`cancel_sse` and :func:`cancel_a2a`
    already use: the same end the other faces' samples measure."""
    samples = []
    mcp_headers = httpx2.Headers(HEADERS)
    async with (
        httpx.AsyncClient(base_url=served.http_base, headers=HEADERS, timeout=None) as http,
        httpx2.AsyncClient(headers=mcp_headers, timeout=httpx2.Timeout(60, read=None)) as mcp_http,
        Client(
            streamable_http_client(served.http_base + "/mcp", http_client=mcp_http),
            mode="legacy",
        ) as mcp,
    ):
        for _ in range(n):
            samples.append(await _mcp_cancel_once(mcp, http))
    return samples


CANCEL_FACES: tuple[tuple[str, Callable[[Served, int], Awaitable[list[float]]]], ...] = (
    ("websocket", cancel_websocket),
    ("sse", cancel_sse),
    ("a2a", cancel_a2a),
    ("agui", cancel_agui),
    ("mcp", cancel_mcp),
)


async def _lean_subscriber(port: int, run_id: str, counts: list[int]) -> None:
    """One event stream read over a raw socket, counting the deltas in the bytes (no
    HTTP client, no line parsing: the figure is the server's, not a client's)."""
    mark = b'"type":"response.text.delta"'
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(
            f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: b\r\n"
            f"Authorization: Bearer {TOKEN}\r\n\r\n".encode()
        )
        got = 0
        tail = b""
        while not tail.endswith(b"\r\n0\r\n\r\n"):
            data = await stream.receive_some(1 << 16)
            if not data:
                break
            seen = tail + data
            # a mark cut by a read boundary is counted once, in the next read
            keep = len(mark) - 1
            got += seen.count(mark) - seen[-keep:].count(mark)
            tail = seen[-keep:]
        counts.append(got + tail.count(mark))


async def deltas_to_subscribers(served: Served, subscribers: int) -> tuple[int, float]:
    """Deliveries (deltas x subscribers) and the seconds they took."""
    port = int(served.http_base.rsplit(":", 1)[1])
    async with httpx.AsyncClient(base_url=served.http_base, headers=HEADERS, timeout=None) as http:
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
        async with trio.open_nursery() as nursery:
            for _ in range(subscribers):
                nursery.start_soon(_lean_subscriber, port, run_id, counts)
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
                        # the same latencies in floor units (the bare scope cancel's)
                        "p50_x_cancel_p50": round(percentile(values, 50) / base.cancel_p50, 1),
                        "x_cancel_p99": round(p99 / base.cancel_p99, 1),
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
    return figures
