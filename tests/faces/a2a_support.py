"""Helpers for the A2A face's tests: a real HTTP server on loopback over a LocalHost,
the official ``a2a-sdk`` client run in a worker thread (it is asyncio-only), and raw
JSON-RPC calls over httpx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx
import trio

import trio_agents as ta
from trio_agents.faces import http_app, serve_http
from trio_agents.hosting import LocalHost

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}

T = TypeVar("T")


@asynccontextmanager
async def serving(
    agents: Mapping[str, ta.Agent], **host_kwargs: Any
) -> AsyncIterator[tuple[LocalHost, str]]:
    """A LocalHost of ``agents`` served over HTTP on 127.0.0.1 (a free port): the host
    and the server's base URL."""
    host = LocalHost(agents, **host_kwargs)
    async with host.running(), trio.open_nursery() as nursery:
        app = http_app(host, auth=TOKENS)
        port = await nursery.start(serve_http, app, "127.0.0.1", 0)
        try:
            yield host, f"http://127.0.0.1:{port}"
        finally:
            nursery.cancel_scope.cancel()


async def in_asyncio(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main`` (an asyncio coroutine function: the SDK's client) in a worker
    thread under ``asyncio.run``, while the Trio server goes on serving."""
    return await trio.to_thread.run_sync(lambda: asyncio.run(main()))  # type: ignore[arg-type]


async def rpc(
    base_url: str,
    method: str,
    params: Any = None,
    *,
    headers: Mapping[str, str] | None = ALICE,
    rpc_id: Any = 1,
) -> httpx.Response:
    """One raw JSON-RPC call to ``/a2a`` (not streaming)."""
    body: dict[str, Any] = {"jsonrpc": "2.0", "id": rpc_id, "method": method}
    if params is not None:
        body["params"] = params
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0)) as client:
        return await client.post(f"{base_url}/a2a", json=body, headers=dict(headers or {}))


def text_message(text: str, **fields: Any) -> dict[str, Any]:
    """A 1.0 user message of one text part."""
    return {"messageId": f"m-{text[:10]}", "role": "ROLE_USER", "parts": [{"text": text}], **fields}


async def sse_results(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON-RPC objects of an SSE answer, one per ``data:`` event."""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif not line and data:
            yield json.loads("\n".join(data))
            data = []
