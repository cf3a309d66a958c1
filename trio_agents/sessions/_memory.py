"""An in-process session, for tests and short-lived programs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import final

import attrs
import trio

from .._items import Item
from ._fork import (
    ForkAt,
    SessionExistsError,
    check_at,
    check_new_id,
    fork_plan,
    kept_items,
    marked_of,
    shape_of,
)

__all__ = ["MemorySession"]


@final
@attrs.define(eq=False)
class _Store:
    """What the sessions ``with_id`` links share: their conversations, by id, and the
    one session object of each id (a session's lock key is its object)."""

    items: dict[str, list[Item]] = attrs.field(factory=dict)
    sessions: dict[str, MemorySession] = attrs.field(factory=dict)


@final
@attrs.define(eq=False)
class MemorySession:
    """A :class:`~trio_agents.sessions.Session` kept in memory (lost with the process).

    A session and every session its :meth:`with_id` reaches (and theirs) form one
    store: one conversation per id, one object per id."""

    session_id: str = "default"
    # The store this session is part of (with_id passes it on; a new MemorySession
    # starts a store of its own).
    _store: _Store = attrs.field(factory=_Store, kw_only=True, repr=False, alias="_store")

    def __attrs_post_init__(self) -> None:
        self._store.sessions.setdefault(self.session_id, self)
        self._store.items.setdefault(self.session_id, [])

    @property
    def _items(self) -> list[Item]:
        return self._store.items[self.session_id]

    def with_id(self, session_id: str) -> MemorySession:
        """The session with ``session_id`` in this session's store (the same object for
        the same id), so the conversation of a child run (``"<id>/<call id>"``, DESIGN
        §17) lives as long as this one."""
        if not isinstance(session_id, str) or not session_id:
            raise ValueError(f"session_id must be a non-empty str, not {session_id!r}")
        other = self._store.sessions.get(session_id)
        if other is None:
            other = MemorySession(session_id, _store=self._store)
        return other

    @property
    def lock_key(self) -> object:
        """One object per id in a store: runs are kept one at a time per object."""
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

    async def fork(self, new_session_id: str, *, at: ForkAt = None) -> MemorySession:
        """Fork this conversation (DESIGN §23) into ``self.with_id(new_session_id)``:
        ``items[:at]`` (all for None), rounded down so that no tool call is kept
        without its result, and the child sessions (``"<id>/<call id>"``, and theirs)
        whose call is kept, whole, under ``"<new id>/<call id>"``. Done at once on the
        Trio thread, so a run writing here meanwhile never splits it; this session is
        not changed.

        Raises:
            TypeError, ValueError: a bad ``new_session_id`` or ``at`` (an event position
                ``(run_id, seq)`` included: a session cannot resolve one).
            SessionExistsError: the new session, or one of its child sessions, already
                holds items (nothing is written).
        """
        new_session_id = check_new_id(self.session_id, new_session_id)
        index = check_at(at)
        stored = self._store.items
        items = self._items
        marked = marked_of(shape_of(item) for item in items)
        plan = fork_plan(self.session_id, new_session_id, len(items), marked, index, self._below())
        for taken in (new_session_id, *plan.children.values()):
            if stored.get(taken):
                raise SessionExistsError(taken)
        fork = self.with_id(new_session_id)
        stored[new_session_id] = kept_items(self._items, plan)
        for old, new in plan.children.items():
            self.with_id(new)
            stored[new] = list(stored[old])
        await trio.lowlevel.cancel_shielded_checkpoint()
        return fork

    async def child_session_ids(self) -> list[str]:
        """The ids of this session's descendants that hold items (``"<id>/..."``, the
        sessions of child runs, DESIGN §17), sorted."""
        await trio.lowlevel.checkpoint()
        return self._below()

    def _below(self) -> list[str]:
        head = self.session_id + "/"
        return sorted(i for i, items in self._store.items.items() if i.startswith(head) and items)

    def statistics(self) -> int:
        """Return the number of stored items."""
        return len(self._items)
