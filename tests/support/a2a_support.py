"""Helpers for the A2A face's tests: a real HTTP server on loopback over a LocalHost,
the official ``a2a-sdk`` client run in a worker thread (it is asyncio-only), and raw
JSON-RPC calls over httpx."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import h11
import httpx
import trio
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.helpers.proto_helpers import new_text_message
from a2a.types.a2a_pb2 import Message, SendMessageRequest

import trio_agents as ta
from trio_agents.faces import http_app, serve_http
from trio_agents.hosting import LocalHost, RunHost
from trio_agents.models import ScriptedModel, Turn

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}
ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}

T = TypeVar("T")


@asynccontextmanager
async def serving(
    agents: Mapping[str, ta.Agent],
    *,
    wrap: Callable[[LocalHost], RunHost] | None = None,
    **host_kwargs: Any,
) -> AsyncIterator[tuple[LocalHost, str]]:
    """A LocalHost of ``agents`` served over HTTP on 127.0.0.1 (a free port): the host
    and the server's base URL. ``wrap``: what the faces are given instead of the host
    (a test's instrumented proxy of it)."""
    host = LocalHost(agents, **host_kwargs)
    async with host.running(), trio.open_nursery() as nursery:
        app = http_app(host if wrap is None else wrap(host), auth=TOKENS)
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


@attrs.define
class SseReader:
    """The JSON-RPC objects of one SSE answer, read over a bare socket with h11 (httpx's
    line iterators are nested async generators that a test leaving a stream early would
    leave to the garbage collector). ``status`` and ``headers`` are the answer's."""

    stream: trio.SocketStream
    conn: h11.Connection
    status: int = 0
    headers: dict[str, str] = attrs.field(factory=dict)
    body: bytes = b""
    ended: bool = False

    async def _event(self) -> Any:
        while True:
            event = self.conn.next_event()
            if event is h11.NEED_DATA:
                self.conn.receive_data(await self.stream.receive_some())
                continue
            return event

    async def start(self) -> None:
        event = await self._event()
        assert isinstance(event, h11.Response), event
        self.status = event.status_code
        self.headers = {k.decode().lower(): v.decode() for k, v in event.headers}

    async def next(self) -> dict[str, Any] | None:
        """The next JSON-RPC object, or None once the stream ended."""
        while True:
            if b"\n\n" in self.body:
                raw, self.body = self.body.split(b"\n\n", 1)
                data = [
                    line[5:].lstrip()
                    for line in raw.decode().split("\n")
                    if line.startswith("data:")
                ]
                if data:
                    return dict(json.loads("\n".join(data)))
                continue
            if self.ended:
                return None
            event = await self._event()
            if isinstance(event, h11.Data):
                self.body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                self.ended = True

    async def rest(self) -> list[dict[str, Any]]:
        """Every object until the stream ends."""
        got = []
        while (message := await self.next()) is not None:
            got.append(message)
        return got


@asynccontextmanager
async def sse(
    base_url: str, method: str, params: Any, *, headers: Mapping[str, str] = ALICE, rpc_id: Any = 1
) -> AsyncIterator[SseReader]:
    """A streaming JSON-RPC call to ``/a2a``; leaving the block closes the connection
    (a client that goes away)."""
    port = int(base_url.rsplit(":", 1)[1])
    body = json.dumps({"jsonrpc": "2.0", "id": rpc_id, "method": method, "params": params}).encode()
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        head = [
            ("Host", f"127.0.0.1:{port}"),
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            *headers.items(),
        ]
        await stream.send_all(conn.send(h11.Request(method="POST", target="/a2a", headers=head)))
        await stream.send_all(conn.send(h11.Data(data=body)))
        await stream.send_all(conn.send(h11.EndOfMessage()))
        reader = SseReader(stream, conn)
        await reader.start()
        yield reader


async def raw_post(url: str, head: Mapping[str, str], chunks: list[bytes]) -> int:
    """POST ``chunks`` to ``/a2a`` over a bare socket (headers as given; the body
    chunked unless ``head`` has a Content-Length) and return the answer's status: a
    server may answer before the body is sent, which httpx does not let a test see."""
    port = int(url.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    chunked = "Content-Length" not in head
    lines = [
        "POST /a2a HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        *(f"{k}: {v}" for k, v in head.items()),
    ]
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    answer = b""
    async with stream:

        async def write() -> None:
            try:
                await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
                for chunk in chunks:
                    await stream.send_all(
                        b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk
                    )
                if chunked:
                    await stream.send_all(b"0\r\n\r\n")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the server answered and closed first

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            while b"\r\n" not in answer:
                data = await stream.receive_some()
                if not data:
                    break
                answer += data
            nursery.cancel_scope.cancel()
    return int(answer.split(b" ", 2)[1])


@asynccontextmanager
async def sdk_client(url: str, *, streaming: bool = True) -> AsyncIterator[Client]:
    """The official SDK's client of the face at ``url``, as Alice (asyncio: run it in
    :func:`in_asyncio`)."""
    async with httpx.AsyncClient(headers=ALICE, timeout=30) as http:
        config = ClientConfig(httpx_client=http, streaming=streaming)
        yield await ClientFactory(config).create_from_url(url)


async def send_all(client: Client, message: Message | str) -> list[Any]:
    """Every event the SDK's client yields for one ``SendMessage`` (a str: one text
    message)."""
    if isinstance(message, str):
        message = new_text_message(message)
    return [e async for e in client.send_message(SendMessageRequest(message=message))]


def approver() -> ta.Agent:
    """Agent ``a``: calls ``launch`` (which needs approval), then says "done"."""

    @ta.function_tool(needs_approval=True)
    async def launch() -> str:
        """Launch, once approved."""
        return "launched"

    script = [Turn(tool_calls=[("launch", {})]), Turn(text="done")]
    return ta.Agent(name="a", instructions="test", model=ScriptedModel(script), tools=[launch])
