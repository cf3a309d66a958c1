"""SQLiteSession on real SQLite files: round trips, sharing a file, concurrency,
cancellation, repair on load, bad files, schema migrations, closing."""

from __future__ import annotations

import contextlib
import itertools
import json
import sqlite3
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.helpers import INTERRUPTED_OUTPUT
from tests.support.session_backends import assert_batches_whole
from trio_agents import (
    AssistantMessage,
    Item,
    ToolCall,
    ToolResult,
    TrioAgentsError,
    UserMessage,
    conversation_problems,
)
from trio_agents.sessions import (
    SCHEMA_VERSION,
    Session,
    SessionStorageError,
    SQLiteSession,
    _sqlite,
    repair_loaded,
)
from trio_agents.sessions._sqlite import MIGRATIONS, SQLiteSessionStatistics

# -- helpers ----------------------------------------------------------------------------


def raw_connection(path: Path) -> contextlib.closing[sqlite3.Connection]:
    """A plain sqlite3 connection, closed on exit (autocommit)."""
    return contextlib.closing(sqlite3.connect(path, isolation_level=None))


def raw_query(path: Path, sql: str, *params: Any) -> list[Any]:
    with raw_connection(path) as conn:
        return conn.execute(sql, params).fetchall()


def raw_execute(path: Path, *statements: str) -> None:
    with raw_connection(path) as conn:
        for statement in statements:
            conn.execute(statement)


def positions(path: Path, session_id: str) -> list[int]:
    rows = raw_query(
        path, "SELECT position FROM items WHERE session_id = ? ORDER BY position", session_id
    )
    return [position for (position,) in rows]


def read_bytes(path: Path) -> bytes:
    return path.read_bytes()


def resolved(path: Path) -> str:
    return str(path.resolve())


def exists(path: Path) -> bool:
    return path.exists()


def sidecar_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


@pytest.fixture
async def session(db: Path) -> AsyncIterator[SQLiteSession]:
    async with SQLiteSession(db, "main") as s:
        yield s


async def assert_storage_error(session: SQLiteSession, match: str) -> SessionStorageError:
    with pytest.raises(SessionStorageError, match=match) as info:
        async with session:
            pytest.fail("opened a file it should have refused")
    return info.value


# -- basics -----------------------------------------------------------------------------


async def test_is_a_session(session: SQLiteSession, db: Path) -> None:
    assert isinstance(session, Session)
    assert session.session_id == "main"
    assert session.path == resolved(db)
    assert issubclass(SessionStorageError, TrioAgentsError)


async def test_new_session_is_empty_and_file_is_created_lazily(db: Path) -> None:
    s = SQLiteSession(db)
    assert s.session_id == "default"
    assert not exists(db)
    try:
        assert await s.get_items() == []
        assert exists(db)
    finally:
        await s.aclose()


async def test_statistics(session: SQLiteSession) -> None:
    await session.add_items([])
    assert await session.statistics() == SQLiteSessionStatistics(session.path, "main", 0)
    await session.add_items([UserMessage("x"), ToolCall("c", "t")])
    stats = await session.statistics()
    # The dangling call is repaired on load, but the count is of stored rows.
    assert stats == SQLiteSessionStatistics(session.path, "main", 2)
    assert len(await session.get_items()) == 3


def test_session_id_and_arguments_are_validated(db: Path) -> None:
    with pytest.raises(ValueError, match="session_id must not be empty"):
        SQLiteSession(db, "")
    with pytest.raises(TypeError, match="session_id must be a str"):
        SQLiteSession(db, 3)  # type: ignore[arg-type]
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
    assert raw_query(db, "PRAGMA journal_mode") == [("wal",)]
    assert raw_query(db, "SELECT key, value FROM meta ORDER BY key") == [
        ("application", "trio_agents.sessions"),
        ("schema_version", str(SCHEMA_VERSION)),
    ]


# -- property: what you add is what you get, across re-opening ---------------------------

