"""The shared store of Temporal runs in PostgreSQL: :class:`PostgresRunStore`.

The same store as :class:`~._run_store.RunStore` (every run's record and event log, the
sessions' claims, the attempts' claims that fence a stale attempt; see that module's
docstring), for workers and servers on several machines: they all reach one database,
where the workers' sessions live too (:func:`~._storage.postgres_sessions`). Needs the
``postgres`` extra (psycopg 3 and psycopg-pool).

Tables (component ``temporal`` of ``trio_agents_schema``, schema version
:data:`SCHEMA_VERSION`; beside the session tables, apart from the cluster's)::

    trio_agents_temporal_runs(run_id PRIMARY KEY, n BIGSERIAL,  -- n: insertion order
        principal, root_id, parent_id, created, status, info, attempt)
    trio_agents_temporal_events(id BIGSERIAL PRIMARY KEY, root_id, run_id, seq, event,
        UNIQUE (run_id, seq))
    trio_agents_temporal_claims(principal, session_id, run_id,
        PRIMARY KEY (principal, session_id))
    trio_agents_temporal_changes(slot PRIMARY KEY, version)  -- the change counter

Isolation is PostgreSQL's default, READ COMMITTED; what SQLite gets from one writer at a
time (``BEGIN IMMEDIATE``) is got here from row and advisory locks, each taken by the
first statement that needs it and held to the commit:

- **Fencing.** Every transaction that writes a root's events (:meth:`write_events`,
  :meth:`finish_if_open`) first locks the root's row (``SELECT ... FOR UPDATE``) and
  checks its ``attempt`` there; :meth:`claim_attempt` raises ``attempt`` with an
  ``UPDATE ... WHERE attempt < n``, which waits for that lock and re-checks its
  condition on the row as committed (READ COMMITTED's re-check of an updated row). So
  a claim and a write never interleave: a write that committed first is seen by the
  claim's next statement (its ``max(seq)``: the new attempt's first seq follows it),
  and a write after the claim finds the new number and writes nothing.
- **The order of events.** Event ids come from a sequence, given out at insert time,
  not at commit. Under the root's row lock the writes of one tree never overlap, so a
  tree's ids are committed in order, and :meth:`events_after` (which reads one tree
  after an id) never steps over an id that commits later.
- **Session claims.** Reading a session's holder and claiming it happen under a
  transaction-level advisory lock of the session (``_lock_session``), so two starts of
  one session never both find it free. Releasing a claim (``DELETE ... WHERE run_id``)
  needs no lock: it only frees, and a delete that meets a row another transaction just
  changed re-checks its ``run_id`` against the committed row.
- **Change detection.** Each write bumps one of :data:`_SLOTS` counters (chosen by the
  root, so writers of different runs seldom wait for each other), as its transaction's
  last statement: the bump commits with the write, never before it.
  :meth:`data_version` is their sum, which only grows and changes at every commit.

Every call runs psycopg's sync API in a worker thread, on a connection of the pool
that :class:`~trio_agents.sessions.PostgresSession` shares per DSN and size (the same
pool, and the same per-run thread limiter, as the workers' sessions), one transaction
per call whose ``lock_timeout`` and ``statement_timeout`` are capped by the caller's
Trio deadline. A call is not abandoned once in its thread (a write is whole or not at
all); every psycopg error is raised as :class:`~._shared_store.RunStoreError`.
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, TypeVar, final

import attrs
import psycopg
import psycopg.conninfo
import trio

from .._events import RunStatus
from ..hosting import RunInfo
from ..sessions import PostgresSession
from ..sessions._postgres import (
    _SCHEMA_LOCK,
    _SCHEMA_TABLE,
    _acquire_pool,
    _Pool,
    _pool_limiter,
    _release_pool,
    transaction,
)
from ._run_store import FENCED_BY_HOST, Claim, StoredEvent
from ._shared_store import IDLE_IN_TRANSACTION, RunStoreError

__all__ = ["SCHEMA_VERSION", "PostgresRunStore"]

T = TypeVar("T")
Conn = psycopg.Connection[Any]

SCHEMA_VERSION: Final = 1
"""The schema version of the ``temporal`` component this code reads and writes."""

_COMPONENT: Final = "temporal"
_SLOTS: Final = 16
# The first key of the session claims' advisory locks: the two-integer form of
# pg_advisory_xact_lock, a key space apart from the schema lock's single bigint.
_CLAIM_LOCKS: Final = 0x74656D70  # "temp"
_TERMINAL: Final = [status.value for status in RunStatus if status.is_terminal]

_DDL: Final = (
    # n: SQLite's rowid (two runs created in the same instant keep their order).
    """CREATE TABLE trio_agents_temporal_runs (
        run_id TEXT PRIMARY KEY,
        n BIGSERIAL NOT NULL,
        principal TEXT NOT NULL,
        root_id TEXT NOT NULL,
        parent_id TEXT,
        created DOUBLE PRECISION NOT NULL,
        status TEXT NOT NULL,
        info TEXT NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 0)""",
    "CREATE INDEX trio_agents_temporal_runs_principal"
    " ON trio_agents_temporal_runs (principal, parent_id, created)",
    "CREATE INDEX trio_agents_temporal_runs_parent"
    " ON trio_agents_temporal_runs (parent_id, created)",
    # event is TEXT, not JSONB: JSONB cannot hold \u0000 and reorders keys.
    """CREATE TABLE trio_agents_temporal_events (
        id BIGSERIAL PRIMARY KEY,
        root_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        event TEXT NOT NULL,
        UNIQUE (run_id, seq))""",
    "CREATE INDEX trio_agents_temporal_events_root ON trio_agents_temporal_events (root_id, id)",
    """CREATE TABLE trio_agents_temporal_claims (
        principal TEXT NOT NULL,
        session_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        PRIMARY KEY (principal, session_id))""",
    "CREATE INDEX trio_agents_temporal_claims_run ON trio_agents_temporal_claims (run_id)",
    """CREATE TABLE trio_agents_temporal_changes (
        slot INTEGER PRIMARY KEY,
        version BIGINT NOT NULL DEFAULT 0)""",
    f"INSERT INTO trio_agents_temporal_changes (slot) SELECT generate_series(0, {_SLOTS - 1})",
    # A tool call of a run's tree recorded before its tool runs (keyed by the root's id);
    # n: the order they were recorded in.
    """CREATE TABLE trio_agents_temporal_calls (
        run_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        n BIGSERIAL NOT NULL,
        PRIMARY KEY (run_id, call_id))""",
    # Where the attempt that owns a root run takes pushed ops ("host:port").
    """CREATE TABLE trio_agents_temporal_places (
        run_id TEXT PRIMARY KEY,
        attempt INTEGER NOT NULL,
        address TEXT NOT NULL)""",
)


def _check_dsn(dsn: object) -> str:
    if not isinstance(dsn, str):
        raise TypeError(f"dsn must be a str, not {type(dsn).__name__}")
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise ValueError(
            f"not a valid PostgreSQL connection string: {' '.join(str(exc).split())}"
        ) from None
    return dsn


@final
class PostgresRunStore:
    """The shared store of Temporal runs in the PostgreSQL database at ``dsn`` (see the
    module docstring): a :class:`SharedRunStore <trio_agents.temporal.SharedRunStore>`
    for workers and servers on several machines. Open it with ``async with`` or call
    :meth:`close` when done.

    Args:
        dsn: a libpq connection string or URI (``"postgresql://user@host/db"``); the
            tables are created on first use. Every worker and server of the same runs
            names the same database.
        max_connections: the size of the connection pool, shared with every
            :class:`~trio_agents.sessions.PostgresSession` of the process on the same
            DSN and size.
        lock_timeout: seconds a call waits for a lock held by another connection.
        statement_timeout: seconds any one statement may run (and a call may wait for a
            connection of the pool).
        idle_timeout: seconds a transaction may sit idle between its statements before
            PostgreSQL ends its connection (a writer frozen mid-transaction releases
            the run's row lock, so the attempt taking the run over can claim it).

    Raises:
        TypeError, ValueError: ``dsn`` is not a connection string.
        RunStoreError: (from any call) PostgreSQL failed, or its tables are not usable.
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_connections: int = 4,
        lock_timeout: float = 5.0,
        statement_timeout: float = 30.0,
        idle_timeout: float = IDLE_IN_TRANSACTION,
    ) -> None:
        self._dsn = _check_dsn(dsn)
        params = psycopg.conninfo.conninfo_to_dict(dsn)
        host, port, dbname = (str(params.get(k) or "") for k in ("host", "port", "dbname"))
        self._database = f"{host or 'localhost'}:{port or '5432'}/{dbname or '(default)'}"
        self._key = (dsn, max_connections)
        self._lock_timeout = lock_timeout
        self._statement_timeout = statement_timeout
        self._idle_timeout = idle_timeout
        self._shared: _Pool | None = None
        # Guards _shared and _calls: a close waits for the calls in flight, whose
        # connections belong to the pool it may close.
        self._state = threading.Condition()
        self._calls = 0
        self._schema_ready = False

    @property
    def database(self) -> str:
        """The database as ``host:port/dbname`` (from the DSN; never the password)."""
        return self._database

    def __repr__(self) -> str:
        return f"PostgresRunStore({self._database!r})"

    async def __aenter__(self) -> PostgresRunStore:
        await self._call(lambda conn: None)  # connects, and checks the tables
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Give the store's share of the pool back (a later call takes it again)."""

        def close() -> None:
            with self._state:
                self._state.wait_for(lambda: self._calls == 0)
                shared, self._shared = self._shared, None
            if shared is not None:
                _release_pool(shared)

        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(close)

    # ------------------------------------------------------------------ plumbing

    async def _call(self, fn: Callable[[Conn], T], *, write: bool = True) -> T:
        """``fn(conn)`` in a worker thread: in one transaction with its timeouts, or,
        for a read (``write=False``), each statement on its own (autocommit): a read
        waits for no row lock in PostgreSQL (MVCC), and saves the ``BEGIN`` and ``COMMIT``
        round trips (what the hosts' polls of :meth:`data_version` cost most)."""
        if not self._schema_ready:
            await self._prepare_sessions()
        remaining = trio.current_effective_deadline() - trio.current_time()
        # A wall-clock deadline for the thread (Trio's clock may be a MockClock).
        deadline = time.monotonic() + max(remaining, 0.0) if remaining < float("inf") else None
        # Counted from here, not from when its thread starts: a close that comes while
        # the call waits for a thread slot waits for it.
        with self._state:
            self._calls += 1
        try:
            return await trio.to_thread.run_sync(
                self._in_thread, fn, deadline, write, limiter=_pool_limiter(self._key)
            )
        finally:  # never abandoned: its thread, if it started, has returned
            with self._state:
                self._calls -= 1
                self._state.notify_all()

    async def _prepare_sessions(self) -> None:
        """The session tables first (PostgresSession creates them, and the
        ``trio_agents_schema`` table this store records its own version in)."""
        try:
            async with PostgresSession(
                self._dsn,
                max_connections=self._key[1],
                lock_timeout=self._lock_timeout,
                statement_timeout=self._statement_timeout,
            ):
                pass
        except Exception as exc:
            raise RunStoreError(f"database {self._database}: {exc}") from exc

    def _in_thread(self, fn: Callable[[Conn], T], deadline: float | None, write: bool) -> T:
        def budget(limit: float) -> float:
            return (
                limit if deadline is None else max(min(limit, deadline - time.monotonic()), 0.001)
            )

        with self._state:
            if self._shared is None:
                self._shared = _acquire_pool(self._key)
            shared = self._shared
        try:
            with shared.pool.connection(timeout=budget(self._statement_timeout)) as conn:
                timeouts = (
                    budget(self._lock_timeout),
                    budget(self._statement_timeout),
                    self._idle_timeout,
                )
                if not self._schema_ready:
                    with transaction(conn, *timeouts):
                        _prepare(conn)
                    self._schema_ready = True
                if not write:
                    return fn(conn)
                with transaction(conn, *timeouts):
                    return fn(conn)
        except psycopg.Error as exc:
            message = " ".join(str(exc).split())
            raise RunStoreError(f"database {self._database}: {message}") from exc

    async def _write(
        self,
        fn: Callable[[Conn], T],
        root_id: str,
        wrote: Callable[[T], bool] = lambda result: True,
    ) -> T:
        """``fn(conn)`` in a transaction that bumps the change counter of ``root_id``'s
        slot as its last statement (the bump commits with the write) — unless
        ``wrote(result)`` says ``fn`` changed nothing: a bump wakes every server that
        polls the store, and a run queued behind a busy session would otherwise wake
        its own host (and every other) with each look at the session."""

        def write(conn: Conn) -> T:
            result = fn(conn)
            if wrote(result):
                conn.execute(
                    "UPDATE trio_agents_temporal_changes SET version = version + 1 WHERE slot = %s",
                    (zlib.crc32(root_id.encode()) % _SLOTS,),
                )
            return result

        return await self._call(write)

    # ------------------------------------------------------------ the host's side

    async def create_run(self, info: RunInfo, principal: str, *, claim_session: bool) -> str | None:
        """Record a new root run (status ``queued``) and, with ``claim_session``, claim
        its session in the same transaction; returns the id of the run that holds the
        session instead (nothing recorded then), or None."""

        def write(conn: Conn) -> str | None:
            if claim_session and info.session_id is not None:
                _lock_session(conn, principal, info.session_id)
                holder = _holder(conn, principal, info.session_id)
                if holder is not None:
                    return holder
                _set_claim(conn, principal, info.session_id, info.run_id)
            conn.execute(
                "INSERT INTO trio_agents_temporal_runs"
                " (run_id, principal, root_id, parent_id, created, status, info)"
                " VALUES (%s, %s, %s, NULL, %s, %s, %s)",
                (
                    info.run_id,
                    principal,
                    info.run_id,
                    time.time(),
                    info.status.value,
                    json.dumps(info.to_json()),
                ),
            )
            return None

        return await self._write(write, info.run_id)

    async def forget_run(self, run_id: str) -> None:
        """Remove a root run recorded by :meth:`create_run` whose workflow never
        started (and its session claim)."""

        def write(conn: Conn) -> None:
            # attempt = 0: no attempt claimed it (one that did keeps its record).
            conn.execute(
                "DELETE FROM trio_agents_temporal_runs WHERE run_id = %s AND attempt = 0",
                (run_id,),
            )
            conn.execute("DELETE FROM trio_agents_temporal_claims WHERE run_id = %s", (run_id,))

        await self._write(write, run_id)

    async def session_holder(self, principal: str, session_id: str) -> str | None:
        """The id of the session's active run, or None."""
        return await self._call(lambda conn: _holder(conn, principal, session_id), write=False)

    async def release_session(self, principal: str, session_id: str, run_id: str) -> None:
        """Free the session's claim if ``run_id`` still holds it."""

        def write(conn: Conn) -> bool:
            deleted = conn.execute(
                "DELETE FROM trio_agents_temporal_claims"
                " WHERE principal = %s AND session_id = %s AND run_id = %s",
                (principal, session_id, run_id),
            )
            return deleted.rowcount > 0

        await self._write(write, run_id, wrote=bool)

    async def info(self, principal: str, run_id: str) -> RunInfo | None:
        """The run's record (any node of a tree), or None when there is none of this
        principal's."""

        def read(conn: Conn) -> RunInfo | None:
            row = conn.execute(
                "SELECT info FROM trio_agents_temporal_runs WHERE run_id = %s AND principal = %s",
                (run_id, principal),
            ).fetchone()
            if row is None:
                return None
            info = RunInfo.from_json(json.loads(row[0]))
            children = conn.execute(
                "SELECT run_id FROM trio_agents_temporal_runs WHERE parent_id = %s"
                " ORDER BY created, n",
                (run_id,),
            ).fetchall()
            return attrs.evolve(info, children=tuple(str(child[0]) for child in children))

        return await self._call(read, write=False)

    async def root_of(self, principal: str, run_id: str) -> str | None:
        """The root run id of ``run_id``'s tree (None: no such run of this principal)."""

        def read(conn: Conn) -> str | None:
            row = conn.execute(
                "SELECT root_id FROM trio_agents_temporal_runs"
                " WHERE run_id = %s AND principal = %s",
                (run_id, principal),
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._call(read, write=False)

    async def runs_of(self, principal: str, *, nodes: bool) -> list[RunInfo]:
        """The principal's roots, oldest first (each followed by every node of its tree,
        parents before children, with ``nodes``)."""

        def read(conn: Conn) -> list[tuple[str, str | None, str]]:
            rows = conn.execute(
                "SELECT run_id, parent_id, info FROM trio_agents_temporal_runs"
                " WHERE principal = %s ORDER BY created, n",
                (principal,),
            ).fetchall()
            return [(str(r), None if p is None else str(p), str(i)) for r, p, i in rows]

        return _trees(await self._call(read, write=False), nodes=nodes)

    async def active_roots(self, principal: str) -> int:
        """How many of the principal's root runs are not terminal."""

        def read(conn: Conn) -> int:
            row = conn.execute(
                "SELECT count(*) FROM trio_agents_temporal_runs WHERE principal = %s"
                " AND parent_id IS NULL AND status <> ALL(%s)",
                (principal, _TERMINAL),
            ).fetchone()
            return 0 if row is None else int(row[0])

        return await self._call(read, write=False)

    async def events_after(
        self, root_id: str, after_id: int, run_ids: Iterable[str] | None, limit: int = 500
    ) -> tuple[list[StoredEvent], int]:
        """Events of ``root_id``'s tree written after ``after_id``, in write order (at
        most ``limit`` rows scanned), only those of ``run_ids`` when given; and the id
        of the last row scanned (where the next call goes on). Safe to page by id: a
        tree's ids commit in order (see the module docstring)."""
        wanted = None if run_ids is None else frozenset(run_ids)

        def read(conn: Conn) -> tuple[list[StoredEvent], int]:
            rows = conn.execute(
                "SELECT id, run_id, seq, event FROM trio_agents_temporal_events"
                " WHERE root_id = %s AND id > %s ORDER BY id LIMIT %s",
                (root_id, after_id, limit),
            ).fetchall()
            found = [
                StoredEvent(int(id_), str(run_id), int(seq), json.loads(event))
                for id_, run_id, seq, event in rows
                if wanted is None or run_id in wanted
            ]
            return found, int(rows[-1][0]) if rows else after_id

        return await self._call(read, write=False)

    async def claim_session(self, principal: str, session_id: str, run_id: str) -> str | None:
        """Claim the session for ``run_id``; the id of the run holding it instead, or
        None once claimed."""

        def write(conn: Conn) -> str | None:
            _lock_session(conn, principal, session_id)
            holder = _holder(conn, principal, session_id)
            if holder is not None and holder != run_id:
                return holder
            _set_claim(conn, principal, session_id, run_id)
            return None

        return await self._write(write, run_id, wrote=lambda holder: holder is None)

    async def open_roots(self) -> list[tuple[str, str]]:
        """``(principal, run_id)`` of every root run whose record is not terminal."""

        def read(conn: Conn) -> list[tuple[str, str]]:
            rows = conn.execute(
                "SELECT principal, run_id FROM trio_agents_temporal_runs"
                " WHERE parent_id IS NULL AND status <> ALL(%s) ORDER BY created, n",
                (_TERMINAL,),
            ).fetchall()
            return [(str(p), str(r)) for p, r in rows]

        return await self._call(read, write=False)

    async def subtree(self, run_id: str) -> list[str]:
        """``run_id`` and every descendant recorded so far (parents before children)."""

        def read(conn: Conn) -> list[str]:
            # One round trip for the whole tree.
            rows = conn.execute(
                "WITH RECURSIVE below(run_id, depth) AS ("
                "   SELECT run_id, 1 FROM trio_agents_temporal_runs WHERE parent_id = %s"
                "   UNION ALL"
                "   SELECT r.run_id, b.depth + 1 FROM trio_agents_temporal_runs r"
                "   JOIN below b ON r.parent_id = b.run_id)"
                " SELECT run_id FROM below ORDER BY depth",
                (run_id,),
            ).fetchall()
            return [run_id, *(str(row[0]) for row in rows)]

        return await self._call(read, write=False)

    async def data_version(self) -> int:
        """The sum of the change counters: it changes once any write committed."""

        def read(conn: Conn) -> int:
            row = conn.execute("SELECT sum(version) FROM trio_agents_temporal_changes").fetchone()
            return 0 if row is None or row[0] is None else int(row[0])

        return await self._call(read, write=False)

    async def finish_if_open(
        self, principal: str, run_id: str, status: str, reason: str | None
    ) -> bool:
        """Write the root run's terminal record and ``run.updated`` event when no attempt
        did (its workflow ended without one), fencing every attempt; False when it was
        terminal."""

        def write(conn: Conn) -> bool:
            # The root's row lock: no attempt's write or claim interleaves (fencing).
            row = conn.execute(
                "SELECT info, status FROM trio_agents_temporal_runs WHERE run_id = %s FOR UPDATE",
                (run_id,),
            ).fetchone()
            if row is None or row[1] in _TERMINAL:
                return False
            info = RunInfo.from_json(json.loads(row[0]))
            seq = _last_seq(conn, run_id) + 1
            event, ended = _terminal(info, run_id, seq, status, reason)
            conn.execute(
                "INSERT INTO trio_agents_temporal_events (root_id, run_id, seq, event)"
                " VALUES (%s, %s, %s, %s)",
                (run_id, run_id, seq, json.dumps(event)),
            )
            conn.execute(
                "UPDATE trio_agents_temporal_runs SET status = %s, info = %s, attempt = %s"
                " WHERE run_id = %s",
                (status, json.dumps(ended.to_json()), FENCED_BY_HOST, run_id),
            )
            conn.execute("DELETE FROM trio_agents_temporal_claims WHERE run_id = %s", (run_id,))
            return True

        return await self._write(write, run_id)

    # ---------------------------------------------------------- a worker's side

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
        """Claim the run's writes for ``attempt`` (a run started without a host gets its
        record here); the seq its next event takes and the calls already started. With
        ``address``, the attempt's push address is recorded with the claim."""

        def write(conn: Conn) -> Claim:
            conn.execute(
                "INSERT INTO trio_agents_temporal_runs"
                " (run_id, principal, root_id, parent_id, created, status, info)"
                " VALUES (%s, %s, %s, NULL, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING",
                (
                    run_id,
                    principal,
                    run_id,
                    time.time(),
                    info.status.value,
                    json.dumps(info.to_json()),
                ),
            )
            if session_id is not None:
                conn.execute(
                    "INSERT INTO trio_agents_temporal_claims VALUES (%s, %s, %s)"
                    " ON CONFLICT DO NOTHING",
                    (principal, session_id, run_id),
                )
            # Waits for a write holding the root's row, then re-checks attempt < n on the
            # committed row: the number only grows, and two claims of one number cannot
            # both succeed.
            claimed = conn.execute(
                "UPDATE trio_agents_temporal_runs SET attempt = %s WHERE run_id = %s"
                " AND attempt < %s",
                (attempt, run_id, attempt),
            ).rowcount
            if claimed == 1 and address is not None:
                conn.execute(
                    "INSERT INTO trio_agents_temporal_places VALUES (%s, %s, %s)"
                    " ON CONFLICT (run_id) DO UPDATE SET attempt = excluded.attempt,"
                    " address = excluded.address",
                    (run_id, attempt, address),
                )
            # Statements after the update: their snapshots hold every write committed
            # before the claim, so the next seq follows all of them, and every call an
            # earlier attempt recorded (record_call holds the same row lock) is seen.
            started = tuple(
                str(row[0])
                for row in conn.execute(
                    "SELECT call_id FROM trio_agents_temporal_calls WHERE run_id = %s ORDER BY n",
                    (run_id,),
                ).fetchall()
            )
            return Claim(owned=claimed == 1, next_seq=_last_seq(conn, run_id) + 1, started=started)

        return await self._write(write, run_id)

    async def record_call(self, root_id: str, attempt: int, call_id: str) -> bool:
        """Record that a tool call of the run's tree starts (before its tool runs);
        False, with nothing written, when ``attempt`` no longer owns the run (fenced)."""

        def write(conn: Conn) -> bool:
            # The root's row lock to the commit, as write_events takes it: a later claim
            # waits for this record (and then reads it), or this one sees the claim.
            if not _owns(conn, root_id, attempt, lock=True):
                return False
            conn.execute(
                "INSERT INTO trio_agents_temporal_calls (run_id, call_id, attempt)"
                " VALUES (%s, %s, %s) ON CONFLICT (run_id, call_id) DO NOTHING",
                (root_id, call_id, attempt),
            )
            return True

        # No change counter bump: nobody follows calls, only attempts read them.
        return await self._call(write)

    async def owns(self, run_id: str, attempt: int) -> bool:
        """Whether ``attempt`` owns the root run ``run_id``'s writes now."""

        def read(conn: Conn) -> bool:
            return _owns(conn, run_id, attempt, lock=False)

        return await self._call(read, write=False)

    async def place_of(self, run_id: str) -> str | None:
        """The push address of the attempt that owns the root run ``run_id`` now (None:
        no attempt has claimed it, or the owning attempt recorded none)."""

        def read(conn: Conn) -> str | None:
            # Only the owner's address: a fenced attempt's could be a frozen worker's.
            row = conn.execute(
                "SELECT p.address FROM trio_agents_temporal_places p"
                " JOIN trio_agents_temporal_runs r ON r.run_id = p.run_id"
                " WHERE p.run_id = %s AND p.attempt = r.attempt",
                (run_id,),
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._call(read, write=False)

    async def write_events(
        self,
        root_id: str,
        attempt: int,
        principal: str,
        events: Sequence[tuple[str, int, str]],
        records: Sequence[tuple[str, str | None, RunInfo]],
        release: str | None,
    ) -> bool:
        """Write a batch of the attempt's events (``(run_id, seq, event JSON)``), then
        each touched run's record (``(run_id, parent_id, info)``), and free the session
        ``release`` names (the root ended), in one transaction; False, with nothing
        written, when the attempt no longer owns the run (fenced)."""

        def write(conn: Conn) -> bool:
            # The root's row lock, held to the commit: a later claim waits for this
            # write, or this write sees the later claim's number (fencing).
            if not _owns(conn, root_id, attempt, lock=True):
                return False
            with conn.cursor() as cursor:
                cursor.executemany(
                    "INSERT INTO trio_agents_temporal_events (root_id, run_id, seq, event)"
                    " VALUES (%s, %s, %s, %s) ON CONFLICT (run_id, seq) DO NOTHING",
                    [(root_id, run_id, seq, event) for run_id, seq, event in events],
                )
                now = time.time()
                cursor.executemany(
                    "INSERT INTO trio_agents_temporal_runs"
                    " (run_id, principal, root_id, parent_id, created, status, info)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (run_id) DO UPDATE SET status = excluded.status,"
                    " info = excluded.info",
                    [
                        (
                            run_id,
                            principal,
                            root_id,
                            parent_id,
                            now,
                            info.status.value,
                            json.dumps(info.to_json()),
                        )
                        for run_id, parent_id, info in records
                    ],
                )
            if release is not None:
                conn.execute(
                    "DELETE FROM trio_agents_temporal_claims"
                    " WHERE principal = %s AND session_id = %s AND run_id = %s",
                    (principal, release, root_id),
                )
            return True

        return await self._write(write, root_id)


def _owns(conn: Conn, root_id: str, attempt: int, *, lock: bool) -> bool:
    """Whether ``attempt`` owns the root run's writes; with ``lock``, the root's row is
    locked to the commit (a write's fence: a later claim waits for it)."""
    row = conn.execute(
        "SELECT attempt FROM trio_agents_temporal_runs WHERE run_id = %s"
        + (" FOR UPDATE" if lock else ""),
        (root_id,),
    ).fetchone()
    return row is not None and int(row[0]) == attempt


def _prepare(conn: Conn) -> None:
    """Create the ``temporal`` component's tables unless they exist (under the
    sessions' advisory schema lock, so concurrent processes create them once)."""

    def version() -> int | None:
        row = conn.execute(
            f"SELECT version FROM {_SCHEMA_TABLE} WHERE component = %s", (_COMPONENT,)
        ).fetchone()
        return None if row is None else int(row[0])

    if version() == SCHEMA_VERSION:
        return
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
    found = version()  # again, under the lock: another process may have created them
    if found == SCHEMA_VERSION:
        return
    if found is not None:
        raise psycopg.DataError(
            f"the Temporal run tables have schema version {found}; this trio_agents reads"
            f" version {SCHEMA_VERSION} (upgrade trio_agents)"
        )
    for statement in _DDL:
        conn.execute(statement)
    conn.execute(
        f"INSERT INTO {_SCHEMA_TABLE} (component, version) VALUES (%s, %s)",
        (_COMPONENT, SCHEMA_VERSION),
    )


def _lock_session(conn: Conn, principal: str, session_id: str) -> None:
    """The session's claim lock, to the commit: a transaction that reads the session's
    holder and then claims it is alone in doing so (READ COMMITTED: the next statement
    sees what the previous holder of the lock committed)."""
    conn.execute(
        "SELECT pg_advisory_xact_lock(%s::integer, hashtext(%s))",
        (_CLAIM_LOCKS, json.dumps([principal, session_id])),
    )


def _holder(conn: Conn, principal: str, session_id: str) -> str | None:
    # A claim whose run is terminal is stale (its release was lost with a process).
    row = conn.execute(
        "SELECT c.run_id FROM trio_agents_temporal_claims c"
        " LEFT JOIN trio_agents_temporal_runs r ON r.run_id = c.run_id"
        " WHERE c.principal = %s AND c.session_id = %s"
        " AND (r.status IS NULL OR r.status <> ALL(%s))",
        (principal, session_id, _TERMINAL),
    ).fetchone()
    return None if row is None else str(row[0])


def _set_claim(conn: Conn, principal: str, session_id: str, run_id: str) -> None:
    """SQLite's ``INSERT OR REPLACE``: the claim is ``run_id``'s (under the session's
    claim lock, after its holder was found free or stale)."""
    conn.execute(
        "INSERT INTO trio_agents_temporal_claims VALUES (%s, %s, %s)"
        " ON CONFLICT (principal, session_id) DO UPDATE SET run_id = excluded.run_id",
        (principal, session_id, run_id),
    )


def _last_seq(conn: Conn, run_id: str) -> int:
    row = conn.execute(
        "SELECT max(seq) FROM trio_agents_temporal_events WHERE run_id = %s", (run_id,)
    ).fetchone()
    return 0 if row is None or row[0] is None else int(row[0])


def _terminal(
    info: RunInfo, run_id: str, seq: int, status: str, reason: str | None
) -> tuple[dict[str, Any], RunInfo]:
    """The ``run.updated`` event and the record of a run a host ends (as RunStore's)."""
    event = {
        "type": "run.updated",
        "run_id": run_id,
        "seq": seq,
        "status": status,
        "reason": reason,
        "turn": info.turn,
        "at": time.time(),
        "detail": {},
    }
    ended = attrs.evolve(
        info, status=RunStatus(status), reason=reason, seq=seq, pending_approvals=(), detail={}
    )
    return event, ended


def _trees(rows: list[tuple[str, str | None, str]], *, nodes: bool) -> list[RunInfo]:
    """Roots in ``rows``' order, each with its ``children``; with ``nodes``, each root
    followed by its tree (depth first, parents before children)."""
    below: dict[str, list[str]] = {}
    infos: dict[str, RunInfo] = {}
    for run_id, parent, data in rows:
        infos[run_id] = RunInfo.from_json(json.loads(data))
        if parent is not None:
            below.setdefault(parent, []).append(run_id)
    found: list[RunInfo] = []
    for run_id, parent, _data in rows:
        if parent is not None:
            continue
        pending = [run_id]
        while pending:
            node = pending.pop()
            found.append(attrs.evolve(infos[node], children=tuple(below.get(node, ()))))
            if not nodes:
                break
            pending.extend(reversed(below.get(node, ())))
    return found
