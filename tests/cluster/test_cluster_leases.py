"""Leases, takeover and the session queue under a lost lease, a taken-over session
holder or queue head, and row locks held by the work (issue 30 items 3, 5 and 6).

The nodes run in one Trio process on one real PostgreSQL database
(tests/support/cluster_support.py); a node "crashes" as a killed process would
(``Node.crash``). The frozen-node and chaos tests with real processes are in
test_cluster_frozen_node.py and test_cluster_chaos.py. Waits are on observable facts (an
event, a row), bounded by ``trio.fail_after`` as hang guards only.
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_internals import until
from tests.support.cluster_nodes import (
    BOUND,
    POLL,
    GatedModel,
    clients,
    nodes,
    poll_row,
    query,
    row_of,
)
from tests.support.cluster_support import Client, client
from tests.support.process_cluster import stored_items
from trio_agents.cluster import ClusterDown


async def logged(dsn: str, run_id: str) -> list[dict[str, Any]]:
    rows = await trio.to_thread.run_sync(
        query,
        dsn,
        "SELECT seq, data FROM trio_agents_events WHERE run_id = %s ORDER BY seq",
        run_id,
    )
    return [{"seq": int(seq), "event": json.loads(data)} for seq, data in rows]


def terminal(event: dict[str, Any]) -> bool:
    return event["type"] == "run.updated" and event["status"] in (
        "completed",
        "failed",
        "cancelled",
    )


def check_exact(c: Client, run_id: str, log: list[dict[str, Any]]) -> None:
    """The subscriber saw every seq once, in order, one terminal update last, and each
    event it saw is the log's event at that seq."""
    frames = c.events[run_id]
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
    assert [f for f in frames if terminal(f["event"])] == [frames[-1]]
    by_seq = {entry["seq"]: entry["event"] for entry in log}
    for frame in frames:
        assert by_seq.get(frame["seq"]) == frame["event"], (frame, by_seq.get(frame["seq"]))


# -- item 3: takeover and the session queue ------------------------------------------------


async def test_a_taken_over_session_holder_goes_before_a_run_queued_on_its_new_node(
    pg_dsn: str,
) -> None:
    """R1 holds session s on A; R2 is queued for s on B; A dies: B takes R1 over and
    R1 keeps the session (it was not failed with SessionBusyError, R2 did not jump
    ahead); then R2 runs."""
    model = GatedModel()
    model.holds["first"] = trio.Event()  # never set: R1's first attempt stalls
    with trio.fail_after(BOUND):
        async with nodes(model, pg_dsn, "A", "B") as (a, b):
            async with clients(a, b) as (ca, cb):
                r1 = await ca.start_run(agent="a", input="first", session_id="s")
                await poll_row(pg_dsn, r1, lambda row: row["status"] == "running")
                # R1's first attempt is in its held model call (its first call, on A):
                # crashed earlier, its attempt on B would be the held first call.
                await model.wait_called("first")
                r2 = await cb.start_run(
                    agent="a", input="second", session_id="s", on_busy="enqueue", subscribe="all"
                )
                await cb.wait_status(r2, "queued")
                await cb.ok("run.subscribe", run_id=r1, from_seq=1)
                a.crash()
                done1 = await cb.wait_terminal(r1)
                done2 = await cb.wait_terminal(r2)
            assert done1["event"]["status"] == "completed", done1
            assert done2["event"]["status"] == "completed", done2
            # R2 ran only once R1 had ended.
            assert done2["seq"] > 0
            assert (await row_of(pg_dsn, r1))["attempt"] == 2
    items = await trio.to_thread.run_sync(stored_items, pg_dsn, "s", "alice")
    assert ta.conversation_problems(items) == []
    texts = [
        item.content for item in items if isinstance(item, ta.UserMessage | ta.AssistantMessage)
    ]
    assert texts == ["first", "ok first", "second", "ok second"]


async def test_a_taken_over_queue_head_and_a_later_run_queued_on_its_new_node_do_not_deadlock(
    pg_dsn: str,
) -> None:
    """R0 holds session s on B; R1 is queued for s through A, R2 later through B; A
    dies and B takes R1 over (still queued, keeping its place). Once R0 ends, R1 runs,
    then R2: neither stays queued forever."""
    model = GatedModel()
    model.holds["zero"] = trio.Event()
    with trio.fail_after(BOUND):
        async with nodes(model, pg_dsn, "A", "B") as (a, b):
            async with clients(a, b) as (ca, cb):
                r0 = await cb.start_run(agent="a", input="zero", session_id="s")
                await poll_row(pg_dsn, r0, lambda row: row["status"] == "running")
                r1 = await ca.start_run(agent="a", input="first", session_id="s", on_busy="enqueue")
                r2 = await cb.start_run(
                    agent="a", input="second", session_id="s", on_busy="enqueue", subscribe="all"
                )
                await cb.wait_status(r2, "queued")
                a.crash()
                # B took R1 over: still queued (attempt 2), behind R0.
                await poll_row(pg_dsn, r1, lambda row: row["owner"] == "B")
                await cb.ok("run.subscribe", run_id=r1, from_seq=1)
                await cb.wait_event(
                    r1,
                    lambda e: (
                        e["type"] == "run.updated" and e["status"] == "queued" and e["seq"] > 1
                    ),
                )
                model.holds["zero"].set()
                done1 = await cb.wait_terminal(r1)
                done2 = await cb.wait_terminal(r2)
            assert done1["event"]["status"] == "completed", done1
            assert done2["event"]["status"] == "completed", done2
    items = await trio.to_thread.run_sync(stored_items, pg_dsn, "s", "alice")
    assert ta.conversation_problems(items) == []
    texts = [
        item.content for item in items if isinstance(item, ta.UserMessage | ta.AssistantMessage)
    ]
    assert texts == ["zero", "ok zero", "first", "ok first", "second", "ok second"]


