"""An in-process session, for tests and short-lived programs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import attrs
import trio

from .._items import Item

__all__ = ["MemorySession"]


@final
@attrs.define(eq=False)
class MemorySession:
    """A :class:`~trio_agents.sessions.Session` kept in memory (lost with the process)."""

    session_id: str = "default"
    _items: list[Item] = attrs.field(init=False, factory=list)
    # The sessions with_id() made: a child run's conversation lives as long as this one.
    _others: dict[str, MemorySession] = attrs.field(init=False, factory=dict, repr=False)

    def with_id(self, session_id: str) -> MemorySession:
        """The session with ``session_id`` in this session's store: for memory, one
        kept by this object (the same object for the same id), so the conversation of
        a child run (``"<id>/<call id>"``, DESIGN §17) lives as long as this one."""
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session_id must be a non-empty str, not {session_id!r}")
        if session_id == self.session_id:
            return self
        other = self._others.get(session_id)
        if other is None:
            other = self._others[session_id] = MemorySession(session_id)
        return other

    @property
    def lock_key(self) -> object:
        """Each object is its own store: runs are kept one at a time per object."""
        return self

    async def get_items(self) -> list[Item]:
        """Return a copy of the stored conversation."""
        await trio.lowlevel.checkpoint()
        return list(self._items)

    async def add_items(self, items: Sequence[Item]) -> None:
        """Append ``items``."""
        self._items.extend(items)
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def replace_items(self, items: Sequence[Item]) -> None:
        """Replace the stored conversation with ``items`` at once (atomically)."""
        self._items[:] = items
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def clear(self) -> None:
        """Delete the stored conversation."""
        self._items.clear()
        await trio.lowlevel.cancel_shielded_checkpoint()

    def statistics(self) -> int:
        """Return the number of stored items."""
        return len(self._items)
