"""PostgresSession on a real PostgreSQL server (started by the suite: tests/support/pg_support.py),
a database per test: round trips, sharing a database, concurrency, cancellation, bounded
waits, repair on load written back, bad tables, schema migrations, the pool, closing."""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg_pool import ConnectionPool

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
    PostgresSession,
    PostgresSessionStatistics,
    Session,
    SessionStorageError,
    _postgres,
    repair_loaded,
)
from trio_agents.sessions._postgres import MIGRATIONS

ITEMS = "trio_agents_session_items"
SESSIONS = "trio_agents_sessions"

# -- helpers ----------------------------------------------------------------------------


def raw_connection(dsn: str) -> psycopg.Connection[Any]:
    """A plain psycopg connection (autocommit), for the test's own look at the tables."""
    return psycopg.connect(dsn, autocommit=True)


def raw_query(dsn: str, sql: str, *params: Any) -> list[Any]:
    with raw_connection(dsn) as conn:
        return conn.execute(sql, params).fetchall()


def raw_execute(dsn: str, *statements: str) -> None:
    with raw_connection(dsn) as conn:
        for statement in statements:
            conn.execute(statement)


def stored(dsn: str, session_id: str) -> list[tuple[int, Item]]:
    rows = raw_query(
        dsn,
        f"SELECT position, data FROM {ITEMS} WHERE session_id = %s ORDER BY position",
        session_id,
    )
    from trio_agents.sessions._storage import decode_item

    return [(position, decode_item(data)) for position, data in rows]


def positions(dsn: str, session_id: str) -> list[int]:
    return [position for position, _ in stored(dsn, session_id)]


