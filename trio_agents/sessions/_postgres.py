"""A session stored in a PostgreSQL database: many processes, one store.

Needs the ``postgres`` extra (``pip install 'trio-agents[postgres]'``: psycopg 3 and
psycopg-pool).

Storage layout (schema version :data:`SCHEMA_VERSION` of the ``sessions`` component),
in the connection's current schema (``search_path``)::

    trio_agents_schema(component TEXT PRIMARY KEY,   -- 'sessions' (the cluster adds its own)
                       version INTEGER, updated_at TIMESTAMPTZ)
    trio_agents_sessions(session_id TEXT PRIMARY KEY,
                         next_position BIGINT,         -- where the next append starts
                         updated_at TIMESTAMPTZ)
    trio_agents_session_items(session_id TEXT, position BIGINT,  -- from 0 per session
                              data TEXT,               -- the item's to_json(), as JSON text
                              created_at TIMESTAMPTZ,
                              PRIMARY KEY (session_id, position))

Every write takes the session's row in ``trio_agents_sessions`` first (an upsert), so
writers of one session — in this process or any other — are serialised by PostgreSQL's
row lock, and writers of different sessions never wait for each other. ``data`` is
``TEXT``, not ``JSONB``: JSONB cannot hold ``\\u0000`` and reorders keys.

Under Trio: psycopg's async API is asyncio-only, so every call runs psycopg's sync API in
a worker thread (``trio.to_thread.run_sync``), on a connection from a
``psycopg_pool.ConnectionPool`` shared by every :class:`PostgresSession` of the process
with the same DSN and ``max_connections`` (opened by the first, closed with the last).
A :class:`trio.CapacityLimiter` per pool and Trio run keeps callers waiting in Trio
(cancellable) rather than in threads. Calls are never abandoned once in their thread — a
write must not run on unsupervised — so they are bounded instead: each call is one
transaction whose ``lock_timeout`` and ``statement_timeout`` are capped by the caller's
Trio deadline. A call costs ``BEGIN`` with both ``SET LOCAL`` (one round trip), its
statements, and ``COMMIT``; the pool checks a connection it hands out with a query only
when its socket has something to read (a server restart's goodbye), not every time.
"""

from __future__ import annotations

import contextlib
import json
import select
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Final, TypeAlias, TypeVar, final

import attrs
import trio

try:
    import psycopg
    import psycopg.conninfo
    from psycopg_pool import ConnectionPool
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "PostgresSession needs psycopg 3 and psycopg-pool: pip install 'trio-agents[postgres]'"
    ) from exc

from .._items import Item
from . import _storage
from ._fork import Marked, SessionExistsError
from ._storage import SessionStorageError
from ._stored_session import MigrationTexts, StoredSession

__all__ = [
    "COMPONENT",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
    "PostgresSession",
    "PostgresSessionStatistics",
]

T = TypeVar("T")
Connection: TypeAlias = "psycopg.Connection[Any]"

SCHEMA_VERSION: Final = 1
"""The schema version of the ``sessions`` component this code reads and writes."""

COMPONENT: Final = "sessions"
"""This component's row in ``trio_agents_schema``."""

Migration: TypeAlias = Callable[["psycopg.Connection[Any]"], None]
"""A schema migration step: upgrades the tables by exactly one version."""

MIGRATIONS: dict[int, Migration] = {}
"""Registered migrations: ``MIGRATIONS[v]`` upgrades the tables from version ``v`` to ``v + 1``.

Tables older than :data:`SCHEMA_VERSION` are upgraded by the first session of a process
that uses the database, running the steps for every version in between, in order, in one
transaction (PostgreSQL's DDL is transactional) under an advisory lock, so concurrent
processes migrate once; if a step is missing or fails, everything is rolled back. A step
gets the connection inside that transaction: it must only ``execute`` statements, never
commit or roll back. Version 1 is created directly; there are no migrations yet.
"""

# Taken (pg_advisory_xact_lock) while the schema is created or migrated.
_SCHEMA_LOCK: Final = 0x7472696F_6167  # "trioag"

_SCHEMA_TABLE: Final = "trio_agents_schema"
_SESSIONS: Final = "trio_agents_sessions"
_ITEMS: Final = "trio_agents_session_items"


