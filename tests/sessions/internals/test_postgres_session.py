"""PostgresSession's own ways on a real PostgreSQL server (started by the suite:
tests/support/pg_support.py), a database per test: its lock key, several pools sharing a
database, the caller's deadline capping a lock wait, a wait for a connection cancelled,
the repair's write-back failing, tables it refuses, the pool. What it shares with
SQLiteSession is in test_sql_sessions.py."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from psycopg_pool import ConnectionPool

from tests.support.session_backends import assert_batches_whole
from tests.support.sessions_sql import (
    CRASHED,
    PG_ITEMS,
    PG_SESSIONS,
    SqlStore,
    assert_storage_error,
    pg_connection,
    postgres_sql,
    trio_runs_in_threads,
)
from trio_agents import ToolCall, UserMessage
from trio_agents.sessions import (
    SCHEMA_VERSION,
    PostgresSession,
    PostgresSessionStatistics,
    SessionStorageError,
    _postgres,
)

ITEMS = PG_ITEMS
SESSIONS = PG_SESSIONS

# -- helpers ----------------------------------------------------------------------------


@pytest.fixture
def sql(pg_dsn: str) -> SqlStore:
    """The test's database (and the test's own look at it)."""
    return postgres_sql(pg_dsn)


# -- basics -----------------------------------------------------------------------------


async def test_database_names_host_port_and_database_but_no_secret(
    session: PostgresSession, pg_dsn: str
) -> None:
    dbname = psycopg.conninfo.conninfo_to_dict(pg_dsn)["dbname"]
    port = psycopg.conninfo.conninfo_to_dict(pg_dsn)["port"]
    assert session.database == f"127.0.0.1:{port}/{dbname}"
    secret = PostgresSession(pg_dsn + " password=hunter2", "x")
    assert "hunter2" not in repr(secret)
    assert "hunter2" not in str(secret.lock_key)


def test_arguments_are_validated(pg_dsn: str) -> None:
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


# -- many sessions, concurrency -----------------------------------------------------------


def test_several_trio_runs_create_and_share_one_database(pg_dsn: str, sql: SqlStore) -> None:
    # Separate pools (sizes differ), so every thread checks the schema itself and they
    # race to create it: the advisory lock makes one of them do it.
    async def worker(n: int) -> None:
        async with PostgresSession(pg_dsn, f"t{n % 2}", max_connections=n + 1) as s:
            for j in range(8):
                await s.add_items([UserMessage(f"t{n}-{j}:{k}") for k in range(3)])

    assert trio_runs_in_threads(worker, 5) == []
    for sid, writers in (("t0", 3), ("t1", 2)):
        rows = [item for _, item in sql.stored(sid)]
        assert len(assert_batches_whole(rows, 3)) == writers * 8
        assert sql.positions(sid) == list(range(writers * 8 * 3))


@pytest.mark.parametrize("call", ["add_items", "get_items", "replace_items", "clear"])
async def test_the_callers_deadline_caps_the_wait_for_a_lock(pg_dsn: str, call: str) -> None:
    # An hour of lock_timeout, but the caller has a deadline: the call fails (it is not
    # abandoned) once the deadline is used up. A hang guard, not a timing claim.
    async with PostgresSession(pg_dsn, "w", lock_timeout=3600, statement_timeout=3600) as s:
        await s.add_items([UserMessage("q"), ToolCall("dangling", "t")])  # get_items repairs
        with postgres_sql(pg_dsn).holding("w") as other:
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


async def test_a_repair_write_back_that_fails_leaves_the_rows_as_they_were(
    session: PostgresSession, sql: SqlStore
) -> None:
    await session.add_items(CRASHED)
    before = sql.stored("main")
    sql.poison("cancelled: interrupted")  # the write-back's insert fails halfway
    with pytest.raises(SessionStorageError, match="poisoned row"):
        await session.get_items()
    # One transaction: the rows were deleted and re-inserted, or (here) neither.
    assert sql.stored("main") == before


async def test_replace_items_is_atomic(session: PostgresSession, sql: SqlStore) -> None:
    await session.add_items([UserMessage("old 1"), UserMessage("old 2"), UserMessage("old 3")])
    await session.replace_items([UserMessage("new")])
    assert await session.get_items() == [UserMessage("new")]
    await session.add_items([UserMessage("next")])
    assert sql.positions("main") == [0, 1]
    sql.poison("poison")
    with pytest.raises(SessionStorageError, match="poisoned row"):
        await session.replace_items([UserMessage("fine"), UserMessage("poison")])
    assert await session.get_items() == [UserMessage("new"), UserMessage("next")]
    await session.replace_items([])
    assert await session.get_items() == []


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
    sql: SqlStore, statements: list[str], match: str
) -> None:
    sql.execute(*statements)
    before = sql.snapshot()
    error = await assert_storage_error(sql.session(), match)
    assert error.database is not None
    assert sql.snapshot() == before


async def test_another_component_in_the_schema_table_is_fine(sql: SqlStore) -> None:
    sql.execute(
        "CREATE TABLE trio_agents_schema (component TEXT PRIMARY KEY, version INTEGER NOT NULL,"
        " updated_at TIMESTAMPTZ NOT NULL DEFAULT now())",
        "INSERT INTO trio_agents_schema (component, version) VALUES ('cluster', 7)",
    )
    async with sql.session() as s:
        await s.add_items([UserMessage("x")])
    rows = sql.query("SELECT component, version FROM trio_agents_schema ORDER BY 1")
    assert rows == [("cluster", 7), ("sessions", SCHEMA_VERSION)]


async def test_unreachable_server_is_a_storage_error(postgres_server: Any) -> None:
    params = psycopg.conninfo.conninfo_to_dict(postgres_server.dsn())
    dsn = f"host=127.0.0.1 port={params['port']} user=postgres dbname=no_such_database"

    async def connect() -> None:
        with trio.move_on_after(1):  # the wait for a connection is capped by this
            async with PostgresSession(dsn):
                pytest.fail("connected to a database that does not exist")

    with trio.fail_after(60), pytest.raises(SessionStorageError, match="no_such_database"):
        await connect()  # within a hang guard


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
    with pg_connection(dsn) as conn:
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
    with pg_connection(pg_dsn) as conn:
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
            lambda: postgres_sql(pg_dsn).query(
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
