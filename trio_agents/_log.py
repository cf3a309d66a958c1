"""The per-run event log and its cursors (``run.events()`` and ``run.updated``).

The log is a ring buffer of the last ``retention`` events, written only from the run's
Trio thread. Readers are cursors holding their own position: they never hold the run
back, and one that falls behind retention gets an ``events.dropped`` marker. Waiting
readers park on one :class:`trio.lowlevel.ParkingLot` that every append wakes.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Protocol, final

import trio

from ._events import EventsDropped, ResponseTextDelta, RunEvent, RunUpdated

__all__ = ["EventCursor", "EventLog", "LogFeed", "StatusCursor", "UpdatedStream"]

# ResponseTextDelta's slots, set directly by EventLog.append_text: an attrs frozen
# __init__ sets each field through object.__setattr__, a third slower, and the run
# builds one per streamed delta.
_new = object.__new__
_set_run_id, _set_seq, _set_turn, _set_text, _set_at = (
    ResponseTextDelta.__dict__[name].__set__ for name in ("run_id", "seq", "turn", "text", "at")
)
_time = time.time


class LogFeed(Protocol):
    """Where the log of a run in a tree also sends its events: the tree's merged
    stream (``_feed.TreeFeed``, which reads these logs, so it is the module above)."""

    def add(self, event: RunEvent) -> None:
        """Take ``event``, just appended to one of the tree's logs."""
        ...

    def wake(self) -> None:
        """A log of the tree closed: wake the readers waiting for more."""
        ...


