"""A stream wrapper that refuses to be reused after an interrupted send.

trio-websocket writes each frame with one ``send_all``. If that call is cancelled (a
send timeout, a ping timeout, a shutdown bound), part of the frame may already be on
the wire, and anything sent afterwards would be read as the rest of it. Once a
``send_all`` ends with an exception, :class:`GuardedStream` marks itself broken and
every later ``send_all`` raises :class:`trio.BrokenResourceError`, which trio-websocket
turns into an abnormal close (1006) instead of writing after half a frame.

Every ``send_all`` is also bounded by ``send_timeout``: trio-websocket writes pongs (and
close frames) from its own reader task, outside the server's writer, so a peer that
floods pings and never reads would otherwise block that task — and the connection —
forever. A send still blocked after ``send_timeout`` closes the stream (``stalled``
is set); every task using it then fails at once and the connection ends.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import final

import trio

from .._serving import send_within

__all__ = ["GuardedStream"]


@final
class GuardedStream(trio.abc.Stream):
    """Wraps ``inner``; after a failed or cancelled ``send_all`` nothing more is sent,
    and a ``send_all`` blocked for ``send_timeout`` seconds aborts the stream."""

    def __init__(self, inner: trio.abc.Stream, send_timeout: float = math.inf) -> None:
        self.inner = inner
        self.send_timeout = send_timeout
        self.broken = False
        self.stalled = False
        # Called once when the peer ends the stream (EOF or a receive error): a client
        # waiting for the websocket handshake must not wait forever (trio-websocket
        # never completes or fails the handshake when the server closes mid-way).
        self.on_peer_closed: Callable[[], None] | None = None

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data``; raises ``BrokenResourceError`` once a send was interrupted or
        stayed blocked past ``send_timeout`` (the stream is then closed)."""
        if self.broken:
            await trio.lowlevel.checkpoint()
            raise trio.BrokenResourceError("a previous send was interrupted mid-frame")
        try:
            sent = await send_within(self.inner, data, self.send_timeout)
        except BaseException:
            self.broken = True
            raise
        if not sent:
            self.broken = self.stalled = True
            raise trio.BrokenResourceError(
                f"the peer read nothing for {self.send_timeout:g} s; connection aborted"
            )

    async def wait_send_all_might_not_block(self) -> None:
        """Delegate to the wrapped stream."""
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """Delegate to the wrapped stream (calling ``on_peer_closed`` at its end)."""
        try:
            data = await self.inner.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._peer_closed()
            raise
        if not data:
            self._peer_closed()
        return data

    def _peer_closed(self) -> None:
        callback, self.on_peer_closed = self.on_peer_closed, None
        if callback is not None:
            callback()

    async def aclose(self) -> None:
        """Close the wrapped stream (idempotent)."""
        self.broken = True
        await self.inner.aclose()
