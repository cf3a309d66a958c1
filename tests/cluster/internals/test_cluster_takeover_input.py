"""A taken-over run's input reaches its session exactly once (issue 30, r30y).

Whether the earlier attempt wrote the input is decided from the run's own record (its
``run.item`` events, or the ``input_written`` marker a takeover commits with the input),
never from whether the session is empty: a session holding earlier runs' items is the
common case. In-process nodes on the suite's real PostgreSQL
(tests/support/cluster_support.py); a node "crashes" as a killed process would
(``Node.crash``), at the exact point the test names.
"""

from __future__ import annotations

import json
from typing import Any, Final

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_nodes import BOUND, GatedModel, nodes, poll_row, query
from tests.support.cluster_support import Node, client
from trio_agents.sessions import SessionStorageError
from trio_agents.sessions._postgres import PostgresSession


def conversation(dsn: str) -> list[ta.Item]:
    rows = query(
        dsn,
        "SELECT data FROM trio_agents_session_items WHERE session_id = %s ORDER BY position",
        json.dumps(["alice", "s"]),
    )
    return [ta.item_from_json(json.loads(row[0])) for row in rows]


def texts(items: list[ta.Item]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, ta.UserMessage | ta.AssistantMessage):
            content = item.content
            out.append((type(item).__name__, content if isinstance(content, str) else ""))
    return out


def crash_after_row_inserted(a: Node, crashed: trio.Event, ids: list[str]) -> None:
    """Crash ``a`` the moment a run's row (and session claim) committed, before the
    run's task exists: its input never reaches the session."""
    claim = a.cluster._node.claim

    async def then_crash(**kwargs: Any) -> Any:
        await claim(**kwargs)
        ids.append(kwargs["run_id"])
        a.crash()
        crashed.set()
        await trio.sleep_forever()  # the node's scope is cancelled: nothing more runs

    a.cluster._node.claim = then_crash  # type: ignore[method-assign]


async def first_run_then_crashing_second(dsn: str, a: Node) -> str:
    """R0 ("zero") completes on s at A; R1 ("first") on s is started at A, which dies
    right after R1's row is inserted; returns R1's id."""
    async with client(a.url) as ca:
        r0 = await ca.start_run(agent="a", input="zero", session_id="s", subscribe="all")
        assert (await ca.wait_terminal(r0))["event"]["status"] == "completed"
        crashed = trio.Event()
        ids: list[str] = []
        crash_after_row_inserted(a, crashed, ids)
        start = {"id": "x", "op": "run.start", "agent": "a", "input": "first", "session_id": "s"}
        await ca.ws.send_message(json.dumps(start))
        await crashed.wait()
    assert texts(await trio.to_thread.run_sync(conversation, dsn)) == [
        ("UserMessage", "zero"),
        ("AssistantMessage", "ok zero"),
    ]
    return ids[0]