@final
class EventLog:
    """Bounded, replayable log of one run's events."""

    # buffer, size, start and retention are read by the cursors below on their hot
    # path (one event per step of a reader that keeps up, W1), hence not underscored;
    # only append(), append_text() and _grow() write them.
    __slots__ = (
        "_closed",
        "_lot",
        "_parked",
        "_statuses",
        "buffer",
        "feed",
        "next_seq",
        "retention",
        "run_id",
        "size",
        "start",
    )

    def __init__(self, run_id: str, retention: int, start_seq: int = 1) -> None:
        if retention < 1:
            raise ValueError("event retention must be at least 1")
        if start_seq < 1:
            raise ValueError("the first seq must be at least 1")
        self.run_id = run_id
        self.retention = retention
        # A short run emits about a dozen events: start small, grow by doubling (8: a
        # run in its first tool call holds 5, and every slot is 8 bytes per run in
        # flight, W3 memory).
        self.buffer: list[RunEvent | None] = [None] * min(retention, 8)
        # len(self.buffer), kept: append() reads it twice per event (B8, a tree cancel,
        # appends about 5 events per run).
        self.size = len(self.buffer)
        # A resumed run (cluster takeover) continues the seqs of its earlier attempts.
        self.start = start_seq
        # The seq the next appended event must carry (a plain attribute: every event
        # reads it, and only append() writes it).
        self.next_seq = start_seq
        self._closed = False
        # Made by the first reader that waits: a run nobody watches never needs one
        # (about 180 bytes per run at 10,000 concurrent runs, W3).
        self._lot: trio.lowlevel.ParkingLot | None = None
        self._parked = 0  # readers in wait(): append() skips the lot when there are none
        self._statuses: list[RunUpdated] = []
        # The tree's merged stream (_feed.py), once this run is part of a tree.
        self.feed: LogFeed | None = None

    @property
    def first_seq(self) -> int:
        """The seq of the oldest retained event (``next_seq`` when empty)."""
        return max(self.start, self.next_seq - self.retention)

    @property
    def closed(self) -> bool:
        """True once the terminal event was appended."""
        return self._closed

    @property
    def last_status(self) -> RunUpdated:
        """The latest ``run.updated`` event."""
        return self._statuses[-1]

    def append(self, event: RunEvent) -> None:
        """Append ``event`` (whose seq must be :attr:`next_seq`) and wake readers."""
        if self._closed:
            raise RuntimeError("event log is closed")
        seq = self.next_seq
        assert event.seq == seq, (event.seq, seq)
        buffer, size = self.buffer, self.size
        if seq - self.start >= size and size < self.retention:
            buffer, size = self._grow()
        buffer[seq % size] = event
        self.next_seq = seq + 1
        if type(event) is RunUpdated:
            self._statuses.append(event)
        if self._parked:
            assert self._lot is not None
            self._lot.unpark_all()
        if self.feed is not None:
            self.feed.add(event)

    def append_text(self, turn: int, text: str) -> None:
        """Append ``ResponseTextDelta(run_id, next_seq, turn, text)`` and wake readers.

        :meth:`append` for the hot path of streaming (one per delta, W1): the event is
        built here, slot by slot, and nothing is checked that only another event type
        could get wrong. The same event in every respect (its ``at`` stamped now, as the
        class's factory does)."""
        if self._closed:
            raise RuntimeError("event log is closed")
        seq = self.next_seq
        buffer, size = self.buffer, self.size
        if seq - self.start >= size and size < self.retention:
            buffer, size = self._grow()
        event = _new(ResponseTextDelta)
        _set_run_id(event, self.run_id)
        _set_seq(event, seq)
        _set_turn(event, turn)
        _set_text(event, text)
        _set_at(event, _time())
        buffer[seq % size] = event
        self.next_seq = seq + 1
        if self._parked:
            assert self._lot is not None
            self._lot.unpark_all()
        if self.feed is not None:
            self.feed.add(event)

    def _grow(self) -> tuple[list[RunEvent | None], int]:
        old, old_size = self.buffer, self.size
        size = min(2 * old_size, self.retention)
        new: list[RunEvent | None] = [None] * size
        for seq in range(max(self.start, self.next_seq - old_size), self.next_seq):
            new[seq % size] = old[seq % old_size]
        self.buffer, self.size = new, size
        return new, size

    def close(self) -> None:
        """Mark the log finished (after the terminal event) and wake every reader."""
        self._closed = True
        if self._lot is not None:
            self._lot.unpark_all()
        if self.feed is not None:
            self.feed.wake()

    def get(self, seq: int) -> RunEvent:
        """Return the retained event with ``seq``."""
        event = self.buffer[seq % self.size]
        assert event is not None, seq
        assert event.seq == seq, (seq, event)
        return event

    def retained(self) -> list[RunEvent]:
        """Return every retained event, oldest first (a snapshot)."""
        return [self.get(seq) for seq in range(self.first_seq, self.next_seq)]

    async def wait(self) -> None:
        """Wait for the next append or the close."""
        lot = self._lot
        if lot is None:
            lot = self._lot = trio.lowlevel.ParkingLot()
        self._parked += 1
        try:
            await lot.park()
        finally:
            self._parked -= 1


