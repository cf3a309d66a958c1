"""Adversarial review of the cluster (DESIGN §12): each test proves one defect where the
cluster breaks a promise, against the real PostgreSQL the suite starts.

Each test was written as ``xfail(strict=True)`` against the defect it proves; the
defects are fixed and the markers gone (the last two tests, database-side fencing, came
with their fix). The nodes run in one Trio process on one database
(like tests/test_cluster_*.py). Two kinds of instrumentation, both standing for things
that happen to real processes:

- ``partition_heartbeat``: the node's lease renewals fail (a network partition between
  it and PostgreSQL, a long GC or event-loop stall) while the node itself stays alive;
  its lease expires and another node takes its runs over.
- ``gate_flushes``: the node's event writer is slow (a flush in its retry backoff after
  a PostgreSQL hiccup, or waiting for a lock); nothing the run's own loop does waits
  for it, so this only widens, deterministically, windows that exist anyway.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support import process_cluster
from tests.support.cluster_internals import short_lease_node, until
from tests.support.cluster_nodes import (
    agents,
    dies_answering,
    local_entry,
    request_as_owner_dies,
    server_connections,
    two_nodes,
)
from tests.support.cluster_support import Client, Node, client
from trio_agents.cluster._db import ClusterDown, Database
from trio_agents.models import ScriptedModel, Turn

# -- helpers --------------------------------------------------------------------------


# Imported from here by tests/cluster/test_cluster_decisions.py until it imports them
# from tests/support (a test file must not import another): then these go.
def partition_heartbeat(node: Node, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make the node's lease renewals fail until the returned ``heal()`` is called."""
    real = node.cluster._node.leases.heartbeat
    cut = [True]

    async def heartbeat() -> None:
        if cut[0]:
            await trio.lowlevel.checkpoint()
            raise ClusterDown("partitioned from PostgreSQL (test)")
        await real()

    monkeypatch.setattr(node.cluster._node.leases, "heartbeat", heartbeat)

    def heal() -> None:
        cut[0] = False

    return heal


def gate_flushes(node: Node, monkeypatch: pytest.MonkeyPatch) -> trio.Event:
    """Hold the node's event-log flushes until the returned event is set."""
    gate = trio.Event()
    real = node.cluster._node.writer._flush

    async def flush(batch: list[Any]) -> None:
        await gate.wait()
        await real(batch)

    monkeypatch.setattr(node.cluster._node.writer, "_flush", flush)
    return gate


async def start_when_started(c: Client, started: trio.Event, **fields: Any) -> str:
    """Start a run of agent ``a`` on session ``s`` (input ``go``) and wait until its
    tool started; return the run's id."""
    run_id = await c.start_run(agent="a", input="go", session_id="s", **fields)
    with trio.fail_after(30):
        await started.wait()
    return run_id


# -- 1. the watchdog stops a node's runs, then the node keeps their leases forever ---


@attrs.define(eq=False)
class Slow:
    """A ``slow`` tool (not idempotent) and the events it sets and waits for: it sets
    ``started``, ends once ``release`` is set, and when cancelled sets ``cancelled``,
    then (with a ``hold``) takes until ``hold`` is set to stop."""

    started: trio.Event = attrs.field(factory=trio.Event)
    release: trio.Event = attrs.field(factory=trio.Event)
    cancelled: trio.Event = attrs.field(factory=trio.Event)
    hold: trio.Event | None = None

    def tool(self) -> ta.Tool:
        @ta.function_tool
        async def slow() -> str:
            """Work for a long time (not idempotent)."""
            self.started.set()
            try:
                await self.release.wait()
            except trio.Cancelled:
                self.cancelled.set()
                if self.hold is not None:  # a shielded cleanup, within cleanup_timeout
                    with trio.CancelScope(shield=True):
                        await self.hold.wait()
                raise
            return "slow done"

        return slow

    def model(self) -> ScriptedModel:
        """A model that calls the tool once (call ``c1``), then answers ``ok``."""
        return ScriptedModel([Turn(tool_calls=[ta.ToolCall("c1", "slow", "{}")])], default="ok")