@attrs.frozen
class PostgresSessionStatistics:
    """What :meth:`PostgresSession.statistics` reports.

    Attributes:
        database: the database as ``host:port/dbname``.
        session_id: the session.
        item_count: the number of items stored for the session (before any repair).
    """

    database: str
    session_id: str
    item_count: int


# -- the pools: one per (DSN, size) per process -------------------------------------------


@final
@attrs.define(eq=False)
class _Pool:
    key: tuple[str, int]
    pool: ConnectionPool[psycopg.Connection[Any]]
    users: int = 0
    schema_ready: bool = False
    schema_lock: threading.Lock = attrs.field(factory=threading.Lock)


_pools_lock = threading.Lock()
_pools: dict[tuple[str, int], _Pool] = {}

_LIMITERS: trio.lowlevel.RunVar[dict[tuple[str, int], trio.CapacityLimiter]] = trio.lowlevel.RunVar(
    "trio_agents.sessions.postgres_limiters"
)


def _pool_limiter(key: tuple[str, int]) -> trio.CapacityLimiter:
    """The limiter (of the pool's size) for calls on the pool ``key`` in this Trio run."""
    return _storage.run_limiter(_LIMITERS, key, key[1])


def _acquire_pool(key: tuple[str, int]) -> _Pool:
    with _pools_lock:
        shared = _pools.get(key)
        if shared is None:
            dsn, size = key
            params = psycopg.conninfo.conninfo_to_dict(dsn)
            extra: dict[str, Any] = {"autocommit": True}  # transactions are explicit
            if "application_name" not in params:
                extra["application_name"] = "trio_agents"
            extra.update(keepalives(params))
            pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
                dsn,
                min_size=1,
                max_size=size,
                kwargs=extra,
                # A connection broken since it was last used (a server restart) is
                # replaced before it is handed out, not discovered by a write.
                check=_check_connection,
                open=True,  # connects in the pool's own threads; nothing waits here
                name="trio_agents.sessions",
            )
            shared = _pools[key] = _Pool(key, pool)
        shared.users += 1
        return shared


def _release_pool(shared: _Pool) -> None:
    with _pools_lock:
        shared.users -= 1
        if shared.users:
            return
        del _pools[shared.key]
    shared.pool.close()


def _check_connection(conn: psycopg.Connection[Any]) -> None:
    """The pool's check of a connection it hands out, without a round trip when it can.

    An idle connection has nothing to read: if its socket is readable, the server sent
    something (a restart's ``FATAL`` and end of file, mostly), and the connection is
    checked with a query (psycopg_pool's own check: raises if it is broken); else it is
    handed out as it is. Saves a round trip on every call.
    """
    if conn.closed or conn.broken:
        raise psycopg.OperationalError("the connection is closed")
    if _readable(conn.pgconn.socket):
        ConnectionPool.check_connection(conn)


def _readable(fd: int) -> bool:
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(poller.poll(0))
    return bool(select.select([fd], [], [], 0)[0])  # pragma: no cover - Windows


@contextlib.contextmanager
def transaction(
    conn: psycopg.Connection[Any],
    lock_timeout: float,
    statement_timeout: float,
    idle_timeout: float | None = None,
) -> Iterator[None]:
    """One transaction on an autocommit connection, its ``lock_timeout`` and
    ``statement_timeout`` (seconds) local to it (the pooled connection goes back with
    its defaults): ``BEGIN`` and both ``SET LOCAL`` in one round trip (a simple query:
    the values are numbers formatted here), ``COMMIT`` at the end, ``ROLLBACK`` on any
    error. With ``idle_timeout``, the server also ends the connection once the
    transaction sits idle that long between statements
    (``idle_in_transaction_session_timeout``): a client frozen mid-transaction (a
    paused process or VM, a partition) does not hold its locks for longer."""
    idle = (
        ""
        if idle_timeout is None
        else f"; SET LOCAL idle_in_transaction_session_timeout = '{_milliseconds(idle_timeout)}'"
    )
    conn.execute(
        f"BEGIN; SET LOCAL lock_timeout = '{_milliseconds(lock_timeout)}';"
        f" SET LOCAL statement_timeout = '{_milliseconds(statement_timeout)}'{idle}"
    )
    try:
        yield
    except BaseException:
        if not conn.broken and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            with contextlib.suppress(psycopg.Error):
                conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# -- validation ---------------------------------------------------------------------------


