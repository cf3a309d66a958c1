"""B10 (faces), AG-UI: cancel → ``RUN_FINISHED`` with the ``cancelled`` outcome seen by an
AG-UI client, over a real loopback socket (``trio_agents.faces``).

A run blocked in a tool streams to an AG-UI client (``POST /ag-ui/{agent}``, SSE). AG-UI
has no cancel request of its own, so the run is cancelled over the REST face
(``POST /runs/{id}/cancel``, the id from ``RUN_STARTED``'s metadata), as a front-end's
stop button backed by that route would; the figure is the time from sending the cancel
to reading ``RUN_FINISHED`` (outcome ``cancelled``) on the AG-UI stream (p50/p99).
Server and client share one process and one Trio loop.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import trio

import trio_agents as ta
from trio_agents.control import Limits
from trio_agents.faces import http_app, serve_http
from trio_agents.hosting import LocalHost
from trio_agents.models import ScriptedModel, Turn

from ._common import Figure, percentile

__all__ = ["bench_agui_cancel"]

TOKEN = "bench"


@ta.function_tool
async def _wait_forever() -> str:
    """Block until cancelled."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def _blocked() -> ta.Agent:
    return ta.Agent(
        name="blocked",
        model=ScriptedModel([], default=Turn(tool_calls=[("_wait_forever", {})])),
        tools=[_wait_forever],
    )


class _Events:
    """The ``data:`` lines of an SSE response as JSON, read one at a time (the body
    generator unwound on close, so nothing is left to the garbage collector)."""

    def __init__(self, response: httpx.Response) -> None:
        self._body = response.aiter_bytes()
        self._buffer = b""

    async def next(self) -> dict[str, Any]:
        while True:
            while b"\n" not in self._buffer:
                self._buffer += await self._body.__anext__()
            line, _, self._buffer = self._buffer.partition(b"\n")
            if line.startswith(b"data: "):
                event: dict[str, Any] = json.loads(line[6:])
                return event

    async def until(self, type_: str) -> dict[str, Any]:
        while (event := await self.next())["type"] != type_:
            pass
        return event

    async def close(self) -> None:
        with trio.CancelScope(shield=True) as scope:
            scope.cancel()
            try:
                while True:
                    await self._body.__anext__()
            except (StopAsyncIteration, httpx.HTTPError):
                return


async def bench_agui_cancel(*, cancels: int = 100) -> list[Figure]:
    """Cancel sent → the AG-UI stream's ``RUN_FINISHED`` (``cancelled``) read, p50/p99:
    half the runs cancelled over REST (what a client sees end to end), half in process
    (what the AG-UI face itself adds once the cancel is applied)."""
    host = LocalHost(
        {"blocked": _blocked()},
        limits=Limits(max_runs_per_principal=10_000, start_rate=1e9, start_burst=10**9),
    )
    headers = {"Authorization": f"Bearer {TOKEN}"}
    seen: list[float] = []  # REST cancel sent -> RUN_FINISHED read
    own: list[float] = []  # host.cancel returned -> RUN_FINISHED read (the face's share)
    async with host.running(), trio.open_nursery() as nursery:
        app = http_app(host, auth={TOKEN: "bench"})
        port = await nursery.start(serve_http, app, "127.0.0.1", 0)
        timeout = httpx.Timeout(10.0, read=None)
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=timeout
        ) as client:
            for number in range(cancels):
                body = {
                    "threadId": f"t{number}",
                    "runId": f"ag{number}",
                    "messages": [{"id": "m", "role": "user", "content": "go"}],
                }
                async with client.stream(
                    "POST", "/ag-ui/blocked", json=body, headers=headers
                ) as response:
                    events = _Events(response)
                    try:
                        started = await events.until("RUN_STARTED")
                        run_id = started["metadata"]["trio-agents"]["run_id"]
                        await events.until("TOOL_CALL_END")
                        start = time.perf_counter()
                        if number % 2:
                            answer = await client.post(
                                f"/runs/{run_id}/cancel", json={"reason": "bench"}, headers=headers
                            )
                            finished = await events.until("RUN_FINISHED")
                            seen.append(time.perf_counter() - start)
                        else:
                            await host.cancel("bench", run_id, "bench")
                            applied = time.perf_counter()
                            answer = httpx.Response(200)
                            finished = await events.until("RUN_FINISHED")
                            own.append(time.perf_counter() - applied)
                    finally:
                        await events.close()
                    if answer.status_code >= 300 or finished.get("outcome") != {
                        "type": "cancelled"
                    }:
                        raise AssertionError(f"not cancelled: {answer.text} {finished}")
        nursery.cancel_scope.cancel()
    return [
        Figure(
            "B10.agui_cancel_to_finished",
            percentile(seen, 99) * 1e3,
            "ms p99",
            note="REST cancel sent -> AG-UI RUN_FINISHED (outcome cancelled) read on the SSE stream",
            extra={"n": len(seen), "p50_ms": round(percentile(seen, 50) * 1e3, 3)},
        ),
        Figure(
            "B10.agui_cancel_applied_to_finished",
            percentile(own, 99) * 1e3,
            "ms p99",
            note="in-process host.cancel returned -> AG-UI RUN_FINISHED (cancelled) read"
            " (the AG-UI face's own share: repair, mapping, SSE write, client read)",
            extra={"n": len(own), "p50_ms": round(percentile(own, 50) * 1e3, 3)},
        ),
    ]