async def test_a_run_started_while_its_session_is_free_for_a_moment_queues_behind_the_queued(
    pg_dsn: str,
) -> None:
    """R0 holds session s on A; R1 is queued for it through B, and B dies. R0 ends: the
    session is free until R1 is taken over. A run started meanwhile does not take it
    past R1: it is queued, and runs after R1."""
    model = GatedModel()
    model.holds["zero"] = trio.Event()
    with trio.fail_after(BOUND):
        async with nodes(model, pg_dsn, "A", "B", lease_ttl=4.0) as (a, b):
            async with clients(a, b) as (ca, cb):
                r0 = await ca.start_run(agent="a", input="zero", session_id="s", subscribe="all")
                await ca.wait_status(r0, "running")
                r1 = await cb.start_run(agent="a", input="first", session_id="s", on_busy="enqueue")
                await poll_row(pg_dsn, r1, lambda row: row["status"] == "queued")
                b.crash()
                model.holds["zero"].set()
                await ca.wait_terminal(r0)
                await poll_row(pg_dsn, r0, lambda row: row["active"] is None)
                r2 = await ca.start_run(
                    agent="a", input="second", session_id="s", on_busy="enqueue", subscribe="all"
                )
                await ca.ok("run.subscribe", run_id=r1, from_seq=1)
                done1 = await ca.wait_terminal(r1)
                done2 = await ca.wait_terminal(r2)
            assert done1["event"]["status"] == "completed", done1
            assert done2["event"]["status"] == "completed", done2
    items = await trio.to_thread.run_sync(stored_items, pg_dsn, "s", "alice")
    texts = [item.content for item in items if isinstance(item, ta.UserMessage)]
    assert texts == ["zero", "first", "second"]


# -- item 5: a subscriber on an owner that loses its lease ---------------------------------


async def test_a_subscriber_on_an_owner_whose_flush_is_fenced_off_sees_exactly_the_log(
    pg_dsn: str,
) -> None:
    """A's run streams ``one`` (persisted, seen by A's subscriber); its row is then
    taken from A (as by a takeover while A was cut off); A's run streams ``two``,
    whose flush is fenced off: A's subscriber must not be sent it (the next attempt
    reuses its seq). It follows the run to its end on B, exactly as the log has it."""
    model = GatedModel()
    with trio.fail_after(BOUND):
        async with nodes(model, pg_dsn, "A", "B") as (a, _b), client(a.url) as ca:
            run_id = (await ca.ok("run.start", agent="a", input="two deltas", subscribe="all"))[
                "run_id"
            ]
            await ca.wait_event(
                run_id, lambda e: e["type"] == "response.text.delta" and e["text"] == "one"
            )
            # Taken from A by a node that then vanished; its lease expired: B
            # takes it over next.
            await trio.to_thread.run_sync(
                query,
                pg_dsn,
                "UPDATE trio_agents_runs SET owner = 'ghost', attempt = attempt + 1,"
                " lease_expires_at = now() - interval '1 second' WHERE run_id = %s"
                " RETURNING 1",
                run_id,
            )
            model.go.set()
            await ca.wait_terminal(run_id)
            log = await logged(pg_dsn, run_id)
            check_exact(ca, run_id, log)
    assert log[-1]["event"]["status"] == "completed"
    assert (await row_of(pg_dsn, run_id))["attempt"] == 3  # taken over by A or B
    assert a.cluster._node.leases.fenced == 0  # A stopped it as taken over, not for its lease


# -- item 6: the heartbeat never waits for the locks the work holds -----------------------


