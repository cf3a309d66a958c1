"""A worker attempt's session: each write first checks that the attempt still owns its
run in the shared store (DESIGN §20: a frozen worker is fenced).

The attempt's events and records are fenced in the store's own transactions; the
session lives in another database (its own SQLite file, or PostgreSQL tables written on
another connection), so its writes cannot join those transactions. The check before
each write closes what matters in practice: a worker thawed after another attempt took
its run over (a SIGSTOP, a long pause, a partition) does not write its cancel repair, or
anything else, into the session the new attempt is writing. What it cannot close is a
pause that falls between the check and the write's own commit (a window of one write);
docs/temporal.md says so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, final

from .._items import Item
from ..sessions import Session, SessionStorageError

__all__ = ["FencedSession"]


@final
class FencedSession:
    """``inner``, whose writes (``add_items``, ``replace_items``, ``clear``, and those
    of the child sessions ``with_id`` gives) first await ``owns()``: False raises
    :class:`~trio_agents.sessions.SessionStorageError` and writes nothing. Reads and
    everything else are ``inner``'s."""

    def __init__(self, inner: Session, owns: Callable[[], Awaitable[bool]]) -> None:
        self._inner = inner
        self._owns = owns

    @property
    def session_id(self) -> str:
        return self._inner.session_id

    async def _check(self) -> None:
        if not await self._owns():
            raise SessionStorageError(
                "fenced: a later attempt took this run over; this attempt writes nothing"
                " more to its session",
                session_id=self._inner.session_id,
            )

    async def get_items(self) -> list[Item]:
        return await self._inner.get_items()

    async def add_items(self, items: Sequence[Item]) -> None:
        await self._check()
        await self._inner.add_items(items)

    async def clear(self) -> None:
        await self._check()
        await self._inner.clear()

    def __getattr__(self, name: str) -> Any:
        # Optional parts of a session (lock_key, aclose, get_stored_items, ...) exist
        # exactly when the inner session has them: callers ask with getattr(s, n, None).
        value = getattr(self._inner, name)
        if name == "replace_items":

            async def replace_items(*args: Any, **kwargs: Any) -> Any:
                await self._check()
                return await value(*args, **kwargs)

            return replace_items
        if name == "with_id":
            # A child session of the tree: fenced by the same run (the root's attempt).
            return lambda session_id: FencedSession(value(session_id), self._owns)
        return value
