"""A cluster run's items and their ``run.item`` events: written in one transaction
(DESIGN §9, §12), so after any failure or crash the session and the event log hold
both or neither — never an item a subscriber was not told of, nor a ``run.item`` a
subscriber saw whose item the session lost.

The failure is a real one, in the middle of the write: a trigger makes PostgreSQL
refuse the insert into one of the two tables (as a full disk, a constraint or a
killed connection would), then the node is crashed (``crash``) or the trigger dropped
and the writer's retry let through (``heal``).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_nodes import host_registry
from tests.support.cluster_support import client, node
from trio_agents.cluster._db import Conn, Database
from trio_agents.cluster._eventlog import EventWriter, Fence
from trio_agents.cluster._listener import Listener
from trio_agents.cluster._session import ClusterSession, session_key
from trio_agents.models import ScriptedModel, Turn

_TABLES = {"session": "trio_agents_session_items", "events": "trio_agents_events"}


def session_rows(dsn: str, session_id: str) -> list[ta.Item]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT data FROM trio_agents_session_items WHERE session_id = %s ORDER BY position",
            (json.dumps(["alice", session_id]),),
        ).fetchall()
    return [ta.item_from_json(json.loads(row[0])) for row in rows]


def item_events(dsn: str, run_id: str) -> list[ta.Item]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT data FROM trio_agents_events WHERE run_id = %s AND type = 'run.item'"
            " ORDER BY seq",
            (run_id,),
        ).fetchall()
    return [ta.item_from_json(json.loads(row[0])["item"]) for row in rows]


def refuse_inserts(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
            " $$ BEGIN RAISE EXCEPTION 'refused (test)'; END $$"
        )
        conn.execute(f"CREATE TRIGGER refuse BEFORE INSERT ON {table} EXECUTE FUNCTION refuse()")


def allow_inserts(dsn: str, table: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP TRIGGER refuse ON {table}")


@pytest.mark.parametrize("then", ["crash", "heal"])
@pytest.mark.parametrize("refused", ["session", "events"])
async def test_an_item_and_its_run_item_event_are_written_together(
    pg_dsn: str, refused: str, then: str
) -> None:
    model = ScriptedModel([], default="ok")
    agents = {"a": ta.Agent(name="a", instructions="", model=model)}
    async with trio.open_nursery() as nursery:
        async with node(nursery, agents, pg_dsn, "A") as a, client(a.url) as ca:
            first = await ca.ok("run.start", agent="a", input="warm up", session_id="w")
            await ca.ok("run.subscribe", run_id=first["run_id"], from_seq=1)
            await ca.wait_terminal(first["run_id"])  # the tables exist, the node works
            refuse_inserts(pg_dsn, _TABLES[refused])
            run_id = await ca.start_run(agent="a", input="go", session_id="s")
            run = host_registry(a).runs[run_id].run
            assert run is not None
            with trio.fail_after(30):
                result = await run.wait()
            # The write of "go" failed: the run says so (DESIGN §5), whichever table
            # refused it.
            assert result.status is ta.RunStatus.FAILED, result
            assert result.reason is not None
            assert result.reason.startswith("session error:"), result.reason
            if then == "crash":
                a.crash()
                assert item_events(pg_dsn, run_id) == session_rows(pg_dsn, "s") == []
            else:
                allow_inserts(pg_dsn, _TABLES[refused])
                await ca.ok("run.subscribe", run_id=run_id, from_seq=1)
                done = await ca.wait_terminal(run_id)  # the writer's retry got through
                assert done["event"]["status"] == "failed"
                stored = session_rows(pg_dsn, "s")
                assert item_events(pg_dsn, run_id) == stored == [ta.UserMessage("go")]
        nursery.cancel_scope.cancel()


async def test_a_flush_retried_after_its_commit_was_lost_writes_no_item_twice(
    pg_dsn: str,
) -> None:
    # The connection died after COMMIT was sent: the writer cannot know the flush got
    # through and writes the batch again; its events are kept once (their key), and so
    # are its items (the run's last seq, read in the same transaction, says so).
    db = Database(pg_dsn)
    run_id = "r-retry"
    session = ClusterSession(pg_dsn, session_key("alice", "s", run_id), "A", Fence(), run_id)
    try:
        await db.call(
            lambda conn: conn.execute(
                "INSERT INTO trio_agents_runs (run_id, principal, session_key, agent, status,"
                " owner, attempt, lease_expires_at) VALUES (%s, 'alice', 'k', 'a', 'running',"
                " 'A', 1, now() + interval '1 minute')",
                (run_id,),
            )
        )
        writer = EventWriter(db, Listener(pg_dsn, lambda message: None), "A")
        item = ta.UserMessage("once")
        event = ta.RunItemEvent(run_id=run_id, seq=1, turn=0, item=item)
        events = [(run_id, 1, event.type, json.dumps(event.to_json()))]
        rows: dict[str, dict[str, Any]] = {run_id: {"attempt": 1, "seq": 1}}
        items = [(run_id, session, [(1, json.dumps(item.to_json(), separators=(",", ":")))])]

        def write(conn: Conn) -> list[str]:
            return writer._write(conn, events, rows, [], items)

        assert await db.call(write) == []
        assert await db.call(write) == []  # the retry
        assert session_rows(pg_dsn, "s") == item_events(pg_dsn, run_id) == [item]
    finally:
        await session.aclose()
        await db.aclose()


@ta.function_tool
async def echo(text: str) -> str:
    """Answer at once."""
    return text


@pytest.mark.parametrize("hang_on", [1, 2, 3], ids=["call", "result", "answer"])
@pytest.mark.parametrize("after", ["add_items", "flush"])
async def test_a_cancel_after_a_write_stored_its_items_stores_them_once(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch, after: str, hang_on: int
) -> None:
    # The cluster's session write of a run's items has happened — the writer flushed
    # them with their run.item events — and then a cancel lands: after the whole
    # add_items (a checkpoint at its end), or after the flush it waited for, before it
    # returned. The repair must not write them again (a call after its own cancelled
    # result, a result twice, an answer twice): seen in 12 of 3,000 cancelled runs.
    stored = trio.Event()
    writes = 0
    patched = "add_items" if after == "add_items" else "_wait_written"
    original = getattr(ClusterSession, patched)

    async def then_hang(self: ClusterSession, *args: Any) -> None:
        nonlocal writes
        await original(self, *args)
        writes += 1
        if writes == hang_on:
            stored.set()
            await trio.sleep_forever()  # cancelled here, the items stored

    monkeypatch.setattr(ClusterSession, patched, then_hang)
    model = ScriptedModel([Turn("let me look", tool_calls=[("echo", {"text": "x"})]), "done"])
    agents = {"a": ta.Agent(name="a", instructions="", model=model, tools=[echo])}
    async with trio.open_nursery() as nursery:
        async with node(nursery, agents, pg_dsn, "A") as a, client(a.url) as ca:
            run_id = await ca.start_run(agent="a", input="hi", session_id="s")
            run = host_registry(a).runs[run_id].run
            assert run is not None
            with trio.fail_after(30):
                await stored.wait()
                await ca.ok("run.cancel", run_id=run_id, reason="stop")
                result = await run.wait()
            assert (result.status, result.reason) == ("cancelled", "stop"), result
            rows = session_rows(pg_dsn, "s")
            assert ta.conversation_problems(rows) == []
            assert rows == list(result.conversation) == item_events(pg_dsn, run_id)
        nursery.cancel_scope.cancel()
