"""The two SQL session backends (a real SQLite file, a database of its own on the suite's
PostgreSQL) behind one face, for the tests of what they share below the Session
contract (tests/sessions/internals/): a new session object on the store, and the test's
own look at the store with a plain driver connection (rows, tables, the schema version,
a lock held elsewhere, a hand-made old schema). Public names only: what a test needs
from the backends' private modules, it passes in."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import attrs
import psycopg
import pytest
import trio
from hypothesis import strategies as st

from tests.support.helpers import INTERRUPTED_OUTPUT
from trio_agents import (
    AssistantMessage,
    Item,
    ToolCall,
    ToolResult,
    UserMessage,
    item_from_json,
)
from trio_agents.sessions import PostgresSession, SessionStorageError, SQLiteSession

PG_ITEMS: Final = "trio_agents_session_items"
PG_SESSIONS: Final = "trio_agents_sessions"
PG_SCHEMA: Final = "trio_agents_schema"

# What a run killed mid-tool leaves behind, and what loading it gives.
CRASHED: Final[list[Item]] = [
    UserMessage("go"),
    ToolCall("a", "slow"),
    ToolCall("b", "fast"),
    ToolResult("b", "2"),
    ToolResult("zombie", "orphan"),
]
REPAIRED: Final[list[Item]] = [
    UserMessage("go"),
    ToolCall("a", "slow"),
    ToolCall("b", "fast"),
    ToolResult("b", "2"),
    ToolResult("a", INTERRUPTED_OUTPUT, status="cancelled"),
]

# Any list of items, valid or not (dangling calls, orphan results), for the property
# tests of repair on load.
text: Final = st.text(max_size=12)
call_ids: Final = st.sampled_from(["a", "b", "c"])
any_item: Final = st.one_of(
    st.builds(UserMessage, text),
    st.builds(AssistantMessage, text, st.sampled_from(["completed", "incomplete"])),
    st.builds(ToolCall, call_ids, st.text(min_size=1, max_size=5), text),
    st.builds(ToolResult, call_ids, text, st.sampled_from(["ok", "error", "cancelled"])),
)


async def assert_storage_error(session: Any, match: str) -> SessionStorageError:
    """Opening ``session`` fails with a :class:`SessionStorageError` matching ``match``."""
    with pytest.raises(SessionStorageError, match=match) as info:
        async with session:
            pytest.fail("used a store it should have refused")
    return info.value


def trio_runs_in_threads(worker: Callable[[int], Any], count: int) -> list[BaseException]:
    """``trio.run(worker, n)`` for n in 0..count-1, each in a thread of its own, let go
    together (as separate processes would race); what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(count)

    def thread_main(n: int) -> None:
        try:
            start.wait()
            trio.run(worker, n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread_main, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def sqlite_connection(path: Path) -> contextlib.closing[sqlite3.Connection]:
    """A plain sqlite3 connection, closed on exit (autocommit)."""
    return contextlib.closing(sqlite3.connect(path, isolation_level=None))


def pg_connection(dsn: str) -> psycopg.Connection[Any]:
    """A plain psycopg connection (autocommit), for the test's own look at the tables."""
    return psycopg.connect(dsn, autocommit=True)


# What differs between the two backends' stores, a table per question, by backend.
ITEMS_TABLE: Final = {"sqlite": "items", "postgres": PG_ITEMS}
MARK: Final = {"sqlite": "?", "postgres": "%s"}  # the driver's parameter marker
# The session options that make a wait for a lock held elsewhere short, the message of
# the error it ends in, and the driver's error behind that.
LOCK_WAIT: Final[dict[str, tuple[dict[str, float], str, type[Exception]]]] = {
    "sqlite": ({"busy_timeout": 0.05}, "database is locked", sqlite3.OperationalError),
    "postgres": ({"lock_timeout": 0.05}, "lock timeout", psycopg.errors.LockNotAvailable),
}
# Where the store keeps the version of its schema.
SCHEMA_VERSION_SQL: Final = {
    "sqlite": "SELECT value FROM meta WHERE key = 'schema_version'",
    "postgres": f"SELECT version FROM {PG_SCHEMA}",
}
# A hand-made "version 0" (its items table has no created_at column yet) holding one
# item of session 'old', and the step that upgrades it.
V0_TABLES: Final = {
    "sqlite": (
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "INSERT INTO meta VALUES ('schema_version', '0')",
        "CREATE TABLE items (session_id TEXT, position INTEGER, data TEXT,"
        " PRIMARY KEY (session_id, position))",
    ),
    "postgres": (
        f"CREATE TABLE {PG_SCHEMA} (component TEXT PRIMARY KEY, version INTEGER NOT NULL,"
        " updated_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        f"INSERT INTO {PG_SCHEMA} (component, version) VALUES ('sessions', 0)",
        f"CREATE TABLE {PG_SESSIONS} (session_id TEXT PRIMARY KEY,"
        " next_position BIGINT NOT NULL, updated_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        f"CREATE TABLE {PG_ITEMS} (session_id TEXT NOT NULL, position BIGINT NOT NULL,"
        " data TEXT NOT NULL, PRIMARY KEY (session_id, position))",
        f"INSERT INTO {PG_SESSIONS} (session_id, next_position) VALUES ('old', 1)",
    ),
}
V0_TO_V1: Final = {
    "sqlite": "ALTER TABLE items ADD COLUMN created_at REAL NOT NULL DEFAULT 0",
    "postgres": f"ALTER TABLE {PG_ITEMS} ADD COLUMN created_at TIMESTAMPTZ NOT NULL DEFAULT now()",
}
_V0_ITEM = json.dumps({"type": "message", "role": "user", "content": "written by v0"})


@attrs.frozen
class SqlStore:
    """One SQL store, the same questions asked of either backend: ``where`` is the
    SQLite file or the PostgreSQL DSN."""

    backend: str
    where: Any

    @property
    def items_table(self) -> str:
        return ITEMS_TABLE[self.backend]

    @property
    def short_lock_wait(self) -> dict[str, float]:
        return LOCK_WAIT[self.backend][0]

    @property
    def lock_wait_error(self) -> str:
        return LOCK_WAIT[self.backend][1]

    @property
    def lock_wait_cause(self) -> type[Exception]:
        return LOCK_WAIT[self.backend][2]

    @property
    def v0_to_v1(self) -> str:
        return V0_TO_V1[self.backend]

    @property
    def v0_statements(self) -> tuple[str, ...]:
        """The "version 0" store, with one row of session 'old'."""
        items = f"INSERT INTO {self.items_table} VALUES ('old', 0, '{_V0_ITEM}')"
        return (*V0_TABLES[self.backend], items)

    def session(self, session_id: str = "default", **options: Any) -> Any:
        cls = SQLiteSession if self.backend == "sqlite" else PostgresSession
        return cls(self.where, session_id, **options)

    def connect(self) -> contextlib.AbstractContextManager[Any]:
        """A plain driver connection of the test's own (autocommit), closed on exit."""
        if self.backend == "sqlite":
            return sqlite_connection(self.where)
        return pg_connection(self.where)

    def query(self, sql: str, *params: Any) -> list[Any]:
        with self.connect() as conn:
            rows: list[Any] = conn.execute(sql, params).fetchall()
            return rows

    def execute(self, *statements: str) -> None:
        with self.connect() as conn:
            for statement in statements:
                conn.execute(statement)

    def rows(self, session_id: str) -> list[tuple[int, str]]:
        """(position, data) of every stored row of ``session_id``, in order."""
        return self.query(
            f"SELECT position, data FROM {self.items_table}"
            f" WHERE session_id = {MARK[self.backend]} ORDER BY position",
            session_id,
        )

    def stored(self, session_id: str) -> list[tuple[int, Item]]:
        """(position, item) of every stored row of ``session_id``, in order."""
        return [(p, item_from_json(json.loads(data))) for p, data in self.rows(session_id)]

    def positions(self, session_id: str) -> list[int]:
        return [position for position, _ in self.stored(session_id)]

    def schema_version(self) -> list[Any]:
        return self.query(SCHEMA_VERSION_SQL[self.backend])

    def version_rows(self, version: int) -> list[Any]:
        """What :meth:`schema_version` gives for ``version`` (SQLite keeps it as text)."""
        return [(str(version),)] if self.backend == "sqlite" else [(version,)]

    def tables(self) -> set[str]:
        if self.backend == "sqlite":
            sql = "SELECT name FROM sqlite_master WHERE type = 'table'"
        else:
            sql = "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        return {name for (name,) in self.query(sql)}

    def snapshot(self) -> Any:
        """All the store holds, to check that a refused store was not touched: the
        SQLite file's bytes, or every PostgreSQL table's rows."""
        if self.backend == "sqlite":
            return Path(self.where).read_bytes()
        return {
            table: sorted(map(repr, self.query(f"SELECT * FROM {table}")))
            for table in sorted(self.tables())
        }

    def insert_row(self, conn: Any, session_id: str, position: int, data: str) -> None:
        """Store ``data`` as a row of ``session_id`` through ``conn``, bypassing the session."""
        if self.backend == "postgres":
            conn.execute(
                f"UPDATE {PG_SESSIONS} SET next_position = next_position + 1 WHERE session_id = %s",
                (session_id,),
            )
        columns = "session_id, position, data" + (
            ", created_at" if self.backend == "sqlite" else ""
        )
        values = ", ".join([MARK[self.backend]] * 3 + (["0"] if self.backend == "sqlite" else []))
        conn.execute(
            f"INSERT INTO {self.items_table} ({columns}) VALUES ({values})",
            (session_id, position, data),
        )

    @contextlib.contextmanager
    def holding(self, session_id: str) -> Iterator[Any]:
        """A connection of its own (another process, as far as the database knows) in a
        transaction holding the write lock ``session_id``'s writers take: the file, or the
        session's row. Rolled back on exit unless the test commits."""
        with self.connect() as conn:
            if self.backend == "sqlite":
                conn.execute("BEGIN IMMEDIATE")
            else:
                conn.autocommit = False
                row = conn.execute(
                    f"SELECT session_id FROM {PG_SESSIONS} WHERE session_id = %s FOR UPDATE",
                    (session_id,),
                ).fetchone()
                assert row is not None
            try:
                yield conn
            finally:
                self.end(conn, "ROLLBACK")

    def end(self, conn: Any, how: str) -> None:
        """End ``conn``'s transaction (``COMMIT`` or ``ROLLBACK``), if one is open."""
        if self.backend == "sqlite":
            if conn.in_transaction:
                conn.execute(how)
        elif how == "COMMIT":
            conn.commit()
        else:
            conn.rollback()

    def poison(self, marker: str) -> None:
        """Make the database itself refuse any item row whose data contains ``marker``."""
        if self.backend == "sqlite":
            self.execute(
                "CREATE TRIGGER poison BEFORE INSERT ON items WHEN NEW.data LIKE"
                f" '%{marker}%' BEGIN SELECT RAISE(ABORT, 'poisoned row'); END"
            )
            return
        self.execute(
            "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
            f" IF NEW.data LIKE '%{marker}%' THEN RAISE EXCEPTION 'poisoned row'; END IF;"
            " RETURN NEW; END $$",
            f"CREATE TRIGGER poison BEFORE INSERT ON {PG_ITEMS}"
            " FOR EACH ROW EXECUTE FUNCTION poison()",
        )


def sqlite_sql(path: Path) -> SqlStore:
    return SqlStore("sqlite", path)


def postgres_sql(dsn: str) -> SqlStore:
    return SqlStore("postgres", dsn)


def items_of(dsn: str, session_id: str) -> list[Item]:
    """The items stored for ``session_id`` in the PostgreSQL database ``dsn``, as stored."""
    return [item for _, item in postgres_sql(dsn).stored(session_id)]
