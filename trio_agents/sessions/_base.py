"""The session protocol: where a conversation lives between runs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from .._items import Item

__all__ = ["Session"]


@runtime_checkable
class Session(Protocol):
    """Stores one conversation. A run loads it at start and appends items as they are
    finalised, so a crash loses at most the item in flight.

    Implementations must be safe to call from the Trio thread; blocking storage must be
    called off it (``trio.to_thread.run_sync``) and must not abandon a write half-done.

    One run at a time per session (see ``open_run``'s ``on_busy``): runs are kept apart
    by the session's optional ``lock_key`` attribute (any hashable naming the stored
    conversation, e.g. a file and an id), or else by its type and ``session_id``.

    Optional: ``with_id(session_id) -> Session``, a session for another conversation in
    the same store. Child runs (DESIGN §17) keep their conversations through it, under
    ``"<parent session id>/<call id>"``; a session without it gives child runs none.
    ``MemorySession``, ``SQLiteSession`` and ``PostgresSession`` have it.

    Optional too (DESIGN §23): ``fork(new_session_id, *, at=None) -> Session`` (copy a
    prefix of the conversation, and the child sessions of its tree, into a new session
    of the same store) and ``child_session_ids() -> list[str]`` (the ids below this one,
    ``"<id>/..."``, that hold items: what a fork copies the tree from). The three
    built-in sessions have both (their ``fork`` is a consistent snapshot); for any
    other session with ``with_id``, :func:`~trio_agents.sessions.fork_session` is the
    default (reads, then writes).
    """

    @property
    def session_id(self) -> str:
        """The id of the conversation this session stores."""
        ...

    async def get_items(self) -> list[Item]:
        """Return the stored conversation, oldest first."""
        ...

    async def add_items(self, items: Sequence[Item]) -> None:
        """Append ``items`` atomically (all or none)."""
        ...

    async def clear(self) -> None:
        """Delete the stored conversation."""
        ...