def lose_the_first_write_answer(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on, the first of the sessions' own write transactions commits but its
    answer is lost (the connection drops at the commit), so ``ClusterSession`` retries
    it: the returned list gets that session's id."""
    lost: list[str] = []
    call = PostgresSession._call

    async def answer_lost(self: PostgresSession, fn: Any, *args: Any) -> Any:
        result = await call(self, fn, *args)
        if not lost and getattr(fn, "__qualname__", "").endswith("_write.<locals>.fenced"):
            lost.append(self.session_id)
            error = SessionStorageError("lost", session_id=self.session_id)
            raise error from psycopg.OperationalError("the connection dropped at the commit")
        return result

    monkeypatch.setattr(PostgresSession, "_call", answer_lost)
    return lost


# The conversation on s once R1 answered its own input, after R0's.
BOTH_ANSWERED: Final = [
    ("UserMessage", "zero"),
    ("AssistantMessage", "ok zero"),
    ("UserMessage", "first"),
    ("AssistantMessage", "ok first"),
]


async def test_a_run_killed_before_its_input_reached_a_used_session_answers_its_own_input(
    pg_dsn: str,
) -> None:
    """s holds a finished run's items; R1's owner dies after R1's row is inserted and
    before R1's input is written: the node taking R1 over writes the input (once) and
    R1 answers it, not the previous user message."""
    model = GatedModel()
    with trio.fail_after(BOUND):
        async with nodes(model, pg_dsn, "A", "B", lease_ttl=2.0) as (a, _b):
            r1 = await first_run_then_crashing_second(pg_dsn, a)
            await poll_row(pg_dsn, r1, lambda row: row["finished"])
    assert texts(await trio.to_thread.run_sync(conversation, pg_dsn)) == BOTH_ANSWERED


async def test_an_input_a_takeover_wrote_is_not_written_again_by_the_next_takeover(
    pg_dsn: str,
) -> None:
    """As above, and B, which wrote R1's input, dies in R1's model call: C takes R1
    over and does not write the input a second time."""
    model = GatedModel()
    model.holds["first"] = trio.Event()  # B's call holds; C's (the second) answers
    with trio.fail_after(BOUND):
        async with nodes(model, pg_dsn, "A", "B", lease_ttl=2.0) as (a, b):
            r1 = await first_run_then_crashing_second(pg_dsn, a)
            await model.wait_called("first")  # on B, its input written
            b.crash()
            async with nodes(model, pg_dsn, "C", lease_ttl=2.0):
                await poll_row(pg_dsn, r1, lambda row: row["finished"])
    assert model.calls.count("first") == 2
    assert texts(await trio.to_thread.run_sync(conversation, pg_dsn)) == BOTH_ANSWERED


async def test_a_takeovers_input_write_retried_after_its_commit_answer_was_lost_is_not_doubled(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The takeover's write of R1's input commits, but its answer is lost (the
    connection drops at the commit) and ``ClusterSession`` retries it: the input is
    stored once."""
    model = GatedModel()
    with trio.fail_after(BOUND):
        async with nodes(model, pg_dsn, "A", "B", lease_ttl=2.0) as (a, _b):
            r1 = await first_run_then_crashing_second(pg_dsn, a)
            # The first of the session's own write transactions: the takeover's input.
            lost = lose_the_first_write_answer(monkeypatch)
            await poll_row(pg_dsn, r1, lambda row: row["finished"])
    assert lost
    assert texts(await trio.to_thread.run_sync(conversation, pg_dsn)) == BOTH_ANSWERED


async def test_a_queued_run_killed_after_its_claim_before_its_input_answers_its_own_input(
    pg_dsn: str,
) -> None:
    """R1 is queued on s behind R0 at A; when R0 ends, R1's claim of s commits and A
    dies before R1's input is written: B takes R1 over (no longer queued) and writes
    the input, though s holds R0's items."""
    model = GatedModel()
    model.holds["zero"] = trio.Event()
    crashed = trio.Event()
    with trio.fail_after(BOUND):
        async with nodes(model, pg_dsn, "A", "B", lease_ttl=2.0) as (a, _b):
            async with client(a.url) as ca:
                await ca.start_run(agent="a", input="zero", session_id="s")
                await model.wait_called("zero")
                claim_queued = a.cluster._node.claim_queued

                async def then_crash(**kwargs: Any) -> Any:
                    claimed = await claim_queued(**kwargs)
                    if claimed:  # R1's claim of s committed
                        a.crash()
                        crashed.set()
                        await trio.sleep_forever()
                    return claimed

                a.cluster._node.claim_queued = then_crash
                r1 = await ca.start_run(
                    agent="a", input="first", session_id="s", on_busy="enqueue", subscribe="all"
                )
                await ca.wait_status(r1, "queued")
                model.holds["zero"].set()
                await crashed.wait()
            await poll_row(pg_dsn, r1, lambda row: row["finished"])
    assert texts(await trio.to_thread.run_sync(conversation, pg_dsn)) == BOTH_ANSWERED


async def test_a_session_append_retried_after_its_commit_answer_was_lost_is_stored_once(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster session's own append (a load's repair written back, a child run's
    items) commits, its answer is lost and ``ClusterSession`` retries it: stored once."""
    from trio_agents.cluster._eventlog import Fence
    from trio_agents.cluster._session import ClusterSession

    session = ClusterSession(pg_dsn, json.dumps(["alice", "s"]), "A", Fence())
    await session.add_items([ta.UserMessage("zero")])
    lost = lose_the_first_write_answer(monkeypatch)
    try:
        await session.add_items([ta.AssistantMessage("ok zero"), ta.UserMessage("first")])
    finally:
        await session.aclose()
    assert lost
    assert texts(await trio.to_thread.run_sync(conversation, pg_dsn)) == [
        ("UserMessage", "zero"),
        ("AssistantMessage", "ok zero"),
        ("UserMessage", "first"),
    ]
