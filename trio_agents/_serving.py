"""Trio services and the streams they write: run a service for a block, close a
server's listeners, send within a bound. What the hosts, the websocket channel and the
HTTP faces share."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TypeVar

import trio

from ._exception_groups import first_leaf, leaves, only_cancelled

_T = TypeVar("_T")

__all__ = ["closing_listeners", "send_within", "serving"]


@asynccontextmanager
async def serving(start: Callable[[trio.Nursery], Awaitable[_T]]) -> AsyncIterator[_T]:
    """Run a service for the duration of the block: ``start(nursery)`` starts it (and
    returns what the block gets); leaving the block cancels it, and the service's own
    graceful shutdown runs. An exception of the block propagates as itself (not in a
    group), as does one of the service; a group of nothing but ``Cancelled`` becomes its
    first ``Cancelled``. What ``open_control_server`` and ``LocalHost.running`` share."""
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            started = await start(nursery)
            try:
                yield started
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        others = [
            leaf
            for leaf in leaves(group)
            if leaf is not body_error and not isinstance(leaf, trio.Cancelled)
        ]
        if others:
            raise
        if body_error is not None:
            raise body_error from None
        raise first_leaf(group) from None


@asynccontextmanager
async def closing_listeners(listeners: Sequence[trio.SocketListener]) -> AsyncIterator[None]:
    """The body of a server on ``listeners``: a group of nothing but ``Cancelled`` leaves
    it as its first ``Cancelled`` (the cancellation that stopped the server), anything
    else as it is; the listeners are closed at the end, shielded, also when the server
    failed before it served them. What ``ControlServer.serve`` and ``serve_http`` share."""
    try:
        yield
    except BaseExceptionGroup as group:
        if only_cancelled(group):
            raise first_leaf(group) from None
        raise
    finally:
        with trio.CancelScope(shield=True):
            for listener in listeners:
                await listener.aclose()


async def send_within(
    inner: trio.abc.SendStream, data: bytes | bytearray | memoryview, bound: float
) -> bool:
    """``inner.send_all(data)`` bounded by ``bound`` seconds: True if it was sent; False if the
    peer read nothing for that long, and ``inner`` is then closed (shielded).
    An exception of the send propagates. The send of the websocket channel's
    ``GuardedStream`` and of the HTTP faces' listener; each marks itself broken on
    anything but True, so nothing is written after half a write."""
    with trio.move_on_after(bound) as timer:
        await inner.send_all(data)
    if not timer.cancelled_caught:
        return True
    with trio.CancelScope(shield=True):
        await inner.aclose()
    return False
