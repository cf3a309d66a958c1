"""A session stored in a SQLite database file: the embedded default.

Storage layout (schema version :data:`SCHEMA_VERSION`)::

    meta(key TEXT PRIMARY KEY, value TEXT)     -- 'application', 'schema_version'
    items(session_id TEXT, position INTEGER,   -- position counts from 0 per session
          data TEXT,                           -- the item's to_json(), as JSON text
          created_at REAL,                     -- time.time() of the append
          PRIMARY KEY (session_id, position))

Many sessions share one file. Every database call runs in a worker thread
(``trio.to_thread.run_sync``) under a :class:`trio.CapacityLimiter` of 1 shared by all
:class:`SQLiteSession` objects on the same file in the Trio run, so statements on one
file never queue up on SQLite's own locks inside the process; other processes are kept
apart by SQLite's locking (WAL mode, ``busy_timeout``). Calls are *not* abandoned on
cancellation: a cancelled caller waits for its (short) statement to finish, so a write is
all or nothing, never half done.

Durability: the database runs in WAL mode with ``synchronous=NORMAL`` by default. A
committed append survives a crash or ``SIGKILL`` of the process, but the last few commits
can be lost if the operating system crashes or the machine loses power before the WAL
is synced (the database itself stays consistent). ``durable=True`` selects
``synchronous=FULL``: the WAL is synced on every commit, at the cost of one ``fsync``
per append.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Final, TypeAlias, TypeVar, final

import attrs
import trio

from .._items import Item
from .._sqlite_busy import retry_while_busy
from . import _storage
from ._fork import Marked, SessionExistsError, Shape, marked_of
from ._storage import SessionStorageError
from ._stored_session import MigrationTexts, StoredSession

__all__ = [
    "APPLICATION_ID",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "Migration",
    "SQLiteSession",
    "SQLiteSessionStatistics",
    "SessionStorageError",
]

T = TypeVar("T")

SCHEMA_VERSION: Final = 1
"""The schema version this code reads and writes."""

APPLICATION_ID: Final = "trio_agents.sessions"
"""The ``application`` value in the ``meta`` table of a session database."""

Migration: TypeAlias = Callable[[sqlite3.Connection], None]
"""A schema migration step: upgrades the database by exactly one version."""

MIGRATIONS: dict[int, Migration] = {}
"""Registered migrations: ``MIGRATIONS[v]`` upgrades a database from version ``v`` to ``v + 1``.

