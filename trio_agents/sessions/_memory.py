"""An in-process session, for tests and short-lived programs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import final

import attrs
import trio

from .._items import Item
from ._fork import ForkAt, SessionExistsError, check_at, check_new_id, fork_plan

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
        tree = self._descendants()
        plan = fork_plan(self.session_id, new_session_id, self._items, index, tree)
        existing = self._others.get(new_session_id)
        if existing is not None and existing._items:
            raise SessionExistsError(new_session_id)
        for new_child in plan.children.values():
            found = self._find(new_session_id, new_child)
            if found is not None and found._items:
                raise SessionExistsError(new_child)
        target = self.with_id(new_session_id)
        target._items[:] = plan.items
        self._copy_children(target, plan.children)
        await trio.lowlevel.cancel_shielded_checkpoint()
        return target

    async def child_session_ids(self) -> list[str]:
        """The ids of this session's descendants that hold items (``"<id>/..."``, the
        sessions of child runs, DESIGN §17), sorted."""
        await trio.lowlevel.checkpoint()
        return sorted(i for i, s in self._descendants().items() if s._items)

    def _descendants(self) -> dict[str, MemorySession]:
        """Every session reachable through ``with_id`` from here whose id is below this
        one's (``"<id>/..."``)."""
        head = self.session_id + "/"
        found: dict[str, MemorySession] = {}
        seen = {id(self)}
        stack = [self]
        while stack:
            for other_id, other in stack.pop()._others.items():
                if id(other) in seen:
                    continue
                seen.add(id(other))
                stack.append(other)
                if other_id.startswith(head):
                    found.setdefault(other_id, other)
        return found

    def _find(self, new_session_id: str, child_id: str) -> MemorySession | None:
        """The session ``child_id`` as the fork's tree would hold it, if it exists."""
        target = self._others.get(new_session_id)
        return None if target is None else target._descendants().get(child_id)

    def _copy_children(self, target: MemorySession, children: Mapping[str, str]) -> None:
        """Copy the planned children into ``target``'s tree, kept by the same objects'
        ``with_id`` as in the source (a resumed child run finds its own children)."""
        stack: list[tuple[MemorySession, MemorySession]] = [(self, target)]
        seen = {id(self)}
        while stack:
            source, copy = stack.pop()
            for other_id, other in list(source._others.items()):
                new_id = children.get(other_id)
                if new_id is None or id(other) in seen:
                    continue
                seen.add(id(other))
                made = copy.with_id(new_id)
                made._items[:] = other._items
                stack.append((other, made))

    def statistics(self) -> int:
        """Return the number of stored items."""
        return len(self._items)