def _check_dsn(_instance: object, _attribute: object, value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"dsn must be a str, not {type(value).__name__}")
    try:
        psycopg.conninfo.conninfo_to_dict(value)
    except psycopg.Error as exc:
        raise ValueError(f"dsn is not a valid connection string: {exc}") from None


def _check_timeout(_instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    name = attribute.name.lstrip("_")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def _check_size(_instance: object, _attribute: object, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_connections must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"max_connections must be >= 1, got {value!r}")


def _milliseconds(seconds: float) -> str:
    # PostgreSQL reads 0 as "no timeout": never send less than 1 ms.
    return f"{max(1, int(seconds * 1000))}ms"


@final
@attrs.define(eq=False)
class PostgresSession(StoredSession[Connection]):
    """A :class:`~trio_agents.sessions.Session` stored in a PostgreSQL database.

    Args:
        dsn: a libpq connection string or URI (``"postgresql://user@host/db"``). The
            tables are created (or migrated) in its database on first use; many sessions
            and processes share one database.
        session_id: the conversation this object reads and writes (a non-empty str).
        max_connections: the size of the connection pool, shared by every
            ``PostgresSession`` in the process with the same ``dsn`` and size.
        lock_timeout: seconds a call waits for a lock held by another connection (a
            writer of the same session elsewhere) before it fails with
            :class:`SessionStorageError`.
        statement_timeout: seconds any one statement may run, and a call may wait for a
            connection from the pool.
        idle_timeout: with a number, PostgreSQL ends the connection of a transaction
            left idle that many seconds between its statements
            (``idle_in_transaction_session_timeout``): a writer frozen in the middle of
            one (a paused process or VM) then does not hold the session's lock until
            it wakes, and the next writer waits at most that long. None (the
            default): no such bound. Workers of a Temporal host set it.

    Both timeouts are capped by what is left of the caller's Trio deadline, so a run's
    repair (under ``cleanup_timeout``) is never stretched by a lock held elsewhere.

    The pool is opened lazily by the first call, or eagerly by ``async with`` (which
    also checks the tables, so a bad database is reported on entry). Close with
    :meth:`aclose` (or ``async with``, or :meth:`close`); afterwards every call raises
    :class:`trio.ClosedResourceError`. Loaded conversations are repaired and the repair
    is written back (see :meth:`get_items`).

    Each call is one transaction on a connection from the pool. Every write takes the
    session's row lock first, so writers of one session, in any process, take turns,
    and a repair written back by :meth:`get_items` re-reads the rows under it, in the
    same transaction. Cancelled while waiting for a connection slot, a call writes
    nothing; once it has started in its thread, it is not abandoned: the caller waits
    for the (bounded) commit, returns, and sees the cancellation at its next checkpoint.

    Raises (from any call):
        SessionStorageError: the database has foreign tables of our names, was written
            by a newer trio_agents, holds an unreadable item, or PostgreSQL failed (a
            lock or statement timeout, a lost connection, ...).
    """

    _dsn: str = attrs.field(validator=_check_dsn, repr=False)  # may hold a password
    _session_id: str = attrs.field(default="default", validator=_storage.check_session_id)
    _max_connections: int = attrs.field(default=4, kw_only=True, validator=_check_size)
    _lock_timeout: float = attrs.field(default=5.0, kw_only=True, validator=_check_timeout)
    _statement_timeout: float = attrs.field(default=30.0, kw_only=True, validator=_check_timeout)
    _database: str = attrs.field(init=False)
    _lock_key: tuple[str, ...] = attrs.field(init=False, repr=False)
    _pool: _Pool | None = attrs.field(init=False, default=None, repr=False)
    _state: threading.Condition = attrs.field(init=False, factory=threading.Condition, repr=False)
    _calls: int = attrs.field(init=False, default=0, repr=False)
    # Its transactions end with the connection once idle that long (see
    # ``transaction``); a cluster's session sets it too.
    _idle_timeout: float | None = attrs.field(
        default=None,
        kw_only=True,
        validator=attrs.validators.optional(_check_timeout),
        repr=False,
    )
    _closed: bool = attrs.field(init=False, default=False, repr=False)
    _migration_texts: ClassVar[MigrationTexts] = MigrationTexts(
        no_step="cannot use {where}: no migration of the session tables",
        migrating="migrating the session tables in {where}",
        must_not="commit or roll back",
    )

    def __attrs_post_init__(self) -> None:
        params = psycopg.conninfo.conninfo_to_dict(self._dsn)
        host, port, dbname = (str(params.get(k) or "") for k in ("host", "port", "dbname"))
        self._database = f"{host or 'localhost'}:{port or '5432'}/{dbname or '(default)'}"
        self._lock_key = ("postgres", host, port, dbname, self._session_id)

    @property
    def lock_key(self) -> tuple[str, ...]:
        """Objects on one database (host, port, dbname of the DSN) with one id are one
        session: one active run at a time in the process."""
        return self._lock_key

    @property
    def database(self) -> str:
        """The database as ``host:port/dbname`` (from the DSN; never the password)."""
        return self._database

    def with_id(self, session_id: str) -> PostgresSession:
        """A new session object for ``session_id`` in the same database, with the same
        options and the same shared pool (a child run's conversation, ``"<id>/<call
        id>"``, DESIGN §17). Close it like any other."""
        return PostgresSession(
            self._dsn,
            session_id,
            max_connections=self._max_connections,
            lock_timeout=self._lock_timeout,
            statement_timeout=self._statement_timeout,
            idle_timeout=self._idle_timeout,
        )

    # -- extras -----------------------------------------------------------------------

    async def statistics(self) -> PostgresSessionStatistics:
        """Return the database, the session id and the number of stored items.

        Async (unlike most ``statistics()``): the count is read from the database.
        """
        count = await self._call(self._count_sync)
        return PostgresSessionStatistics(self._database, self._session_id, count)

    def close(self) -> None:
        """Give this session's share of the pool back (the last one closes the pool),
        from synchronous code. Idempotent.

        Blocks the calling thread while a call of this session is in flight in a worker
        thread, and while the last user's pool closes; in async code prefer
        :meth:`aclose`.
        """
        with self._state:
            self._closed = True
            self._state.wait_for(lambda: self._calls == 0)
            shared, self._pool = self._pool, None
        if shared is not None:
            _release_pool(shared)

    async def __aenter__(self) -> PostgresSession:
        """Open the pool, check (create, migrate) the tables, and return ``self``.

        On failure the session is closed (its share of the pool given back) before the
        error propagates."""
        try:
            await self._call(lambda conn: None)
        except BaseException:
            await self._close_shielded()  # no checkpoint: the error is what propagates
            raise
        return self

    # -- plumbing ---------------------------------------------------------------------

    async def _call(self, fn: Callable[[Connection], T]) -> T:
        """Run ``fn(connection)`` in one transaction, in a worker thread.

        Not abandoned on cancellation (see the module docstring), so bounded: the
        transaction's ``lock_timeout`` and ``statement_timeout`` are capped by what is
        left of the caller's Trio deadline (a run's repair passes its
        ``cleanup_timeout`` this way), and a lock held by another connection makes the
        call fail with a lock timeout in time rather than block past it.
        """
        # Counted in flight from here (not from when its thread starts), so a close
        # that comes while the call waits for a thread waits for it instead of failing it.
        with self._state:
            if self._closed:
                raise trio.ClosedResourceError("this PostgresSession is closed")
            self._calls += 1
        try:
            remaining = trio.current_effective_deadline() - trio.current_time()
            # A wall-clock deadline for the thread (Trio's clock may be a MockClock).
            deadline = time.monotonic() + max(remaining, 0.0) if remaining < float("inf") else None
            key = (self._dsn, self._max_connections)
            return await trio.to_thread.run_sync(
                self._in_thread, fn, deadline, limiter=_pool_limiter(key)
            )
        finally:  # not abandoned: the thread, if it started, has returned
            with self._state:
                self._calls -= 1
                self._state.notify_all()

    def _in_thread(self, fn: Callable[[Connection], T], deadline: float | None) -> T:
        with self._state:  # a close waits for this call: the pool is still ours
            if self._pool is None:
                self._pool = _acquire_pool((self._dsn, self._max_connections))
            shared = self._pool

        def budget(limit: float) -> float:
            if deadline is None:
                return limit
            return min(limit, deadline - time.monotonic())

        try:
            with shared.pool.connection(
                timeout=max(budget(self._statement_timeout), 0.001)
            ) as conn:
                if not shared.schema_ready:
                    with shared.schema_lock:
                        if not shared.schema_ready:
                            self._transaction(conn, budget, self._prepare)
                            shared.schema_ready = True
                return self._transaction(conn, budget, fn)
        except psycopg.Error as exc:
            raise self._failed(exc) from exc

    def _transaction(
        self, conn: Connection, budget: Callable[[float], float], fn: Callable[[Connection], T]
    ) -> T:
        with transaction(
            conn, budget(self._lock_timeout), budget(self._statement_timeout), self._idle_timeout
        ):
            return fn(conn)

    @property
    def _where(self) -> str:
        return f"database {self._database}"

    def _error(self, message: str, **data: Any) -> SessionStorageError:
        return SessionStorageError(message, database=self._database, **data)

    # -- the schema -------------------------------------------------------------------

    def _schema_version(self) -> int:
        return SCHEMA_VERSION

    @contextlib.contextmanager
    def _schema_lock(self, conn: Connection) -> Iterator[None]:
        """The advisory lock, held to the end of the call's transaction."""
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
        yield

    def _inspect(self, conn: Connection) -> int | None:
        """Return the schema version, or ``None`` when the tables do not exist yet."""
        # A plain query of the catalog (not to_regclass, which answers from this
        # backend's catalog cache and can miss a table another process created while
        # we waited for the advisory lock), in the schema tables are created in.
        found_tables = {
            name
            for (name,) in conn.execute(
                "SELECT c.relname FROM pg_catalog.pg_class c"
                " JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = current_schema() AND c.relname = ANY(%s)",
                ([_SCHEMA_TABLE, _SESSIONS, _ITEMS],),
            ).fetchall()
        }
        has_schema, has_sessions, has_items = (
            name in found_tables for name in (_SCHEMA_TABLE, _SESSIONS, _ITEMS)
        )
        foreign = f"database {self._database} is not usable for trio_agents sessions"
        version: int | None = None
        if has_schema:
            try:
                with conn.transaction():  # a savepoint: a failure here must not end ours
                    found = conn.execute(
                        f"SELECT version FROM {_SCHEMA_TABLE} WHERE component = %s",
                        (COMPONENT,),
                    ).fetchone()
            except psycopg.Error as exc:
                raise self._error(f"{foreign} (unexpected {_SCHEMA_TABLE} table: {exc})") from exc
            if found is not None:
                if not isinstance(found[0], int):
                    raise self._error(f"{foreign} (no valid version in {_SCHEMA_TABLE})")
                version = found[0]
        if version is None:
            if has_sessions or has_items:
                raise self._error(
                    f"{foreign} (it has a {_ITEMS if has_items else _SESSIONS} table"
                    f" that no {_SCHEMA_TABLE} row accounts for)"
                )
            return None
        if version > SCHEMA_VERSION:
            raise self._error(
                f"the session tables in database {self._database} have schema version"
                f" {version}, newer than this trio_agents supports ({SCHEMA_VERSION});"
                " upgrade trio_agents"
            )
        if version == SCHEMA_VERSION and not (has_sessions and has_items):
            raise self._error(
                f"the session tables in database {self._database} are corrupt:"
                f" no {_SESSIONS if not has_sessions else _ITEMS} table"
            )
        return version

    def _create_schema(self, conn: Connection) -> None:
        """Create the tables of schema version :data:`SCHEMA_VERSION` (in a transaction)."""
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {_SCHEMA_TABLE} ("
            " component TEXT PRIMARY KEY,"
            " version INTEGER NOT NULL,"
            " updated_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        conn.execute(
            f"CREATE TABLE {_SESSIONS} ("
            " session_id TEXT PRIMARY KEY,"
            " next_position BIGINT NOT NULL,"
            " updated_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        conn.execute(
            f"CREATE TABLE {_ITEMS} ("
            " session_id TEXT NOT NULL,"
            " position BIGINT NOT NULL,"
            " data TEXT NOT NULL,"
            " created_at TIMESTAMPTZ NOT NULL DEFAULT now(),"
            " PRIMARY KEY (session_id, position))"
        )
        conn.execute(
            f"INSERT INTO {_SCHEMA_TABLE} (component, version) VALUES (%s, %s)",
            (COMPONENT, SCHEMA_VERSION),
        )

    def _migration_steps(self) -> dict[int, Migration]:
        return MIGRATIONS

    def _in_transaction(self, conn: Connection) -> bool:
        return conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS

    def _record_version(self, conn: Connection, version: int) -> None:
        conn.execute(
            f"UPDATE {_SCHEMA_TABLE} SET version = %s, updated_at = now() WHERE component = %s",
            (version, COMPONENT),
        )

    # -- the statements (each inside the call's transaction) ----------------------------

    def _read_sync(self, conn: Connection) -> list[Item]:
        rows = conn.execute(
            f"SELECT position, data FROM {_ITEMS} WHERE session_id = %s ORDER BY position",
            (self._session_id,),
        ).fetchall()
        return _storage.decode_rows(rows, self._where, self._session_id, self._error)

    @contextlib.contextmanager
    def _write_lock(self, conn: Connection) -> Iterator[None]:
        """The session's row lock (the row created if missing), held to the end of the
        call's transaction."""
        conn.execute(
            f"INSERT INTO {_SESSIONS} AS s (session_id, next_position) VALUES (%s, 0)"
            " ON CONFLICT (session_id) DO UPDATE SET updated_at = now()",
            (self._session_id,),
        )
        yield

    def _write_all_sync(self, conn: Connection, encoded: list[str]) -> None:
        """Replace this session's rows; the caller holds the row lock."""
        conn.execute(f"DELETE FROM {_ITEMS} WHERE session_id = %s", (self._session_id,))
        conn.execute(
            f"INSERT INTO {_ITEMS} (session_id, position, data)"
            " SELECT %s, item.ordinality - 1, item.data"
            " FROM unnest(%s::text[]) WITH ORDINALITY AS item(data, ordinality)",
            (self._session_id, encoded),
        )
        conn.execute(
            f"UPDATE {_SESSIONS} SET next_position = %s, updated_at = now() WHERE session_id = %s",
            (len(encoded), self._session_id),
        )

    def _add_items_sync(self, conn: Connection, encoded: list[str]) -> None:
        # One statement: the upsert reserves positions [start, start + n) under the
        # session's row lock (ON CONFLICT DO UPDATE works on the latest row version,
        # even under READ COMMITTED), and the rows go in at those positions.
        conn.execute(
            f"WITH reserved AS ("
            f" INSERT INTO {_SESSIONS} AS s (session_id, next_position) VALUES (%(sid)s, %(n)s)"
            "  ON CONFLICT (session_id) DO UPDATE"
            "  SET next_position = s.next_position + EXCLUDED.next_position, updated_at = now()"
            "  RETURNING s.next_position - %(n)s AS start)"
            f" INSERT INTO {_ITEMS} (session_id, position, data)"
            " SELECT %(sid)s, reserved.start + item.ordinality - 1, item.data"
            " FROM reserved, unnest(%(data)s::text[]) WITH ORDINALITY AS item(data, ordinality)",
            {"sid": self._session_id, "n": len(encoded), "data": encoded},
        )

    def _clear_sync(self, conn: Connection) -> None:
        # The row first: its lock orders the clear with concurrent appends.
        conn.execute(f"DELETE FROM {_SESSIONS} WHERE session_id = %s", (self._session_id,))
        conn.execute(f"DELETE FROM {_ITEMS} WHERE session_id = %s", (self._session_id,))

    def _fork_transaction(self, conn: Connection) -> contextlib.AbstractContextManager[None]:
        # Every call is one transaction already (``_call``).
        return contextlib.nullcontext()

    def _below_sync(self, conn: Connection) -> list[str]:
        # Through the sessions table (every session holding items has its row there; a
        # small table, where the items table would be scanned whole: text's collation
        # keeps a prefix from being an index range), then the items' primary key.
        rows = conn.execute(
            f"SELECT s.session_id FROM {_SESSIONS} s WHERE starts_with(s.session_id, %s)"
            f" AND EXISTS (SELECT 1 FROM {_ITEMS} i WHERE i.session_id = s.session_id)",
            (self._session_id + "/",),
        ).fetchall()
        return [session_id for (session_id,) in rows]

    def _fork_scan_sync(self, conn: Connection) -> tuple[int, list[Marked], list[str]]:
        # The session's row, shared: its writers (every append, replace and clear takes
        # the row first) wait for the fork's commit, so the statements of this READ
        # COMMITTED transaction all see the same rows of it. A descendant whose call is
        # kept had ended: nothing writes it.
        conn.execute(
            f"SELECT 1 FROM {_SESSIONS} WHERE session_id = %s FOR SHARE", (self._session_id,)
        )
        count, contiguous = self._extent_sync(conn, self._session_id)
        # A row's index is its position (0..count-1, as this module writes them), or,
        # with gaps, its rank.
        index = "position" if contiguous else "row_number() OVER (ORDER BY position) - 1"
        rows = conn.execute(
            # The call id: a call or a result as this module writes it (`fast`: its
            # text starts `{"type":"function_call","call_id":"` or
            # `{"type":"function_call_output","call_id":"`) has it as its eighth
            # '"'-separated field, unless it holds a backslash (an escape: perhaps an
            # escaped quote that cut the field short); in those and any other row
            # (written otherwise), the whole JSON string found by pattern, unescaped in
            # Python.
            "SELECT idx, kind, CASE WHEN fast AND strpos(id, chr(92)) = 0 THEN id"
            " ELSE substring(data from %(call)s) END"
            f" FROM (SELECT {index} AS idx, data,"
            # Both fields read in the JSON text the session wrote (compact, ASCII-only),
            # never parsed: data::json ->> would decode every string of the item, and
            # PostgreSQL refuses the \u0000 and lone surrogate escapes an item may hold.
            # split_part() and starts_with() never count characters (substr() after
            # strpos() did, in a UTF-8 database: 40 % slower), and regular expressions
            # over every row of a 10,000-item session took ~0.2 s: they run only in the
            # rare cases above.
            '  (starts_with(data, \'{"type":"function_call","call_id":"\')'
            '   OR starts_with(data, \'{"type":"function_call_output","call_id":"\'))'
            "  AS fast,"
            # The type is the first key this module writes: the fourth field; in other
            # text, the first "type" key, by pattern.
            "  CASE WHEN starts_with(data, '{\"type\":\"') THEN split_part(data, '\"', 4)"
            "  ELSE substring(data from %(type)s) END AS kind,"
            "  split_part(data, '\"', 8) AS id"
            f"  FROM {_ITEMS} WHERE session_id = %(sid)s) AS item"
            # Only the rows holding a "call_id" key (calls and results: the rows that
            # decide the cut), found by strpos(), a plain byte search: `"call_id"` is a
            # key's text only, as inside a string its quotes are escaped. Outside the
            # subquery so that a rank counts every row; without one, PostgreSQL pushes
            # it down into the scan.
            " WHERE strpos(data, '\"call_id\"') > 0 ORDER BY idx",
            {"sid": self._session_id, "type": _TYPE_PATTERN, "call": _CALL_ID_PATTERN},
        ).fetchall()
        marked: list[Marked] = [
            (int(position), kind, _unescape(call_id))
            for position, kind, call_id in rows
            if call_id is not None
        ]
        return count, marked, self._below_sync(conn)

    def _extent_sync(self, conn: Connection, session_id: str) -> tuple[int, bool]:
        """How many rows ``session_id`` has, and whether their positions run from 0
        without a gap (as every write of this module leaves them). From the primary
        key alone."""
        row = conn.execute(
            f"SELECT COUNT(*), MIN(position), MAX(position) FROM {_ITEMS} WHERE session_id = %s",
            (session_id,),
        ).fetchone()
        assert row is not None
        count, low, high = int(row[0]), row[1], row[2]
        return count, count == 0 or (low == 0 and high == count - 1)

    def _fork_write_sync(
        self,
        conn: Connection,
        copies: list[tuple[str, str, int | None]],
        written: dict[str, list[str]],
    ) -> None:
        ids = [new for new, _, _ in copies] + list(written)
        # The new sessions' rows first (made if missing, locked either way, in id order
        # so two forks never wait for each other in a cycle): a concurrent fork or
        # append into one of them waits for this transaction, then sees its rows.
        conn.execute(
            f"INSERT INTO {_SESSIONS} AS s (session_id, next_position)"
            " SELECT id, 0 FROM unnest(%s::text[]) AS id ORDER BY id"
            " ON CONFLICT (session_id) DO UPDATE SET updated_at = now()",
            (sorted(ids),),
        )
        taken = conn.execute(
            f"SELECT session_id FROM {_ITEMS} WHERE session_id = ANY(%s) LIMIT 1", (ids,)
        ).fetchone()
        if taken is not None:
            raise SessionExistsError(taken[0])
        for new, old, count in copies:
            self._copy_sync(conn, new, old, count)
        for new, encoded in written.items():
            conn.execute(
                f"INSERT INTO {_ITEMS} (session_id, position, data)"
                " SELECT %s, item.ordinality - 1, item.data"
                " FROM unnest(%s::text[]) WITH ORDINALITY AS item(data, ordinality)",
                (new, encoded),
            )
        conn.execute(
            f"UPDATE {_SESSIONS} AS s SET next_position = (SELECT COALESCE(MAX(position) + 1, 0)"
            f" FROM {_ITEMS} i WHERE i.session_id = s.session_id) WHERE s.session_id = ANY(%s)",
            (ids,),
        )

    def _copy_sync(self, conn: Connection, new: str, old: str, count: int | None) -> None:
        """Copy the first ``count`` rows of ``old`` (all for None) to ``new`` in the
        database: one INSERT ... SELECT, the items' text never leaving PostgreSQL."""
        total, contiguous = self._extent_sync(conn, old)
        kept = total if count is None else min(count, total)
        if contiguous:
            # Positions 0..total-1: the kept rows are a range of the primary key and
            # keep their positions (no window function, no sort).
            conn.execute(
                f"INSERT INTO {_ITEMS} (session_id, position, data)"
                f" SELECT %s, position, data FROM {_ITEMS}"
                " WHERE session_id = %s AND position < %s",
                (new, old, kept),
            )
            return
        # Positions with gaps: renumbered from 0 in the copy.
        conn.execute(
            f"INSERT INTO {_ITEMS} (session_id, position, data)"
            " SELECT %s, row_number() OVER (ORDER BY position) - 1, data FROM"
            f" (SELECT position, data FROM {_ITEMS} WHERE session_id = %s"
            "  ORDER BY position LIMIT %s) AS kept",
            (new, old, kept),
        )

    def _count_sync(self, conn: Connection) -> int:
        row = conn.execute(
            f"SELECT COUNT(*) FROM {_ITEMS} WHERE session_id = %s", (self._session_id,)
        ).fetchone()
        assert row is not None
        return int(row[0])


# An object's own keys (a key's quotes are never escaped, a string's always are), with
# the whitespace JSON allows around the colon and after the separator.
_TYPE_PATTERN: Final = r'[{,]\s*"type"\s*:\s*"([a-z_]+)"'
_CALL_ID_PATTERN: Final = r'[{,]\s*"call_id"\s*:\s*"((?:[^"\\]|\\.)*)"'


def _unescape(text: str) -> str:
    """A JSON string's body (as stored, escaped) as the str it encodes."""
    if "\\" not in text:
        return text
    value = json.loads(f'"{text}"')
    return value if isinstance(value, str) else text


# -- TCP keepalives -----------------------------------------------------------------------

KEEPALIVES: Final[dict[str, int]] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 15000,
}
"""libpq's TCP keepalive settings for every connection trio_agents opens: a server that
vanished (a partition, a host gone without closing its sockets) is noticed within
about 11 s of silence (``keepalives_idle + interval * count``), and unacknowledged
data within 15 s (``tcp_user_timeout``, milliseconds), instead of the kernel's two
hours: a call waiting on such a connection fails and is retried on a new one."""


def keepalives(params: dict[str, Any]) -> dict[str, Any]:
    """:data:`KEEPALIVES`, except those the DSN's ``params`` set itself."""
    return {key: value for key, value in KEEPALIVES.items() if key not in params}
