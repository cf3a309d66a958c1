"""Keeping a ``MockClock`` still while real work (threads, processes) happens.

``MockClock(autojump_threshold=0)`` jumps to the next deadline as soon as every task
is blocked, and a task waiting for a worker thread or a child process counts as
blocked: virtual time would race ahead of work that takes real time, and examples
would stop replaying exactly. While a hold is active the clock does not autojump.

A hold must never last forever, or a sync tool that ignores ``ctx.cancelled`` (and so
never returns) would freeze virtual time, and with it every cancel that could reach
it. :class:`ClockHoldingLimiter` therefore holds the clock for each worker thread for
at most ``hold_limit`` seconds of real time; a thread that runs longer is treated as
taking arbitrarily long (virtual time goes on while it runs). The holds of one
``trio.run`` live in a :class:`trio.lowlevel.RunVar`, so a hold that a leaked thread
never gives back dies with its run.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import final

import attrs
import trio
import trio.testing

from .. import ToolContext

__all__ = [
    "THREAD_PREFIX",
    "Borrow",
    "ClockHoldingLimiter",
    "acquire_hold",
    "current_thread_task_name",
    "hold_again",
    "hold_clock",
    "let_go_of_thread",
    "release_hold",
]

THREAD_PREFIX = "trio_agents.testing"
"""Names of the harness's own helper threads start with this (leak checks skip them)."""


@attrs.define(eq=False)
class _Holds:
    count: int
    threshold: float
    limiters: list[ClockHoldingLimiter] = attrs.Factory(list)


_HOLDS: trio.lowlevel.RunVar[_Holds] = trio.lowlevel.RunVar("trio_agents.testing.clock_holds")


def _mock_clock() -> trio.testing.MockClock | None:
    clock = trio.lowlevel.current_clock()
    return clock if isinstance(clock, trio.testing.MockClock) else None


def _holds() -> _Holds | None:
    clock = _mock_clock()
    if clock is None:
        return None
    try:
        return _HOLDS.get()
    except LookupError:
        holds = _Holds(0, clock.autojump_threshold)
        _HOLDS.set(holds)
        return holds


def acquire_hold() -> None:
    """On the Trio thread: hold a ``MockClock`` still until the matching
    :func:`release_hold` (holds nest; nothing without a ``MockClock``)."""
    clock, holds = _mock_clock(), _holds()
    if clock is None or holds is None:
        return
    if holds.count == 0:
        holds.threshold = clock.autojump_threshold
    holds.count += 1
    clock.autojump_threshold = math.inf


def release_hold() -> None:
    """Give back one :func:`acquire_hold`: the clock jumps again once none is left."""
    clock, holds = _mock_clock(), _holds()
    if clock is None or holds is None or holds.count == 0:
        return
    holds.count -= 1
    if holds.count == 0:
        clock.autojump_threshold = holds.threshold


@contextmanager
def hold_clock() -> Iterator[None]:
    """Inside the block (on the Trio thread), a ``MockClock`` does not autojump."""
    acquire_hold()
    try:
        yield
    finally:
        release_hold()


@attrs.define(eq=False)
class Borrow:
    """The clock hold of one worker thread of a :class:`ClockHoldingLimiter`."""

    task_name: str
    call_id: str | None = None
    holding: bool = True
    finished: bool = False  # its thread returned: never hold the clock for it again
    timer: threading.Timer | None = None
    # The tool call's context, if it could be seen: whether the call was cancelled and
    # whether the tool ever read ctx.cancelled (its event is made on first read).
    ctx: ToolContext | None = None
    expired: bool = False  # it ran past its hold: virtual time went on meanwhile


def _calling_tool_context() -> ToolContext | None:
    """The ``ToolContext`` of the tool call whose thread is being started, if it can be
    seen.

    Called from ``acquire_on_behalf_of``: the caller is ``trio.to_thread.run_sync``,
    whose ``sync_fn`` is the tool function with its ``ToolContext`` bound (when the
    tool takes one); above it, the run's own call path holds the call's context as
    ``ctx`` (when it does not). This looks at Trio's and the run's frames (an
    implementation detail); without them, threads are matched by task name only.
    """
    frame = inspect.currentframe()  # this function's; the search starts above its caller
    frame = frame.f_back if frame is not None else None
    for _ in range(8):  # acquire_on_behalf_of, trio's to_thread.run_sync, the run's call
        frame = frame.f_back if frame is not None else None
        if frame is None:
            return None
        local = frame.f_locals
        fn = local.get("sync_fn")
        while isinstance(fn, functools.partial):
            for value in (*fn.args, *fn.keywords.values()):
                if isinstance(value, ToolContext):
                    return value
            fn = fn.func
        ctx = local.get("ctx")
        if isinstance(ctx, ToolContext):
            return ctx
    return None


def _call_soon(token: trio.lowlevel.TrioToken, fn: object, *args: object) -> None:
    # Called from a timer thread: the run may be over by then.
    with contextlib.suppress(trio.RunFinishedError):
        token.run_sync_soon(fn, *args)  # type: ignore[arg-type]


