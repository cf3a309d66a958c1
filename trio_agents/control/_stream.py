"""A stream wrapper that refuses to be reused after an interrupted send.

trio-websocket writes each frame with one ``send_all``. If that call is cancelled (a
send timeout, a ping timeout, a shutdown bound), part of the frame may already be on
the wire, and anything sent afterwards would be read as the rest of it. Once a
``send_all`` ends with an exception, :class:`GuardedStream` marks itself broken and
every later ``send_all`` raises :class:`trio.BrokenResourceError`, which trio-websocket
turns into an abnormal close (1006) instead of writing after half a frame.
"""

from __future__ import annotations

from typing import final

import trio

__all__ = ["GuardedStream"]


@final
class GuardedStream(trio.abc.Stream):
    """Wraps ``inner``; after a failed or cancelled ``send_all`` nothing more is sent."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.broken = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data``; raises ``BrokenResourceError`` once a send was interrupted."""
        if self.broken:
            await trio.lowlevel.checkpoint()
            raise trio.BrokenResourceError("a previous send was interrupted mid-frame")
        try:
            await self.inner.send_all(data)
        except BaseException:
            self.broken = True
            raise

    async def wait_send_all_might_not_block(self) -> None:
        """Delegate to the wrapped stream."""
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        """Delegate to the wrapped stream."""
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        """Close the wrapped stream (idempotent)."""
        self.broken = True
        await self.inner.aclose()