def tables(dsn: str) -> set[str]:
    rows = raw_query(dsn, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {name for (name,) in rows}


def snapshot(dsn: str) -> dict[str, list[Any]]:
    """Every public table's rows, to check that a refused database was not touched."""
    result = {}
    for table in sorted(tables(dsn)):
        result[table] = sorted(map(repr, raw_query(dsn, f"SELECT * FROM {table}")))
    return result


def poison(dsn: str, marker: str) -> None:
    """Make PostgreSQL itself refuse any item row whose data contains ``marker``."""
    raw_execute(
        dsn,
        "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
        f" IF NEW.data LIKE '%{marker}%' THEN RAISE EXCEPTION 'poisoned row'; END IF;"
        " RETURN NEW; END $$",
        f"CREATE TRIGGER poison BEFORE INSERT ON {ITEMS} FOR EACH ROW EXECUTE FUNCTION poison()",
    )


@pytest.fixture
async def session(pg_dsn: str) -> AsyncIterator[PostgresSession]:
    async with PostgresSession(pg_dsn, "main") as s:
        yield s


async def assert_storage_error(session: PostgresSession, match: str) -> SessionStorageError:
    with pytest.raises(SessionStorageError, match=match) as info:
        async with session:
            pytest.fail("used a database it should have refused")
    return info.value


# -- basics -----------------------------------------------------------------------------


async def test_is_a_session(session: PostgresSession, pg_dsn: str) -> None:
    assert isinstance(session, Session)
    assert session.session_id == "main"
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    port = psycopg.conninfo.conninfo_to_dict(pg_dsn)["port"]
    assert session.database == f"127.0.0.1:{port}/{dbname}"
    assert issubclass(SessionStorageError, TrioAgentsError)
    secret = PostgresSession(pg_dsn + " password=hunter2", "x")
    assert "hunter2" not in repr(secret)
    assert "hunter2" not in str(secret.lock_key)


async def test_new_session_is_empty_and_tables_are_created_lazily(pg_dsn: str) -> None:
    s = PostgresSession(pg_dsn)
    assert s.session_id == "default"
    assert tables(pg_dsn) == set()
    try:
        assert await s.get_items() == []
        assert tables(pg_dsn) == {"trio_agents_schema", SESSIONS, ITEMS}
        assert raw_query(pg_dsn, "SELECT component, version FROM trio_agents_schema") == [
            ("sessions", SCHEMA_VERSION)
        ]
    finally:
        await s.aclose()


async def test_statistics(session: PostgresSession) -> None:
    await session.add_items([])
    assert await session.statistics() == PostgresSessionStatistics(session.database, "main", 0)
    await session.add_items([UserMessage("x"), ToolCall("c", "t")])
    stats = await session.statistics()
    # The count is of stored rows; get_items repairs (and writes the repair back).
    assert stats == PostgresSessionStatistics(session.database, "main", 2)
    assert len(await session.get_items()) == 3
    assert (await session.statistics()).item_count == 3


def test_arguments_are_validated(pg_dsn: str) -> None:
    with pytest.raises(ValueError, match="session_id must not be empty"):
        PostgresSession(pg_dsn, "")
    with pytest.raises(TypeError, match="session_id must be a str"):
        PostgresSession(pg_dsn, 3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dsn must be a str"):
        PostgresSession(Path("/x"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a valid connection string"):
        PostgresSession("host=x port")
    with pytest.raises(ValueError, match="lock_timeout must be > 0"):
        PostgresSession(pg_dsn, lock_timeout=0)
    with pytest.raises(ValueError, match="statement_timeout must be > 0"):
        PostgresSession(pg_dsn, statement_timeout=-1)
    with pytest.raises(ValueError, match="max_connections must be >= 1"):
        PostgresSession(pg_dsn, max_connections=0)
    with pytest.raises(TypeError, match="max_connections must be an int"):
        PostgresSession(pg_dsn, max_connections=1.5)  # type: ignore[arg-type]


def test_lock_key_names_the_database_and_the_session(pg_dsn: str) -> None:
    params = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    uri = f"postgresql://postgres@127.0.0.1:{params['port']}/{params['dbname']}"
    assert PostgresSession(uri, "s").lock_key == PostgresSession(pg_dsn, "s").lock_key
    assert PostgresSession(pg_dsn, "s").lock_key != PostgresSession(pg_dsn, "t").lock_key
    other_db = pg_dsn.replace(f"dbname={params['dbname']}", "dbname=elsewhere")
    assert PostgresSession(other_db, "s").lock_key != PostgresSession(pg_dsn, "s").lock_key


# -- property: what you add is what you get ----------------------------------------------

text = st.text(max_size=12)
call_ids = st.sampled_from(["a", "b", "c"])
any_item = st.one_of(
    st.builds(UserMessage, text),
    st.builds(AssistantMessage, text, st.sampled_from(["completed", "incomplete"])),
    st.builds(ToolCall, call_ids, st.text(min_size=1, max_size=5), text),
    st.builds(ToolResult, call_ids, text, st.sampled_from(["ok", "error", "cancelled"])),
)


@settings(max_examples=25)
@given(batches=st.lists(st.lists(any_item, max_size=6), max_size=4))
def test_any_stored_list_loads_repaired_and_stays_so(
    pg_dsn: str, batches: list[list[Item]]
) -> None:
    session_id = uuid.uuid4().hex  # a fresh session per example, in the test's database

    async def main() -> None:
        async with PostgresSession(pg_dsn, session_id) as writer:
            for batch in batches:
                await writer.add_items(batch)
        everything = [item for batch in batches for item in batch]
        async with PostgresSession(pg_dsn, session_id) as reader:
            loaded = await reader.get_items()
        assert loaded == repair_loaded(everything)
        assert conversation_problems(loaded) == []
        # The repair was written back: the rows are the repaired conversation.
        assert [item for _, item in stored(pg_dsn, session_id)] == loaded
        assert positions(pg_dsn, session_id) == list(range(len(loaded)))

    trio.run(main)


# -- many sessions, concurrency -----------------------------------------------------------


def test_several_trio_runs_create_and_share_one_database(pg_dsn: str) -> None:
    # Separate pools (sizes differ), so every thread checks the schema itself and they
    # race to create it: the advisory lock makes one of them do it.
    errors: list[BaseException] = []
    start = threading.Barrier(5)

    async def worker(n: int) -> None:
        async with PostgresSession(pg_dsn, f"t{n % 2}", max_connections=n + 1) as s:
            for j in range(8):
                await s.add_items([UserMessage(f"t{n}-{j}:{k}") for k in range(3)])

    def thread_main(n: int) -> None:
        try:
            start.wait()
            trio.run(worker, n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread_main, args=(n,)) for n in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    for sid, writers in (("t0", 3), ("t1", 2)):
        rows = [item for _, item in stored(pg_dsn, sid)]
        assert len(assert_batches_whole(rows, 3)) == writers * 8
        assert positions(pg_dsn, sid) == list(range(writers * 8 * 3))


async def test_waits_for_another_connection_holding_the_session(pg_dsn: str) -> None:
    async with PostgresSession(pg_dsn, "w") as s:
        await s.add_items([UserMessage("first")])
        with raw_connection(pg_dsn) as other:  # another process, as far as PostgreSQL knows
            other.autocommit = False
            other.execute(
                f"UPDATE {SESSIONS} SET next_position = next_position + 1 WHERE session_id = 'w'"
            )
            other.execute(
                f"INSERT INTO {ITEMS} (session_id, position, data) VALUES ('w', 1, %s)",
                (json.dumps(UserMessage("raw").to_json()),),
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(s.add_items, [UserMessage("second")])
                await trio.testing.wait_all_tasks_blocked()  # its thread waits on the lock
                other.commit()
        assert await s.get_items() == [
            UserMessage("first"),
            UserMessage("raw"),
            UserMessage("second"),
        ]


def lock_session_row(conn: psycopg.Connection[Any], session_id: str) -> None:
    """Hold ``session_id``'s row lock in ``conn`` (a transaction left open)."""
    conn.autocommit = False
    row = conn.execute(
        f"SELECT session_id FROM {SESSIONS} WHERE session_id = %s FOR UPDATE", (session_id,)
    ).fetchone()
    assert row is not None


async def test_lock_timeout_gives_a_storage_error(pg_dsn: str) -> None:
    async with PostgresSession(pg_dsn, "w", lock_timeout=0.05) as s:
        await s.add_items([UserMessage("before")])
        with raw_connection(pg_dsn) as other:
            lock_session_row(other, "w")
            with pytest.raises(SessionStorageError, match="lock timeout") as info:
                await s.add_items([UserMessage("blocked")])
            assert info.value.session_id == "w"
            assert info.value.database == s.database
            assert isinstance(info.value.__cause__, psycopg.errors.LockNotAvailable)
            other.rollback()
        await s.add_items([UserMessage("fine now")])
        assert await s.get_items() == [UserMessage("before"), UserMessage("fine now")]


@pytest.mark.parametrize("call", ["add_items", "get_items", "replace_items", "clear"])
async def test_the_callers_deadline_caps_the_wait_for_a_lock(pg_dsn: str, call: str) -> None:
    # An hour of lock_timeout, but the caller has a deadline: the call fails (it is not
    # abandoned) once the deadline is used up. A hang guard, not a timing claim.
    async with PostgresSession(pg_dsn, "w", lock_timeout=3600, statement_timeout=3600) as s:
        await s.add_items([UserMessage("q"), ToolCall("dangling", "t")])  # get_items repairs
        with raw_connection(pg_dsn) as other:
            lock_session_row(other, "w")
            operation: Callable[[], Any] = {
                "add_items": lambda: s.add_items([UserMessage("blocked")]),
                "get_items": s.get_items,
                "replace_items": lambda: s.replace_items([UserMessage("new")]),
                "clear": s.clear,
            }[call]
            with trio.fail_after(60):
                with pytest.raises(SessionStorageError, match="timeout"):
                    with trio.move_on_after(0.2):
                        await operation()
            other.rollback()
        assert await s.statistics() == PostgresSessionStatistics(s.database, "w", 2)


# -- cancellation ----------------------------------------------------------------------


async def test_cancelled_while_waiting_for_a_connection_writes_nothing(
    session: PostgresSession, pg_dsn: str
) -> None:
    limiter = _postgres._pool_limiter((pg_dsn, 4))
    holders = [object() for _ in range(4)]  # every connection slot taken
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            for holder in holders:
                await limiter.acquire_on_behalf_of(holder)
            try:
                nursery.start_soon(session.add_items, [UserMessage("never")])
                await trio.testing.wait_all_tasks_blocked()
                assert limiter.statistics().tasks_waiting == 1
                scope.cancel()
            finally:
                for holder in holders:
                    limiter.release_on_behalf_of(holder)
    assert scope.cancelled_caught
    assert await session.get_items() == []


# -- repair on load, written back --------------------------------------------------------

CRASHED: list[Item] = [
    UserMessage("go"),
    ToolCall("a", "slow"),
    ToolCall("b", "fast"),
    ToolResult("b", "2"),
    ToolResult("zombie", "orphan"),
]
REPAIRED: list[Item] = [
    UserMessage("go"),
    ToolCall("a", "slow"),
    ToolCall("b", "fast"),
    ToolResult("b", "2"),
    ToolResult("a", INTERRUPTED_OUTPUT, status="cancelled"),
]


async def test_dangling_calls_are_repaired_on_load_and_written_back(
    session: PostgresSession, pg_dsn: str
) -> None:
    await session.add_items(CRASHED)
    loaded = await session.get_items()
    assert loaded == REPAIRED
    assert conversation_problems(loaded) == []
    assert stored(pg_dsn, "main") == list(enumerate(REPAIRED))
    assert raw_query(pg_dsn, f"SELECT next_position FROM {SESSIONS}") == [(len(REPAIRED),)]
    # The next run appends after the repaired rows; the conversation stays valid.
    await session.add_items([UserMessage("again"), AssistantMessage("ok")])
    loaded = await session.get_items()
    assert loaded == [*REPAIRED, UserMessage("again"), AssistantMessage("ok")]
    assert positions(pg_dsn, "main") == list(range(7))


async def test_a_repair_write_back_that_fails_leaves_the_rows_as_they_were(
    session: PostgresSession, pg_dsn: str
) -> None:
    await session.add_items(CRASHED)
    before = stored(pg_dsn, "main")
    poison(pg_dsn, "cancelled: interrupted")  # the write-back's insert fails halfway
    with pytest.raises(SessionStorageError, match="poisoned row"):
        await session.get_items()
    # One transaction: the rows were deleted and re-inserted, or (here) neither.
    assert stored(pg_dsn, "main") == before


async def test_replace_items_is_atomic(session: PostgresSession, pg_dsn: str) -> None:
    await session.add_items([UserMessage("old 1"), UserMessage("old 2"), UserMessage("old 3")])
    await session.replace_items([UserMessage("new")])
    assert await session.get_items() == [UserMessage("new")]
    await session.add_items([UserMessage("next")])
    assert positions(pg_dsn, "main") == [0, 1]
    poison(pg_dsn, "poison")
    with pytest.raises(SessionStorageError, match="poisoned row"):
        await session.replace_items([UserMessage("fine"), UserMessage("poison")])
    assert await session.get_items() == [UserMessage("new"), UserMessage("next")]
    await session.replace_items([])
    assert await session.get_items() == []


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ("{not json", "Expecting property name"),
        ('{"type": "teleport"}', "unknown item type"),
        ('["a list"]', "must be a dict"),
    ],
)
async def test_unreadable_row_names_session_and_position(
    session: PostgresSession, pg_dsn: str, data: str, problem: str
) -> None:
    await session.add_items([UserMessage("fine"), UserMessage("also fine")])
    with raw_connection(pg_dsn) as conn:
        conn.execute(
            f"INSERT INTO {ITEMS} (session_id, position, data) VALUES ('main', 2, %s)", (data,)
        )
    with pytest.raises(SessionStorageError, match=problem) as info:
        await session.get_items()
    assert "'main'" in str(info.value)
    assert "position 2" in str(info.value)
    assert info.value.session_id == "main"
    assert info.value.position == 2
    assert info.value.database == session.database


# -- bad tables ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("statements", "match"),
    [
        (
            [f"CREATE TABLE {ITEMS} (id INTEGER PRIMARY KEY, name TEXT)"],
            f"it has a {ITEMS} table that no trio_agents_schema row accounts for",
        ),
        (
            [
                "CREATE TABLE trio_agents_schema (component TEXT, version INTEGER)",
                "INSERT INTO trio_agents_schema VALUES ('cluster', 1)",
                f"CREATE TABLE {SESSIONS} (x INTEGER)",
            ],
            f"it has a {SESSIONS} table",
        ),
        (
            ["CREATE TABLE trio_agents_schema (id INTEGER, blob BYTEA)"],
            "unexpected trio_agents_schema table",
        ),
        (
            [
                "CREATE TABLE trio_agents_schema (component TEXT, version TEXT)",
                "INSERT INTO trio_agents_schema VALUES ('sessions', 'one')",
            ],
            "no valid version",
        ),
    ],
)
async def test_foreign_tables_are_refused_untouched(
    pg_dsn: str, statements: list[str], match: str
) -> None:
    raw_execute(pg_dsn, *statements)
    before = snapshot(pg_dsn)
    error = await assert_storage_error(PostgresSession(pg_dsn), match)
    assert error.database is not None
    assert snapshot(pg_dsn) == before


async def test_another_component_in_the_schema_table_is_fine(pg_dsn: str) -> None:
    raw_execute(
        pg_dsn,
        "CREATE TABLE trio_agents_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL,"
        " updated_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        "INSERT INTO trio_agents_schema (component, version) VALUES ('cluster', 7)",
    )
    async with PostgresSession(pg_dsn) as s:
        await s.add_items([UserMessage("x")])
    rows = raw_query(pg_dsn, "SELECT component, version FROM trio_agents_schema ORDER BY 1")
    assert rows == [("cluster", 7), ("sessions", SCHEMA_VERSION)]


async def test_tables_from_the_future_are_refused_untouched(pg_dsn: str) -> None:
    async with PostgresSession(pg_dsn) as s:
        await s.add_items([UserMessage("from the past")])
    raw_execute(pg_dsn, f"UPDATE trio_agents_schema SET version = {SCHEMA_VERSION + 1}")
    before = snapshot(pg_dsn)
    error = await assert_storage_error(
        PostgresSession(pg_dsn), f"schema version {SCHEMA_VERSION + 1}, newer than"
    )
    assert "upgrade trio_agents" in str(error)
    assert snapshot(pg_dsn) == before


async def test_current_version_without_items_table_is_corrupt(pg_dsn: str) -> None:
    async with PostgresSession(pg_dsn):
        pass
    raw_execute(pg_dsn, f"DROP TABLE {ITEMS}")
    await assert_storage_error(PostgresSession(pg_dsn), f"corrupt: no {ITEMS} table")


async def test_unreachable_server_is_a_storage_error(postgres_server: Any) -> None:
    params = psycopg.conninfo.conninfo_to_dict(postgres_server.dsn())
    dsn = f"host=127.0.0.1 port={params['port']} user=postgres dbname=no_such_database"

    async def connect() -> None:
        with trio.move_on_after(1):  # the wait for a connection is capped by this
            async with PostgresSession(dsn):
                pytest.fail("connected to a database that does not exist")

    with trio.fail_after(60), pytest.raises(SessionStorageError, match="no_such_database"):
        await connect()  # within a hang guard


# -- schema migrations -------------------------------------------------------------------


def make_v0_tables(dsn: str) -> None:
    """A hand-made "version 0": the items table has no created_at column yet."""
    raw_execute(
        dsn,
        "CREATE TABLE trio_agents_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL,"
        " updated_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        "INSERT INTO trio_agents_schema (component, version) VALUES ('sessions', 0)",
        f"CREATE TABLE {SESSIONS} (session_id TEXT PRIMARY KEY, next_position BIGINT NOT NULL,"
        " updated_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        f"CREATE TABLE {ITEMS} (session_id TEXT NOT NULL, position BIGINT NOT NULL,"
        " data TEXT NOT NULL, PRIMARY KEY (session_id, position))",
        f"INSERT INTO {SESSIONS} (session_id, next_position) VALUES ('old', 1)",
        f'INSERT INTO {ITEMS} VALUES (\'old\', 0, \'{{"type": "message", "role": "user",'
        ' "content": "written by v0"}\')',
    )


def migrate_v0_to_v1(conn: psycopg.Connection[Any]) -> None:
    conn.execute(f"ALTER TABLE {ITEMS} ADD COLUMN created_at TIMESTAMPTZ NOT NULL DEFAULT now()")


async def test_migration_hook_upgrades_old_tables(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_v0_tables(pg_dsn)
    calls: list[int] = []

    def step(conn: psycopg.Connection[Any]) -> None:
        calls.append(0)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        migrate_v0_to_v1(conn)

    monkeypatch.setitem(MIGRATIONS, 0, step)
    async with PostgresSession(pg_dsn, "old") as s:
        assert await s.get_items() == [UserMessage("written by v0")]
        await s.add_items([AssistantMessage("read by v1")])
        assert await s.get_items() == [UserMessage("written by v0"), AssistantMessage("read by v1")]
    assert calls == [0]
    assert raw_query(pg_dsn, "SELECT version FROM trio_agents_schema") == [(SCHEMA_VERSION,)]
    async with PostgresSession(pg_dsn, "old") as s:  # already migrated: nothing runs
        assert len(await s.get_items()) == 2
    assert calls == [0]


async def test_migrations_run_in_order_in_one_transaction(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with PostgresSession(pg_dsn) as s:
        await s.add_items([UserMessage("v1 data")])
    ran: list[int] = []

    def step(version: int) -> Callable[[psycopg.Connection[Any]], None]:
        def migrate(conn: psycopg.Connection[Any]) -> None:
            ran.append(version)
            conn.execute(f"CREATE TABLE added_in_v{version + 1} (x INTEGER)")

        return migrate

    monkeypatch.setattr(_postgres, "SCHEMA_VERSION", 3)
    monkeypatch.setitem(MIGRATIONS, 1, step(1))
    monkeypatch.setitem(MIGRATIONS, 2, step(2))
    async with PostgresSession(pg_dsn) as s:
        assert await s.get_items() == [UserMessage("v1 data")]
    assert ran == [1, 2]
    assert raw_query(pg_dsn, "SELECT version FROM trio_agents_schema") == [(3,)]
    assert {"added_in_v2", "added_in_v3"} <= tables(pg_dsn)


async def test_missing_migration_is_refused_untouched(pg_dsn: str) -> None:
    make_v0_tables(pg_dsn)
    assert 0 not in MIGRATIONS
    before = snapshot(pg_dsn)
    await assert_storage_error(PostgresSession(pg_dsn), "no migration .* from schema version 0")
    assert snapshot(pg_dsn) == before


async def test_failed_migration_is_rolled_back(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_v0_tables(pg_dsn)
    before = snapshot(pg_dsn)

    def half_then_fail(conn: psycopg.Connection[Any]) -> None:
        migrate_v0_to_v1(conn)
        conn.execute("CREATE TABLE half_done (x INTEGER)")
        raise RuntimeError("step exploded")

    monkeypatch.setitem(MIGRATIONS, 0, half_then_fail)
    error = await assert_storage_error(PostgresSession(pg_dsn), "from schema version 0 to 1 failed")
    assert isinstance(error.__cause__, RuntimeError)
    assert snapshot(pg_dsn) == before
    assert "half_done" not in tables(pg_dsn)


async def test_migration_that_commits_is_refused(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_v0_tables(pg_dsn)
    monkeypatch.setitem(MIGRATIONS, 0, lambda conn: conn.execute("COMMIT"))
    await assert_storage_error(PostgresSession(pg_dsn), "migrations must not commit")


# -- the pool, closing --------------------------------------------------------------------


def is_closed(pool: Any) -> bool:
    return bool(pool.closed)


async def test_sessions_share_one_pool_per_dsn_and_size(pg_dsn: str) -> None:
    a, b, c = (
        PostgresSession(pg_dsn, "a"),
        PostgresSession(pg_dsn, "b"),
        PostgresSession(pg_dsn, "c", max_connections=2),
    )
    try:
        for s in (a, b, c):
            await s.add_items([UserMessage(s.session_id)])
        assert a._pool is b._pool
        assert a._pool is not None
        assert a._pool is not c._pool
        assert a._pool.users == 2
        pool = a._pool.pool
        await a.aclose()
        assert not is_closed(pool)  # b still uses it
        assert await b.get_items() == [UserMessage("b")]
        await b.aclose()
        assert is_closed(pool)
        assert (pg_dsn, 4) not in _postgres._pools
    finally:
        for s in (a, b, c):
            await s.aclose()


async def test_aclose_closes(pg_dsn: str) -> None:
    s = PostgresSession(pg_dsn)
    await s.add_items([UserMessage("x")])
    await s.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await s.get_items()
    with pytest.raises(trio.ClosedResourceError):
        await s.add_items([UserMessage("y")])
    with pytest.raises(trio.ClosedResourceError):
        await s.add_items([])
    await s.aclose()  # idempotent
    async with PostgresSession(pg_dsn) as reopened:
        assert await reopened.get_items() == [UserMessage("x")]


async def test_async_with_closes_even_on_error(pg_dsn: str) -> None:
    s = PostgresSession(pg_dsn)

    async def fail_inside() -> None:
        async with s:
            await s.add_items([UserMessage("x")])
            raise KeyError("boom")

    with pytest.raises(KeyError):
        await fail_inside()
    with pytest.raises(trio.ClosedResourceError):
        await s.clear()
    assert (pg_dsn, 4) not in _postgres._pools


async def test_aclose_when_cancelled_still_closes(pg_dsn: str) -> None:
    s = PostgresSession(pg_dsn)
    await s.add_items([UserMessage("x")])
    with trio.CancelScope() as scope:
        scope.cancel()
        await s.aclose()
    assert scope.cancelled_caught
    with pytest.raises(trio.ClosedResourceError):
        await s.get_items()
    assert (pg_dsn, 4) not in _postgres._pools


async def test_sync_close(pg_dsn: str) -> None:
    s = PostgresSession(pg_dsn)
    s.close()  # never opened: fine
    with pytest.raises(trio.ClosedResourceError):
        await s.get_items()
    t = PostgresSession(pg_dsn)
    await t.add_items([UserMessage("x")])
    t.close()
    t.close()
    assert (pg_dsn, 4) not in _postgres._pools


# -- the guide's example runs (on the test server) --------------------------------------


def guide_blocks() -> Iterator[str]:
    page = (Path(__file__).resolve().parents[3] / "docs" / "sessions.md").read_text()
    for block in re.findall(r"^```python\n(.*?)^```", page, re.MULTILINE | re.DOTALL):
        if block.startswith("# not run: needs a PostgreSQL server"):
            yield block


def test_the_guides_postgres_example_runs(pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    blocks = list(guide_blocks())
    assert blocks, "docs/sessions.md has a PostgresSession example"
    for block in blocks:
        code, count = re.subn(r'^DSN = ".*"$', f"DSN = {pg_dsn!r}", block, flags=re.MULTILINE)
        assert count == 1, "the example names its DSN on one line: DSN = '...'"
        exec(compile(code, "docs/sessions.md", "exec"), {"__name__": "docs_sessions_postgres"})
    assert "completed" in capsys.readouterr().out


def terminate_backend(dsn: str, pid: int) -> None:
    """End the server process of a connection, and wait until it is gone."""
    with raw_connection(dsn) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            conn.execute("SELECT pg_sleep(0.01)")


def test_the_pool_checks_an_idle_connection_only_when_it_has_something_to_read(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A healthy idle connection is handed out without a round trip; one whose server
    # process ended (a restart) has its FATAL and end of file to read: it is checked
    # (with a query) and refused, so the pool replaces it.
    checked: list[object] = []
    real_check = ConnectionPool.check_connection

    def counting_check(conn: psycopg.Connection[Any]) -> None:
        checked.append(conn)
        real_check(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", counting_check)
    with raw_connection(pg_dsn) as conn:
        _postgres._check_connection(conn)
        _postgres._check_connection(conn)
        assert checked == []
        terminate_backend(pg_dsn, conn.info.backend_pid)
        with pytest.raises(psycopg.OperationalError):
            _postgres._check_connection(conn)
        assert checked == [conn]


async def test_a_pooled_connection_whose_server_process_ended_is_replaced(pg_dsn: str) -> None:
    async with PostgresSession(pg_dsn, "s", max_connections=1) as s:
        await s.add_items([UserMessage("x")])
        assert s._pool is not None
        (pid,) = await trio.to_thread.run_sync(
            lambda: raw_query(
                pg_dsn,
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'trio_agents'"
                " AND datname = current_database()",
            )[0]
        )
        await trio.to_thread.run_sync(terminate_backend, pg_dsn, pid)
        assert await s.get_items() == [UserMessage("x")]  # not an error: a new connection


async def test_a_failed_call_rolls_its_transaction_back(pg_dsn: str) -> None:
    async with PostgresSession(pg_dsn, "s", max_connections=1) as s:

        def write_then_fail(conn: psycopg.Connection[Any]) -> None:
            s._add_items_sync(conn, ['{"type": "user_message", "content": "lost"}'])
            conn.execute("SELECT 1/0")

        with pytest.raises(SessionStorageError):
            await s._call(write_then_fail)
        # The same (single) pooled connection went back idle, with the server's own
        # timeouts (SET LOCAL ended with the transaction).
        assert await s.get_items() == []
        shared = s._pool
        assert shared is not None

        def look() -> tuple[Any, ...]:
            with shared.pool.connection() as conn:
                row = conn.execute("SHOW lock_timeout").fetchone()
                return conn.info.transaction_status, row

        status, row = await trio.to_thread.run_sync(look)
        assert status == psycopg.pq.TransactionStatus.IDLE
        assert row == ("0",)