text = st.text(max_size=12)
call_ids = st.sampled_from(["a", "b", "c"])
any_item = st.one_of(
    st.builds(UserMessage, text),
    st.builds(AssistantMessage, text, st.sampled_from(["completed", "incomplete"])),
    st.builds(ToolCall, call_ids, st.text(min_size=1, max_size=5), text),
    st.builds(ToolResult, call_ids, text, st.sampled_from(["ok", "error", "cancelled"])),
)


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


@settings(max_examples=40)
@given(batches=st.lists(st.lists(any_item, max_size=6), max_size=4))
def test_any_stored_list_loads_repaired(batches: list[list[Item]]) -> None:
    async def main(path: Path) -> None:
        async with SQLiteSession(path, "prop") as writer:
            for batch in batches:
                await writer.add_items(batch)
        async with SQLiteSession(path, "prop") as reader:
            loaded = await reader.get_items()
        everything = [item for batch in batches for item in batch]
        assert loaded == repair_loaded(everything)
        assert conversation_problems(loaded) == []

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


async def test_waits_for_another_connection_holding_the_file(db: Path) -> None:
    async with SQLiteSession(db, "w") as s:
        await s.add_items([UserMessage("first")])
        with raw_connection(db) as other:  # another process, as far as SQLite knows
            other.execute("BEGIN IMMEDIATE")
            other.execute(
                "INSERT INTO items VALUES ('w', 1, ?, 0)",
                (json.dumps(UserMessage("raw").to_json()),),
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(s.add_items, [UserMessage("second")])
                await trio.testing.wait_all_tasks_blocked()  # its thread waits on the lock
                other.execute("COMMIT")
        assert await s.get_items() == [
            UserMessage("first"),
            UserMessage("raw"),
            UserMessage("second"),
        ]


async def test_busy_timeout_gives_a_storage_error(db: Path) -> None:
    async with SQLiteSession(db, "w", busy_timeout=0.05) as s:
        with raw_connection(db) as other:
            other.execute("BEGIN IMMEDIATE")
            with pytest.raises(SessionStorageError, match="database is locked") as info:
                await s.add_items([UserMessage("blocked")])
            assert info.value.session_id == "w"
            other.execute("ROLLBACK")
        await s.add_items([UserMessage("fine now")])
        assert await s.get_items() == [UserMessage("fine now")]


def test_several_trio_runs_in_threads_create_and_share_one_file(tmp_path: Path) -> None:
    # Separate Trio runs have separate limiters, so only SQLite's locking keeps them
    # apart, as it does for separate processes. They also race to create the schema.
    path = tmp_path / "shared.db"
    errors: list[BaseException] = []

    async def worker(n: int) -> None:
        async with SQLiteSession(path, f"t{n % 3}") as s:
            for j in range(10):
                await s.add_items([UserMessage(f"t{n}-{j}:{k}") for k in range(3)])

    def thread_main(n: int) -> None:
        try:
            trio.run(worker, n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread_main, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    async def check() -> None:
        for sid in ("t0", "t1", "t2"):
            async with SQLiteSession(path, sid) as s:
                items = await s.get_items()
            writers = assert_batches_whole(items, 3)
            assert len(writers) == 20
        assert positions(path, "t0") == list(range(60))

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


# -- repair on load ----------------------------------------------------------------------


async def test_dangling_calls_are_repaired_on_load_but_not_rewritten(
    session: SQLiteSession, db: Path
) -> None:
    # What a run killed mid-tool leaves behind.
    stored: list[Item] = [
        UserMessage("go"),
        ToolCall("a", "slow"),
        ToolCall("b", "fast"),
        ToolResult("b", "2"),
        ToolResult("zombie", "orphan"),
    ]
    await session.add_items(stored)
    loaded = await session.get_items()
    assert loaded == [
        UserMessage("go"),
        ToolCall("a", "slow"),
        ToolCall("b", "fast"),
        ToolResult("b", "2"),
        ToolResult("a", INTERRUPTED_OUTPUT, status="cancelled"),
    ]
    assert conversation_problems(loaded) == []
    assert positions(db, "main") == [0, 1, 2, 3, 4]
    # The next run appends after the stored rows; the conversation stays valid.
    await session.add_items([UserMessage("again"), AssistantMessage("ok")])
    loaded = await session.get_items()
    assert loaded[-3:] == [
        ToolResult("a", INTERRUPTED_OUTPUT, status="cancelled"),
        UserMessage("again"),
        AssistantMessage("ok"),
    ]
    assert conversation_problems(loaded) == []


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ("{not json", "Expecting property name"),
        ('{"type": "teleport"}', "unknown item type"),
        ('["a list"]', "must be a dict"),
    ],
)
async def test_unreadable_row_names_session_and_position(
    session: SQLiteSession, db: Path, data: str, problem: str
) -> None:
    await session.add_items([UserMessage("fine"), UserMessage("also fine")])
    raw_execute(
        db,
        "INSERT INTO items (session_id, position, data, created_at)"
        f" VALUES ('main', 2, '{data.replace(chr(39), chr(39) * 2)}', 0)",
    )
    with pytest.raises(SessionStorageError, match=problem) as info:
        await session.get_items()
    assert "'main'" in str(info.value)
    assert "position 2" in str(info.value)
    assert info.value.session_id == "main"
    assert info.value.position == 2
    assert info.value.path == session.path


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
    raw_execute(
        path,
        "CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)",
        "INSERT INTO users (name) VALUES ('ada')",
    )
    before = read_bytes(path)
    await assert_storage_error(SQLiteSession(path), "not a trio_agents session database")
    assert read_bytes(path) == before
    assert sidecar_files(path) == []
    assert raw_query(path, "PRAGMA journal_mode") == [("delete",)]  # not switched to WAL


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
    raw_execute(path, *statements)
    before = read_bytes(path)
    await assert_storage_error(SQLiteSession(path), match)
    assert read_bytes(path) == before


