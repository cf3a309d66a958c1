"""The cluster's database access: PostgresSession's pool, timeouts and schema machinery.

Every call runs psycopg's sync API in a worker thread on a connection of the pool that
:class:`~trio_agents.sessions.PostgresSession` shares per DSN and size (its
``_acquire_pool``), waiting for a thread slot in Trio (the pool's
:class:`trio.CapacityLimiter`), inside one transaction whose ``lock_timeout`` and
``statement_timeout`` are capped by the caller's Trio deadline. A call is not abandoned
once its thread started (a write must not run on unsupervised); it is bounded instead.

The tables are checked (created, migrated) by the first call: the ``sessions``
component first (PostgresSession's own ``_prepare``), then the ``cluster`` component
(``_schema.py``), under the same advisory lock and ``trio_agents_schema`` table.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar, final

import psycopg
import trio

from .._exceptions import TrioAgentsError
from ..sessions._postgres import (
    PostgresSession,
    _acquire_pool,
    _Pool,
    _pool_limiter,
    _release_pool,
    keepalives,
    transaction,
)
from ..sessions._storage import SessionStorageError
from ._schema import prepare_cluster_schema

__all__ = ["ClusterDown", "ClusterSchemaError", "Conn", "Database", "Dedicated"]

T = TypeVar("T")
Conn = psycopg.Connection[Any]


class ClusterSchemaError(TrioAgentsError):
    """The database's tables are not usable by this trio_agents (newer, or foreign):
    not retried; the node does not start (its control server's ``serve`` raises this)."""


class ClusterDown(TrioAgentsError):
    """The database could not be reached or a statement failed (the node retries).
    Its control server's ``serve`` raises this when the database stays unreachable
    while the node starts."""


@final
class Database:
    """Calls on the cluster's database (see the module docstring)."""

    def __init__(self, dsn: str, *, size: int = 10) -> None:
        self.dsn = dsn
        self._key = (dsn, size)
        self._shared: _Pool | None = None
        self._lock = threading.Lock()
        self.schema_ready = False
        self.statement_timeout = 10.0
        self.lock_timeout = 5.0
        # A transaction idle that long between its statements (its node frozen: a
        # paused process or VM, a partition) is ended by the server, releasing its
        # locks (the cluster sets it from its lease: see PostgresCluster).
        self.idle_timeout: float | None = None
        self.dead = False  # a "crashed" node (tests): every call fails at once
        self.statements = 0

    def _pool(self) -> _Pool:
        with self._lock:
            if self._shared is None:
                self._shared = _acquire_pool(self._key)
            return self._shared

    def close(self) -> None:
        """Give the pool back (blocking; call from a thread)."""
        with self._lock:
            shared, self._shared = self._shared, None
        if shared is not None:
            _release_pool(shared)

    async def aclose(self) -> None:
        """Give the pool back (shielded)."""
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.close)

    async def call(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn(conn)`` in one transaction in a worker thread (see the module
        docstring). Raises :class:`ClusterDown` on any database error."""
        if self.dead:
            await trio.lowlevel.checkpoint()
            raise ClusterDown("this node is stopped")
        remaining = trio.current_effective_deadline() - trio.current_time()
        deadline = time.monotonic() + max(remaining, 0.0) if remaining < float("inf") else None
        return await trio.to_thread.run_sync(
            self._in_thread, fn, deadline, limiter=_pool_limiter(self._key)
        )

    def _in_thread(self, fn: Callable[[Conn], T], deadline: float | None) -> T:
        def budget(limit: float) -> float:
            return limit if deadline is None else min(limit, deadline - time.monotonic())

        shared = self._pool()
        try:
            with shared.pool.connection(timeout=max(budget(self.statement_timeout), 0.001)) as conn:
                if not self.schema_ready:
                    try:
                        with conn.transaction():
                            PostgresSession(self.dsn)._prepare(conn)
                            prepare_cluster_schema(conn)
                    except (psycopg.DataError, SessionStorageError) as exc:
                        raise ClusterSchemaError(str(exc)) from exc
                    self.schema_ready = True
                with transaction(
                    conn,
                    budget(self.lock_timeout),
                    budget(self.statement_timeout),
                    self.idle_timeout,
                ):
                    self.statements += 1
                    return fn(conn)
        except psycopg.Error as exc:
            raise ClusterDown(str(exc)) from exc


@final
class Dedicated:
    """One connection of its own, outside the pool, for the node's heartbeat: it never
    waits for a pooled connection or a worker-thread slot behind the work (the flushes,
    routed ops and sessions of hundreds of runs), so a busy node renews its lease in
    time. Same transactions and timeouts as :meth:`Database.call`; the connection is
    opened on first use, and again after any error."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._conn: Conn | None = None
        self._limiter = trio.CapacityLimiter(1)

    async def call(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn(conn)`` in one transaction on this connection, in a worker thread.
        Raises :class:`ClusterDown` on any database error."""
        db = self._db
        if not db.schema_ready:  # the tables exist once a pooled call checked them
            await db.call(lambda conn: None)
        if db.dead:
            await trio.lowlevel.checkpoint()
            raise ClusterDown("this node is stopped")
        remaining = trio.current_effective_deadline() - trio.current_time()
        deadline = time.monotonic() + max(remaining, 0.0) if remaining < float("inf") else None
        return await trio.to_thread.run_sync(self._in_thread, fn, deadline, limiter=self._limiter)

    def _in_thread(self, fn: Callable[[Conn], T], deadline: float | None) -> T:
        db = self._db

        def budget(limit: float) -> float:
            return (
                limit if deadline is None else max(min(limit, deadline - time.monotonic()), 0.001)
            )

        try:
            conn = self._conn
            if conn is None or conn.closed or conn.broken:
                self._conn = None
                params = psycopg.conninfo.conninfo_to_dict(db.dsn)
                extra: dict[str, Any] = {"autocommit": True, **keepalives(params)}
                if "application_name" not in params:
                    extra["application_name"] = "trio_agents"
                if "connect_timeout" not in params:  # libpq: whole seconds, at least 2
                    extra["connect_timeout"] = max(2, int(budget(db.statement_timeout)))
                conn = self._conn = psycopg.connect(db.dsn, **extra)
            with transaction(
                conn, budget(db.lock_timeout), budget(db.statement_timeout), db.idle_timeout
            ):
                db.statements += 1
                return fn(conn)
        except psycopg.Error as exc:
            self.close()
            raise ClusterDown(str(exc)) from exc

    def close(self) -> None:
        """Close the connection (blocking; call from a thread)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        """Close the connection (shielded; waits for a call in flight)."""
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.close, limiter=self._limiter)
