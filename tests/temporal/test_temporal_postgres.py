"""Temporal runs whose sessions and events live in PostgreSQL (``trio-agents worker
--db postgresql://...``): what workers on several machines share. Real worker
processes, a real dev server, the suite's PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable

import httpx
import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cli_support import assert_one_error_line, cli, cli_process, serving_url
from tests.support.http_support import messages
from tests.support.pg_support import postgres_url
from tests.support.temporal_support import (
    Workers,
    assert_resumed_once,
    free_port,
    opened_host,
    until_event,
)
from trio_agents.hosting import Origin, StartRequest
from trio_agents.sessions import PostgresSession
from trio_agents.temporal import PostgresRunStore, RunStoreError

BOUND = 90.0  # hang guard per wait on a loaded machine
ALICE = Origin(principal="alice")


async def test_a_run_whose_worker_dies_resumes_on_another_from_postgres(
    workers: Callable[..., Workers], pg_dsn: str
) -> None:
    group = workers(2, storage=postgres_url(pg_dsn))
    with trio.fail_after(BOUND):
        async with opened_host(group, begin_shutdown=True) as host:
            run_id = await host.start(
                ALICE,
                StartRequest(agent="rules", input=(ta.UserMessage("block"),), session_id="s1"),
            )
            await until_event(host, run_id, "tool.started")
            pid = int((group.marks / f"{run_id}.started").read_text())
            os.kill(pid, signal.SIGKILL)
            info = await host.wait_terminal("alice", run_id)
            async with host.events("alice", run_id) as events:
                seen = [event async for event in events]
    assert info.status == ta.RunStatus.COMPLETED, group.logs()
    assert_resumed_once(seen)
    # The conversation is in PostgreSQL, under the control server's key: the call the
    # lost attempt left open closed as interrupted, then the answer.
    async with PostgresSession(pg_dsn, json.dumps(["alice", "s1"])) as session:
        items = [item.to_json() for item in await session.get_items()]
    results = [item for item in items if item["type"] == "function_call_output"]
    assert len(results) == 1
    assert results[0]["output"].startswith("interrupted")
    assert items[-1]["type"] == "message"
    assert items[-1]["content"].startswith("done: interrupted")


async def test_serve_and_workers_over_one_postgres_database(
    workers: Callable[..., Workers], pg_dsn: str
) -> None:
    url = postgres_url(pg_dsn)
    group = workers(1, storage=url)
    database = url.split("@", 1)[1]
    argv = ["serve", "--temporal", group.target, "--task-queue", group.task_queue]
    argv += ["--db", url, "--app", "tests.support.temporal_app:AGENTS"]
    argv += ["--port", "0", "--token", "tok"]
    with trio.fail_after(BOUND):
        async with cli_process(*argv) as served:
            await serving_url(served)
            assert f"sessions and runs in PostgreSQL {database}" in served.stdout.lines[-1]
            base = next(line for line in served.stdout.lines if line.startswith("http: ")).split()[
                1
            ]
            headers = {"Authorization": "Bearer tok"}
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=None) as http:
                body = {"agent": "rules", "input": "hello", "session_id": "s1"}
                answer = await http.post("/runs", json=body)
                assert answer.status_code == 201, answer.text
                run_id = answer.json()["run_id"]
                async with http.stream("GET", f"/runs/{run_id}/events") as stream:
                    seen = [message async for message in messages(stream)]  # to its end
                assert seen[-1].terminal
                assert seen[-1].data["event"]["status"] == "completed", group.logs()
            served.process.send_signal(signal.SIGTERM)
            assert await served.process.wait() == 0, served.stderr
    async with PostgresSession(pg_dsn, json.dumps(["alice", "s1"])) as session:
        assert await session.get_items() == []  # the token's principal is "cli"
    async with PostgresSession(pg_dsn, json.dumps(["cli", "s1"])) as session:
        items = [item.to_json() for item in await session.get_items()]
    assert items[-1]["content"] == "echo: hello"


def test_a_malformed_or_unreachable_database_is_one_line() -> None:
    app = ["--temporal", "127.0.0.1:7233", "--app", "tests.support.temporal_app:AGENTS"]
    bad = cli("worker", *app, "--db", "postgresql://no such host/db")
    line = assert_one_error_line(bad, 1)
    assert line.startswith("trio-agents: error: --db: not a valid PostgreSQL connection string")
    port = free_port()  # nobody listens there
    for command in (["worker"], ["serve", "--port", "0", "--token", "t"]):
        down = cli(*command, *app, "--db", f"postgresql://postgres@127.0.0.1:{port}/x")
        line = assert_one_error_line(down, 1)
        assert line.startswith(
            f"trio-agents: error: --db: cannot connect to PostgreSQL at 127.0.0.1:{port}/x:"
        ), line
    local = cli("serve", "--port", "0", "--token", "t", "--db", "postgresql://h/x")
    line = assert_one_error_line(local, 2)
    assert "a PostgreSQL database keeps the runs of Temporal workers (--temporal)" in line


async def test_a_database_with_newer_run_tables_is_one_line(pg_dsn: str) -> None:
    url = postgres_url(pg_dsn)
    async with PostgresRunStore(url):  # creates the tables
        pass
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE trio_agents_schema SET version = 99 WHERE component = 'temporal'")
    app = ["--temporal", "127.0.0.1:7233", "--app", "tests.support.temporal_app:AGENTS"]
    done = await trio.to_thread.run_sync(lambda: cli("worker", *app, "--db", url))
    line = assert_one_error_line(done, 1)
    assert line.startswith("trio-agents: error: --db: database 127.0.0.1:"), line
    assert "the Temporal run tables have schema version 99" in line
    with pytest.raises(RunStoreError, match="schema version 99"):
        async with PostgresRunStore(url):
            pass  # pragma: no cover
