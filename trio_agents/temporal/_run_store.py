"""The shared store of Temporal runs: every run's record and event log, in one SQLite
file that the workers and the servers share (one disk).

Temporal's history holds a run's start request, its steering ops and its terminal
result, never its events (a history's size is capped): the events of a run a worker
runs are written here by that worker's attempt (:mod:`._event_writer`), and every
server's :class:`~trio_agents.temporal.TemporalHost` reads them here, so a face on any
process replays and follows a run's events (SSE ``Last-Event-ID``, tree streams, the web
UI) while it runs on a worker. A subscriber is only ever given what is written, so what
any client saw survives the worker's death, and the next attempt never reuses a seq a
client saw (its first seq is the last written one plus one).

Layout::

    runs(run_id PRIMARY KEY, principal, root_id, parent_id, created,
         info,       -- the run's RunInfo JSON as of its last written event
         attempt)    -- the attempt that owns the run's writes (the root's row)
    events(id INTEGER PRIMARY KEY AUTOINCREMENT,  -- the order they were written
           root_id, run_id, seq, event,           -- UNIQUE (run_id, seq)
    claims(principal, session_id, run_id)        -- a session's active run
    calls(run_id, call_id, attempt)              -- tool calls started (the root's id)
    places(run_id PRIMARY KEY, attempt, address) -- where the owning attempt takes ops

Fencing: an attempt claims its run (``attempt`` grows, never shrinks) before it writes,
and every write checks the claim in the same transaction, so once a later attempt took
a run over, nothing an earlier one does (a frozen worker thawed) is written: it learns
that it is fenced and stops. A host that sees the run's workflow end with no terminal
record written (cancelled before any attempt ran, an attempt that crashed) writes the
terminal record itself, with an attempt number no worker's can reach.

Every call runs in a worker thread under a :class:`trio.CapacityLimiter` of 1 per
store (statements on one connection never overlap); other processes are kept apart by
SQLite's own locking (WAL mode, ``busy_timeout``). A call is not abandoned when its
caller is cancelled: a write is whole or not at all.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar, final

import attrs
import trio

from .._events import RunStatus
from .._sqlite_busy import retry_while_busy
from ..hosting import RunInfo

__all__ = ["FENCED_BY_HOST", "Claim", "RunStore", "StoredEvent"]

T = TypeVar("T")

FENCED_BY_HOST: Final = 1 << 30
"""The attempt number a host writes a run's terminal record with: no attempt of a
worker reaches it, so whatever one writes afterwards is fenced."""

_TERMINAL: Final = tuple(status.value for status in RunStatus if status.is_terminal)

_SCHEMA: Final = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    principal TEXT NOT NULL,
    root_id TEXT NOT NULL,
    parent_id TEXT,
    created REAL NOT NULL,
    status TEXT NOT NULL,
    info TEXT NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_by_principal ON runs (principal, parent_id, created);
CREATE INDEX IF NOT EXISTS runs_by_parent ON runs (parent_id, created);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    root_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event TEXT NOT NULL,
    UNIQUE (run_id, seq)
);
CREATE INDEX IF NOT EXISTS events_by_root ON events (root_id, id);
CREATE TABLE IF NOT EXISTS claims (
    principal TEXT NOT NULL,
    session_id TEXT NOT NULL,
    run_id TEXT NOT NULL,
    PRIMARY KEY (principal, session_id)
);
-- A tool call of a run's tree recorded before its tool runs (the before_tool barrier),
-- so no later attempt runs it again; keyed by the root's id.
CREATE TABLE IF NOT EXISTS calls (
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    PRIMARY KEY (run_id, call_id)
);
-- Where the attempt that owns a root run takes pushed ops ("host:port"): a host pushes
-- a cancel there directly once Temporal has recorded it. A table of its own rather than
-- a column of runs: a store written by an earlier version gains it with the schema.
CREATE TABLE IF NOT EXISTS places (
    run_id TEXT PRIMARY KEY,
    attempt INTEGER NOT NULL,
    address TEXT NOT NULL
);
"""