async def test_database_from_the_future_is_refused_untouched(db: Path) -> None:
    async with SQLiteSession(db) as s:
        await s.add_items([UserMessage("from the past")])
    raw_execute(db, f"UPDATE meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'")
    before = read_bytes(db)
    error = await assert_storage_error(
        SQLiteSession(db), f"schema version {SCHEMA_VERSION + 1}, newer than"
    )
    assert "upgrade trio_agents" in str(error)
    assert read_bytes(db) == before


async def test_current_version_without_items_table_is_corrupt(db: Path) -> None:
    async with SQLiteSession(db):
        pass
    raw_execute(db, "DROP TABLE items")
    await assert_storage_error(SQLiteSession(db), "corrupt: no items table")


async def test_unopenable_path(tmp_path: Path) -> None:
    await assert_storage_error(
        SQLiteSession(tmp_path / "no" / "such" / "dir.db"), "unable to open database file"
    )


# -- schema migrations -------------------------------------------------------------------


def make_v0_database(path: Path) -> None:
    """A hand-made "version 0": the items table has no created_at column yet."""
    raw_execute(
        path,
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
        "INSERT INTO meta VALUES ('schema_version', '0')",
        "CREATE TABLE items (session_id TEXT, position INTEGER, data TEXT,"
        " PRIMARY KEY (session_id, position))",
        'INSERT INTO items VALUES (\'old\', 0, \'{"type": "message", "role": "user",'
        ' "content": "written by v0"}\')',
    )


