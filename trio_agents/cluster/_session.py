"""The sessions of a cluster's runs: :class:`PostgresSession` in the cluster's database,
fenced and patient.

- Stored under ``json.dumps([principal, session_id])`` (a run without a session gets
  its own, ``[principal, "run:" + run_id]``, so every run can be resumed).
- *Fenced*: once the run's :class:`~._eventlog.Fence` is closed (its node stopped, or
  handed the run over, or lost its lease) writes are dropped, so the node that takes the
  run over continues from what was persisted before, never from a repair written by a
  node that was leaving.
- *Raw loads*: :meth:`ClusterSession.get_items` returns the stored rows unrepaired; the
  run core repairs them (and writes the repair back), keeping a resumed run's open
  calls open.
- *Patient*: a write or load that fails because the database is unreachable (a
  PostgreSQL restart) is retried with backoff for up to :data:`RETRY_FOR` seconds (and
  never past the caller's deadline) instead of failing the run.
- Its ``lock_key`` includes the node id: the core's in-process claim is per node; the
  cluster-wide claim is the runs table's ``active_key`` (``_claims.py``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Final, TypeVar, final

import psycopg
import trio

from .._items import Item
from ..sessions._postgres import PostgresSession
from ..sessions._storage import SessionStorageError
from ._eventlog import Fence

__all__ = ["RETRY_FOR", "ClusterSession", "session_key"]

T = TypeVar("T")

RETRY_FOR: Final = 30.0


def session_key(principal: str, session_id: str | None, run_id: str) -> str:
    """The stored session id (and the runs table's ``session_key``)."""
    return json.dumps([principal, session_id if session_id is not None else f"run:{run_id}"])


def _transient(exc: SessionStorageError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, psycopg.OperationalError) and not isinstance(
        cause, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled
    )


@final
class ClusterSession:
    """A run's session in a cluster (see the module docstring)."""

    def __init__(self, dsn: str, key: str, node_id: str, fence: Fence) -> None:
        self.inner = PostgresSession(dsn, key)
        self.fence = fence
        self.lock_key: Hashable = ("trio_agents.cluster", node_id, key)

    @property
    def session_id(self) -> str:
        return self.inner.session_id

    async def _retry(self, fn: Callable[[], Awaitable[T]]) -> T:
        backoff = 0.05
        give_up = trio.current_time() + RETRY_FOR
        while True:
            try:
                return await fn()
            except SessionStorageError as exc:
                if not _transient(exc) or trio.current_time() + backoff > give_up:
                    raise
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def get_items(self) -> list[Item]:
        # The stored rows as they are: the run core repairs them itself, keeping the
        # calls left open by a crashed attempt open when it resumes (PostgresSession's
        # own get_items would close them as cancelled).
        inner = self.inner
        return await self._retry(lambda: inner._call(inner._read_sync))

    async def add_items(self, items: Sequence[Item]) -> None:
        if self.fence.closed:
            await trio.lowlevel.checkpoint()
            return
        await self._retry(lambda: self.inner.add_items(items))

    async def replace_items(self, items: Sequence[Item]) -> None:
        if self.fence.closed:
            await trio.lowlevel.checkpoint()
            return
        await self._retry(lambda: self.inner.replace_items(items))

    async def clear(self) -> None:
        if self.fence.closed:
            await trio.lowlevel.checkpoint()
            return
        await self._retry(self.inner.clear)

    async def aclose(self) -> None:
        await self.inner.aclose()
