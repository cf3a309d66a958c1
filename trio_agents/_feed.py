"""The merged event stream of a run tree: ``run.events(tree=True)`` (DESIGN §17).

Each run keeps its own log (``_log.py``) with its own seqs. A tree also keeps one
:class:`TreeFeed`, shared by every run in it: each log of the tree hands every event it
appends to the feed too, so the feed holds the tree's events in the order they
happened. A :class:`TreeCursor` reads the feed, keeping the events of one run's subtree.

The feed exists only once a tree does: a run that never starts a child (nearly all of
them) pays one ``is None`` test per event for it. The root's feed is made when its
first child starts (or when someone asks for ``events(tree=True)``), seeded with what
the root's own log retains, so it misses nothing that happened before.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import final

import trio

from ._events import EventsDropped, RunEvent, RunUpdated
from ._log import EventLog

__all__ = ["TreeCursor", "TreeFeed"]


@final
class TreeFeed:
    """Every event of one run tree, oldest first, the last ``retention`` of them."""

    __slots__ = ("_base", "_end", "_events", "_lot", "_parents", "_parked", "_retention")

    def __init__(self, retention: int) -> None:
        self._retention = retention
        self._events: list[RunEvent] = []
        self._base = 0  # the position of _events[0] in the whole stream
        self._end = 0  # _base + len(_events), kept: add() is called for every event
        # run id -> parent run id (None for the root): who is in whose subtree.
        self._parents: dict[str, str | None] = {}
        self._lot = trio.lowlevel.ParkingLot()
        self._parked = 0

    @property
    def end(self) -> int:
        """The position the next event will have."""
        return self._end

    @property
    def first(self) -> int:
        """The position of the oldest retained event."""
        return self._base

    def join(self, run_id: str, parent_id: str | None) -> None:
        """Record that ``run_id`` is in the tree, below ``parent_id``."""
        self._parents[run_id] = parent_id

    def add(self, event: RunEvent) -> None:
        """Append an event (called by the logs of the tree, on the run's thread)."""
        events = self._events
        events.append(event)
        end = self._end = self._end + 1
        if end - self._base >= 2 * self._retention:
            # Trim in chunks: one slice every `retention` events, not one per event.
            drop = end - self._base - self._retention
            del events[:drop]
            self._base += drop
        if self._parked:
            self._lot.unpark_all()

    def get(self, position: int) -> RunEvent:
        return self._events[position - self._base]

    def below(self, run_id: str, ancestor: str) -> bool:
        """Whether ``run_id`` is ``ancestor`` or one of its descendants."""
        parents = self._parents
        node: str | None = run_id
        while node is not None:
            if node == ancestor:
                return True
            node = parents.get(node)
        return False

    async def wait(self) -> None:
        """Wait for the next event of the tree."""
        self._parked += 1
        try:
            await self._lot.park()
        finally:
            self._parked -= 1

    def wake(self) -> None:
        """Wake every waiting reader (a run of the tree ended)."""
        if self._parked:  # every run of a cancelled tree ends here: no call for nobody
            self._lot.unpark_all()


@final
class TreeCursor(AsyncIterator[RunEvent]):
    """An independent reader of one run's subtree events, in the order they happened.

    Each event keeps its own ``run_id`` and per-run ``seq``. The iteration ends after
    the run's own terminal ``run.updated`` (every descendant's comes before it). A
    reader that falls behind the feed's retention gets one ``events.dropped`` marker
    whose ``first_missing_seq`` and ``count`` are positions in the merged stream (its
    ``seq`` is 0: the missing events belong to several runs). Safe to ``break`` out of.
    """

    __slots__ = ("_done", "_feed", "_log", "_next", "_run_id")

    def __init__(self, feed: TreeFeed, log: EventLog) -> None:
        self._feed = feed
        self._log = log
        self._run_id = log.run_id
        self._next = feed.first
        self._done = False

    def __aiter__(self) -> TreeCursor:
        return self

    async def __anext__(self) -> RunEvent:
        feed = self._feed
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._done:
            if self._next < feed.first:
                missing = feed.first - self._next
                dropped = EventsDropped(
                    run_id=self._run_id, seq=0, first_missing_seq=self._next, count=missing
                )
                self._next = feed.first
                await trio.lowlevel.cancel_shielded_checkpoint()
                return dropped
            while self._next < feed.end:
                event = feed.get(self._next)
                self._next += 1
                if not feed.below(event.run_id, self._run_id):
                    continue
                if (
                    event.run_id == self._run_id
                    and type(event) is RunUpdated
                    and event.status.is_terminal
                ):
                    self._done = True
                await trio.lowlevel.cancel_shielded_checkpoint()
                return event
            if self._log.closed:
                break  # its terminal update was trimmed from the feed: nothing more
            await feed.wait()
        raise StopAsyncIteration