def migrate_v0_to_v1(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE items ADD COLUMN created_at REAL NOT NULL DEFAULT 0")


async def test_migration_hook_upgrades_an_old_database(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_v0_database(db)
    calls: list[int] = []

    def step(conn: sqlite3.Connection) -> None:
        calls.append(0)
        assert conn.in_transaction
        migrate_v0_to_v1(conn)

    monkeypatch.setitem(MIGRATIONS, 0, step)
    async with SQLiteSession(db, "old") as s:
        assert await s.get_items() == [UserMessage("written by v0")]
        await s.add_items([AssistantMessage("read by v1")])
        assert await s.get_items() == [UserMessage("written by v0"), AssistantMessage("read by v1")]
    assert calls == [0]
    assert raw_query(db, "SELECT value FROM meta WHERE key = 'schema_version'") == [
        (str(SCHEMA_VERSION),)
    ]
    # Already migrated: opening again runs nothing.
    async with SQLiteSession(db, "old") as s:
        assert len(await s.get_items()) == 2
    assert calls == [0]


async def test_migrations_run_in_order_in_one_transaction(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SQLiteSession(db) as s:
        await s.add_items([UserMessage("v1 data")])
    ran: list[int] = []

    def step(version: int) -> Callable[[sqlite3.Connection], None]:
        def migrate(conn: sqlite3.Connection) -> None:
            ran.append(version)
            conn.execute(f"CREATE TABLE added_in_v{version + 1} (x)")

        return migrate

    monkeypatch.setattr(_sqlite, "SCHEMA_VERSION", 3)
    monkeypatch.setitem(MIGRATIONS, 1, step(1))
    monkeypatch.setitem(MIGRATIONS, 2, step(2))
    async with SQLiteSession(db) as s:
        assert await s.get_items() == [UserMessage("v1 data")]
    assert ran == [1, 2]
    assert raw_query(db, "SELECT value FROM meta WHERE key = 'schema_version'") == [("3",)]
    tables = {name for (name,) in raw_query(db, "SELECT name FROM sqlite_master")}
    assert {"added_in_v2", "added_in_v3"} <= tables


async def test_missing_migration_is_refused_untouched(db: Path) -> None:
    make_v0_database(db)
    assert 0 not in MIGRATIONS
    before = read_bytes(db)
    await assert_storage_error(SQLiteSession(db), "no migration from schema version 0 to 1")
    assert read_bytes(db) == before


async def test_failed_migration_is_rolled_back(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_v0_database(db)
    before = read_bytes(db)

    def half_then_fail(conn: sqlite3.Connection) -> None:
        migrate_v0_to_v1(conn)
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("step exploded")

    monkeypatch.setitem(MIGRATIONS, 0, half_then_fail)
    error = await assert_storage_error(SQLiteSession(db), "from schema version 0 to 1 failed")
    assert isinstance(error.__cause__, RuntimeError)
    assert read_bytes(db) == before
    tables = {name for (name,) in raw_query(db, "SELECT name FROM sqlite_master")}
    assert "half_done" not in tables


async def test_migration_that_commits_is_refused(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_v0_database(db)
    monkeypatch.setitem(MIGRATIONS, 0, lambda conn: conn.execute("COMMIT"))
    await assert_storage_error(SQLiteSession(db), "migrations must not commit")


# -- closing -----------------------------------------------------------------------------


async def test_aclose_closes_the_connection(db: Path) -> None:
    s = SQLiteSession(db)
    await s.add_items([UserMessage("x")])
    assert sorted(sidecar_files(db)) == ["sessions.db-shm", "sessions.db-wal"]
    await s.aclose()
    # SQLite removes the WAL files when the last connection to the file closes.
    assert sidecar_files(db) == []
    with pytest.raises(trio.ClosedResourceError):
        await s.get_items()
    with pytest.raises(trio.ClosedResourceError):
        await s.add_items([UserMessage("y")])
    await s.aclose()  # idempotent
    async with SQLiteSession(db) as reopened:
        assert await reopened.get_items() == [UserMessage("x")]


async def test_async_with_closes_even_on_error(db: Path) -> None:
    s = SQLiteSession(db)

    async def fail_inside() -> None:
        async with s:
            await s.add_items([UserMessage("x")])
            raise KeyError("boom")

    with pytest.raises(KeyError):
        await fail_inside()
    assert sidecar_files(db) == []
    with pytest.raises(trio.ClosedResourceError):
        await s.clear()


async def test_aclose_when_cancelled_still_closes(db: Path) -> None:
    s = SQLiteSession(db)
    await s.add_items([UserMessage("x")])
    with trio.CancelScope() as scope:
        scope.cancel()
        await s.aclose()
    assert scope.cancelled_caught
    assert sidecar_files(db) == []
    with pytest.raises(trio.ClosedResourceError):
        await s.get_items()


async def test_sync_close(db: Path) -> None:
    s = SQLiteSession(db)
    s.close()  # never opened: fine
    with pytest.raises(trio.ClosedResourceError):
        await s.get_items()
    t = SQLiteSession(db)
    await t.add_items([UserMessage("x")])
    t.close()
    t.close()
    assert sidecar_files(db) == []