@asynccontextmanager
async def node_running_slow(dsn: str, slow: Slow) -> AsyncIterator[tuple[Node, Client, str]]:
    """Node A and a client of it, with a run of ``slow`` started on session ``s`` and its
    tool started: yields the node, the client and the run's id."""
    async with trio.open_nursery() as nursery:
        served = agents(slow.model(), [slow.tool()])
        async with short_lease_node(nursery, served, dsn, "A") as a, client(a.url) as ca:
            yield a, ca, await start_when_started(ca, slow.started)
        nursery.cancel_scope.cancel()


async def test_runs_stopped_by_the_watchdog_are_resumed_after_the_database_returns(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = Slow()
    async with node_running_slow(pg_dsn, slow) as (a, ca, run_id):
        heal = partition_heartbeat(a, monkeypatch)  # a short outage, under lease_ttl
        with trio.fail_after(30):
            await slow.cancelled.wait()  # the watchdog stopped the run ("lease lost")
        heal()
        # Once the database is back the run must go on (here, or on any node): its
        # call c1 gets "interrupted" and the model answers.
        await ca.ok("run.subscribe", run_id=run_id, from_seq=1)
        with trio.fail_after(20):
            done = await ca.wait_terminal(run_id)
        assert done["event"]["status"] == "completed", done


async def test_a_node_resuming_its_own_stopped_run_waits_for_that_attempt_to_end(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watchdog stopped the run ("lease lost"); its tool takes a while to stop (a
    # shielded cleanup, within the run's cleanup_timeout), so that attempt still holds
    # the session in this process when the node claims the run back. The resume waits
    # for it (hosting/_run_tasks.py, _OLD_ATTEMPT_BOUND) instead of finding the session
    # busy and failing the run.
    hold = trio.Event()
    slow = Slow(hold=hold)  # never released: it runs until cancelled
    async with node_running_slow(pg_dsn, slow) as (a, ca, run_id):
        stopped = local_entry(a, run_id)
        heal = partition_heartbeat(a, monkeypatch)
        with trio.fail_after(30):
            await slow.cancelled.wait()  # the watchdog stopped the run ("lease lost")
        heal()  # the next heartbeat releases the run; A's scan claims it back
        await until(lambda: a.cluster._node.leases.takeovers == 1)
        assert stopped.run.result is None  # that attempt is still stopping
        hold.set()
        await ca.ok("run.subscribe", run_id=run_id, from_seq=1)
        with trio.fail_after(20):
            done = await ca.wait_terminal(run_id)
        assert done["event"]["status"] == "completed", done
        resumed = await ca.wait_event(
            run_id, lambda e: e["type"] == "run.updated" and e.get("detail")
        )
        assert resumed["event"]["detail"] == {"resumed": True, "attempt": 2}


async def test_a_run_that_moved_to_another_attempt_is_cancelled_when_its_client_leaves(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # on_disconnect="cancel": the run's attempt on the client's node was stopped (lease
    # lost) and the run goes on as a new attempt (here or on B); the client's disconnect
    # from A still cancels it, wherever it runs.
    started = trio.Event()

    @ta.function_tool(idempotent=True)
    async def work() -> str:
        """Work for a long time (idempotent: it runs again on the next attempt)."""
        started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    model = ScriptedModel([], default=Turn(tool_calls=[("work", {})]))
    async with (
        two_nodes(pg_dsn, agents(model, [work]), agents(model, [work])) as (a, b),
        client(b.url) as cb,
    ):
        async with client(a.url) as ca:
            run_id = await start_when_started(ca, started, on_disconnect="cancel")
            await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
            started = trio.Event()
            heal = partition_heartbeat(a, monkeypatch)
            await until(lambda: a.cluster._node.leases.fenced == 1)  # A stopped its attempt
            heal()
            await cb.wait_event(
                run_id,
                lambda e: e["type"] == "run.updated" and (e.get("detail") or {}).get("resumed"),
            )
            with trio.fail_after(30):
                await started.wait()  # the next attempt runs the tool again
        done = (await cb.wait_terminal(run_id))["event"]
        assert (done["status"], done["reason"]) == ("cancelled", "client disconnected")


async def test_a_slow_cleanup_does_not_stop_a_healthy_nodes_runs(pg_dsn: str) -> None:
    slow = Slow()
    async with node_running_slow(pg_dsn, slow) as (a, _ca, _run_id):
        # A node row long dead, which the cleanup deletes; another transaction (say,
        # an operator's, or a long scan elsewhere) holds its row lock for a while.
        def connect() -> psycopg.Connection[Any]:
            return psycopg.connect(pg_dsn)

        with await trio.to_thread.run_sync(connect) as conn:
            await trio.to_thread.run_sync(
                conn.execute,
                "INSERT INTO trio_agents_nodes (node_id, lease_expires_at, max_runs)"
                " VALUES ('Z', now() - interval '1 day', 1)",
            )
            await trio.to_thread.run_sync(conn.commit)
            await trio.to_thread.run_sync(
                conn.execute, "SELECT 1 FROM trio_agents_nodes WHERE node_id = 'Z' FOR UPDATE"
            )
            a.cluster._node.leases._next_cleanup = 0.0  # its next sweep is due (every 60 s)
            a.cluster._node.leases.wake()
            await trio.sleep(2 * a.cluster.lease_ttl)  # the lock is held this long
            await trio.to_thread.run_sync(conn.rollback)
        renewed = a.cluster._node.leases.renewed_at
        await until(lambda: a.cluster._node.leases.renewed_at != renewed)
        assert a.cluster._node.leases.fenced == 0
        assert not slow.cancelled.is_set()
        slow.release.set()


# -- 2. what a crashed owner had acked is not what its successor does ---------------


async def test_an_acked_cancel_survives_the_owner_crash(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = Slow()
    served = agents(slow.model(), [slow.tool()])
    async with (
        two_nodes(pg_dsn, served, served) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = await start_when_started(ca, slow.started)
        gate = gate_flushes(a, monkeypatch)
        await cb.ok("run.cancel", run_id=run_id, reason="stop it")  # routed to A
        with trio.fail_after(30):
            await local_entry(a, run_id).done.wait()  # cancelled on A
        a.crash()  # before A's writer got to persist the terminal status
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        done = await cb.wait_terminal(run_id)
        gate.set()
        assert done["event"]["status"] == "cancelled", done


def lose_flushes_from_delivery(node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the first ``inbox.delivered`` event on, the node's writer persists nothing
    more (it stalls there, as one cut off from PostgreSQL): what came before it is
    persisted (the delivered items with their ``run.item`` events), it is not."""
    real = node.cluster._node.writer._flush
    stalled = [False]

    async def flush(batch: list[Any]) -> None:
        cut = next(
            (i for i, entry in enumerate(batch) if isinstance(entry[1], ta.InboxDelivered)),
            None,
        )
        if stalled[0]:
            cut = 0
        if cut is None:
            await real(batch)
            return
        stalled[0] = True
        if cut:
            await real(batch[:cut])
        await trio.sleep_forever()

    monkeypatch.setattr(node.cluster._node.writer, "_flush", flush)


async def test_an_injection_is_delivered_once_across_a_crash(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The injection's items reached the session (with their run.item events), its
    # inbox.delivered event did not: the takeover finds them delivered (in the session
    # after the last item before its acceptance) and does not inject them again.
    first = trio.Event()
    release = trio.Event()

    @ta.function_tool
    async def work(ctx: ta.ToolContext) -> str:
        """Work (not idempotent)."""
        first.set()
        await release.wait()
        return "worked"

    a_model = ScriptedModel(
        [
            Turn(tool_calls=[ta.ToolCall("w1", "work", "{}")]),
            Turn(tool_calls=[ta.ToolCall("w2", "work", "{}")]),
        ]
    )
    b_model = ScriptedModel([], default="done")
    async with (
        two_nodes(pg_dsn, agents(a_model, [work]), agents(b_model, [work])) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = await start_when_started(ca, first)
        await ca.ok("run.inject", run_id=run_id, items="remember this")  # acked: durable
        lose_flushes_from_delivery(a, monkeypatch)
        release.set()  # w1 ends; the injection is delivered; its inbox.delivered is lost

        def delivered() -> bool:
            return any(
                isinstance(i, ta.UserMessage) and i.content == "remember this"
                for i in process_cluster.stored_items(pg_dsn, "s", "alice")
            )

        await until(delivered)  # in the session, as its run.item event was persisted
        a.crash()
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        done = await cb.wait_terminal(run_id)
        assert done["event"]["status"] == "completed", done
    texts = [i.content for i in b_model.requests[-1].items if isinstance(i, ta.UserMessage)]
    assert texts == ["go", "remember this"]


@pytest.mark.parametrize("op", ["run.inject", "run.withdraw", "run.cancel"])
async def test_a_routed_op_is_applied_once_when_its_owner_dies_answering_it(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    # A client on B sends an op for A's run (routed). A applies it and makes it durable,
    # then dies before it could answer. B takes the run over (re-injecting acked
    # injections, honouring withdrawals and the cancel), and must not apply the command
    # a second time: the client gets A's answer, stored with the op's durable effect.
    first, hold = trio.Event(), trio.Event()

    @ta.function_tool
    async def work(ctx: ta.ToolContext) -> str:
        """Work (not idempotent)."""
        if ctx.call_id == "w1":
            first.set()
            await trio.sleep_forever()
        await hold.wait()
        return "worked"

    a_model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("w1", "work", "{}")])])
    b_model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("w2", "work", "{}")])], default="done")
    async with (
        two_nodes(pg_dsn, agents(a_model, [work]), agents(b_model, [work])) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = await start_when_started(ca, first)
        fields: dict[str, Any] = {"items": "remember"}
        if op == "run.withdraw":
            injected = await ca.ok("run.inject", run_id=run_id, items="withdrawn")
            fields = {"injection_id": injected["injection_id"]}
        elif op == "run.cancel":
            fields = {"reason": "stop"}
        applied, stored = dies_answering(a, pg_dsn, monkeypatch)
        answer = await request_as_owner_dies(a, cb, op, once=[applied], run_id=run_id, **fields)
        # Answered with what A stored (B took the run over meanwhile).
        assert stored[0] is not None
        assert answer["type"] == "ack", answer
        assert {k: v for k, v in answer.items() if k not in ("type", "id")} == json.loads(
            stored[0]
        )["ok"]
        if op == "run.withdraw":
            assert answer["withdrawn"] is True
        hold.set()
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        done = await cb.wait_terminal(run_id)
    if op == "run.cancel":
        assert (done["event"]["status"], done["event"]["reason"]) == ("cancelled", "stop")
        return
    assert done["event"]["status"] == "completed", done
    texts = [i.content for i in b_model.requests[-1].items if isinstance(i, ta.UserMessage)]
    assert texts == (["go", "remember"] if op == "run.inject" else ["go"])


# -- 3. subscriptions on a non-owner -------------------------------------------------


@asynccontextmanager
async def two_nodes_saying_hello(dsn: str) -> AsyncIterator[tuple[Node, Client, Client]]:
    """``two_nodes`` whose agent answers ``hello``, and a client of each: yields B and
    the clients of A and B."""
    served = agents(ScriptedModel([], default="hello"))
    async with two_nodes(dsn, served, served) as (a, b), client(a.url) as ca, client(b.url) as cb:
        yield b, ca, cb


def followed(node: Node, run_ids: list[str]) -> bool:
    """Whether a connection to ``node`` still follows one of ``run_ids``."""
    return any(
        run_id in conn.subscriptions for conn in server_connections(node) for run_id in run_ids
    )


async def test_subscribing_past_the_end_of_a_finished_run_ends(pg_dsn: str) -> None:
    async with two_nodes_saying_hello(pg_dsn) as (b, ca, cb):
        run_id = await ca.start_run(agent="a", input="hi", subscribe="all")
        last = (await ca.wait_terminal(run_id))["seq"]
        await cb.ok("run.subscribe", run_id=run_id, from_seq=last + 1)
        await until(lambda: not followed(b, [run_id]))


async def test_remote_subscriptions_leave_no_waiters_behind(pg_dsn: str) -> None:
    async with two_nodes_saying_hello(pg_dsn) as (b, ca, cb):
        run_ids = []
        for _ in range(3):
            run_id = await ca.start_run(agent="a", input="hi", subscribe="all")
            await ca.wait_terminal(run_id)
            await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
            await cb.wait_terminal(run_id)
            run_ids.append(run_id)
        await until(lambda: not followed(b, run_ids))
        waiters = b.cluster._node.listener._waiters
        assert [r for r in run_ids if waiters.get(("run", r))] == []


# -- 4. database-side fencing ---------------------------------------------------------


async def insert_run_owned_by_b(db: Database, run_id: str) -> None:
    """Insert ``run_id``'s row: running on B at attempt 2 (A, stalled, lost it)."""

    def insert(conn: Any) -> None:
        conn.execute(
            "INSERT INTO trio_agents_runs (run_id, principal, session_key, agent, status,"
            " owner, attempt, lease_expires_at) VALUES (%s, 'alice', 'k', 'a',"
            " 'running', 'B', 2, now() + interval '1 minute')",
            (run_id,),
        )

    await db.call(insert)


async def test_the_before_tool_barrier_refuses_a_node_that_no_longer_owns_the_attempt(
    pg_dsn: str,
) -> None:
    from trio_agents.cluster._eventlog import Fence
    from trio_agents.cluster._queries import tool_start_barrier

    db = Database(pg_dsn)
    try:
        await db.call(lambda conn: conn.execute("SELECT 1"))  # the tables exist
        await insert_run_owned_by_b(db, "r-fence")
        stale = tool_start_barrier(db, "r-fence", "A", 1, Fence())  # A stalled: B has it
        with pytest.raises(RuntimeError):
            await stale(ta.ToolCall("c1", "slow", "{}"))
        current = tool_start_barrier(db, "r-fence", "B", 2, Fence())
        await current(ta.ToolCall("c2", "slow", "{}"))

        def starts(conn: Any) -> list[str]:
            rows = conn.execute(
                "SELECT call_id FROM trio_agents_tool_starts WHERE run_id = 'r-fence'"
            ).fetchall()
            return [str(r[0]) for r in rows]

        assert await db.call(starts) == ["c2"]
    finally:
        await db.aclose()


async def test_a_stale_owner_does_not_write_into_the_session(pg_dsn: str) -> None:
    from trio_agents.cluster._eventlog import Fence
    from trio_agents.cluster._session import ClusterSession, session_key

    db = Database(pg_dsn)
    try:
        await insert_run_owned_by_b(db, "r-stale")
    finally:
        await db.aclose()
    key = session_key("alice", "stale", "r-stale")
    stale = ClusterSession(pg_dsn, key, "A", Fence(), "r-stale")  # A stalled: B has it
    current = ClusterSession(pg_dsn, key, "B", Fence(), "r-stale")
    current.attempt = 2
    try:
        await stale.add_items([ta.UserMessage("stale")])
        await current.add_items([ta.UserMessage("current")])
        await stale.replace_items([ta.UserMessage("stale")])
        await stale.clear()
    finally:
        await stale.aclose()
        await current.aclose()
    items = process_cluster.stored_items(pg_dsn, "stale", "alice")
    assert items == [ta.UserMessage("current")]