@attrs.frozen
class StoredEvent:
    """One written event: its place in the store's order, its run and seq, its JSON."""

    id: int
    run_id: str
    seq: int
    event: Mapping[str, Any]


@attrs.frozen
class Claim:
    """What an attempt's claim of its run found: whether it holds the run's writes now,
    and the seq its run's next event takes (the last written one plus one)."""

    owned: bool
    next_seq: int
    started: tuple[str, ...] = ()
    """The tool calls of the run's tree that earlier attempts recorded as started."""


@final
class RunStore:
    """The shared store of Temporal runs in the SQLite file at ``path`` (see the
    module docstring). Open it with ``async with`` or call :meth:`close` when done.

    Args:
        path: the file (created with its tables if missing). Every worker and server of
            the same runs opens the same file.
        busy_timeout: seconds a statement waits for another process's lock.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 10.0) -> None:
        self._path = os.fspath(path)
        self._busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._limiter = trio.CapacityLimiter(1)

    @classmethod
    def beside(cls, sessions_db: str | os.PathLike[str], **options: Any) -> RunStore:
        """The store in the file beside a SQLite sessions file: its name plus ``.runs``
        (what ``trio-agents worker`` and ``serve --temporal`` use with ``--db``). A
        file of its own: a session database holds nothing else."""
        return cls(os.fspath(sessions_db) + ".runs", **options)

    @property
    def path(self) -> str:
        """The store's file."""
        return self._path

    async def __aenter__(self) -> RunStore:
        await self._call(lambda conn: None)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the store's connection (a later call opens it again)."""

        def close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await trio.to_thread.run_sync(close, limiter=self._limiter, abandon_on_cancel=False)

    # ------------------------------------------------------------------ plumbing

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await trio.to_thread.run_sync(
            self._in_thread, fn, limiter=self._limiter, abandon_on_cancel=False
        )

    def _in_thread(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            conn = sqlite3.connect(
                self._path,
                timeout=self._busy_timeout,
                isolation_level=None,  # explicit BEGIN IMMEDIATE for every write
                check_same_thread=False,
            )

            def prepare() -> None:
                # Only the first opener switches the file to WAL (an exclusive lock
                # SQLite does not wait for: another store opening the same file at that
                # moment gets "locked" at once, hence the retry).
                if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                conn.executescript(_SCHEMA)

            try:
                retry_while_busy(prepare, self._busy_timeout)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return fn(self._conn)

    @staticmethod
    def _write(conn: sqlite3.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    # ------------------------------------------------------------ the host's side

    async def create_run(self, info: RunInfo, principal: str, *, claim_session: bool) -> str | None:
        """Record a new root run (status ``queued``) and, with ``claim_session``, claim
        its session in the same transaction; returns the id of the run that holds the
        session instead (nothing recorded then), or None."""

        def write(conn: sqlite3.Connection) -> str | None:
            if claim_session and info.session_id is not None:
                holder = _holder(conn, principal, info.session_id)
                if holder is not None:
                    return holder
                conn.execute(
                    "INSERT OR REPLACE INTO claims VALUES (?, ?, ?)",
                    (principal, info.session_id, info.run_id),
                )
            conn.execute(
                "INSERT INTO runs (run_id, principal, root_id, parent_id, created, status, info)"
                " VALUES (?, ?, ?, NULL, ?, ?, ?)",
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

        return await self._call(lambda conn: self._write(conn, write))

    async def forget_run(self, run_id: str) -> None:
        """Remove a root run recorded by :meth:`create_run` whose workflow never
        started (and its session claim)."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM runs WHERE run_id = ? AND attempt = 0", (run_id,))
            conn.execute("DELETE FROM claims WHERE run_id = ?", (run_id,))

        await self._call(lambda conn: self._write(conn, write))

    async def session_holder(self, principal: str, session_id: str) -> str | None:
        """The id of the session's active run, or None."""
        return await self._call(lambda conn: _holder(conn, principal, session_id))

    async def release_session(self, principal: str, session_id: str, run_id: str) -> None:
        """Free the session's claim if ``run_id`` still holds it."""

        def write(conn: sqlite3.Connection) -> None:
            conn.execute(
                "DELETE FROM claims WHERE principal = ? AND session_id = ? AND run_id = ?",
                (principal, session_id, run_id),
            )

        await self._call(lambda conn: self._write(conn, write))

    async def info(self, principal: str, run_id: str) -> RunInfo | None:
        """The run's record (any node of a tree), or None when there is none of this
        principal's."""

        def read(conn: sqlite3.Connection) -> RunInfo | None:
            row = conn.execute(
                "SELECT info FROM runs WHERE run_id = ? AND principal = ?", (run_id, principal)
            ).fetchone()
            if row is None:
                return None
            return _with_children(conn, RunInfo.from_json(json.loads(row[0])))

        return await self._call(read)

    async def root_of(self, principal: str, run_id: str) -> str | None:
        """The root run id of ``run_id``'s tree (None: no such run of this principal)."""

        def read(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT root_id FROM runs WHERE run_id = ? AND principal = ?",
                (run_id, principal),
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._call(read)

    async def runs_of(self, principal: str, *, nodes: bool) -> list[RunInfo]:
        """The principal's roots, oldest first (each followed by every node of its tree,
        parents before children, with ``nodes``)."""

        def read(conn: sqlite3.Connection) -> list[RunInfo]:
            rows = conn.execute(
                "SELECT run_id, root_id, parent_id, info FROM runs WHERE principal = ?"
                " ORDER BY created, rowid",
                (principal,),
            ).fetchall()
            below: dict[str, list[str]] = {}
            infos: dict[str, RunInfo] = {}
            for run_id, _root, parent, data in rows:
                infos[run_id] = RunInfo.from_json(json.loads(data))
                if parent is not None:
                    below.setdefault(parent, []).append(run_id)
            found: list[RunInfo] = []
            for run_id, _root, parent, _data in rows:
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

        return await self._call(read)

    async def active_roots(self, principal: str) -> int:
        """How many of the principal's root runs are not terminal."""

        def read(conn: sqlite3.Connection) -> int:
            marks = ",".join("?" * len(_TERMINAL))
            row = conn.execute(
                "SELECT count(*) FROM runs WHERE principal = ? AND parent_id IS NULL"
                f" AND status NOT IN ({marks})",
                (principal, *_TERMINAL),
            ).fetchone()
            return int(row[0])

        return await self._call(read)

    async def events_after(
        self, root_id: str, after_id: int, run_ids: Iterable[str] | None, limit: int = 500
    ) -> tuple[list[StoredEvent], int]:
        """Events of ``root_id``'s tree written after ``after_id``, in write order (at
        most ``limit`` rows scanned), only those of ``run_ids`` when given; and the id
        of the last row scanned (where the next call goes on)."""
        wanted = None if run_ids is None else frozenset(run_ids)

        def read(conn: sqlite3.Connection) -> tuple[list[StoredEvent], int]:
            rows = conn.execute(
                "SELECT id, run_id, seq, event FROM events WHERE root_id = ? AND id > ?"
                " ORDER BY id LIMIT ?",
                (root_id, after_id, limit),
            ).fetchall()
            found = [
                StoredEvent(int(id_), run_id, int(seq), json.loads(event))
                for id_, run_id, seq, event in rows
                if wanted is None or run_id in wanted
            ]
            return found, int(rows[-1][0]) if rows else after_id

        return await self._call(read)

    async def claim_session(self, principal: str, session_id: str, run_id: str) -> str | None:
        """Claim the session for ``run_id``; the id of the run holding it instead, or
        None once claimed."""

        def write(conn: sqlite3.Connection) -> str | None:
            holder = _holder(conn, principal, session_id)
            if holder is not None and holder != run_id:
                return holder
            conn.execute(
                "INSERT OR REPLACE INTO claims VALUES (?, ?, ?)", (principal, session_id, run_id)
            )
            return None

        return await self._call(lambda conn: self._write(conn, write))

    async def open_roots(self) -> list[tuple[str, str]]:
        """``(principal, run_id)`` of every root run whose record is not terminal."""

        def read(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            marks = ",".join("?" * len(_TERMINAL))
            rows = conn.execute(
                "SELECT principal, run_id FROM runs WHERE parent_id IS NULL"
                f" AND status NOT IN ({marks}) ORDER BY created",
                _TERMINAL,
            ).fetchall()
            return [(str(p), str(r)) for p, r in rows]

        return await self._call(read)

    async def subtree(self, run_id: str) -> list[str]:
        """``run_id`` and every descendant recorded so far."""

        def read(conn: sqlite3.Connection) -> list[str]:
            found = [run_id]
            pending = [run_id]
            while pending:
                node = pending.pop()
                below = [
                    str(row[0])
                    for row in conn.execute(
                        "SELECT run_id FROM runs WHERE parent_id = ?", (node,)
                    ).fetchall()
                ]
                found.extend(below)
                pending.extend(below)
            return found

        return await self._call(read)

    async def data_version(self) -> int:
        """SQLite's ``data_version``: it changes when another connection commits."""
        return await self._call(lambda conn: int(conn.execute("PRAGMA data_version").fetchone()[0]))

    async def finish_if_open(
        self, principal: str, run_id: str, status: str, reason: str | None
    ) -> bool:
        """Write the root run's terminal record and ``run.updated`` event when no attempt
        did (its workflow ended without one: cancelled before an attempt ran, an
        attempt that crashed), fencing every attempt; False when it was terminal."""

        def write(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT info, status FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if row is None or row[1] in _TERMINAL:
                return False
            info = RunInfo.from_json(json.loads(row[0]))
            seq = _last_seq(conn, run_id) + 1
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
                info,
                status=RunStatus(status),
                reason=reason,
                seq=seq,
                pending_approvals=(),
                detail={},
            )
            conn.execute(
                "INSERT INTO events (root_id, run_id, seq, event) VALUES (?, ?, ?, ?)",
                (run_id, run_id, seq, json.dumps(event)),
            )
            conn.execute(
                "UPDATE runs SET status = ?, info = ?, attempt = ? WHERE run_id = ?",
                (status, json.dumps(ended.to_json()), FENCED_BY_HOST, run_id),
            )
            conn.execute("DELETE FROM claims WHERE run_id = ?", (run_id,))
            return True

        return await self._call(lambda conn: self._write(conn, write))

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

        def write(conn: sqlite3.Connection) -> Claim:
            conn.execute(
                "INSERT OR IGNORE INTO runs"
                " (run_id, principal, root_id, parent_id, created, status, info)"
                " VALUES (?, ?, ?, NULL, ?, ?, ?)",
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
                    "INSERT OR IGNORE INTO claims VALUES (?, ?, ?)", (principal, session_id, run_id)
                )
            claimed = conn.execute(
                "UPDATE runs SET attempt = ? WHERE run_id = ? AND attempt < ?",
                (attempt, run_id, attempt),
            ).rowcount
            if claimed == 1 and address is not None:
                conn.execute(
                    "INSERT OR REPLACE INTO places VALUES (?, ?, ?)", (run_id, attempt, address)
                )
            started = tuple(
                str(row[0])
                for row in conn.execute(
                    "SELECT call_id FROM calls WHERE run_id = ? ORDER BY rowid", (run_id,)
                )
            )
            return Claim(owned=claimed == 1, next_seq=_last_seq(conn, run_id) + 1, started=started)

        return await self._call(lambda conn: self._write(conn, write))

    async def record_call(self, root_id: str, attempt: int, call_id: str) -> bool:
        """Record that a tool call of the run's tree starts (before its tool runs);
        False, with nothing written, when ``attempt`` no longer owns the run (fenced)."""

        def write(conn: sqlite3.Connection) -> bool:
            # The claim check and the insert in one transaction: a fenced attempt's call
            # is never recorded, so it never looks started to the attempt that owns the run.
            if not _owns(conn, root_id, attempt):
                return False
            conn.execute(
                "INSERT OR IGNORE INTO calls VALUES (?, ?, ?)", (root_id, call_id, attempt)
            )
            return True

        return await self._call(lambda conn: self._write(conn, write))

    async def owns(self, run_id: str, attempt: int) -> bool:
        """Whether ``attempt`` owns the root run ``run_id``'s writes now."""

        def read(conn: sqlite3.Connection) -> bool:
            return _owns(conn, run_id, attempt)

        return await self._call(read)

    async def place_of(self, run_id: str) -> str | None:
        """The push address of the attempt that owns the root run ``run_id`` now (None:
        no attempt has claimed it, or the owning attempt recorded none)."""

        def read(conn: sqlite3.Connection) -> str | None:
            # Only the owner's address: one of a fenced attempt would take ops it cannot
            # apply (its worker may be frozen, so the push would wait for its bound).
            row = conn.execute(
                "SELECT p.address FROM places p JOIN runs r ON r.run_id = p.run_id"
                " WHERE p.run_id = ? AND p.attempt = r.attempt",
                (run_id,),
            ).fetchone()
            return None if row is None else str(row[0])

        return await self._call(read)

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

        def write(conn: sqlite3.Connection) -> bool:
            if not _owns(conn, root_id, attempt):
                return False
            conn.executemany(
                "INSERT OR IGNORE INTO events (root_id, run_id, seq, event) VALUES (?, ?, ?, ?)",
                [(root_id, run_id, seq, event) for run_id, seq, event in events],
            )
            now = time.time()
            for run_id, parent_id, info in records:
                data = json.dumps(info.to_json())
                conn.execute(
                    "INSERT INTO runs (run_id, principal, root_id, parent_id, created, status, info)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (run_id) DO UPDATE SET status = excluded.status,"
                    " info = excluded.info",
                    (run_id, principal, root_id, parent_id, now, info.status.value, data),
                )
            if release is not None:
                conn.execute(
                    "DELETE FROM claims WHERE principal = ? AND session_id = ? AND run_id = ?",
                    (principal, release, root_id),
                )
            return True

        return await self._call(lambda conn: self._write(conn, write))


def _holder(conn: sqlite3.Connection, principal: str, session_id: str) -> str | None:
    # A claim whose run is terminal is stale (its release was lost with a process).
    marks = ",".join("?" * len(_TERMINAL))
    row = conn.execute(
        "SELECT c.run_id FROM claims c LEFT JOIN runs r ON r.run_id = c.run_id"
        " WHERE c.principal = ? AND c.session_id = ?"
        f" AND (r.status IS NULL OR r.status NOT IN ({marks}))",
        (principal, session_id, *_TERMINAL),
    ).fetchone()
    return None if row is None else str(row[0])


def _owns(conn: sqlite3.Connection, root_id: str, attempt: int) -> bool:
    # Inside a write's BEGIN IMMEDIATE this read holds the file's write lock to the
    # commit: no claim comes between the check and the write (the fence).
    row = conn.execute("SELECT attempt FROM runs WHERE run_id = ?", (root_id,)).fetchone()
    return row is not None and int(row[0]) == attempt


def _last_seq(conn: sqlite3.Connection, run_id: str) -> int:
    row = conn.execute("SELECT max(seq) FROM events WHERE run_id = ?", (run_id,)).fetchone()
    return int(row[0]) if row[0] is not None else 0


def _with_children(conn: sqlite3.Connection, info: RunInfo) -> RunInfo:
    children = tuple(
        str(row[0])
        for row in conn.execute(
            "SELECT run_id FROM runs WHERE parent_id = ? ORDER BY created, rowid", (info.run_id,)
        ).fetchall()
    )
    return attrs.evolve(info, children=children)