async def test_a_run_row_locked_longer_than_the_lease_does_not_cost_its_node_the_lease(
    pg_dsn: str,
) -> None:
    """Another transaction (a routed write, the node's own flush under load) holds a
    run's row lock for longer than the lease: the heartbeat does not wait for it, the
    node keeps its lease and its runs (no "lease lost"), and the run completes on its
    first attempt."""
    model = GatedModel()
    model.holds["held"] = trio.Event()
    lease = 1.5
    with trio.fail_after(BOUND):
        async with nodes(model, pg_dsn, "A", lease_ttl=lease) as (a,), client(a.url) as ca:
            run_id = await ca.start_run(agent="a", input="held", subscribe="all")
            await ca.wait_status(run_id, "running")
            leases = a.cluster._node.leases
            conn = await trio.to_thread.run_sync(lambda: psycopg.connect(pg_dsn, autocommit=False))
            try:
                await trio.to_thread.run_sync(
                    lambda: conn.execute(
                        "SELECT 1 FROM trio_agents_runs WHERE run_id = %s FOR UPDATE",
                        (run_id,),
                    )
                )
                # Hold it over two leases' worth of heartbeats (or until the node
                # gives its runs up, which it must not).
                locked_at = trio.current_time()
                while True:
                    if leases.renewed_at >= locked_at + 2 * lease or leases.fenced:
                        break
                    await trio.sleep(POLL)
            finally:
                await trio.to_thread.run_sync(conn.rollback)
                await trio.to_thread.run_sync(conn.close)
            assert leases.fenced == 0
            model.holds["held"].set()
            done = await ca.wait_terminal(run_id)
    assert done["event"]["status"] == "completed", done
    row = await row_of(pg_dsn, run_id)
    assert (row["attempt"], row["owner"]) == (1, "A")


async def test_a_renewal_slower_than_a_third_of_the_lease_does_not_cost_its_node_the_lease(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One heartbeat takes longer than ``lease_ttl / 3`` (its database or its process
    busy) and renews well before the watchdog's ``0.8 * lease_ttl``: the node keeps its
    runs (no "lease lost") and the run completes on its first attempt. (Such a beat was
    cut at ``lease_ttl / 3`` and the next sent a third of the lease after that, past
    the watchdog: on a loaded machine the node lost its runs to another node.)"""
    model = GatedModel()
    model.holds["held"] = trio.Event()
    lease = 9.0  # the slow beat ends 2/3 of it in, leaving the renewal 0.13 of it
    with trio.fail_after(BOUND):
        async with nodes(model, pg_dsn, "A", lease_ttl=lease) as (a,), client(a.url) as ca:
            run_id = await ca.start_run(agent="a", input="held", subscribe="all")
            await ca.wait_status(run_id, "running")
            leases = a.cluster._node.leases
            connection = leases._connection
            real = connection.call
            slow_done = trio.Event()

            async def slow_once(fn: Any) -> Any:
                """The next beat's transaction starts a little over a third of the
                lease after the beat did (the watchdog's moment is further off)."""
                monkeypatch.setattr(connection, "call", real)
                try:
                    await trio.sleep_until(trio.current_time() + lease / 3 + 0.2)
                    return await real(fn)
                finally:
                    slow_done.set()  # renewed, or cut short

            monkeypatch.setattr(connection, "call", slow_once)
            await slow_done.wait()
            done_at = trio.current_time()
            # The next beat's renewal, or the watchdog's verdict (nothing signals either).
            await until(lambda: leases.renewed_at > done_at or leases.fenced > 0, lease)
            assert leases.fenced == 0
            model.holds["held"].set()
            done = await ca.wait_terminal(run_id)
    assert done["event"]["status"] == "completed", done
    row = await row_of(pg_dsn, run_id)
    assert (row["attempt"], row["owner"]) == (1, "A")


# -- a queued run's claim whose answer is lost ----------------------------------------------


async def test_a_queued_run_whose_session_claim_committed_with_its_answer_lost_runs(
    pg_dsn: str,
) -> None:
    """R0 holds session s on A; R1 is queued for s on B. When R0 ends, B's claim of s
    for R1 commits, but its answer is lost (the connection drops at the commit, as when
    PostgreSQL stops then) and the claim is retried: R1's own row holds s by then, and
    R1 runs — it does not wait for itself to end."""
    model = GatedModel()
    model.holds["zero"] = trio.Event()
    lost: list[Any] = []
    with trio.fail_after(BOUND):
        async with nodes(model, pg_dsn, "A", "B", lease_ttl=10.0) as (a, b):
            async with clients(a, b) as (ca, cb):
                await ca.start_run(agent="a", input="zero", session_id="s")
                await model.wait_called("zero")
                call = b.cluster._node.db.call

                async def answer_lost(fn: Any) -> Any:
                    result = await call(fn)
                    claim = "claim_queued" in getattr(fn, "__qualname__", "")
                    if claim and not lost and result[0] is True:
                        lost.append(result)  # committed: only its answer is lost
                        raise ClusterDown("the connection dropped at the commit")
                    return result

                b.cluster._node.db.call = answer_lost
                r1 = await cb.start_run(
                    agent="a", input="first", session_id="s", on_busy="enqueue", subscribe="all"
                )
                await cb.wait_status(r1, "queued")
                model.holds["zero"].set()
                done1 = await cb.wait_terminal(r1)
            assert lost
            assert done1["event"]["status"] == "completed", done1
    items = await trio.to_thread.run_sync(stored_items, pg_dsn, "s", "alice")
    texts = [item.content for item in items if isinstance(item, ta.UserMessage)]
    assert texts == ["zero", "first"]
