"""What SQLiteSession and PostgresSession share below the Session contract, run against
a real SQLite file and a database of its own on the suite's PostgreSQL: lazy creation,
statistics, repair on load written back, a writer holding the store elsewhere, unreadable rows, stores from the future, schema
migrations, closing. What only one of them does is in test_sqlite_session.py and
test_postgres_session.py; the contract itself in sessions/test_session_conformance.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.sessions_sql import (
    CRASHED,
    PG_SESSIONS,
    REPAIRED,
    SqlStore,
    any_item,
    assert_storage_error,
    postgres_sql,
    sqlite_sql,
)
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
    PostgresSessionStatistics,
    Session,
    SessionStorageError,
    _postgres,
    _sqlite,
    fork_point,
    repair_loaded,
)
from trio_agents.sessions._sqlite import SQLiteSessionStatistics

# Each backend's module (its MIGRATIONS and SCHEMA_VERSION) and its statistics class.
MODULES: dict[str, Any] = {"sqlite": _sqlite, "postgres": _postgres}
STATISTICS: dict[str, Any] = {
    "sqlite": SQLiteSessionStatistics,
    "postgres": PostgresSessionStatistics,
}


@pytest.fixture(params=["sqlite", "postgres"])
def sql(request: pytest.FixtureRequest, tmp_path: Path) -> SqlStore:
    """An empty store: a SQLite file, or a database on the suite's PostgreSQL (only that
    case starts the server)."""
    if request.param == "sqlite":
        return sqlite_sql(tmp_path / "sessions.db")
    return postgres_sql(request.getfixturevalue("pg_dsn"))


def statistics(sql: SqlStore, session: Any, item_count: int) -> Any:
    where = session.path if sql.backend == "sqlite" else session.database
    return STATISTICS[sql.backend](where, session.session_id, item_count)


def exists(path: Path) -> bool:
    return path.exists()


def where_of(sql: SqlStore, holder: Any) -> Any:
    """Where ``holder`` (a session, or an error about one) says its store is."""
    return holder.path if sql.backend == "sqlite" else holder.database


def held_open(sql: SqlStore) -> list[Any]:
    """What of the store a session holds open: SQLite's WAL files (SQLite removes them
    when the last connection to the file closes), the PostgreSQL pool of the default size."""
    if sql.backend == "sqlite":
        return sorted(p.name for p in Path(sql.where).parent.iterdir() if p.name != "sessions.db")
    return [key for key in [(sql.where, 4)] if key in _postgres._pools]


# -- basics -----------------------------------------------------------------------------


async def test_is_a_session(session: Any) -> None:
    assert isinstance(session, Session)
    assert session.session_id == "main"
    assert issubclass(SessionStorageError, TrioAgentsError)


async def test_new_session_is_empty_and_the_store_is_created_lazily(sql: SqlStore) -> None:
    s = sql.session()
    assert s.session_id == "default"
    if sql.backend == "sqlite":
        assert not exists(sql.where)
    else:
        assert sql.tables() == set()
    try:
        assert await s.get_items() == []
        if sql.backend == "sqlite":
            assert exists(sql.where)
        else:
            assert sql.tables() == {"trio_agents_schema", PG_SESSIONS, sql.items_table}
            assert sql.query("SELECT component, version FROM trio_agents_schema") == [
                ("sessions", SCHEMA_VERSION)
            ]
    finally:
        await s.aclose()


def test_session_id_is_validated(sql: SqlStore) -> None:
    with pytest.raises(ValueError, match="session_id must not be empty"):
        sql.session("")
    with pytest.raises(TypeError, match="session_id must be a str"):
        sql.session(3)  # type: ignore[arg-type]


async def test_statistics(sql: SqlStore, session: Any) -> None:
    await session.add_items([])
    assert await session.statistics() == statistics(sql, session, 0)
    await session.add_items([UserMessage("x"), ToolCall("c", "t")])
    # The count is of stored rows: the dangling call's repair is made on load.
    assert await session.statistics() == statistics(sql, session, 2)
    assert len(await session.get_items()) == 3
    # get_items wrote the repair back.
    assert await session.statistics() == statistics(sql, session, 3)


# -- repair on load -----------------------------------------------------------------------


@settings(max_examples=40)
@given(batches=st.lists(st.lists(any_item, max_size=6), max_size=4))
def test_any_stored_list_loads_repaired(sql: SqlStore, batches: list[list[Item]]) -> None:
    session_id = uuid.uuid4().hex  # a fresh session per example, in the test's store

    async def main() -> None:
        async with sql.session(session_id) as writer:
            for batch in batches:
                await writer.add_items(batch)
        everything = [item for batch in batches for item in batch]
        async with sql.session(session_id) as reader:
            loaded = await reader.get_items()
        assert loaded == repair_loaded(everything)
        assert conversation_problems(loaded) == []
        # The repair was written back: the rows are the repaired conversation.
        assert [item for _, item in sql.stored(session_id)] == loaded
        assert sql.positions(session_id) == list(range(len(loaded)))

    trio.run(main)


async def test_dangling_calls_are_repaired_on_load_and_written_back(
    sql: SqlStore, session: Any
) -> None:
    await session.add_items(CRASHED)
    loaded = await session.get_items()
    assert loaded == REPAIRED
    assert conversation_problems(loaded) == []
    assert sql.stored("main") == list(enumerate(REPAIRED))  # written back
    if sql.backend == "postgres":
        next_position = sql.query(f"SELECT next_position FROM {PG_SESSIONS}")
        assert next_position == [(len(REPAIRED),)]
    # The next run appends after the stored rows; the conversation stays valid.
    await session.add_items([UserMessage("again"), AssistantMessage("ok")])
    loaded = await session.get_items()
    assert loaded == [*REPAIRED, UserMessage("again"), AssistantMessage("ok")]
    assert conversation_problems(loaded) == []
    assert sql.positions("main") == list(range(7))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ("{not json", "Expecting property name"),
        ('{"type": "teleport"}', "unknown item type"),
        ('["a list"]', "must be a dict"),
    ],
)
async def test_unreadable_row_names_session_and_position(
    sql: SqlStore, session: Any, data: str, problem: str
) -> None:
    await session.add_items([UserMessage("fine"), UserMessage("also fine")])
    with sql.connect() as conn:
        sql.insert_row(conn, "main", 2, data)
    with pytest.raises(SessionStorageError, match=problem) as info:
        await session.get_items()
    assert "'main'" in str(info.value)
    assert "position 2" in str(info.value)
    assert info.value.session_id == "main"
    assert info.value.position == 2
    assert where_of(sql, info.value) == where_of(sql, session)


# -- a writer elsewhere -------------------------------------------------------------------


async def test_waits_for_another_connection_holding_the_store(sql: SqlStore) -> None:
    async with sql.session("w") as s:
        await s.add_items([UserMessage("first")])
        with sql.holding("w") as other:
            sql.insert_row(other, "w", 1, json.dumps(UserMessage("raw").to_json()))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(s.add_items, [UserMessage("second")])
                await trio.testing.wait_all_tasks_blocked()  # its thread waits on the lock
                sql.end(other, "COMMIT")
        assert await s.get_items() == [
            UserMessage("first"),
            UserMessage("raw"),
            UserMessage("second"),
        ]


async def test_a_lock_wait_past_its_timeout_is_a_storage_error(sql: SqlStore) -> None:
    async with sql.session("w", **sql.short_lock_wait) as s:
        await s.add_items([UserMessage("before")])
        with sql.holding("w"):
            with pytest.raises(SessionStorageError, match=sql.lock_wait_error) as info:
                await s.add_items([UserMessage("blocked")])
            assert info.value.session_id == "w"
            assert where_of(sql, info.value) == where_of(sql, s)
            assert isinstance(info.value.__cause__, sql.lock_wait_cause)
        await s.add_items([UserMessage("fine now")])
        assert await s.get_items() == [UserMessage("before"), UserMessage("fine now")]


# -- stores it refuses ------------------------------------------------------------------


async def test_a_store_from_the_future_is_refused_untouched(sql: SqlStore) -> None:
    async with sql.session() as s:
        await s.add_items([UserMessage("from the past")])
    future = SCHEMA_VERSION + 1
    if sql.backend == "sqlite":
        sql.execute(f"UPDATE meta SET value = '{future}' WHERE key = 'schema_version'")
    else:
        sql.execute(f"UPDATE trio_agents_schema SET version = {future}")
    before = sql.snapshot()
    error = await assert_storage_error(sql.session(), f"schema version {future}, newer than")
    assert "upgrade trio_agents" in str(error)
    assert sql.snapshot() == before


async def test_current_version_without_items_table_is_corrupt(sql: SqlStore) -> None:
    async with sql.session():
        pass
    sql.execute(f"DROP TABLE {sql.items_table}")
    await assert_storage_error(sql.session(), f"corrupt: no {sql.items_table} table")


# -- schema migrations -------------------------------------------------------------------


async def test_migration_hook_upgrades_an_old_store(
    sql: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sql.execute(*sql.v0_statements)
    calls: list[int] = []

    def step(conn: Any) -> None:
        calls.append(0)
        if sql.backend == "sqlite":
            assert conn.in_transaction
        else:
            assert conn.info.transaction_status == conn.info.transaction_status.INTRANS
        conn.execute(sql.v0_to_v1)

    monkeypatch.setitem(MODULES[sql.backend].MIGRATIONS, 0, step)
    async with sql.session("old") as s:
        assert await s.get_items() == [UserMessage("written by v0")]
        await s.add_items([AssistantMessage("read by v1")])
        assert await s.get_items() == [UserMessage("written by v0"), AssistantMessage("read by v1")]
    assert calls == [0]
    assert sql.schema_version() == sql.version_rows(SCHEMA_VERSION)
    async with sql.session("old") as s:  # already migrated: nothing runs
        assert len(await s.get_items()) == 2
    assert calls == [0]


async def test_migrations_run_in_order_in_one_transaction(
    sql: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with sql.session() as s:
        await s.add_items([UserMessage("v1 data")])
    ran: list[int] = []

    def step(version: int) -> Callable[[Any], None]:
        def migrate(conn: Any) -> None:
            ran.append(version)
            conn.execute(f"CREATE TABLE added_in_v{version + 1} (x INTEGER)")

        return migrate

    module = MODULES[sql.backend]
    monkeypatch.setattr(module, "SCHEMA_VERSION", 3)
    monkeypatch.setitem(module.MIGRATIONS, 1, step(1))
    monkeypatch.setitem(module.MIGRATIONS, 2, step(2))
    async with sql.session() as s:
        assert await s.get_items() == [UserMessage("v1 data")]
    assert ran == [1, 2]
    assert sql.schema_version() == sql.version_rows(3)
    assert {"added_in_v2", "added_in_v3"} <= sql.tables()


async def test_missing_migration_is_refused_untouched(sql: SqlStore) -> None:
    sql.execute(*sql.v0_statements)
    assert 0 not in MODULES[sql.backend].MIGRATIONS
    before = sql.snapshot()
    await assert_storage_error(sql.session(), "no migration .*from schema version 0 to 1")
    assert sql.snapshot() == before


async def test_failed_migration_is_rolled_back(
    sql: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sql.execute(*sql.v0_statements)
    before = sql.snapshot()

    def half_then_fail(conn: Any) -> None:
        conn.execute(sql.v0_to_v1)
        conn.execute("CREATE TABLE half_done (x INTEGER)")
        raise RuntimeError("step exploded")

    monkeypatch.setitem(MODULES[sql.backend].MIGRATIONS, 0, half_then_fail)
    error = await assert_storage_error(sql.session(), "from schema version 0 to 1 failed")
    assert isinstance(error.__cause__, RuntimeError)
    assert sql.snapshot() == before
    assert "half_done" not in sql.tables()


async def test_migration_that_commits_is_refused(
    sql: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sql.execute(*sql.v0_statements)
    monkeypatch.setitem(MODULES[sql.backend].MIGRATIONS, 0, lambda conn: conn.execute("COMMIT"))
    await assert_storage_error(sql.session(), "migrations must not commit")


# -- closing -----------------------------------------------------------------------------


async def test_aclose_closes(sql: SqlStore) -> None:
    s = sql.session()
    await s.add_items([UserMessage("x")])
    sqlite_wal = ["sessions.db-shm", "sessions.db-wal"]
    assert held_open(sql) == (sqlite_wal if sql.backend == "sqlite" else [(sql.where, 4)])
    await s.aclose()
    assert held_open(sql) == []
    with pytest.raises(trio.ClosedResourceError):
        await s.get_items()
    with pytest.raises(trio.ClosedResourceError):
        await s.add_items([UserMessage("y")])
    with pytest.raises(trio.ClosedResourceError):
        await s.add_items([])
    await s.aclose()  # idempotent
    async with sql.session() as reopened:
        assert await reopened.get_items() == [UserMessage("x")]


async def test_async_with_closes_even_on_error(sql: SqlStore) -> None:
    s = sql.session()

    async def fail_inside() -> None:
        async with s:
            await s.add_items([UserMessage("x")])
            raise KeyError("boom")

    with pytest.raises(KeyError):
        await fail_inside()
    assert held_open(sql) == []
    with pytest.raises(trio.ClosedResourceError):
        await s.clear()


async def test_aclose_when_cancelled_still_closes(sql: SqlStore) -> None:
    s = sql.session()
    await s.add_items([UserMessage("x")])
    with trio.CancelScope() as scope:
        scope.cancel()
        await s.aclose()
    assert scope.cancelled_caught
    assert held_open(sql) == []
    with pytest.raises(trio.ClosedResourceError):
        await s.get_items()


async def test_sync_close(sql: SqlStore) -> None:
    s = sql.session()
    s.close()  # never opened: fine
    with pytest.raises(trio.ClosedResourceError):
        await s.get_items()
    t = sql.session()
    await t.add_items([UserMessage("x")])
    t.close()
    t.close()
    assert held_open(sql) == []


# -- forks of rows this library did not write ----------------------------------------


@pytest.mark.parametrize("gaps", [False, True], ids=["contiguous", "gaps"])
async def test_rows_written_otherwise_fork_right_at_every_boundary(
    sql: SqlStore, gaps: bool
) -> None:
    """A fork reads only the rows holding a call id, and reads their type and call id
    in the database, from the text this library writes (type first, compact). Rows
    another tool wrote (keys in another order, spaces after the separators, call ids
    with escaped quotes and backslashes, positions with gaps) are read as what they
    are: the cut is the one the decoded items give, at every boundary, and the fork's
    positions count from 0."""
    items: list[Item] = [
        UserMessage('say "call_id": "nope"'),
        ToolCall('q"1', "t", '{"call_id": "x"}'),
        ToolCall("b\\2", "t"),
        ToolResult("b\\2", "r"),
        ToolResult('q"1', "r"),
        AssistantMessage("a"),
        ToolCall("k3", "t"),
        ToolCall("k4", "t"),
        ToolResult("k4", "r"),
        ToolResult("k3", "r"),
        AssistantMessage("end"),
    ]
    async with sql.session("s") as source:  # creates the store
        with sql.connect() as conn:
            if sql.backend == "postgres":
                conn.execute(
                    f"INSERT INTO {PG_SESSIONS} (session_id, next_position) VALUES ('s', 0)"
                )
            for index, item in enumerate(items):
                data = item.to_json()
                if isinstance(item, ToolCall | ToolResult):
                    data = dict(reversed(data.items()))  # call_id after the rest, type last
                text = json.dumps(data, separators=(", ", ": ") if index % 2 else (",", ":"))
                sql.insert_row(conn, "s", index * 10 + 3 if gaps else index, text)
        for at in range(len(items) + 2):
            fork = await source.fork(f"f{at}", at=at)
            kept = fork_point(items, at)
            async with fork:
                assert await fork.get_items() == items[:kept], at
            assert sql.positions(f"f{at}") == list(range(kept))
