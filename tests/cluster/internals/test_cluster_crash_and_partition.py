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
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NoReturn

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_support import Node, client, node
from trio_agents.cluster._db import ClusterDown
from trio_agents.control import Limits
from trio_agents.models import ScriptedModel, Turn

# -- helpers --------------------------------------------------------------------------


def review_node(
    nursery: trio.Nursery,
    agents: Mapping[str, ta.Agent],
    dsn: str,
    node_id: str,
    *,
    lease_ttl: float = 0.5,
    limits: Limits | None = None,
) -> AbstractAsyncContextManager[Node]:
    """``cluster_support.node`` with a short lease."""
    return node(nursery, agents, dsn, node_id, lease_ttl=lease_ttl, limits=limits)


def agent(model: ta.Model, tools: list[ta.Tool]) -> dict[str, ta.Agent]:
    return {"a": ta.Agent(name="a", instructions="", model=model, tools=tools)}


@asynccontextmanager
async def two_nodes(
    dsn: str,
    a_agents: Mapping[str, ta.Agent],
    b_agents: Mapping[str, ta.Agent],
    *,
    limits: Limits | None = None,
) -> AsyncIterator[tuple[Node, Node]]:
    async with trio.open_nursery() as nursery:
        async with (
            review_node(nursery, a_agents, dsn, "A", limits=limits) as a,
            review_node(nursery, b_agents, dsn, "B", limits=limits) as b,
        ):
            yield a, b
        nursery.cancel_scope.cancel()


def partition_heartbeat(node: Node, monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """Make the node's lease renewals fail until the returned ``heal()`` is called."""
    real = node.cluster._leases.heartbeat
    cut = [True]

    async def heartbeat() -> None:
        if cut[0]:
            await trio.lowlevel.checkpoint()
            raise ClusterDown("partitioned from PostgreSQL (test)")
        await real()

    monkeypatch.setattr(node.cluster._leases, "heartbeat", heartbeat)

    def heal() -> None:
        cut[0] = False

    return heal


def gate_flushes(node: Node, monkeypatch: pytest.MonkeyPatch) -> trio.Event:
    """Hold the node's event-log flushes until the returned event is set."""
    gate = trio.Event()
    real = node.cluster._writer._flush

    async def flush(batch: list[Any]) -> None:
        await gate.wait()
        await real(batch)

    monkeypatch.setattr(node.cluster._writer, "_flush", flush)
    return gate


def local_entry(node: Node, run_id: str) -> Any:
    return node.server._registry.runs[run_id]


def stored_items(dsn: str, principal: str, session_id: str) -> list[ta.Item]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT data FROM trio_agents_session_items WHERE session_id = %s ORDER BY position",
            (json.dumps([principal, session_id]),),
        ).fetchall()
    return [ta.item_from_json(json.loads(r[0])) for r in rows]


async def until(predicate: Callable[[], bool], limit: float = 10.0) -> None:
    """Poll a condition on state nothing signals (database rows, server internals),
    bounded by ``limit`` seconds."""
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 (no event to wait for)
            await trio.sleep(0.05)


# -- 1. the watchdog stops a node's runs, then the node keeps their leases forever ---


def slow_tool(started: trio.Event, release: trio.Event, cancelled: trio.Event) -> ta.Tool:
    @ta.function_tool
    async def slow() -> str:
        """Work for a long time (not idempotent)."""
        started.set()
        try:
            await release.wait()
        except trio.Cancelled:
            cancelled.set()
            raise
        return "slow done"

    return slow


async def test_runs_stopped_by_the_watchdog_are_resumed_after_the_database_returns(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release, cancelled = trio.Event(), trio.Event(), trio.Event()
    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("c1", "slow", "{}")])], default="ok")
    async with trio.open_nursery() as nursery:
        tools = [slow_tool(started, release, cancelled)]
        async with review_node(nursery, agent(model, tools), pg_dsn, "A") as a, client(a.url) as ca:
            run_id = await ca.start_run(agent="a", input="go", session_id="s")
            with trio.fail_after(30):
                await started.wait()
            heal = partition_heartbeat(a, monkeypatch)  # a short outage, under lease_ttl
            with trio.fail_after(30):
                await cancelled.wait()  # the watchdog stopped the run ("lease lost")
            heal()
            # Once the database is back the run must go on (here, or on any node): its
            # call c1 gets "interrupted" and the model answers.
            await ca.ok("run.subscribe", run_id=run_id, from_seq=1)
            with trio.fail_after(20):
                done = await ca.wait_terminal(run_id)
            assert done["event"]["status"] == "completed", done
        nursery.cancel_scope.cancel()


