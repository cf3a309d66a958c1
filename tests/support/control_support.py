"""Helpers for the control-channel tests: a server on loopback, raw websocket clients."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

import trio
import trio.testing
from trio_websocket import ConnectionRejected, WebSocketConnection, wrap_client_stream

import trio_agents as ta
from trio_agents.control import (
    SUBPROTOCOL,
    ControlClient,
    ControlServer,
    connect,
    open_control_server,
)

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}


@asynccontextmanager
async def serving(
    agents: Mapping[str, ta.Agent], **kwargs: Any
) -> AsyncIterator[tuple[ControlServer, str]]:
    """A control server on 127.0.0.1 (a free port) and its URL."""
    kwargs.setdefault("auth", TOKENS)
    async with open_control_server(agents, **kwargs) as server:
        yield server, f"ws://127.0.0.1:{server.port}/"


@asynccontextmanager
async def raw_client(
    url: str,
    *,
    token: str | None = "tok-alice",
    headers: list[tuple[bytes, bytes]] | None = None,
    subprotocols: list[str] | None = None,
    receive_buffer: int | None = None,
) -> AsyncIterator[WebSocketConnection]:
    """A bare trio-websocket client over a stream we own (and always close)."""
    port = int(url.rsplit(":", 1)[1].strip("/"))
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    if receive_buffer is not None:
        import socket

        stream.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    extra = list(headers or [])
    if token is not None:
        extra.append((b"Authorization", f"Bearer {token}".encode()))
    try:
        async with trio.open_nursery() as nursery:
            protocols = [SUBPROTOCOL] if subprotocols is None else subprotocols
            async with _websocket(nursery, stream, f"127.0.0.1:{port}", protocols, extra) as ws:
                yield ws
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        matched, _ = group.split(ConnectionRejected)
        if matched is None:
            raise
        leaf: BaseException = matched
        while isinstance(leaf, BaseExceptionGroup):
            leaf = leaf.exceptions[0]
        raise leaf from None
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


@asynccontextmanager
async def memory_client(
    server: ControlServer, *, token: str = "tok-alice"
) -> AsyncIterator[WebSocketConnection]:
    """A bare client wired to ``server`` through an in-memory *lockstep* stream: a send
    blocks until the other side has read it, exactly and without any timing, so a
    client that stops reading backs the server up at once (use it on a MockClock).

    The server side is handed to the server's per-connection handler, the one
    ``serve()`` runs for every accepted socket.
    """
    client_stream, server_stream = trio.testing.lockstep_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.handle_stream, server_stream)
        try:
            headers = [(b"Authorization", f"Bearer {token}".encode())]
            # any trio Stream will do
            stream = cast(trio.SocketStream, client_stream)
            async with _websocket(nursery, stream, "memory", [SUBPROTOCOL], headers) as ws:
                yield ws
        finally:
            with trio.CancelScope(shield=True):
                await client_stream.aclose()
            nursery.cancel_scope.cancel()


async def answer(ws: WebSocketConnection) -> dict[str, Any]:
    """The next non-event frame."""
    while True:
        frame = json.loads(await ws.get_message())
        assert isinstance(frame, dict)
        if frame["type"] != "event":
            return frame


async def ask(ws: WebSocketConnection, request: Mapping[str, Any]) -> dict[str, Any]:
    """Send one request and return its answer (skipping event frames)."""
    await ws.send_message(json.dumps(request))
    return await answer(ws)


async def wait_until(predicate: Callable[[], bool]) -> None:
    """Poll ``predicate`` (for state only observable across real sockets)."""
    while not predicate():  # noqa: ASYNC110 - server state, no event to wait on
        await trio.sleep(0.005)


@asynccontextmanager
async def _websocket(
    nursery: trio.Nursery,
    stream: trio.SocketStream,
    host: str,
    subprotocols: list[str],
    headers: list[tuple[bytes, bytes]],
) -> AsyncIterator[WebSocketConnection]:
    """A client websocket over ``stream``, closed (within a second) when the block ends,
    however it ends. One-message queue: a test sees back-pressure at once."""
    ws = await wrap_client_stream(
        nursery,
        stream,
        host,
        "/",
        subprotocols=subprotocols,
        extra_headers=headers,
        message_queue_size=1,
        max_message_size=1 << 26,
    )
    try:
        yield ws
    finally:
        with trio.move_on_after(1, shield=True):
            await ws.aclose()


@asynccontextmanager
async def serving_alice(
    agents: Mapping[str, ta.Agent], **kwargs: Any
) -> AsyncIterator[tuple[ControlServer, ControlClient]]:
    """A control server as :func:`serving` starts it, and Alice's client connected to it."""
    async with serving(agents, **kwargs) as (server, url), connect(url, token="tok-alice") as alice:
        yield server, alice


# Tools the agents of the control and hosting tests call.


@ta.function_tool
async def sleep_hour() -> str:
    """Sleep for an hour."""
    await trio.sleep(3600)
    return "woke"


@ta.function_tool(needs_approval=True)
async def launch() -> str:
    """Launch, once approved."""
    return "launched"
