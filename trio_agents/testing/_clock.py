"""Keeping a ``MockClock`` still while real work (threads, processes) happens.

``MockClock(autojump_threshold=0)`` jumps to the next deadline as soon as every task
is blocked, and a task waiting for a worker thread or a child process counts as
blocked: virtual time would race ahead of work that takes real time, and examples
would stop replaying exactly. While a hold is active the clock does not autojump.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import final

import trio
import trio.testing

__all__ = ["ClockHoldingLimiter", "hold_clock"]

_holds: dict[int, tuple[int, float]] = {}


def _mock_clock() -> trio.testing.MockClock | None:
    clock = trio.lowlevel.current_clock()
    return clock if isinstance(clock, trio.testing.MockClock) else None


def _acquire() -> None:
    clock = _mock_clock()
    if clock is None:
        return
    count, threshold = _holds.get(id(clock), (0, clock.autojump_threshold))
    _holds[id(clock)] = (count + 1, threshold)
    clock.autojump_threshold = math.inf


def _release() -> None:
    clock = _mock_clock()
    if clock is None or id(clock) not in _holds:
        return
    count, threshold = _holds[id(clock)]
    if count <= 1:
        del _holds[id(clock)]
        clock.autojump_threshold = threshold
    else:
        _holds[id(clock)] = (count - 1, threshold)


@contextmanager
def hold_clock() -> Iterator[None]:
    """Inside the block (on the Trio thread), a ``MockClock`` does not autojump."""
    _acquire()
    try:
        yield
    finally:
        _release()


@final
class ClockHoldingLimiter:
    """A thread limiter (for ``thread_limiter=``) that holds the clock while its
    threads run; it delegates the limiting to a :class:`trio.CapacityLimiter`."""

    def __init__(self, inner: trio.CapacityLimiter) -> None:
        self._inner = inner

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        """Acquire a token; hold the clock until it is released."""
        await self._inner.acquire_on_behalf_of(borrower)
        _acquire()

    def release_on_behalf_of(self, borrower: object) -> None:
        """Release the token and the hold."""
        self._inner.release_on_behalf_of(borrower)
        _release()