async def test_a_node_resuming_its_own_stopped_run_waits_for_that_attempt_to_end(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The watchdog stopped the run ("lease lost"); its tool takes a while to stop (a
    # shielded cleanup, within the run's cleanup_timeout), so that attempt still holds
    # the session in this process when the node claims the run back. The resume waits
    # for it (hosting/_run_tasks.py, _OLD_ATTEMPT_BOUND) instead of finding the session
    # busy and failing the run.
    started, cancelled, hold = trio.Event(), trio.Event(), trio.Event()

    @ta.function_tool
    async def slow() -> str:
        """Work for a long time, and take a while to stop (not idempotent)."""
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.set()
            with trio.CancelScope(shield=True):
                await hold.wait()
            raise
        raise AssertionError("unreachable")

    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("c1", "slow", "{}")])], default="ok")
    async with trio.open_nursery() as nursery:
        async with (
            review_node(nursery, agent(model, [slow]), pg_dsn, "A") as a,
            client(a.url) as ca,
        ):
            run_id = await ca.start_run(agent="a", input="go", session_id="s")
            with trio.fail_after(30):
                await started.wait()
            stopped = local_entry(a, run_id)
            heal = partition_heartbeat(a, monkeypatch)
            with trio.fail_after(30):
                await cancelled.wait()  # the watchdog stopped the run ("lease lost")
            heal()  # the next heartbeat releases the run; A's scan claims it back
            await until(lambda: a.cluster._leases.takeovers == 1)
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
        nursery.cancel_scope.cancel()


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
        two_nodes(pg_dsn, agent(model, [work]), agent(model, [work])) as (a, b),
        client(b.url) as cb,
    ):
        async with client(a.url) as ca:
            run_id = await ca.start_run(
                agent="a", input="go", session_id="s", on_disconnect="cancel"
            )
            with trio.fail_after(30):
                await started.wait()
            await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
            started = trio.Event()
            heal = partition_heartbeat(a, monkeypatch)
            await until(lambda: a.cluster._leases.fenced == 1)  # A stopped its attempt
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
    started, release, cancelled = trio.Event(), trio.Event(), trio.Event()
    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("c1", "slow", "{}")])], default="ok")
    async with trio.open_nursery() as nursery:
        tools = [slow_tool(started, release, cancelled)]
        async with review_node(nursery, agent(model, tools), pg_dsn, "A") as a, client(a.url) as ca:
            await ca.ok("run.start", agent="a", input="go", session_id="s")
            with trio.fail_after(30):
                await started.wait()

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
                a.cluster._leases._next_cleanup = 0.0  # its next sweep is due (every 60 s)
                a.cluster._leases.wake()
                await trio.sleep(2 * a.cluster.lease_ttl)  # the lock is held this long
                await trio.to_thread.run_sync(conn.rollback)
            renewed = a.cluster._leases.renewed_at
            with trio.fail_after(10):
                while a.cluster._leases.renewed_at == renewed:  # noqa: ASYNC110 (no event)
                    await trio.sleep(0.05)
            assert a.cluster._leases.fenced == 0
            assert not cancelled.is_set()
            release.set()
        nursery.cancel_scope.cancel()


# -- 2. what a crashed owner had acked is not what its successor does ---------------


