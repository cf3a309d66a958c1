"""Where the control server's sessions live: metered in-memory sessions (evictable, LRU
per principal), or a factory's sessions scoped to their principal."""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeAlias, final

import attrs
import trio

from .._items import Item
from .._session_lock import session_lock_key
from ..sessions import Session, fork_point, repair_loaded
from ._error_codes import ProtocolError

__all__ = [
    "SESSION_OVERHEAD",
    "MemorySessions",
    "MeteredSession",
    "ScopedSession",
    "SessionFactory",
    "items_bytes",
    "sqlite_sessions",
]

SessionFactory: TypeAlias = Callable[[str, str], Session]
"""``factory(principal, session_id) -> Session``; called once per run that names a session."""

SESSION_OVERHEAD = 512
"""Bytes counted per in-memory session on top of its items (so empty ones count too)."""


def items_bytes(items: Sequence[Item]) -> int:
    """The size of ``items`` as compact JSON: what the byte limits count."""
    return sum(
        len(json.dumps(item.to_json(), separators=(",", ":")).encode("utf-8", "replace"))
        for item in items
    )


def sqlite_sessions(path: str | os.PathLike[str]) -> SessionFactory:
    """A session factory storing every principal's sessions in one SQLite file.

    The stored session id is ``json.dumps([principal, session_id])``, so two
    principals' ``"s1"`` never meet. Each run gets its own
    :class:`~trio_agents.sessions._sqlite.SQLiteSession`, closed when the run ends.
    """
    from ..sessions._sqlite import SQLiteSession

    resolved = os.fspath(path)

    def factory(principal: str, session_id: str) -> Session:
        return SQLiteSession(resolved, json.dumps([principal, session_id]))

    return factory


@final
class ScopedSession:
    """A factory's session, claimed under a key that includes the principal.

    The run core keeps one active run per session *key*; a factory that returns, say,
    ``MemorySession("s1")`` for two principals would otherwise make them share a busy
    slot (and leak that the other's session exists). Everything else is delegated.
    """

    def __init__(self, inner: Session, principal: str) -> None:
        self.inner = inner
        self.lock_key: Hashable = ("trio_agents.control", principal, session_lock_key(inner))

    @property
    def session_id(self) -> str:
        return self.inner.session_id

    async def get_items(self) -> list[Item]:
        return await self.inner.get_items()

    async def add_items(self, items: Sequence[Item]) -> None:
        await self.inner.add_items(items)

    async def clear(self) -> None:
        await self.inner.clear()

    def __getattr__(self, name: str) -> Any:
        # replace_items, aclose, ... when the inner session has them
        return getattr(self.inner, name)


@final
class MeteredSession:
    """An in-memory session that knows its size in bytes (items as JSON + overhead).

    ``users`` counts the server's runs that use it (active or queued): a session with
    users is never evicted.
    """

    def __init__(self, session_id: str, owner: MemorySessions) -> None:
        self.session_id = session_id
        self.users = 0
        self.bytes = SESSION_OVERHEAD
        self._owner = owner
        self._items: list[Item] = []
        self._sizes: list[int] = []

    @property
    def lock_key(self) -> object:
        """Each object is its own store (principals' ``"s1"`` are different objects)."""
        return self

    @property
    def items(self) -> list[Item]:
        """A copy of the stored conversation, read at once (no checkpoint)."""
        return list(self._items)

    def _resize(self, new: int) -> None:
        self._owner.bytes += new - self.bytes
        self.bytes = new

    async def get_items(self) -> list[Item]:
        await trio.lowlevel.checkpoint()
        return list(self._items)

    async def add_items(self, items: Sequence[Item]) -> None:
        sizes = [items_bytes([item]) for item in items]
        self._items.extend(items)
        self._sizes.extend(sizes)
        self._resize(self.bytes + sum(sizes))
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def replace_items(self, items: Sequence[Item]) -> None:
        sizes = [items_bytes([item]) for item in items]
        self._items[:] = items
        self._sizes[:] = sizes
        self._resize(SESSION_OVERHEAD + sum(sizes))
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def clear(self) -> None:
        await self.replace_items(())


@final
@attrs.define(eq=False)
class MemorySessions:
    """One principal's in-memory sessions, least recently used first, and their bytes."""

    limit: int
    bytes: int = 0
    evicted: int = 0
    _sessions: OrderedDict[str, MeteredSession] = attrs.field(init=False, factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._sessions)

    def acquire(self, session_id: str) -> MeteredSession | None:
        """The session for a new run, marked used and most recent; evicts idle sessions
        to make room. None (nothing changed) if the principal is still over its limit."""
        session = self._sessions.get(session_id)
        created = session is None
        if session is None:
            session = self._sessions[session_id] = MeteredSession(session_id, self)
            self.bytes += session.bytes
        self._sessions.move_to_end(session_id)
        session.users += 1
        self.make_room()
        if self.bytes > self.limit:  # the active sessions alone fill the budget
            session.users -= 1
            if created:
                self._forget(session_id)
            return None
        return session

    def release(self, session: MeteredSession) -> None:
        """A run that used ``session`` ended (or never started): it is the most
        recently used now."""
        session.users -= 1
        if self._sessions.get(session.session_id) is session:
            self._sessions.move_to_end(session.session_id)
        self.make_room()

    def make_room(self) -> None:
        """Evict idle sessions, least recently used first, until under the limit."""
        if self.bytes <= self.limit:
            return
        victims: list[str] = []
        excess = self.bytes - self.limit
        for session_id, session in self._sessions.items():  # oldest first
            if session.users == 0:
                victims.append(session_id)
                excess -= session.bytes
                if excess <= 0:
                    break
        for session_id in victims:
            self._forget(session_id)
            self.evicted += 1

    async def fork(self, session_id: str, new_session_id: str, at: int | None) -> int:
        """Fork the in-memory session ``session_id`` into ``new_session_id`` (DESIGN
        §23; in-memory sessions have no child sessions); returns the number of items
        the fork holds. At once on the Trio thread: a run writing the source meanwhile
        never splits it.

        Raises:
            ProtocolError: ``not_found`` (no such session, or it holds no items),
                ``invalid_request`` (the new session holds items), ``limit_exceeded``
                (the fork would not fit the principal's session bytes).
        """
        source = self._sessions.get(session_id)
        items = [] if source is None else source.items
        if not items:
            raise ProtocolError("not_found", f"no session {session_id!r}")
        existing = self._sessions.get(new_session_id)
        if existing is not None and existing.items:
            raise ProtocolError(
                "invalid_request",
                f"session {new_session_id!r} already holds items: a fork never overwrites",
            )
        kept = repair_loaded(items[: fork_point(items, at)])
        if SESSION_OVERHEAD + items_bytes(kept) > self.limit:
            raise ProtocolError(
                "limit_exceeded",
                f"the fork would hold over {self.limit} bytes of in-memory sessions",
            )
        target = self.acquire(new_session_id)
        if target is None:
            raise ProtocolError(
                "limit_exceeded",
                f"in-memory sessions of this principal hold over {self.limit} bytes in active runs",
            )
        try:
            await target.replace_items(kept)
        finally:
            self.release(target)
        return len(kept)

    def _forget(self, session_id: str) -> None:
        session = self._sessions.pop(session_id)
        self.bytes -= session.bytes
