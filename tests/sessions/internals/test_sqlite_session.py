"""SQLiteSession's own ways on real SQLite files: the file's path, WAL mode, one limiter
per file, several Trio runs sharing a file, a wait for the file cancelled, files it
refuses (not a database, someone else's database). What it shares with PostgresSession
is in test_sql_sessions.py."""

from __future__ import annotations

import itertools
import sqlite3
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.session_backends import assert_batches_whole
from tests.support.sessions_sql import (
    SqlStore,
    assert_storage_error,
    sqlite_sql,
    text,
    trio_runs_in_threads,
)
from trio_agents import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from trio_agents.sessions import (
    SCHEMA_VERSION,
    SQLiteSession,
    _sqlite,
)

# -- helpers ----------------------------------------------------------------------------


def read_bytes(path: Path) -> bytes:
    return path.read_bytes()


def resolved(path: Path) -> str:
    return str(path.resolve())


def sidecar_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture
def sql(db: Path) -> SqlStore:
    """The test's file (and the test's own look at it)."""
    return sqlite_sql(db)


# -- basics -----------------------------------------------------------------------------


async def test_path_is_the_resolved_file(session: SQLiteSession, db: Path) -> None:
    assert session.path == resolved(db)


def test_arguments_are_validated(db: Path) -> None:
    with pytest.raises(ValueError, match="busy_timeout"):
        SQLiteSession(db, busy_timeout=-1)
    with pytest.raises(ValueError, match="database file"):
        SQLiteSession(":memory:")
    with pytest.raises(ValueError, match="database file"):
        SQLiteSession("")


async def test_wal_mode_and_synchronous(db: Path, tmp_path: Path) -> None:
    def synchronous(conn: sqlite3.Connection) -> int:
        (value,) = conn.execute("PRAGMA synchronous").fetchone()
        return int(value)

    async with SQLiteSession(db) as normal:
        assert await normal._call(synchronous) == 1  # NORMAL
    async with SQLiteSession(db, durable=True) as durable:
        assert await durable._call(synchronous) == 2  # FULL
    assert sqlite_sql(db).query("PRAGMA journal_mode") == [("wal",)]
    assert sqlite_sql(db).query("SELECT key, value FROM meta ORDER BY key") == [
        ("application", "trio_agents.sessions"),
        ("schema_version", str(SCHEMA_VERSION)),
    ]


# -- property: what you add is what you get, across re-opening ---------------------------


@st.composite
def valid_batches(draw: st.DrawFn) -> list[list[Item]]:
    """A valid conversation (every call answered), cut into append batches."""
    conversation: list[Item] = []
    for n in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["user", "assistant", "calls"]))
        if kind == "user":
            conversation.append(draw(st.builds(UserMessage, text)))
        elif kind == "assistant":
            conversation.append(draw(st.builds(AssistantMessage, text)))
        else:
            ids = [f"{n}-{i}" for i in range(draw(st.integers(1, 3)))]
            conversation += [ToolCall(i, draw(st.sampled_from(["t", "u"])), "{}") for i in ids]
            conversation += [ToolResult(i, draw(text)) for i in draw(st.permutations(ids))]
    cuts = sorted(draw(st.lists(st.integers(0, len(conversation)), max_size=4)))
    bounds = [0, *cuts, len(conversation)]
    return [conversation[a:b] for a, b in itertools.pairwise(bounds)]


