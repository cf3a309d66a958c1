"""Server-Sent Events for every face that streams (REST's event streams, AG-UI).

:class:`EventStream` is a Starlette response that opens its source *before* it answers
— so a source that refuses (an unknown run: ``not_found``) is an ordinary JSON error,
not an empty stream — then writes the source's messages as they come, with a comment
line after ``keepalive_interval`` of silence, and ends when the source does.

Three tasks, no buffer: a pump reads the source into an unbuffered channel, the writer
sends, a watcher reads ``receive()`` for ``http.disconnect``. So a stream holds at most
one message beyond what the socket has taken; a client that stops reading blocks the
writer, which the server's bounded socket writes (``_serve.py``) cut after
``send_timeout`` — the watcher then hears the disconnect and the stream ends, the run
does not. The source is never iterated while a write is pending, so the host's log, not
this stream, holds what the client has not read yet (and says ``events.dropped`` when it
lapses past retention).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, final

import trio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ._app import Face

__all__ = ["EventStream", "sse_message"]


def sse_message(data: Mapping[str, Any] | str, *, id: str | None = None) -> bytes:
    """One SSE message: an ``id:`` line if given, then ``data`` (a JSON object, or text
    already encoded) on ``data:`` lines, then the blank line that ends it."""
    text = (
        data
        if isinstance(data, str)
        else json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    )
    lines = [] if id is None else [f"id: {id}"]
    lines.extend(f"data: {line}" for line in text.split("\n"))
    return ("\n".join(lines) + "\n\n").encode("utf-8")


_HEADERS = {
    "Cache-Control": "no-store",
    # nginx and friends buffer responses unless told not to.
    "X-Accel-Buffering": "no",
}


@final
class EventStream(Response):
    """An SSE response over ``source()``, an async context manager yielding an async
    iterator of ready SSE messages (:func:`sse_message`). Entered before the response
    starts (its errors become JSON errors); counted against the principal's
    ``max_streams_per_principal``.
    """

    media_type = "text/event-stream"

    def __init__(
        self,
        face: Face,
        principal: str,
        source: Callable[[], AbstractAsyncContextManager[AsyncIterator[bytes]]],
        *,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.face = face
        self.principal = principal
        self.source = source
        self.status_code = 200
        self.background = None
        self.init_headers({**_HEADERS, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        uncount = self.face.open_stream(self.principal)
        try:
            async with self.source() as messages:
                await send(
                    {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
                )
                await self._stream(messages, receive, send)
        finally:
            uncount()

    async def _stream(self, messages: AsyncIterator[bytes], receive: Receive, send: Send) -> None:
        limits = self.face.limits
        # A comment first: the client sees the response (and its headers) at once.
        ended = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch, receive, nursery.cancel_scope)
            to_writer, from_pump = trio.open_memory_channel[bytes](0)
            nursery.start_soon(_pump, messages, to_writer)
            if not await _write(send, b": stream open\n\n", limits.send_timeout):
                nursery.cancel_scope.cancel()
                return
            async with from_pump:
                while True:
                    message = b": keep-alive\n\n"
                    with trio.move_on_after(limits.keepalive_interval):
                        try:
                            message = await from_pump.receive()
                        except trio.EndOfChannel:
                            ended = True
                            break
                    if not await _write(send, message, limits.send_timeout):
                        break
            if ended:
                await _write(send, b"", limits.send_timeout, more=False)
            nursery.cancel_scope.cancel()


async def _write(send: Send, body: bytes, bound: float, *, more: bool = True) -> bool:
    """Send one chunk; False if it did not go within ``bound`` (twice the socket's own
    bound: only reached under an ASGI server that does not bound its writes)."""
    with trio.move_on_after(2 * bound):
        await send({"type": "http.response.body", "body": body, "more_body": more})
        return True
    return False


async def _pump(messages: AsyncIterator[bytes], to_writer: trio.MemorySendChannel[bytes]) -> None:
    try:
        async with to_writer:
            async for message in messages:
                await to_writer.send(message)
    finally:
        # An async generator left suspended would be finalized later, by the garbage
        # collector; close it here, in this task, while the source is still open.
        close = getattr(messages, "aclose", None)
        if close is not None:
            with trio.CancelScope(shield=True):
                await close()


async def _watch(receive: Receive, scope: trio.CancelScope) -> None:
    """End the stream when the client goes away (the request body, if any, is
    already read: an event stream is a GET)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return
