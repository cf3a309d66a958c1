"""What a Temporal run store is: :class:`SharedRunStore`, the one seam between the
attempts that write runs and the hosts that serve them.

Two stores satisfy it: :class:`~._run_store.RunStore` (one SQLite file, every worker
and server on one disk) and :class:`~._pg_run_store.PostgresRunStore` (a PostgreSQL
database, workers and servers on any number of machines). :class:`TemporalHost
<trio_agents.temporal.TemporalHost>`, the attempts' event writer and the workers take
either, and never ask which one they hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, Self

from .._exceptions import TrioAgentsError
from ..hosting import RunInfo
from ._run_store import Claim, StoredEvent

__all__ = ["IDLE_IN_TRANSACTION", "RunStoreError", "SharedRunStore"]

IDLE_IN_TRANSACTION = 2.0
"""Seconds a PostgreSQL transaction of a worker (its run store's, its sessions') may
sit idle between statements before the server ends its connection and releases its
locks: a worker frozen in the middle of one (SIGSTOP, a paused VM) would otherwise
hold the run's row, or its session's, until it thaws, and the attempt that takes the
run over could not claim it. Well below the stores' 5 s ``lock_timeout``, so that
claim, waiting on the frozen row, gets it at its first try; a live transaction is
never idle that long (its statements run back to back in one thread)."""


class RunStoreError(TrioAgentsError):
    """A call on a :class:`PostgresRunStore <trio_agents.temporal.PostgresRunStore>`
    failed: the database could not be reached, a lock or statement timed out, or its
    tables are not usable by this trio_agents (the message says which; the psycopg
    error is its ``__cause__``). An attempt's event writer retries a write that failed
    so; an op of a host that failed so answers ``internal``."""


class SharedRunStore(Protocol):
    """The store of Temporal runs shared by the workers that run them and the servers
    that serve them: every run's record, its event log, the sessions' claims, and the
    attempts' claims that fence a stale attempt (docs/temporal.md, "The shared store").

    Semantics every store keeps (the tests run both against them):

    - a call is whole or not at all, and is not abandoned when its caller is cancelled;
    - :meth:`claim_attempt` only ever raises a run's attempt number, and
      :meth:`write_events` writes nothing, returning False, unless the run's number is
      still the writer's (checked in the write's own transaction);
    - the events of a root's tree are returned by :meth:`events_after` in the order
      they were written, each once, and a write is seen whole or not at all;
    - :meth:`data_version` changes once anyone committed a change (it may change more
      often), so a server that polls it never misses a write.

    Open it with ``async with`` (or call :meth:`close` when done).
    """

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    async def close(self) -> None:
        """Give the store's connections back (a later call opens them again)."""
        ...

    async def create_run(self, info: RunInfo, principal: str, *, claim_session: bool) -> str | None:
        """Record a new root run and, with ``claim_session``, claim its session in the
        same transaction; the id of the run holding the session instead, or None."""
        ...

    async def forget_run(self, run_id: str) -> None:
        """Remove a root run whose workflow never started (and its session claim)."""
        ...

    async def session_holder(self, principal: str, session_id: str) -> str | None:
        """The id of the session's active run, or None."""
        ...

    async def release_session(self, principal: str, session_id: str, run_id: str) -> None:
        """Free the session's claim if ``run_id`` still holds it."""
        ...

    async def info(self, principal: str, run_id: str) -> RunInfo | None:
        """The run's record (any node of a tree), or None."""
        ...

    async def root_of(self, principal: str, run_id: str) -> str | None:
        """The root run id of ``run_id``'s tree, or None."""
        ...

    async def runs_of(self, principal: str, *, nodes: bool) -> list[RunInfo]:
        """The principal's roots, oldest first (with ``nodes``, each followed by its
        tree, parents before children)."""
        ...

    async def active_roots(self, principal: str) -> int:
        """How many of the principal's root runs are not terminal."""
        ...

    async def events_after(
        self, root_id: str, after_id: int, run_ids: Iterable[str] | None, limit: int = 500
    ) -> tuple[list[StoredEvent], int]:
        """Events of the tree written after ``after_id`` (only ``run_ids``' when given),
        and where the next call goes on."""
        ...

    async def claim_session(self, principal: str, session_id: str, run_id: str) -> str | None:
        """Claim the session for ``run_id``; the id of the run holding it, or None."""
        ...

    async def open_roots(self) -> list[tuple[str, str]]:
        """``(principal, run_id)`` of every root run whose record is not terminal."""
        ...

    async def subtree(self, run_id: str) -> list[str]:
        """``run_id`` and every descendant recorded so far."""
        ...

    async def data_version(self) -> int:
        """A number that changes once anyone committed a change to the store."""
        ...

    async def finish_if_open(
        self, principal: str, run_id: str, status: str, reason: str | None
    ) -> bool:
        """Write the root's terminal record when no attempt did, fencing every attempt;
        False when it was terminal."""
        ...

    async def claim_attempt(
        self,
        run_id: str,
        principal: str,
        session_id: str | None,
        attempt: int,
        info: RunInfo,
        *,
        address: str | None = None,
    ) -> Claim:
        """Claim the run's writes for ``attempt`` (recording its push ``address``);
        whether it owns them, its next seq and the calls earlier attempts started."""
        ...

    async def record_call(self, root_id: str, attempt: int, call_id: str) -> bool:
        """Record that a call of the tree starts, before its tool runs; False when
        ``attempt`` is fenced (nothing recorded)."""
        ...

    async def owns(self, run_id: str, attempt: int) -> bool:
        """Whether ``attempt`` owns the root run's writes now (not fenced)."""
        ...

    async def place_of(self, run_id: str) -> str | None:
        """Where the attempt that owns the root run takes pushed ops, if it said."""
        ...

    async def write_events(
        self,
        root_id: str,
        attempt: int,
        principal: str,
        events: Sequence[tuple[str, int, str]],
        records: Sequence[tuple[str, str | None, RunInfo]],
        release: str | None,
    ) -> bool:
        """Write a batch of the attempt's events and records (and free the session
        ``release`` names) in one transaction; False, nothing written, when fenced."""
        ...