def run_in_fresh_file(body: Callable[[Path], Any]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        trio.run(body, Path(directory) / "p.db")


@settings(max_examples=40)
@given(batches=valid_batches())
def test_what_you_add_is_what_you_get_across_reopening(batches: list[list[Item]]) -> None:
    async def main(path: Path) -> None:
        async with SQLiteSession(path, "prop") as writer:
            for batch in batches:
                await writer.add_items(batch)
        async with SQLiteSession(path, "prop") as reader:
            assert await reader.get_items() == [item for batch in batches for item in batch]

    run_in_fresh_file(main)


# -- many sessions, concurrency -----------------------------------------------------------


def test_one_limiter_per_file_per_run(tmp_path: Path) -> None:
    async def main() -> None:
        a = _sqlite._file_limiter(str(tmp_path / "a.db"))
        assert _sqlite._file_limiter(str(tmp_path / "a.db")) is a
        assert _sqlite._file_limiter(str(tmp_path / "b.db")) is not a
        assert a.total_tokens == 1

    trio.run(main)


async def test_sessions_on_one_file_share_its_limiter(db: Path, tmp_path: Path) -> None:
    limiter = _sqlite._file_limiter(resolved(db))
    other_file = SQLiteSession(tmp_path / "other.db")
    done: list[str] = []

    async def add(s: SQLiteSession, name: str) -> None:
        await s.add_items([UserMessage(name)])
        done.append(name)

    async with SQLiteSession(db, "x") as x, SQLiteSession(db, "y") as y, other_file:
        await limiter.acquire()  # hold the file: both sessions on it must wait
        held = True
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(add, x, "x")
                nursery.start_soon(add, y, "y")
                await add(other_file, "other")  # a different file is not held up
                await trio.testing.wait_all_tasks_blocked()
                assert done == ["other"]
                assert limiter.statistics().tasks_waiting == 2
                limiter.release()
                held = False
        finally:
            if held:
                limiter.release()
    assert sorted(done) == ["other", "x", "y"]


def test_several_trio_runs_in_threads_create_and_share_one_file(tmp_path: Path) -> None:
    # Separate Trio runs have separate limiters, so only SQLite's locking keeps them
    # apart, as it does for separate processes. They also race to create the schema.
    path = tmp_path / "shared.db"

    async def worker(n: int) -> None:
        async with SQLiteSession(path, f"t{n % 3}") as s:
            for j in range(10):
                await s.add_items([UserMessage(f"t{n}-{j}:{k}") for k in range(3)])

    assert trio_runs_in_threads(worker, 6) == []

    async def check() -> None:
        for sid in ("t0", "t1", "t2"):
            async with SQLiteSession(path, sid) as s:
                items = await s.get_items()
            writers = assert_batches_whole(items, 3)
            assert len(writers) == 20
        assert sqlite_sql(path).positions("t0") == list(range(60))

    trio.run(check)


# -- cancellation ----------------------------------------------------------------------


async def test_cancelled_while_waiting_for_the_file_writes_nothing(
    session: SQLiteSession,
) -> None:
    limiter = _sqlite._file_limiter(session.path)
    with trio.CancelScope() as scope:
        async with limiter, trio.open_nursery() as nursery:
            nursery.start_soon(session.add_items, [UserMessage("never")])
            await trio.testing.wait_all_tasks_blocked()
            assert limiter.statistics().tasks_waiting == 1
            scope.cancel()
    assert scope.cancelled_caught
    assert await session.get_items() == []


# -- bad files ---------------------------------------------------------------------------


async def test_text_file_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    path.write_text("these are my notes, not a database\n" * 50)
    before = read_bytes(path)
    error = await assert_storage_error(SQLiteSession(path), "file is not a database")
    assert error.path == str(path.resolve())
    assert read_bytes(path) == before
    assert sidecar_files(path) == []


async def test_garbage_after_a_sqlite_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "broken.db"
    path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 20)
    before = read_bytes(path)
    await assert_storage_error(SQLiteSession(path), "cannot open session database")
    assert read_bytes(path) == before


async def test_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    sqlite_sql(path).execute(
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)",
        "INSERT INTO users (name) VALUES ('ada')",
    )
    before = read_bytes(path)
    await assert_storage_error(SQLiteSession(path), "not a trio_agents session database")
    assert read_bytes(path) == before
    assert sidecar_files(path) == []
    assert sqlite_sql(path).query("PRAGMA journal_mode") == [("delete",)]  # not switched to WAL


@pytest.mark.parametrize(
    ("statements", "match"),
    [
        (["CREATE TABLE meta (id INTEGER, blob BLOB)"], "unexpected meta table"),
        (
            [
                "CREATE TABLE meta (key TEXT, value TEXT)",
                "INSERT INTO meta VALUES ('application', 'someone.else'), ('schema_version', '1')",
            ],
            "belongs to 'someone.else'",
        ),
        (["CREATE TABLE meta (key TEXT, value TEXT)"], "no valid schema_version"),
        (
            [
                "CREATE TABLE meta (key TEXT, value TEXT)",
                "INSERT INTO meta VALUES ('schema_version', 'one')",
            ],
            "no valid schema_version",
        ),
    ],
)
async def test_foreign_meta_table_is_refused_untouched(
    tmp_path: Path, statements: list[str], match: str
) -> None:
    path = tmp_path / "app.db"
    sqlite_sql(path).execute(*statements)
    before = read_bytes(path)
    await assert_storage_error(SQLiteSession(path), match)
    assert read_bytes(path) == before


async def test_unopenable_path(tmp_path: Path) -> None:
    await assert_storage_error(
        SQLiteSession(tmp_path / "no" / "such" / "dir.db"), "unable to open database file"
    )
