"""Controllable fake tools that report what happened to them.

Every fake tool writes one :class:`CallRecord` per call into a shared
:class:`ToolRecorder`: when it started, and whether it finished, failed or was
cancelled. The tools are ordinary :class:`~trio_agents.Tool` objects (made with
:func:`~trio_agents.function_tool`), so a run treats them like any other tool.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeAlias, final

import attrs
import trio

from .. import Tool, ToolContext, function_tool
from ._clock import (
    Borrow,
    acquire_hold,
    current_thread_task_name,
    hold_again,
    hold_clock,
    let_go_of_thread,
    release_hold,
)

__all__ = [
    "GARBAGE",
    "HOSTILE_TEXTS",
    "BrokenStrError",
    "CallBook",
    "CallRecord",
    "FakeToolError",
    "ToolRecorder",
    "blocking_tool",
    "book_of",
    "broken_str_tool",
    "failing_tool",
    "garbage_tool",
    "hostile_text_tool",
    "process_tool",
    "shielding_tool",
    "sleeping_tool",
    "stray_cancel_tool",
    "stray_cancelled",
    "stubborn_thread_tool",
    "swallowing_tool",
    "thread_tool",
]

CallState: TypeAlias = Literal["running", "finished", "failed", "cancelled"]
"""What a fake tool call is doing: still ``running``, or how it ended."""

ToolFault: TypeAlias = Literal["swallow", "stray_cancel", "shield", "garbage", "stubborn"]
"""The deliberate misbehaviour of a fault tool (see :attr:`CallRecord.fault`)."""

ApprovalPolicy: TypeAlias = bool | Callable[[Mapping[str, Any]], bool]


class FakeToolError(Exception):
    """What :func:`failing_tool` raises (the model reads ``error: FakeToolError: ...``)."""


@final
@attrs.define(eq=False)
class CallRecord:
    """What happened to one call of a fake tool.

    Attributes:
        tool: the tool's name.
        call_id: the id of the tool call.
        run_id: the id of the run that made the call.
        kind: ``"async"``, ``"thread"`` or ``"process"``.
        started_at: Trio time when the call started (None for thread tools, which
            cannot read the Trio clock).
        state: ``"running"``, ``"finished"``, ``"failed"`` or ``"cancelled"``.
        ended_at: Trio time when the call ended (None while running, and for thread
            tools).
        fault: for the fault tools, how the call misbehaves on purpose (the checker
            does not blame the run for what the tool itself does wrong); else None.
    """

    tool: str
    call_id: str
    run_id: str
    kind: str
    started_at: float | None
    state: CallState = "running"
    ended_at: float | None = None
    fault: ToolFault | None = None


@final
@attrs.define(eq=False)
class CallBook:
    """The fake tools' side of a :class:`ToolRecorder` (package-internal): the records
    they write, and the release they wait for. Thread tools write from their thread,
    under :attr:`lock`."""

    calls: list[CallRecord] = attrs.field(init=False, factory=list)
    lock: threading.Lock = attrs.field(init=False, factory=threading.Lock)
    released: bool = attrs.field(init=False, default=False)
    release_event: trio.Event | None = attrs.field(init=False, default=None)
    # What thread tools wait on (a new one per example: a thread left from the last
    # example waits on its own).
    thread_release: threading.Event = attrs.field(init=False, factory=threading.Event)
    waiting_threads: list[Borrow] = attrs.field(init=False, factory=list)
    thread_done: threading.Condition = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.thread_done = threading.Condition(self.lock)

    def start(
        self, tool: str, ctx: ToolContext, kind: str, fault: ToolFault | None = None
    ) -> CallRecord:
        """Record that a call started (a thread tool's, with no Trio time)."""
        at = trio.current_time() if kind != "thread" else None
        record = CallRecord(tool, ctx.call_id, ctx.run_id, kind, at, fault=fault)
        with self.lock:
            self.calls.append(record)
        return record

    def end(self, record: CallRecord, state: CallState) -> None:
        """Record how a call ended."""
        at = trio.current_time() if record.kind != "thread" else None
        with self.thread_done:
            record.state = state
            record.ended_at = at
            self.thread_done.notify_all()

    def thread_waits(self, call_id: str, task_name: str | None) -> None:
        """On the Trio thread, for a thread tool about to wait for the release:
        let the clock move while it waits (unless it is released already)."""
        if self.released:
            return
        borrow = let_go_of_thread(call_id, task_name)
        if borrow is not None:
            self.waiting_threads.append(borrow)

    async def wait_released(self) -> None:
        """Wait (an async tool) until the release."""
        if self.released:
            await trio.lowlevel.checkpoint()
            return
        if self.release_event is None:
            self.release_event = trio.Event()
        await self.release_event.wait()


@final
@attrs.define(eq=False)
class ToolRecorder:
    """The shared record of every call of the fake tools built with it.

    :func:`~trio_agents.testing.run_schedule` calls :meth:`reset` before each example,
    and its ``release`` operation calls :meth:`release`. All methods are meant for the
    Trio thread, except that thread tools update their records from their thread
    (under a lock).
    """

    # What the fake tools built with this recorder write into (see book_of).
    _book: CallBook = attrs.field(init=False, factory=CallBook)

    @property
    def calls(self) -> tuple[CallRecord, ...]:
        """Every call so far, in start order."""
        with self._book.lock:
            return tuple(self._book.calls)

    def running(self) -> tuple[CallRecord, ...]:
        """The calls that have not ended."""
        return tuple(c for c in self.calls if c.state == "running")

    def by_call_id(self, call_id: str) -> CallRecord | None:
        """The record of the call ``call_id`` (the last one, if several runs used it)."""
        for record in reversed(self.calls):
            if record.call_id == call_id:
                return record
        return None

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called since the last :meth:`reset`."""
        return self._book.released

    def release(self) -> None:
        """Let every waiting (and every future) :func:`blocking_tool` and
        :func:`stubborn_thread_tool` call finish."""
        book = self._book
        book.released = True
        # The threads waiting for this work again until they return: hold the clock
        # for them in this very tick, before it can jump.
        for borrow in book.waiting_threads:
            hold_again(borrow)
        book.waiting_threads.clear()
        book.thread_release.set()
        if book.release_event is not None:
            book.release_event.set()

    def reset(self) -> None:
        """Forget all calls and un-release the blocking tools (between examples)."""
        book = self._book
        with book.lock:
            book.calls.clear()
        book.released = False
        book.release_event = None
        book.thread_release = threading.Event()
        book.waiting_threads = []

    def wait_for_threads(self, timeout: float) -> bool:
        """Block (in real time, up to ``timeout`` s) until no thread-tool call runs.

        Returns True if none is left running. Call it from a worker thread
        (``trio.to_thread.run_sync``), never from the Trio thread.
        """
        book = self._book
        with book.thread_done:
            return book.thread_done.wait_for(
                lambda: all(c.state != "running" for c in book.calls if c.kind == "thread"),
                timeout,
            )


def book_of(recorder: ToolRecorder) -> CallBook:
    """What the fake tools built with ``recorder`` record into: the one way in to the
    recorder's private side, for this module's tools."""
    return recorder._book


def _only_cancelled(exc: object) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_cancelled(e) for e in exc.exceptions)
    return False


class _Recording:
    """Context manager: record how an async call ends (Cancelled → cancelled)."""

    def __init__(
        self,
        book: CallBook,
        name: str,
        ctx: ToolContext,
        kind: str,
        fault: ToolFault | None = None,
    ) -> None:
        self._book = book
        self._record = book.start(name, ctx, kind, fault)

    def __enter__(self) -> CallRecord:
        return self._record

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        if exc_type is None:
            state: CallState = "finished"
        elif _only_cancelled(exc):
            state = "cancelled"
        else:
            state = "failed"
        self._book.end(self._record, state)


def blocking_tool(
    recorder: ToolRecorder,
    *,
    name: str = "block",
    timeout: float | None = None,
    needs_approval: ApprovalPolicy = False,
) -> Tool:
    """An async tool that waits until ``recorder.release()`` or until it is cancelled.

    It takes no arguments and returns ``"released"``. A run of
    :func:`~trio_agents.testing.run_schedule` releases it when the schedule says
    ``release`` and once the schedule is over.
    """

    book = book_of(recorder)

    async def block(ctx: ToolContext) -> str:
        """Wait until released."""
        with _Recording(book, name, ctx, "async"):
            await book.wait_released()
            return "released"

    return function_tool(block, name=name, timeout=timeout, needs_approval=needs_approval)


def sleeping_tool(
    recorder: ToolRecorder,
    *,
    name: str = "sleep",
    timeout: float | None = None,
    needs_approval: ApprovalPolicy = False,
) -> Tool:
    """An async tool ``sleep(seconds: float)`` that sleeps in Trio time, then returns."""

    book = book_of(recorder)

    async def sleep(ctx: ToolContext, seconds: float) -> str:
        """Sleep for a while.

        Args:
            seconds: how long to sleep.
        """
        with _Recording(book, name, ctx, "async"):
            await trio.sleep(seconds)
            return f"slept {seconds:g} s"

    return function_tool(sleep, name=name, timeout=timeout, needs_approval=needs_approval)


def failing_tool(
    recorder: ToolRecorder,
    *,
    name: str = "fail",
    timeout: float | None = None,
    needs_approval: ApprovalPolicy = False,
) -> Tool:
    """An async tool ``fail(after: float = 0)`` that raises :class:`FakeToolError`.

    It sleeps ``after`` seconds first (Trio time).
    """

    book = book_of(recorder)

    async def fail(ctx: ToolContext, after: float = 0.0) -> str:
        """Fail after a while.

        Args:
            after: seconds to wait before failing.
        """
        with _Recording(book, name, ctx, "async"):
            await trio.sleep(after)
            raise FakeToolError(f"{name} failed on purpose")

    return function_tool(fail, name=name, timeout=timeout, needs_approval=needs_approval)


def thread_tool(
    recorder: ToolRecorder,
    *,
    name: str = "crunch",
    timeout: float | None = None,
    needs_approval: ApprovalPolicy = False,
    step_seconds: float = 0.0002,
) -> Tool:
    """A sync tool ``crunch(steps: int)`` that works in a worker thread.

    Each step waits ``step_seconds`` of real time on ``ctx.cancelled``; once that event
    is set the call stops at once and records ``cancelled``. Its record has no Trio
    times (a worker thread cannot read the Trio clock).
    """

    book = book_of(recorder)

    def crunch(ctx: ToolContext, steps: int) -> str:
        """Crunch numbers in a thread.

        Args:
            steps: how many steps to take.
        """
        record = book.start(name, ctx, "thread")
        state: CallState = "failed"
        try:
            for _ in range(steps):
                if ctx.cancelled.wait(step_seconds):
                    state = "cancelled"
                    return "stopped"
            state = "finished"
            return f"crunched {steps} steps"
        finally:
            book.end(record, state)

    return function_tool(crunch, name=name, timeout=timeout, needs_approval=needs_approval)


class _Teardown:
    """Holds the clock from the moment a process call is cancelled until it ends."""

    def __init__(self) -> None:
        self.done = False
        self.held = False

    async def watch(self) -> None:
        try:
            await trio.sleep_forever()
        finally:
            if not self.done:
                self.held = True
                acquire_hold()

    def release(self) -> None:
        if self.held:
            self.held = False
            release_hold()


def process_tool(
    recorder: ToolRecorder,
    *,
    name: str = "proc",
    timeout: float | None = None,
    needs_approval: ApprovalPolicy = False,
) -> Tool:
    """An async tool ``proc(seconds: float)`` that runs a child process for ``seconds``.

    The child is a Python interpreter sleeping in *real* time, started with
    ``ctx.run_process``, so it is killed with the call. POSIX only. A child of at most
    1 s holds a ``MockClock`` still while it runs (it is part of the tick); under a
    longer one the Trio clock keeps jumping, so use it with ``0`` (a child that exits
    at once) or a long time (one that must be killed). Once the call is cancelled the
    clock is held until the child is dead, so the kill costs no virtual time.
    """

    book = book_of(recorder)

    async def proc(ctx: ToolContext, seconds: float) -> str:
        """Run a child process.

        Args:
            seconds: how long the child sleeps (real time).
        """
        with _Recording(book, name, ctx, "process"):
            code = f"import time; time.sleep({float(seconds)!r})"
            teardown = _Teardown()
            try:
                # A short child is part of the tick: keep a MockClock still meanwhile.
                # A long one lets the clock run, but once cancelled, killing it is
                # part of the cancel's tick too (see _Teardown).
                with hold_clock() if seconds <= 1 else contextlib.nullcontext():
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(teardown.watch)
                        await ctx.run_process([sys.executable, "-c", code], grace=0.1)
                        teardown.done = True
                        nursery.cancel_scope.cancel()
            finally:
                teardown.release()
            return f"child slept {seconds:g} s"

    return function_tool(proc, name=name, timeout=timeout, needs_approval=needs_approval)


# ------------------------------------------------------------------ fault tools
#
# Tools that misbehave on purpose, the way real user code does. The checker knows
# them by ``CallRecord.fault``: it does not report what the tool itself does wrong
# (a swallowed cancellation), only what the run makes of it.


async def stray_cancelled() -> trio.Cancelled:
    """A ``trio.Cancelled`` that belongs to no scope of the caller (as when one is
    re-raised from a shared service nursery): raising it later makes it stray."""
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as exc:
            # Deliberately not re-raised: the fault is to raise it somewhere else.
            return exc
    raise AssertionError("unreachable: the scope was cancelled")  # pragma: no cover


def swallowing_tool(recorder: ToolRecorder, *, name: str = "swallow") -> Tool:
    """An async tool ``swallow(seconds: float)`` that sleeps and, if cancelled,
    swallows ``trio.Cancelled`` and returns ``"swallowed"`` (fault ``"swallow"``)."""

    book = book_of(recorder)

    async def swallow(ctx: ToolContext, seconds: float) -> str:
        """Sleep; never admit a cancellation.

        Args:
            seconds: how long to sleep.
        """
        record = book.start(name, ctx, "async", "swallow")
        try:
            await trio.sleep(seconds)
        except trio.Cancelled:
            book.end(record, "cancelled")
            return "swallowed"  # the bug, on purpose
        book.end(record, "finished")
        return f"slept {seconds:g} s"

    return function_tool(swallow, name=name)


def stray_cancel_tool(recorder: ToolRecorder, *, name: str = "stray") -> Tool:
    """An async tool ``stray(after: float)`` that sleeps ``after`` seconds, then raises
    a stray ``trio.Cancelled`` that no scope of the run cancelled (fault
    ``"stray_cancel"``)."""

    book = book_of(recorder)

    async def stray(ctx: ToolContext, after: float = 0.0) -> str:
        """Raise a cancellation that belongs to nobody.

        Args:
            after: seconds to wait first.
        """
        with _Recording(book, name, ctx, "async", "stray_cancel"):
            await trio.sleep(after)
            raise await stray_cancelled()

    return function_tool(stray, name=name)


def shielding_tool(recorder: ToolRecorder, *, name: str = "shield") -> Tool:
    """An async tool ``shield(seconds: float)`` that sleeps in a shielded scope, so a
    cancel reaches it only once the sleep is over (fault ``"shield"``).

    After the shield it checkpoints, so it then ends ``cancelled`` like a well-behaved
    tool. Its ``ended_at`` is when the shield ended: the run cannot leave its scope
    before, so the checker measures the cleanup bound from then.
    """

    book = book_of(recorder)

    async def shield(ctx: ToolContext, seconds: float) -> str:
        """Work in a shield that a cancel cannot interrupt.

        Args:
            seconds: how long the shielded work takes.
        """
        with _Recording(book, name, ctx, "async", "shield"):
            with trio.CancelScope(shield=True):
                await trio.sleep(seconds)
            await trio.lowlevel.checkpoint()
            return f"shielded {seconds:g} s"

    return function_tool(shield, name=name)


class _Unprintable:
    """An object that cannot be turned into text at all."""

    def __str__(self) -> str:
        raise RuntimeError("this object cannot be printed")

    __repr__ = __str__


GARBAGE: tuple[Callable[[], object], ...] = (
    lambda: {"when": object()},  # a dict JSON cannot encode
    lambda: b"\xff\xfe raw bytes",
    lambda: math.nan,
    lambda: {1, 2, frozenset({3})},
    _Unprintable,
)
"""What :func:`garbage_tool` returns, by ``kind``: values no JSON encoder takes."""


def garbage_tool(recorder: ToolRecorder, *, name: str = "garbage") -> Tool:
    """An async tool ``garbage(kind: int)`` that returns a value that is not
    JSON-serialisable (``GARBAGE[kind % len(GARBAGE)]``, one of them not even
    printable) instead of text (fault ``"garbage"``)."""

    book = book_of(recorder)

    async def garbage(ctx: ToolContext, kind: int) -> Any:
        """Return something that is not text.

        Args:
            kind: which kind of garbage.
        """
        with _Recording(book, name, ctx, "async", "garbage"):
            await trio.lowlevel.checkpoint()
            return GARBAGE[kind % len(GARBAGE)]()

    return function_tool(garbage, name=name)


def stubborn_thread_tool(
    recorder: ToolRecorder, *, name: str = "stubborn", patience: float = 30.0
) -> Tool:
    """A sync tool ``stubborn()`` whose thread ignores ``ctx.cancelled``: it waits until
    ``recorder.release()`` (at most ``patience`` real seconds) and returns ``"done"``
    even if the run abandoned it long before (fault ``"stubborn"``).

    While it waits, the ``MockClock`` moves (it waits for the harness, which acts in
    virtual time), so cancels reach the run while the thread still runs.
    """

    book = book_of(recorder)

    def stubborn(ctx: ToolContext) -> str:
        """Work in a thread that does not listen to cancellation."""
        record = book.start(name, ctx, "thread", "stubborn")
        release = book.thread_release
        try:
            with contextlib.suppress(RuntimeError, trio.Cancelled, trio.RunFinishedError):
                trio.from_thread.run_sync(
                    book.thread_waits, ctx.call_id, current_thread_task_name()
                )
            release.wait(patience)  # never looks at ctx.cancelled: the fault
        finally:
            book.end(record, "finished")
        return "done"

    return function_tool(stubborn, name=name)


# ------------------------------------------------------------------ hostile text

HOSTILE_TEXTS: tuple[str, ...] = (
    "r\udce9sum\udce9.pdf",  # os.fsdecode() of a Latin-1 file name: lone low surrogates
    "smile \ud83d",  # an emoji's high half, its low half lost
    "\ude00 alone",  # a low half alone
    "\ud83d\ude00",  # both halves as two code points (one character once joined)
    "nul \x00 inside",
    "x" * 100_000,  # huge
)
"""Text no UTF-8 encoder takes as is (and some it does, but few expect): what
:func:`hostile_text_tool` returns, and what :func:`~trio_agents.testing.hostile_items`
and ``scripts(hostile_text=True)`` stream and inject."""


def hostile_text_tool(recorder: ToolRecorder, *, name: str = "hostile") -> Tool:
    """An async tool ``hostile(kind: int, echo: str = "")`` that returns
    ``HOSTILE_TEXTS[kind % len(HOSTILE_TEXTS)] + echo``: lone surrogates, a split pair,
    NUL, 100,000 characters. The run must hand it to the model and the session in a
    form they accept (the tool itself behaves: it is no fault tool)."""

    book = book_of(recorder)

    async def hostile(ctx: ToolContext, kind: int, echo: str = "") -> str:
        """Return text that is hard to encode.

        Args:
            kind: which text.
            echo: appended as given (a model may send JSON-escaped surrogates).
        """
        with _Recording(book, name, ctx, "async"):
            await trio.lowlevel.checkpoint()
            return HOSTILE_TEXTS[kind % len(HOSTILE_TEXTS)] + echo

    return function_tool(hostile, name=name)


class BrokenStrError(Exception):
    """What :func:`broken_str_tool` raises: an exception whose ``str()`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("BrokenStrError.__str__ raised on purpose")


def broken_str_tool(
    recorder: ToolRecorder, *, name: str = "brokenstr", thread: bool = False
) -> Tool:
    """A tool ``brokenstr()`` that raises :class:`BrokenStrError` — an async tool, or
    (``thread``) a sync one, run in a worker thread. The run must still turn it into an
    error result (or, with ``on_tool_error="fail"``, a failure with a readable reason)."""

    book = book_of(recorder)

    async def brokenstr(ctx: ToolContext) -> str:
        """Fail with an error that cannot be described."""
        with _Recording(book, name, ctx, "async"):
            await trio.lowlevel.checkpoint()
            raise BrokenStrError

    def brokenstr_thread(ctx: ToolContext) -> str:
        """Fail, in a thread, with an error that cannot be described."""
        record = book.start(name, ctx, "thread")
        try:
            raise BrokenStrError
        finally:
            book.end(record, "failed")

    return function_tool(brokenstr_thread if thread else brokenstr, name=name)