async def test_an_acked_cancel_survives_the_owner_crash(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release, cancelled = trio.Event(), trio.Event(), trio.Event()
    tools = [slow_tool(started, release, cancelled)]
    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("c1", "slow", "{}")])], default="ok")
    async with (
        two_nodes(pg_dsn, agent(model, tools), agent(model, tools)) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = await ca.start_run(agent="a", input="go", session_id="s")
        with trio.fail_after(30):
            await started.wait()
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
    real = node.cluster._writer._flush
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

    monkeypatch.setattr(node.cluster._writer, "_flush", flush)


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
        two_nodes(pg_dsn, agent(a_model, [work]), agent(b_model, [work])) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = await ca.start_run(agent="a", input="go", session_id="s")
        with trio.fail_after(30):
            await first.wait()
        await ca.ok("run.inject", run_id=run_id, items="remember this")  # acked: durable
        lose_flushes_from_delivery(a, monkeypatch)
        release.set()  # w1 ends; the injection is delivered; its inbox.delivered is lost

        def delivered() -> bool:
            return any(
                isinstance(i, ta.UserMessage) and i.content == "remember this"
                for i in stored_items(pg_dsn, "alice", "s")
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
        two_nodes(pg_dsn, agent(a_model, [work]), agent(b_model, [work])) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = await ca.start_run(agent="a", input="go", session_id="s")
        with trio.fail_after(30):
            await first.wait()
        fields: dict[str, Any] = {"items": "remember"}
        if op == "run.withdraw":
            injected = await ca.ok("run.inject", run_id=run_id, items="withdrawn")
            fields = {"injection_id": injected["injection_id"]}
        elif op == "run.cancel":
            fields = {"reason": "stop"}
        applied = trio.Event()
        stored: list[str | None] = []
        execute = a.cluster._router.execute
        assert execute is not None

        def reply_of(command_id: int) -> str | None:
            with psycopg.connect(pg_dsn) as conn:
                row = conn.execute(
                    "SELECT reply FROM trio_agents_commands WHERE command_id = %s", (command_id,)
                ).fetchone()
            assert row is not None
            return None if row[0] is None else str(row[0])

        async def answered_by_a_dying_node(*args: Any) -> NoReturn:
            await execute(*args)  # applied, and durable (acked only then)
            stored.append(await trio.to_thread.run_sync(reply_of, args[2]))
            applied.set()
            await trio.sleep_forever()  # A dies before its answer is written

        monkeypatch.setattr(a.cluster._router, "execute", answered_by_a_dying_node)
        answers: list[dict[str, Any]] = []
        async with trio.open_nursery() as waiting:

            async def send() -> None:
                answers.append(await cb.request(op, run_id=run_id, **fields))

            waiting.start_soon(send)
            with trio.fail_after(30):
                await applied.wait()
            a.crash()
        # Answered with what A stored (B took the run over meanwhile).
        assert stored[0] is not None
        assert answers[0]["type"] == "ack", answers
        assert {k: v for k, v in answers[0].items() if k not in ("type", "id")} == json.loads(
            stored[0]
        )["ok"]
        if op == "run.withdraw":
            assert answers[0]["withdrawn"] is True
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


async def test_subscribing_past_the_end_of_a_finished_run_ends(pg_dsn: str) -> None:
    model = ScriptedModel([], default="hello")
    async with (
        two_nodes(pg_dsn, agent(model, []), agent(model, [])) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = await ca.start_run(agent="a", input="hi", subscribe="all")
        last = (await ca.wait_terminal(run_id))["seq"]
        await cb.ok("run.subscribe", run_id=run_id, from_seq=last + 1)

        def followed() -> bool:
            return any(run_id in conn.subscriptions for conn in b.server._connections)

        await until(lambda: not followed())


async def test_remote_subscriptions_leave_no_waiters_behind(pg_dsn: str) -> None:
    model = ScriptedModel([], default="hello")
    async with (
        two_nodes(pg_dsn, agent(model, []), agent(model, [])) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_ids = []
        for _ in range(3):
            run_id = await ca.start_run(agent="a", input="hi", subscribe="all")
            await ca.wait_terminal(run_id)
            await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
            await cb.wait_terminal(run_id)
            run_ids.append(run_id)

        def followed() -> bool:
            return any(
                run_id in conn.subscriptions for conn in b.server._connections for run_id in run_ids
            )

        await until(lambda: not followed())
        waiters = b.cluster._listener._waiters
        assert [r for r in run_ids if waiters.get(("run", r))] == []


# -- 4. database-side fencing ---------------------------------------------------------


async def test_the_before_tool_barrier_refuses_a_node_that_no_longer_owns_the_attempt(
    pg_dsn: str,
) -> None:
    from trio_agents.cluster._db import Database
    from trio_agents.cluster._eventlog import Fence
    from trio_agents.cluster._queries import tool_start_barrier

    db = Database(pg_dsn)
    try:
        await db.call(lambda conn: conn.execute("SELECT 1"))  # the tables exist

        def insert(conn: Any) -> None:
            conn.execute(
                "INSERT INTO trio_agents_runs (run_id, principal, session_key, agent, status,"
                " owner, attempt, lease_expires_at) VALUES ('r-fence', 'alice', 'k', 'a',"
                " 'running', 'B', 2, now() + interval '1 minute')"
            )

        await db.call(insert)
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
    from trio_agents.cluster._db import Database
    from trio_agents.cluster._eventlog import Fence
    from trio_agents.cluster._session import ClusterSession, session_key

    db = Database(pg_dsn)
    try:

        def insert(conn: Any) -> None:
            conn.execute(
                "INSERT INTO trio_agents_runs (run_id, principal, session_key, agent, status,"
                " owner, attempt, lease_expires_at) VALUES ('r-stale', 'alice', 'k', 'a',"
                " 'running', 'B', 2, now() + interval '1 minute')"
            )

        await db.call(insert)
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
    items = stored_items(pg_dsn, "alice", "stale")
    assert items == [ta.UserMessage("current")]
