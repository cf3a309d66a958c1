"""Server-Sent Events for every face that streams (REST's event streams, AG-UI).

:class:`EventStream` is a Starlette response that opens its source *before* it answers
— so a source that refuses (an unknown run: ``not_found``) is an ordinary JSON error,
not an empty stream — then writes the source's messages as they come, with a comment
line after ``keepalive_interval`` of silence, and ends when the source does.

Three tasks and one small buffer: a pump reads the source into a :class:`_Batch`
(at most ``_BATCH_BYTES``, plus the one message that crosses it), the writer sends
*everything the batch holds* in one body write, a watcher reads ``receive()`` for
``http.disconnect``. Writing per batch, not per message, is what makes a fast run
cheap to follow: each body write costs a task hop, Hypercorn's per-send work and a
socket write, and a model's network read (the host's log hands out every event that
is ready at one wake-up) often carries dozens of deltas, which now go in one write.
Order and ids are the source's (the batch only concatenates). A client that stops
reading blocks the writer, which the server's bounded socket writes (``_serve.py``)
cut after ``send_timeout`` — the watcher then hears the disconnect and the stream
ends, the run does not. The pump stops reading the source when the batch is full, so
the host's log, not this stream, holds what the client has not read yet (and says
``events.dropped`` when it lapses past retention).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, final

import trio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ._face import Face

__all__ = ["EventStream", "sse_message"]


def sse_message(data: Mapping[str, Any] | str, *, id: str | None = None) -> bytes:
    """One SSE message: an ``id:`` line if given, then ``data`` (a JSON object, or text
    already encoded) on ``data:`` lines, then the blank line that ends it."""
    head = "" if id is None else f"id: {id}\n"
    if not isinstance(data, str):
        # JSON escapes every line break inside strings: the text is one data line.
        text = _encode(data)
        return f"{head}data: {text}\n\n".encode()
    body = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"{head}{body}\n".encode()


_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode

# What the pump may read ahead of the socket: one body write's worth (a message larger
# than this still goes, alone).
_BATCH_BYTES = 64 * 1024


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
        batch = _Batch(_BATCH_BYTES)
        ended = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_watch, receive, nursery.cancel_scope)
            nursery.start_soon(_pump, messages, batch)
            # A comment first: the client sees the response (and its headers) at once.
            if not await _write(send, b": stream open\n\n", limits.send_timeout):
                nursery.cancel_scope.cancel()
                return
            while True:
                body: bytes | None = b": keep-alive\n\n"
                with trio.move_on_after(limits.keepalive_interval):
                    body = await batch.take()
                if body is None:
                    ended = True
                    break
                if not await _write(send, body, limits.send_timeout):
                    break
            nursery.cancel_scope.cancel()
        if ended:
            # The body's end is written out here, after the watcher is gone and shielded
            # (bounded by _write): inside this one send the server finishes the exchange
            # — it tells the app ``http.disconnect`` (which the watcher answered by
            # cancelling the nursery around this very send), then closes the connection
            # (HTTP/1.0, ``Connection: close``) or arms its keep-alive timer. Cut at its
            # first checkpoint, that work never happened: the socket stayed open for good.
            with trio.CancelScope(shield=True):
                await _write(send, b"", limits.send_timeout, more=False)


@final
class _Batch:
    """The messages the pump has read and the writer not yet taken: at most
    ``max_bytes`` (plus the one message that crosses it), handed over all at once."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.parts: list[bytes] = []
        self.size = 0
        self.ended = False
        self._filled = trio.lowlevel.ParkingLot()  # the writer waits for a message
        self._taken = trio.lowlevel.ParkingLot()  # the pump waits for room

    async def put(self, message: bytes) -> None:
        """Add ``message``; waits while the batch is full. No schedule point otherwise:
        the pump reads on until the source has nothing ready, then the writer runs."""
        while self.size >= self.max_bytes:
            await self._taken.park()
        self.parts.append(message)
        self.size += len(message)
        self._filled.unpark_all()

    def end(self) -> None:
        """The source ended: the writer takes what is left, then None."""
        self.ended = True
        self._filled.unpark_all()

    async def take(self) -> bytes | None:
        """Every message held, joined (one body write); None once the source ended
        and everything was taken. Waits while the batch is empty."""
        while not self.parts:
            if self.ended:
                return None
            await self._filled.park()
        body = b"".join(self.parts)
        self.parts = []
        self.size = 0
        self._taken.unpark_all()
        return body


async def _write(send: Send, body: bytes, bound: float, *, more: bool = True) -> bool:
    """Send one chunk; False if it did not go within ``bound`` (twice the socket's own
    bound: only reached under an ASGI server that does not bound its writes)."""
    with trio.move_on_after(2 * bound):
        await send({"type": "http.response.body", "body": body, "more_body": more})
        return True
    return False


async def _pump(messages: AsyncIterator[bytes], batch: _Batch) -> None:
    try:
        async for message in messages:
            await batch.put(message)
        batch.end()
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