A database older than :data:`SCHEMA_VERSION` is upgraded on open by running the steps
for every version in between, in order, in one transaction, then recording the new
version; if a step is missing or fails, the transaction is rolled back and nothing is
rewritten. A step receives the connection inside that transaction: it must only
``execute`` statements, never commit, roll back or use ``executescript`` (which commits).
Version 1 is created directly; there are no migrations yet.
"""


@attrs.frozen
class SQLiteSessionStatistics:
    """What :meth:`SQLiteSession.statistics` reports.

    Attributes:
        path: the resolved path of the database file.
        session_id: the session.
        item_count: the number of items stored for the session (before any repair).
    """

    path: str
    session_id: str
    item_count: int


_LIMITERS: trio.lowlevel.RunVar[dict[str, trio.CapacityLimiter]] = trio.lowlevel.RunVar(
    "trio_agents.sessions.sqlite_limiters"
)


def _file_limiter(path: str) -> trio.CapacityLimiter:
    """Return the limiter of 1 shared by every session on the database file ``path``."""
    return _storage.run_limiter(_LIMITERS, path, 1)


def _resolve_path(path: str | os.PathLike[str]) -> str:
    resolved = os.fspath(path)
    if not isinstance(resolved, str):
        raise TypeError(f"path must be a str or a path-like object, not {type(path).__name__}")
    if not resolved or resolved == ":memory:" or resolved.startswith("file:"):
        raise ValueError(f"path must name a database file, got {resolved!r}")
    return os.path.realpath(resolved)


def _check_busy_timeout(_instance: object, _attribute: object, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"busy_timeout must be a number, not {type(value).__name__}")
    if not value >= 0:
        raise ValueError(f"busy_timeout must be >= 0, got {value!r}")


@final
@attrs.define(eq=False)
class SQLiteSession(StoredSession[sqlite3.Connection]):
    """A :class:`~trio_agents.sessions.Session` stored in a SQLite database file.

    Args:
        path: the database file; created (with its directory's permissions) if missing.
            Many sessions, in one process or several, can share one file.
        session_id: the conversation this object reads and writes (a non-empty str).
        durable: ``True`` for ``synchronous=FULL`` (survives power loss, one fsync per
            append); the default ``synchronous=NORMAL`` survives a process crash but may
            lose the last commits on an OS crash or power loss.
        busy_timeout: seconds SQLite waits for another process's lock on the file before
            giving up with :class:`SessionStorageError`.

    The connection is opened lazily by the first call, or eagerly by ``async with``
    (so a bad file is reported on entry). Close it with :meth:`aclose` (or ``async
    with``, or :meth:`close`); afterwards every call raises
    :class:`trio.ClosedResourceError`. Loaded conversations are repaired
    (:func:`~trio_agents.sessions._dangling_calls.repair_loaded`): dangling tool calls from a
    crashed run are closed with a ``cancelled`` result.

    Calls on one file take turns in the Trio run (one at a time, each in a worker
    thread). A write takes the file's write lock (``BEGIN IMMEDIATE``) for its
    transaction, so writers in other processes wait for it (up to ``busy_timeout``), and
    a repair written back by :meth:`get_items` re-reads the rows under it. Cancelled
    while waiting for the file, a call writes nothing; once its statement has started
    in its thread, it is not abandoned: the caller waits for the (short) commit,
    returns, and sees the cancellation at its next checkpoint.

    Raises (from any call):
        SessionStorageError: the file is not a session database (nothing is rewritten),
            was written by a newer trio_agents, holds an unreadable item, or SQLite
            failed.
    """

    _path: str = attrs.field(converter=_resolve_path)
    _session_id: str = attrs.field(default="default", validator=_storage.check_session_id)
    _durable: bool = attrs.field(default=False, kw_only=True)
    _busy_timeout: float = attrs.field(default=5.0, kw_only=True, validator=_check_busy_timeout)
    _conn: sqlite3.Connection | None = attrs.field(init=False, default=None, repr=False)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock, repr=False)
    _closed: bool = attrs.field(init=False, default=False, repr=False)
    _migration_texts: ClassVar[MigrationTexts] = MigrationTexts(
        no_step="cannot open session database {where}: no migration",
        migrating="migrating session database {where}",
        must_not="commit",
    )

    @property
    def lock_key(self) -> tuple[str, str, str]:
        """Objects on one file with one id are one session (one active run at a time)."""
        return ("sqlite", self._path, self._session_id)

    @property
    def path(self) -> str:
        """The resolved path of the database file."""
        return self._path

    # -- extras -----------------------------------------------------------------------

    def with_id(self, session_id: str) -> SQLiteSession:
        """A new session object for ``session_id`` in the same file, with the same
        options (a child run's conversation, ``"<id>/<call id>"``, DESIGN §17). It opens
        its own connection on first use; close it like any other."""
        return SQLiteSession(
            self._path, session_id, durable=self._durable, busy_timeout=self._busy_timeout
        )

    async def statistics(self) -> SQLiteSessionStatistics:
        """Return the path, the session id and the number of stored items.

        Unlike most ``statistics()`` methods this one is async: the count is read from
        the database, which other objects and processes may be writing to.
        """
        count = await self._call(self._count_sync)
        return SQLiteSessionStatistics(self._path, self._session_id, count)

    def close(self) -> None:
        """Close the database connection from synchronous code. Idempotent.

        Blocks the calling thread while a statement of this session is in flight in a
        worker thread; in async code prefer :meth:`aclose`.
        """
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    async def __aenter__(self) -> SQLiteSession:
        """Open the connection (checking the file and migrating it) and return ``self``."""
        await self._call(lambda conn: None)
        return self

    # -- plumbing ---------------------------------------------------------------------

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(connection)`` in a worker thread under the file's limiter.

        The call is never abandoned (a write must not run on unsupervised while the
        limiter slot goes to the next caller), so it is bounded instead: SQLite's busy
        timeout is capped by the caller's Trio deadline (a run's repair passes its
        ``cleanup_timeout`` this way), and a lock held by another connection makes the
        call fail with "database is locked" in time rather than block past it.
        """
        if self._closed:
            raise trio.ClosedResourceError("this SQLiteSession is closed")
        remaining = trio.current_effective_deadline() - trio.current_time()
        budget = min(self._busy_timeout, max(remaining, 0.0))
        return await trio.to_thread.run_sync(
            self._in_thread, fn, budget, limiter=_file_limiter(self._path)
        )

    def _in_thread(self, fn: Callable[[sqlite3.Connection], T], budget: float) -> T:
        with self._lock:
            if self._closed:
                raise trio.ClosedResourceError("this SQLiteSession is closed")
            conn = self._conn
            if conn is None:
                conn = self._conn = self._connect()
            capped = budget < self._busy_timeout
            try:
                if capped:
                    conn.execute(f"PRAGMA busy_timeout = {int(budget * 1000)}")
                return fn(conn)
            except sqlite3.Error as exc:
                raise self._failed(exc) from exc
            finally:
                if capped:
                    conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")

    def _close_limiter(self) -> trio.CapacityLimiter:
        # The close takes its turn on the file: a statement in flight finishes first.
        return _file_limiter(self._path)

    @property
    def _where(self) -> str:
        return repr(self._path)

    def _error(self, message: str, **data: Any) -> SessionStorageError:
        return SessionStorageError(message, path=self._path, **data)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self._path,
                timeout=self._busy_timeout,
                isolation_level=None,  # we issue BEGIN/COMMIT ourselves
                check_same_thread=False,  # used from worker threads, one at a time
            )
        except sqlite3.Error as exc:
            raise self._error(f"cannot open session database {self._path!r}: {exc}") from exc
        # SQLite returns SQLITE_BUSY without calling its busy handler in a few places
        # that opening can hit while another process creates the schema or switches
        # the file to WAL (the journal-mode change and WAL recovery), so opening retries
        # "locked"/"busy" itself, within the same `busy_timeout` budget.

        def prepare() -> None:
            self._prepare(conn)
            self._configure(conn)

        try:
            retry_while_busy(prepare, self._busy_timeout)
            return conn
        except sqlite3.Error as exc:
            conn.close()
            raise self._error(f"cannot open session database {self._path!r}: {exc}") from exc
        except BaseException:
            conn.close()
            raise

    def _configure(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL mode and set the durability, once the schema is
        checked (:meth:`_prepare`): a foreign or future file must not be touched, not
        even switched to WAL mode (which rewrites the header)."""
        # The journal mode is stored in the file: only the first opener changes it
        # (an exclusive lock), later ones just read it.
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if self._durable else 'NORMAL'}")

    # -- the schema -------------------------------------------------------------------

    def _schema_version(self) -> int:
        return SCHEMA_VERSION

    def _schema_lock(self, conn: sqlite3.Connection) -> contextlib.AbstractContextManager[None]:
        return _immediate(conn)

    def _inspect(self, conn: sqlite3.Connection) -> int | None:
        """Return the schema version, or ``None`` for an empty database."""
        objects = conn.execute(
            "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
        ).fetchall()
        if not objects:
            return None
        tables = {name for kind, name in objects if kind == "table"}
        foreign = f"{self._path!r} is not a trio_agents session database"
        if "meta" not in tables:
            raise self._error(f"{foreign} (it has no meta table)")
        try:
            meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
        except sqlite3.Error as exc:
            raise self._error(f"{foreign} (unexpected meta table: {exc})") from exc
        application = meta.get("application")
        if application is not None and application != APPLICATION_ID:
            raise self._error(f"{foreign} (it belongs to {application!r})")
        raw_version = meta.get("schema_version")
        if not (isinstance(raw_version, str) and raw_version.isascii() and raw_version.isdigit()):
            raise self._error(f"{foreign} (no valid schema_version in its meta table)")
        version = int(raw_version)
        if version > SCHEMA_VERSION:
            raise self._error(
                f"session database {self._path!r} has schema version {version}, newer than"
                f" this trio_agents supports ({SCHEMA_VERSION}); upgrade trio_agents"
            )
        if version == SCHEMA_VERSION and "items" not in tables:
            raise self._error(f"session database {self._path!r} is corrupt: no items table")
        return version

    def _create_schema(self, conn: sqlite3.Connection) -> None:
        """Create schema version :data:`SCHEMA_VERSION` in an empty database (in a transaction)."""
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.executemany(
            "INSERT INTO meta (key, value) VALUES (?, ?)",
            [("application", APPLICATION_ID), ("schema_version", str(SCHEMA_VERSION))],
        )
        conn.execute(
            "CREATE TABLE items ("
            " session_id TEXT NOT NULL,"
            " position INTEGER NOT NULL,"
            " data TEXT NOT NULL,"
            " created_at REAL NOT NULL,"
            " PRIMARY KEY (session_id, position))"
        )

    def _migration_steps(self) -> dict[int, Migration]:
        return MIGRATIONS

    def _in_transaction(self, conn: sqlite3.Connection) -> bool:
        return conn.in_transaction

    def _record_version(self, conn: sqlite3.Connection, version: int) -> None:
        conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
            (str(version),),
        )

    # -- the statements -----------------------------------------------------------------

    def _write_lock(self, conn: sqlite3.Connection) -> contextlib.AbstractContextManager[None]:
        return _immediate(conn)

    def _read_sync(self, conn: sqlite3.Connection) -> list[Item]:
        rows = conn.execute(
            "SELECT position, data FROM items WHERE session_id = ? ORDER BY position",
            (self._session_id,),
        ).fetchall()
        return _storage.decode_rows(rows, self._where, self._session_id, self._error)

    def _write_all_sync(self, conn: sqlite3.Connection, encoded: list[str]) -> None:
        """Replace this session's rows (inside the caller's transaction)."""
        self._clear_sync(conn)
        now = time.time()
        conn.executemany(
            "INSERT INTO items (session_id, position, data, created_at) VALUES (?, ?, ?, ?)",
            [(self._session_id, i, data, now) for i, data in enumerate(encoded)],
        )

    def _add_items_sync(self, conn: sqlite3.Connection, encoded: list[str]) -> None:
        with _immediate(conn):
            (start,) = conn.execute(
                "SELECT COALESCE(MAX(position) + 1, 0) FROM items WHERE session_id = ?",
                (self._session_id,),
            ).fetchone()
            now = time.time()
            conn.executemany(
                "INSERT INTO items (session_id, position, data, created_at) VALUES (?, ?, ?, ?)",
                [(self._session_id, start + i, data, now) for i, data in enumerate(encoded)],
            )

    def _clear_sync(self, conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM items WHERE session_id = ?", (self._session_id,))

    def _fork_transaction(
        self, conn: sqlite3.Connection
    ) -> contextlib.AbstractContextManager[None]:
        # The file's write lock from the first read: no writer (in any process) comes
        # between what the fork reads and what it writes.
        return _immediate(conn)

    def _below_sync(self, conn: sqlite3.Connection) -> list[str]:
        # The descendants' ids ("<id>/...") as a range of the primary key: TEXT compares
        # with BINARY (memcmp of UTF-8, so code point order), and every id starting
        # "<id>/" sorts from "<id>/" to just before "<id>0" ("0" follows "/").
        rows = conn.execute(
            "SELECT DISTINCT session_id FROM items WHERE session_id >= ? AND session_id < ?",
            (self._session_id + "/", self._session_id + "0"),
        ).fetchall()
        return [session_id for (session_id,) in rows]

    def _fork_scan_sync(self, conn: sqlite3.Connection) -> tuple[int, list[Marked], list[str]]:
        count, contiguous = self._extent_sync(conn, self._session_id)
        if not contiguous:
            # Positions with gaps (never written so by this module): the rows' indexes
            # are their ranks, so every row's shape is read.
            shapes = self._shapes_sync(conn)
            return count, marked_of(shapes), self._below_sync(conn)
        try:
            # Only the rows holding a "call_id" key (a call or a result: the rows that
            # decide the cut; in a session of mostly messages, few), found by instr(),
            # a plain byte search in C: the key is the text `"call_id"` only outside a
            # string (inside one its quotes are escaped, `\"call_id\"`). Of those
            # rows, json_extract (SQLite's JSON functions, built in since 3.38) reads
            # the two fields; a false match would be read as what it is.
            rows = conn.execute(
                "SELECT position, json_extract(data, '$.type'), json_extract(data, '$.call_id')"
                " FROM items WHERE session_id = ? AND instr(data, '\"call_id\"') > 0"
                " ORDER BY position",
                (self._session_id,),
            ).fetchall()
        except sqlite3.OperationalError as exc:
            if "json_extract" not in str(exc):
                raise
            return count, marked_of(self._shapes_sync(conn)), self._below_sync(conn)
        # Positions run 0..count-1 here: a row's position is its index.
        marked: list[Marked] = [
            (position, kind, call_id)
            for position, kind, call_id in rows
            if isinstance(call_id, str)
        ]
        return count, marked, self._below_sync(conn)

    def _extent_sync(self, conn: sqlite3.Connection, session_id: str) -> tuple[int, bool]:
        """How many rows ``session_id`` has, and whether their positions run from 0
        without a gap (as every write of this module leaves them): then a row's
        position is its index. From the primary key alone."""
        count, low, high = conn.execute(
            "SELECT COUNT(*), MIN(position), MAX(position) FROM items WHERE session_id = ?",
            (session_id,),
        ).fetchone()
        return int(count), count == 0 or (low == 0 and high == count - 1)

    def _shapes_sync(self, conn: sqlite3.Connection) -> list[Shape]:
        """Every row's shape, in order (the slow path: each row decoded in Python)."""
        rows = conn.execute(
            "SELECT data FROM items WHERE session_id = ? ORDER BY position",
            (self._session_id,),
        ).fetchall()
        return [_shape(data) for (data,) in rows]

    def _fork_write_sync(
        self,
        conn: sqlite3.Connection,
        copies: list[tuple[str, str, int | None]],
        written: dict[str, list[str]],
    ) -> None:
        """Inside the fork's transaction (the file's write lock is held)."""
        for session_id in [new for new, _, _ in copies] + list(written):
            if conn.execute(
                "SELECT 1 FROM items WHERE session_id = ? LIMIT 1", (session_id,)
            ).fetchone():
                raise SessionExistsError(session_id)
        now = time.time()
        for new, old, count in copies:
            self._copy_sync(conn, new, old, count, now)
        conn.executemany(
            "INSERT INTO items (session_id, position, data, created_at) VALUES (?, ?, ?, ?)",
            [
                (session_id, i, data, now)
                for session_id, encoded in written.items()
                for i, data in enumerate(encoded)
            ],
        )

    def _copy_sync(
        self, conn: sqlite3.Connection, new: str, old: str, count: int | None, now: float
    ) -> None:
        """Copy the first ``count`` rows of ``old`` (all for None) to ``new``, in the
        database: one INSERT ... SELECT, the items' text never leaving SQLite."""
        total, contiguous = self._extent_sync(conn, old)
        kept = total if count is None else min(count, total)
        if contiguous:
            # Positions 0..total-1: the kept rows are a range of the primary key, and
            # keep their positions (no renumbering, no sort: read and written in key
            # order, each row appended at the end of both B-trees).
            conn.execute(
                "INSERT INTO items (session_id, position, data, created_at)"
                " SELECT ?, position, data, ? FROM items"
                " WHERE session_id = ? AND position < ? ORDER BY position",
                (new, now, old, kept),
            )
            return
        # Positions with gaps: renumbered from 0 in the copy.
        conn.execute(
            "INSERT INTO items (session_id, position, data, created_at)"
            " SELECT ?, ROW_NUMBER() OVER (ORDER BY position) - 1, data, ? FROM"
            " (SELECT position, data FROM items WHERE session_id = ?"
            "  ORDER BY position LIMIT ?)",
            (new, now, old, kept),
        )

    def _count_sync(self, conn: sqlite3.Connection) -> int:
        (count,) = conn.execute(
            "SELECT COUNT(*) FROM items WHERE session_id = ?", (self._session_id,)
        ).fetchone()
        return int(count)


def _shape(data: str) -> Shape:
    """An item's shape read in Python (a SQLite without its JSON functions)."""
    try:
        value = json.loads(data)
    except ValueError:
        return (None, None)
    if not isinstance(value, dict):
        return (None, None)
    kind, call_id = value.get("type"), value.get("call_id")
    return (
        kind if isinstance(kind, str) else None,
        call_id if isinstance(call_id, str) else None,
    )


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One transaction holding the file's write lock (``BEGIN IMMEDIATE``): ``COMMIT`` at
    the end, ``ROLLBACK`` on any error (a failed commit included)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise
