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
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeAlias, TypeVar, final

import attrs
import trio

from .._items import Item
from ._dangling_calls import repair_loaded
from ._storage import (
    MigrationTexts,
    SessionStorageError,
    check_session_id,
    decode_rows,
    encode_items,
    refuse_or_checkpoint,
    run_limiter,
    run_migrations,
)

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
    return run_limiter(_LIMITERS, path, 1)


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
class SQLiteSession:
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

    Raises (from any call):
        SessionStorageError: the file is not a session database (nothing is rewritten),
            was written by a newer trio_agents, holds an unreadable item, or SQLite
            failed.
    """

    _path: str = attrs.field(converter=_resolve_path)
    _session_id: str = attrs.field(default="default", validator=check_session_id)
    _durable: bool = attrs.field(default=False, kw_only=True)
    _busy_timeout: float = attrs.field(default=5.0, kw_only=True, validator=_check_busy_timeout)
    _conn: sqlite3.Connection | None = attrs.field(init=False, default=None, repr=False)
    _lock: threading.Lock = attrs.field(init=False, factory=threading.Lock, repr=False)
    _closed: bool = attrs.field(init=False, default=False, repr=False)

    @property
    def session_id(self) -> str:
        """The id of the conversation this session stores."""
        return self._session_id

    @property
    def lock_key(self) -> tuple[str, str, str]:
        """Objects on one file with one id are one session (one active run at a time)."""
        return ("sqlite", self._path, self._session_id)

    @property
    def path(self) -> str:
        """The resolved path of the database file."""
        return self._path

    # -- the Session protocol ---------------------------------------------------------

    async def get_items(self) -> list[Item]:
        """Return the stored conversation, oldest first, repaired.

        Dangling tool calls are answered with a ``cancelled`` result and orphan results
        dropped (see :func:`~trio_agents.sessions._dangling_calls.repair_loaded`), and the repair
        is written back in one transaction, so the stored rows are valid again.

        Raises:
            SessionStorageError: a stored item cannot be read (names its position).
        """
        return await self._call(self._get_items_sync)

    async def add_items(self, items: Sequence[Item]) -> None:
        """Append ``items`` in one transaction: all of them or, on any error, none.

        Cancellation never leaves half a batch: cancelled while waiting for the file,
        nothing is written; once the write has started in its thread, it is not
        abandoned: the caller waits for the (short) commit, returns, and sees the
        cancellation at its next checkpoint.

        Raises:
            TypeError: an element of ``items`` is not an item (nothing is written).
        """
        encoded = encode_items(items)
        if not encoded:
            await refuse_or_checkpoint(self._closed, "SQLiteSession")
            return
        await self._call(lambda conn: self._add_items_sync(conn, encoded))

    async def clear(self) -> None:
        """Delete the stored conversation of this session (other sessions are untouched)."""
        await self._call(self._clear_sync)

    async def replace_items(self, items: Sequence[Item]) -> None:
        """Replace the stored conversation with ``items`` in one transaction (how a run
        writes back a repair that is not just an append).

        Raises:
            TypeError: an element of ``items`` is not an item (nothing is written).
        """
        encoded = encode_items(items)
        await self._call(lambda conn: self._in_transaction(conn, self._replace_sync, encoded))

    async def get_stored_items(self) -> list[Item]:
        """Return the stored conversation as it is: not repaired, nothing written.

        What a resumed run (the ``resume`` run option) loads: it decides the calls a
        dead process left open itself (run again, ask for approval, or answer
        ``interrupted``), where :meth:`get_items` would close them as ``cancelled``.

        Raises:
            SessionStorageError: a stored item cannot be read (names its position).
        """
        return await self._call(self._read_sync)

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

    async def aclose(self) -> None:
        """Close the database connection. Idempotent.

        Waits for a statement in flight on this session to finish first. The close is
        shielded from cancellation (it is quick); a cancelled caller sees the
        cancellation after the connection is closed.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.close, limiter=_file_limiter(self._path))
        await trio.lowlevel.checkpoint_if_cancelled()

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

    async def __aexit__(self, *exc_info: object) -> None:
        """Close the connection (see :meth:`aclose`)."""
        await self.aclose()

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
                raise self._error(
                    f"session {self._session_id!r} in {self._path!r}: {exc}",
                    session_id=self._session_id,
                ) from exc
            finally:
                if capped:
                    conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout * 1000)}")

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
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.005
        try:
            while True:
                try:
                    self._prepare(conn)
                    return conn
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc) or time.monotonic() + pause > deadline:
                        raise
                time.sleep(pause)  # in a worker thread, never on the Trio thread
                pause = min(pause * 2, 0.1)
        except sqlite3.Error as exc:
            conn.close()
            raise self._error(f"cannot open session database {self._path!r}: {exc}") from exc
        except BaseException:
            conn.close()
            raise

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Check the file is ours, create or migrate the schema, then configure."""
        # Read-only checks first: a foreign or future file must not be touched, not
        # even switched to WAL mode (which rewrites the header).
        version = self._inspect(conn)
        if version != SCHEMA_VERSION:
            conn.execute("BEGIN IMMEDIATE")
            try:
                # Another connection may have created or migrated it meanwhile.
                version = self._inspect(conn)
                if version is None:
                    _create_schema(conn)
                elif version < SCHEMA_VERSION:
                    self._migrate(conn, version)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
        # The journal mode is stored in the file: only the first opener changes it
        # (an exclusive lock), later ones just read it.
        if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={'FULL' if self._durable else 'NORMAL'}")

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

    def _migrate(self, conn: sqlite3.Connection, version: int) -> None:
        texts = MigrationTexts(
            no_step=f"cannot open session database {self._path!r}: no migration",
            migrating=f"migrating session database {self._path!r}",
            must_not="commit",
        )
        run_migrations(
            conn, version, SCHEMA_VERSION, MIGRATIONS, texts, _inside_transaction, self._error
        )
        conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
            (str(SCHEMA_VERSION),),
        )

    def _get_items_sync(self, conn: sqlite3.Connection) -> list[Item]:
        items = self._read_sync(conn)
        repaired = repair_loaded(items)
        if repaired == items:
            return items
        # Write the repair back: re-read under the write lock (another process may have
        # repaired it meanwhile) and replace the rows in the same transaction.
        conn.execute("BEGIN IMMEDIATE")
        try:
            repaired = repair_loaded(self._read_sync(conn))
            self._replace_sync(conn, encode_items(repaired))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        return repaired

    def _read_sync(self, conn: sqlite3.Connection) -> list[Item]:
        rows = conn.execute(
            "SELECT position, data FROM items WHERE session_id = ? ORDER BY position",
            (self._session_id,),
        ).fetchall()
        return decode_rows(rows, repr(self._path), self._session_id, self._error)

    def _replace_sync(self, conn: sqlite3.Connection, encoded: list[str]) -> None:
        """Replace this session's rows (inside the caller's transaction)."""
        self._clear_sync(conn)
        now = time.time()
        conn.executemany(
            "INSERT INTO items (session_id, position, data, created_at) VALUES (?, ?, ?, ?)",
            [(self._session_id, i, data, now) for i, data in enumerate(encoded)],
        )

    def _in_transaction(
        self,
        conn: sqlite3.Connection,
        fn: Callable[[sqlite3.Connection, list[str]], None],
        encoded: list[str],
    ) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            fn(conn, encoded)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def _add_items_sync(self, conn: sqlite3.Connection, encoded: list[str]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            (start,) = conn.execute(
                "SELECT COALESCE(MAX(position) + 1, 0) FROM items WHERE session_id = ?",
                (self._session_id,),
            ).fetchone()
            now = time.time()
            conn.executemany(
                "INSERT INTO items (session_id, position, data, created_at) VALUES (?, ?, ?, ?)",
                [(self._session_id, start + i, data, now) for i, data in enumerate(encoded)],
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def _clear_sync(self, conn: sqlite3.Connection) -> None:
        conn.execute("DELETE FROM items WHERE session_id = ?", (self._session_id,))

    def _count_sync(self, conn: sqlite3.Connection) -> int:
        (count,) = conn.execute(
            "SELECT COUNT(*) FROM items WHERE session_id = ?", (self._session_id,)
        ).fetchone()
        return int(count)


def _create_schema(conn: sqlite3.Connection) -> None:
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


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` is SQLite's "database is locked/busy" (worth retrying)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    message = str(exc)
    return "locked" in message or "busy" in message


def _inside_transaction(conn: sqlite3.Connection) -> bool:
    """Whether the migrations left the transaction open (they must)."""
    return conn.in_transaction
