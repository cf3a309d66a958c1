"""One active run per session: the process-wide registry behind ``on_busy``.

A run that has a session claims it before it loads anything and releases it after its
repair is persisted, just before its terminal update, so a client that sees the
terminal update can start the next run on the session at once. Claims are keyed by
:func:`session_lock_key`, so two :class:`~trio_agents.sessions.SQLiteSession` objects for
the same file and id are the same session, in any thread of the process.

Waiters (``on_busy="enqueue"`` / ``"interrupt"``) are woken through their own Trio
token, so a claim released in one ``trio.run`` (thread) hands over to a waiter in
another. The slot is handed straight to the next waiter (never left free in between),
so nobody can barge in ahead of a queue.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Hashable
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias, final

import attrs
import trio

from ._exceptions import SessionBusyError

if TYPE_CHECKING:
    from .sessions._base import Session

__all__ = ["OnBusy", "SessionClaim", "session_lock_key"]

OnBusy: TypeAlias = Literal["reject", "interrupt", "enqueue"]
"""What ``open_run`` does when the session already has an active run."""

SUPERSEDED = "superseded"


class Holder(Protocol):
    """What the registry needs of a run: its id, and a way to supersede it."""

    @property
    def id(self) -> str: ...

    def cancel(self, reason: str | None = None) -> None: ...


def session_lock_key(session: Session) -> Hashable:
    """The identity under which a session is claimed.

    A session may define ``lock_key`` (any hashable) to say which objects share its
    storage; otherwise the key is its type and ``session_id`` (conservative: two
    objects of one type with one id are taken to be one conversation).
    """
    key = getattr(session, "lock_key", None)
    if key is not None:
        return key  # type: ignore[no-any-return]
    return (type(session).__module__, type(session).__qualname__, session.session_id)


@final
@attrs.define(eq=False)
class _Waiter:
    run: Holder
    token: trio.lowlevel.TrioToken
    event: trio.Event = attrs.field(factory=trio.Event)
    granted: bool = False


@final
@attrs.define(eq=False)
class _Slot:
    holder: Holder
    waiters: deque[_Waiter] = attrs.field(factory=deque)


_lock = threading.Lock()
_slots: dict[Hashable, _Slot] = {}


@final
@attrs.define(eq=False)
class SessionClaim:
    """A run's claim on its session (one per run that has a session)."""

    key: Hashable
    session_id: str
    run: Holder
    _waiter: _Waiter | None = attrs.field(init=False, default=None)
    _held: bool = attrs.field(init=False, default=False)

    @property
    def held(self) -> bool:
        """Whether the run holds the session (and may read and write it)."""
        return self._held

    @property
    def owned(self) -> bool:
        """Whether the session is this run's: held, or already handed over to it while
        its task has not resumed from :meth:`wait` yet."""
        return self._held or (self._waiter is not None and self._waiter.granted)

    def claim_now(self, on_busy: OnBusy) -> None:
        """Take the session if it is free; otherwise queue (or raise, for ``reject``).

        Synchronous, so ``on_busy="reject"`` fails before anything starts. A queued
        claim is completed by :meth:`wait`; ``interrupt`` also cancels the holder
        (reason ``"superseded"``).

        Raises:
            SessionBusyError: the session is busy and ``on_busy="reject"``.
        """
        with _lock:
            slot = _slots.get(self.key)
            if slot is None:
                _slots[self.key] = _Slot(self.run)
                self._held = True
                return
            holder = slot.holder
            if on_busy == "reject":
                raise SessionBusyError(self.session_id, holder.id)
            waiter = _Waiter(self.run, trio.lowlevel.current_trio_token())
            if on_busy == "interrupt":
                slot.waiters.appendleft(waiter)
            else:
                slot.waiters.append(waiter)
            self._waiter = waiter
        if on_busy == "interrupt":
            holder.cancel(SUPERSEDED)

    async def wait(self) -> None:
        """Wait until a queued claim is granted (cancellable: see :meth:`release`)."""
        waiter = self._waiter
        if waiter is None:
            return
        await waiter.event.wait()
        self._waiter = None
        self._held = True

    def release(self) -> None:
        """Give the session up, or the place in its queue (idempotent).

        The next waiter, if any, gets the session.
        """
        with _lock:
            waiter, self._waiter = self._waiter, None
            if waiter is not None and not waiter.granted:
                slot = _slots.get(self.key)
                if slot is not None:
                    slot.waiters.remove(waiter)
                return
            if waiter is None and not self._held:
                return
            # Held, or handed over to us while we stopped waiting: pass it on.
            self._held = False
            slot = _slots.get(self.key)
            if slot is None or slot.holder is not self.run:
                return
            while slot.waiters:
                nxt = slot.waiters.popleft()
                try:
                    nxt.token.run_sync_soon(nxt.event.set)
                except trio.RunFinishedError:
                    continue  # its Trio run is gone; nobody is waiting there
                nxt.granted = True
                slot.holder = nxt.run
                return
            del _slots[self.key]