@final
class EventCursor(AsyncIterator[RunEvent]):
    """An independent reader of a run's events, as :meth:`trio_agents.Run.events` returns it.

    ``async for event in cursor`` yields one event per iteration, and every iteration
    is a checkpoint (a cancel point and a schedule point), as Trio's convention is:
    code between two events may rely on other tasks having run. :meth:`batches` reads
    the same events in lists instead, every event that is ready at one wake-up, with
    one checkpoint per list.

    Safe to ``break`` out of: it holds nothing but its position.
    """

    __slots__ = ("_log", "_next")

    def __init__(self, log: EventLog, from_seq: int | None) -> None:
        if from_seq is not None:
            if isinstance(from_seq, bool) or not isinstance(from_seq, int):
                raise TypeError("from_seq must be an int or None")
            if from_seq < 0:
                raise ValueError("from_seq must be >= 0")
        self._log = log
        self._next = log.first_seq if from_seq is None else max(from_seq, 1)

    def __aiter__(self) -> EventCursor:
        return self

    def batches(self, max_events: int = 1024) -> AsyncIterator[list[RunEvent]]:
        """The same events in lists: ``async for batch in run.events().batches()``.

        Each list holds every event that is ready when the reader wakes (at most
        ``max_events``, in order, an ``events.dropped`` marker where the reader fell
        behind retention), and each iteration is one checkpoint: a reader of a model
        that streams many deltas per network read takes them in one task step instead
        of one per event. Never empty; the iteration ends after the list with the
        terminal ``run.updated``. The lists share this cursor's position: reading
        continues where the cursor is, and the cursor continues after the lists read.
        """
        if isinstance(max_events, bool) or not isinstance(max_events, int):
            raise TypeError("max_events must be an int")
        if max_events < 1:
            raise ValueError("max_events must be >= 1")
        return _EventBatches(self, max_events)

    def _take(self, limit: int) -> list[RunEvent]:
        """Up to ``limit`` ready events (a dropped marker first, if any); [] if none."""
        log = self._log
        taken: list[RunEvent] = []
        first = log.first_seq
        if self._next < first:
            taken.append(
                EventsDropped(
                    run_id=log.run_id,
                    seq=first - 1,
                    first_missing_seq=self._next,
                    count=first - self._next,
                )
            )
            self._next = first
        end = min(log.next_seq, self._next + limit - len(taken))
        if end > self._next:
            get = log.get
            taken.extend([get(seq) for seq in range(self._next, end)])
            self._next = end
        return taken

    async def __anext__(self) -> RunEvent:
        log = self._log
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            seq = self._next
            end = log.next_seq
            if seq < end:
                if seq >= log.start and end - seq <= log.retention:
                    # Retained: the event taken here, not through first_seq and get()
                    # (two calls per event on the hot path of a reader that keeps up,
                    # W1); this test is first_seq's, spelled out.
                    event = log.buffer[seq % log.size]
                    self._next = seq + 1
                else:
                    first = log.first_seq
                    event = EventsDropped(
                        run_id=log.run_id, seq=first - 1, first_missing_seq=seq, count=first - seq
                    )
                    self._next = first
                # Taken first, then the schedule point, which cannot raise: a cancel
                # never loses an event the cursor moved past, and the writer gets its
                # turn before this reader looks again (so a reader that keeps up finds
                # the next event ready instead of parking for it).
                await trio.lowlevel.cancel_shielded_checkpoint()
                assert event is not None
                return event
            if log.closed:
                raise StopAsyncIteration
            await log.wait()


@final
class _EventBatches(AsyncIterator[list[RunEvent]]):
    """What :meth:`EventCursor.batches` returns."""

    __slots__ = ("_cursor", "_limit")

    def __init__(self, cursor: EventCursor, limit: int) -> None:
        self._cursor = cursor
        self._limit = limit

    def __aiter__(self) -> _EventBatches:
        return self

    async def __anext__(self) -> list[RunEvent]:
        cursor = self._cursor
        log = cursor._log
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            batch = cursor._take(self._limit)
            if batch:
                # Taken first, then the schedule point, which cannot raise: a cancel
                # never loses events the cursor has moved past.
                await trio.lowlevel.cancel_shielded_checkpoint()
                return batch
            if log.closed:
                raise StopAsyncIteration
            await log.wait()


@final
class StatusCursor(AsyncIterator[RunUpdated]):
    """An independent reader of a run's status changes; see :attr:`trio_agents.Run.updated`.

    The first value is the status current when iteration starts; the iteration ends
    after the terminal status.
    """

    __slots__ = ("_index", "_log")

    def __init__(self, log: EventLog) -> None:
        self._log = log
        self._index: int | None = None

    def __aiter__(self) -> StatusCursor:
        return self

    async def __anext__(self) -> RunUpdated:
        log = self._log
        await trio.lowlevel.checkpoint_if_cancelled()
        statuses = log._statuses
        if self._index is None:
            self._index = len(statuses) - 1
        while True:
            if self._index < len(statuses):
                event = statuses[self._index]
                self._index += 1
                await trio.lowlevel.cancel_shielded_checkpoint()
                return event
            if log.closed:
                raise StopAsyncIteration
            await log.wait()


@final
class UpdatedStream:
    """``run.updated``: each ``async for`` over it is a new, independent subscriber."""

    __slots__ = ("_log",)

    def __init__(self, log: EventLog) -> None:
        self._log = log

    def __aiter__(self) -> StatusCursor:
        return StatusCursor(self._log)

    @property
    def current(self) -> RunUpdated:
        """The latest status update."""
        return self._log.last_status
