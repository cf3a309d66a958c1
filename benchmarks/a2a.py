"""B10 (A2A part): ``CancelTask`` answered, over a real loopback HTTP socket.

The run blocks in a tool; the client — raw JSON-RPC over httpx, in the same process and
Trio loop as the server — sends ``CancelTask`` and the clock stops when the answer
arrives. The face answers only after the run's terminal update (``host.cancel`` then
``host.wait_terminal``, then the task rebuilt from the run's log), so the figure is
cancel → terminal → answer, end to end. For B10's comparison with the other faces
(``benchmarks/faces.py``): target p99 <= 2x the websocket's ``cancel_to_terminal``.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import trio

import trio_agents as ta
from trio_agents.faces import http_app, serve_http
from trio_agents.hosting import LocalHost
from trio_agents.models import ScriptedModel, Turn

from ._common import Baselines, Figure, median, percentile
from .control import _limits

__all__ = ["bench_a2a_cancel"]

TOKEN = "bench"


@ta.function_tool
async def _wait_forever() -> str:
    """Block until cancelled."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def _agent() -> ta.Agent:
    return ta.Agent(
        name="blocked",
        model=ScriptedModel([], default=Turn(tool_calls=[("_wait_forever", {})])),
        tools=[_wait_forever],
    )


async def _rpc(
    http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any]
) -> dict[str, Any]:
    answer = await http.post(
        url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    )
    body = answer.json()
    assert "result" in body, body
    return dict(body["result"])


async def bench_a2a_cancel(base: Baselines, *, cancels: int) -> list[Figure]:
    """``B10.a2a_cancel_answered``: CancelTask sent → answer (the canceled task)
    received, p99 (p50 in ``extra``)."""
    # Limits out of the way: the figure is the face's, not the guard rails'.
    host = LocalHost({"blocked": _agent()}, limits=_limits())
    times: list[float] = []
    async with host.running(), trio.open_nursery() as nursery:
        app = http_app(host, auth={TOKEN: "p"})
        port = await nursery.start(serve_http, app, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}/a2a"
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(60.0)) as http:
            for _ in range(cancels + 2):  # two warm-ups
                message = {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "go"}]}
                started = await _rpc(
                    http,
                    url,
                    "SendMessage",
                    {"message": message, "configuration": {"returnImmediately": True}},
                )
                run_id = started["task"]["id"]
                # Wait (on the host, not over HTTP) until the run is inside its tool.
                async with host.events("p", run_id) as events:
                    async for hosted in events:
                        if hosted.event.get("type") == "tool.started":
                            break
                begin = time.perf_counter()
                task = await _rpc(http, url, "CancelTask", {"id": run_id})
                times.append(time.perf_counter() - begin)
                assert task["status"]["state"] == "TASK_STATE_CANCELED", task
        nursery.cancel_scope.cancel()
    times = times[2:]
    return [
        Figure(
            "B10.a2a_cancel_answered",
            percentile(times, 99) * 1e3,
            "ms p99",
            note="A2A CancelTask sent -> answer (the canceled task) received; run blocked"
            " in a tool; loopback HTTP, client in the same process",
            extra={
                "n": len(times),
                "p50_ms": round(percentile(times, 50) * 1e3, 4),
                **base.ratios(median(times)),
            },
        )
    ]