@final
class ClockHoldingLimiter:
    """A thread limiter (for ``thread_limiter=``) that holds the clock while its
    threads run, for at most ``hold_limit`` real seconds each (None: no limit); it
    delegates the limiting to a :class:`trio.CapacityLimiter`.

    It also knows which of its threads are still running (:meth:`running`): Trio
    gives a limiter token back only when the thread itself has finished, even when
    the waiting task abandoned it.
    """

    def __init__(self, inner: trio.CapacityLimiter, *, hold_limit: float | None = None) -> None:
        self._inner = inner
        self._hold_limit = hold_limit
        self._borrows: dict[object, Borrow] = {}
        self._idle = threading.Event()
        self._idle.set()
        self._registered = False
        # (call id, description) of each thread that ignored its call's cancellation.
        self.ignored_cancels: list[tuple[str, str]] = []

    async def acquire_on_behalf_of(self, borrower: object) -> None:
        """Acquire a token; hold the clock until it is released (or the hold expires)."""
        await self._inner.acquire_on_behalf_of(borrower)
        if not self._registered:
            holds = _holds()
            if holds is not None:
                holds.limiters.append(self)
            self._registered = True
        ctx = _calling_tool_context()
        borrow = Borrow(
            trio.lowlevel.current_task().name, None if ctx is None else ctx.call_id, ctx=ctx
        )
        self._borrows[borrower] = borrow
        self._idle.clear()
        acquire_hold()
        if self._hold_limit is not None and _mock_clock() is not None:
            token = trio.lowlevel.current_trio_token()
            timer = threading.Timer(self._hold_limit, _call_soon, (token, self._expire, borrower))
            timer.name = f"{THREAD_PREFIX}: clock hold"
            timer.daemon = True
            borrow.timer = timer
            timer.start()

    def release_on_behalf_of(self, borrower: object) -> None:
        """Release the token and the hold."""
        self._inner.release_on_behalf_of(borrower)
        borrow = self._borrows.pop(borrower, None)
        if borrow is not None:
            borrow.finished = True
            self._check_cancel_read(borrow)
            if borrow.timer is not None:
                borrow.timer.cancel()
            self._let_go(borrow)
        if not self._borrows:
            self._idle.set()

    def _expire(self, borrower: object) -> None:
        borrow = self._borrows.get(borrower)
        if borrow is not None:
            borrow.expired = True
            self._let_go(borrow)

    def _check_cancel_read(self, borrow: Borrow) -> None:
        """A thread that ran past its hold, whose call was cancelled meanwhile, and
        that returned without ever reading ``ctx.cancelled`` (its event is made on the
        first read) ignored the cancellation: recorded whatever the grace, so a tool
        that ignores it for 3 s is found as surely as one that never returns. Only
        threads past their hold: a cancel can reach a thread that still holds the clock
        only by landing at the same virtual instant, which real timing decides."""
        ctx = borrow.ctx
        if ctx is None or not borrow.expired or not ctx._is_cancelled or ctx._event is not None:
            return
        self.ignored_cancels.append(
            (
                ctx.call_id,
                f"the worker thread of tool call {ctx.call_id!r} ({ctx.tool_name!r}, task"
                f" {borrow.task_name!r}) returned after its call was cancelled, never having"
                " read ctx.cancelled",
            )
        )

    def _let_go(self, borrow: Borrow) -> None:
        if borrow.holding:
            borrow.holding = False
            release_hold()

    def let_go(self) -> None:
        """Stop holding the clock for every thread (the run abandoned them)."""
        for borrow in self._borrows.values():
            self._let_go(borrow)

    def let_go_of_one(self, call_id: str | None, task_name: str | None) -> Borrow | None:
        """Stop holding the clock for the thread of tool call ``call_id`` (if it is
        known), else for one of a task named ``task_name`` (the latest such), else for
        the latest one; return its borrow."""
        holding = [b for b in self._borrows.values() if b.holding]
        exact = [b for b in holding if call_id is not None and b.call_id == call_id]
        named = [b for b in holding if b.task_name == task_name]
        chosen = (exact or named or holding)[-1:]
        for borrow in chosen:
            self._let_go(borrow)
        return chosen[0] if chosen else None

    def running(self) -> list[str]:
        """The names of the tasks whose worker threads are still running (call it on
        the Trio thread)."""
        return [borrow.task_name for borrow in self._borrows.values()]

    @property
    def idle(self) -> bool:
        """Whether none of its threads runs (safe from any thread)."""
        return self._idle.is_set()

    def wait_idle(self, timeout: float) -> bool:
        """Block (real time, from a worker thread) until no thread of ours runs."""
        return self._idle.wait(timeout)


def hold_again(borrow: Borrow) -> None:
    """Hold the clock for a thread again (on the Trio thread): it stopped waiting for
    the harness and works until it returns."""
    if not borrow.holding and not borrow.finished:
        # (A thread that already returned would never give the hold back: the clock
        # would stand still for the rest of the run.)
        borrow.holding = True
        acquire_hold()


def let_go_of_thread(call_id: str | None, task_name: str | None) -> Borrow | None:
    """On the Trio thread: stop holding the clock for the worker thread of tool call
    ``call_id`` (see :meth:`ClockHoldingLimiter.let_go_of_one`)."""
    holds = _holds()
    if holds is None:
        return None
    for limiter in holds.limiters:
        borrow = limiter.let_go_of_one(call_id, task_name)
        if borrow is not None:
            return borrow
    return None


def current_thread_task_name() -> str | None:
    """In a worker thread started by ``trio.to_thread.run_sync``: the name of the task
    that started it (Trio names worker threads ``"<fn> from <task name>"``)."""
    name = threading.current_thread().name
    return name.split(" from ", 1)[1] if " from " in name else None
