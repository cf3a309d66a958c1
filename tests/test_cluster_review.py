"""Adversarial review of the cluster (DESIGN §12): each test proves one defect where the
cluster breaks a promise, against the real PostgreSQL the suite starts.

Every test is ``xfail(strict=True)``: it fails today and flips (and must then lose its
marker) when the defect is fixed. The nodes run in one Trio process on one database
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
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio

import trio_agents as ta
from trio_agents.cluster import PostgresCluster
from trio_agents.cluster._db import ClusterDown
from trio_agents.control import ControlServer, Limits
from trio_agents.models import ScriptedModel, Turn

from .cluster_support import Client, Node, client

# -- helpers --------------------------------------------------------------------------


@asynccontextmanager
async def review_node(
    nursery: trio.Nursery,
    agents: Mapping[str, ta.Agent],
    dsn: str,
    node_id: str,
    *,
    lease_ttl: float = 0.5,
    limits: Limits | None = None,
) -> AsyncIterator[Node]:
    """Like ``cluster_support.node``, with the server's limits as a parameter."""
    from .control_support import TOKENS

    cluster = PostgresCluster(dsn, node_id=node_id, lease_ttl=lease_ttl)
    server = ControlServer(
        agents,
        auth=TOKENS,
        cluster=cluster,
        limits=limits or Limits(ping_interval=None, shutdown_timeout=10.0),
    )
    scope = trio.CancelScope()
    stopped = trio.Event()

    async def serve(task_status: trio.TaskStatus[int]) -> None:
        try:
            with scope:
                await server.serve("127.0.0.1", 0, task_status=task_status)
        finally:
            stopped.set()

    port = await nursery.start(serve)
    the_node = Node(server, cluster, f"ws://127.0.0.1:{port}/", scope, stopped)
    try:
        yield the_node
    finally:
        scope.cancel()
        with trio.CancelScope(shield=True):
            await stopped.wait()


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
    real = node.cluster.leases.heartbeat
    cut = [True]

    async def heartbeat() -> None:
        if cut[0]:
            await trio.lowlevel.checkpoint()
            raise ClusterDown("partitioned from PostgreSQL (test)")
        await real()

    monkeypatch.setattr(node.cluster.leases, "heartbeat", heartbeat)

    def heal() -> None:
        cut[0] = False

    return heal


def gate_flushes(node: Node, monkeypatch: pytest.MonkeyPatch) -> trio.Event:
    """Hold the node's event-log flushes until the returned event is set."""
    gate = trio.Event()
    real = node.cluster.writer._flush

    async def flush(batch: list[tuple[Any, Any]]) -> None:
        await gate.wait()
        await real(batch)

    monkeypatch.setattr(node.cluster.writer, "_flush", flush)
    return gate


def local_entry(node: Node, run_id: str) -> Any:
    return node.server._registry.runs[run_id]


async def wait_taken_over(c: Client, run_id: str) -> None:
    """``c`` (on the taking-over node) follows the run until it completes there."""
    await c.ok("run.subscribe", run_id=run_id, from_seq=1)
    await c.wait_event(run_id, lambda e: e["type"] == "run.updated" and e["detail"].get("resumed"))
    done = await c.wait_terminal(run_id)
    assert done["event"]["status"] == "completed", done


def stored_items(dsn: str, principal: str, session_id: str) -> list[ta.Item]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT data FROM trio_agents_session_items WHERE session_id = %s ORDER BY position",
            (json.dumps([principal, session_id]),),
        ).fetchall()
    return [ta.item_from_json(json.loads(r[0])) for r in rows]


def count(dsn: str, sql: str, *params: Any) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql, params).fetchone()
        assert row is not None
        return int(row[0])


async def until(predicate: Callable[[], bool], limit: float = 10.0) -> None:
    """Poll a condition on state nothing signals (database rows, server internals),
    bounded by ``limit`` seconds."""
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 (no event to wait for)
            await trio.sleep(0.05)


# -- 1. a node that lost its lease while alive is never fenced ------------------------


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


@asynccontextmanager
async def lost_lease(
    pg_dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    a_model: ta.Model,
    b_model: ta.Model,
    extra_tools: list[ta.Tool] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """Node A runs a run whose tool ``slow`` (call c1) blocks; A's lease renewals fail,
    node B takes the run over and completes it (c1 ``interrupted``). A stays alive."""
    started, release, cancelled = trio.Event(), trio.Event(), trio.Event()
    tools = [slow_tool(started, release, cancelled), *(extra_tools or [])]
    async with (
        two_nodes(pg_dsn, agent(a_model, tools), agent(b_model, tools)) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = (await ca.ok("run.start", agent="a", input="go", session_id="s", subscribe="all"))[
            "run_id"
        ]
        with trio.fail_after(30):
            await started.wait()
        heal = partition_heartbeat(a, monkeypatch)
        await wait_taken_over(cb, run_id)
        yield {
            "a": a,
            "b": b,
            "ca": ca,
            "cb": cb,
            "run_id": run_id,
            "heal": heal,
            "release": release,
            "cancelled": cancelled,
        }
        release.set()


@pytest.mark.xfail(
    strict=True,
    reason="a node whose lease was taken over while it was alive keeps running the run"
    " (and its tool) forever: lease loss is only noticed by a flush, never by the heartbeat",
)
async def test_owner_that_lost_its_lease_stops_its_run(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("c1", "slow", "{}")])], default="ok")
    async with lost_lease(pg_dsn, monkeypatch, a_model, ScriptedModel([], default="ok")) as t:
        t["heal"]()  # A reaches PostgreSQL again: it must now learn the run is not its own
        with trio.fail_after(10):
            await t["cancelled"].wait()


@pytest.mark.xfail(
    strict=True,
    reason="run.get on a node that lost the run's lease answers from its stale local copy"
    " (running) while the run completed on its new owner",
)
async def test_run_get_on_a_node_that_lost_the_lease_answers_the_truth(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("c1", "slow", "{}")])], default="ok")
    async with lost_lease(pg_dsn, monkeypatch, a_model, ScriptedModel([], default="ok")) as t:
        t["heal"]()
        seen: list[str] = []

        def completed() -> bool:
            return bool(seen) and seen[-1] == "completed"

        with trio.fail_after(10):
            while not completed():
                seen.append((await t["ca"].ok("run.get", run_id=t["run_id"]))["run"]["status"])
                if not completed():
                    await trio.sleep(0.1)


@pytest.mark.xfail(
    strict=True,
    reason="run.inject on a node that lost the run's lease is acked (with an injection_id)"
    " although the run completed on its new owner and the injection is never delivered",
)
async def test_inject_on_a_node_that_lost_the_lease_is_not_acked(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("c1", "slow", "{}")])], default="ok")
    async with lost_lease(pg_dsn, monkeypatch, a_model, ScriptedModel([], default="ok")) as t:
        # The run is completed (B said so, persisted). One process answers run_closed.
        answer = await t["ca"].request("run.inject", run_id=t["run_id"], items="too late")
        assert answer["type"] == "error", answer


# -- 2. exactly-once: the before_tool barrier does not check ownership --------------


@pytest.mark.xfail(
    strict=True,
    reason="before_tool inserts into tool_starts without checking that this node still"
    " owns the run's attempt: a node that lost its lease starts a non-idempotent tool"
    " the new owner also runs",
)
async def test_a_non_idempotent_tool_never_runs_twice_after_a_lost_lease(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    charged: list[str] = []

    @ta.function_tool
    async def charge(ctx: ta.ToolContext) -> str:
        """Charge a card (never twice)."""
        charged.append(ctx.call_id)
        return "charged"

    c1, c2 = ta.ToolCall("c1", "slow", "{}"), ta.ToolCall("c2", "charge", "{}")
    a_model = ScriptedModel([Turn(tool_calls=[c1]), Turn(tool_calls=[c2])], default="ok")
    b_model = ScriptedModel([Turn(tool_calls=[c2])], default="ok")
    async with lost_lease(pg_dsn, monkeypatch, a_model, b_model, [charge]) as t:
        assert charged == ["c2"]  # B interrupted c1, then the model asked for c2: ran once
        a, ca, run_id = t["a"], t["ca"], t["run_id"]
        gate = gate_flushes(a, monkeypatch)
        entry = local_entry(a, run_id)
        t["release"].set()  # A's slow tool returns; A's model then asks for c2 too

        def c2_result(e: dict[str, Any]) -> bool:
            item = e.get("item") or {}
            return (
                e["type"] == "run.item"
                and item.get("type") == "function_call_output"
                and item.get("call_id") == "c2"
            )

        async def c2_settled_on_a() -> None:
            await ca.wait_event(run_id, c2_result)

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:

                async def first(fn: Callable[[], Any]) -> None:
                    await fn()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(first, c2_settled_on_a)
                nursery.start_soon(first, entry.done.wait)
        gate.set()
    assert charged == ["c2"]


# -- 3. a stale owner writes into the session its successor is using ---------------


@pytest.mark.xfail(
    strict=True,
    reason="session writes are fenced only by a local flag set by a later flush: a node"
    " that lost its lease appends its stale items to the session the new owner uses",
)
async def test_a_stale_owner_does_not_write_into_the_session(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    a_model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("c1", "slow", "{}")])], default="ok")
    async with lost_lease(pg_dsn, monkeypatch, a_model, ScriptedModel([], default="ok")) as t:
        a, run_id = t["a"], t["run_id"]
        gate = gate_flushes(a, monkeypatch)
        entry = local_entry(a, run_id)
        t["release"].set()  # A's tool returns; A commits its result and answers
        with trio.fail_after(30):
            await entry.done.wait()
        gate.set()
    items = stored_items(pg_dsn, "alice", "s")
    results = [i for i in items if isinstance(i, ta.ToolResult) and i.call_id == "c1"]
    assert len(results) == 1, items
    assert ta.conversation_problems(items) == []


# -- 4. what a crashed owner had acked is not what its successor does ---------------


@pytest.mark.xfail(
    strict=True,
    reason="run.cancel is acked by the owner but not made durable: if the owner dies"
    " before its terminal status is flushed, the new owner resumes the run and completes it",
)
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
        run_id = (await ca.ok("run.start", agent="a", input="go", session_id="s"))["run_id"]
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


@pytest.mark.xfail(
    strict=True,
    reason="an acked injection delivered into the session is injected again after a"
    " takeover when its inbox.delivered event was not flushed before the crash",
)
async def test_an_injection_is_delivered_once_across_a_crash(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = trio.Event(), trio.Event()
    release = trio.Event()

    @ta.function_tool
    async def work(ctx: ta.ToolContext) -> str:
        """Work (not idempotent)."""
        (first if ctx.call_id == "w1" else second).set()
        await release.wait() if ctx.call_id == "w1" else await trio.sleep_forever()
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
        run_id = (await ca.ok("run.start", agent="a", input="go", session_id="s"))["run_id"]
        with trio.fail_after(30):
            await first.wait()
        await ca.ok("run.inject", run_id=run_id, items="remember this")  # acked: durable
        gate_flushes(a, monkeypatch)
        release.set()  # w1 ends; the injection is delivered; the model calls w2
        with trio.fail_after(30):
            await second.wait()

        def delivered() -> bool:
            return any(
                isinstance(i, ta.UserMessage) and i.content == "remember this"
                for i in stored_items(pg_dsn, "alice", "s")
            )

        await until(delivered)  # in the session, as its turn's items were persisted
        a.crash()
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        done = await cb.wait_terminal(run_id)
        assert done["event"]["status"] == "completed", done
    texts = [i.content for i in b_model.requests[-1].items if isinstance(i, ta.UserMessage)]
    assert texts == ["go", "remember this"]


# -- 5. subscriptions on a non-owner -------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="run.subscribe on a non-owner with from_seq past the end of a finished run never"
    " ends (follow() polls the events table every 2 s forever, holding a subscription slot);"
    " one process ends it at once",
)
async def test_subscribing_past_the_end_of_a_finished_run_ends(pg_dsn: str) -> None:
    model = ScriptedModel([], default="hello")
    async with (
        two_nodes(pg_dsn, agent(model, []), agent(model, [])) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = (await ca.ok("run.start", agent="a", input="hi", subscribe="all"))["run_id"]
        last = (await ca.wait_terminal(run_id))["seq"]
        await cb.ok("run.subscribe", run_id=run_id, from_seq=last + 1)

        def followed() -> bool:
            return any(run_id in conn.subscriptions for conn in b.server._connections)

        await until(lambda: not followed())


@pytest.mark.xfail(
    strict=True,
    reason="Listener.watch() registrations are never removed when a waiter stops waiting:"
    " every remote subscription (and every 2 s poll) leaves an Event in _waiters forever",
)
async def test_remote_subscriptions_leave_no_waiters_behind(pg_dsn: str) -> None:
    model = ScriptedModel([], default="hello")
    async with (
        two_nodes(pg_dsn, agent(model, []), agent(model, [])) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_ids = []
        for _ in range(3):
            run_id = (await ca.ok("run.start", agent="a", input="hi", subscribe="all"))["run_id"]
            await ca.wait_terminal(run_id)
            await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
            await cb.wait_terminal(run_id)
            run_ids.append(run_id)

        def followed() -> bool:
            return any(
                run_id in conn.subscriptions for conn in b.server._connections for run_id in run_ids
            )

        await until(lambda: not followed())
        waiters = b.cluster.listener._waiters
        assert [r for r in run_ids if waiters.get(("run", r))] == []


# -- 6. unbounded tables ------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="answered rows of trio_agents_commands are never deleted: the table grows by"
    " one row per routed op, forever",
)
async def test_answered_commands_are_deleted(pg_dsn: str) -> None:
    release = trio.Event()

    @ta.function_tool
    async def wait() -> str:
        """Wait."""
        await release.wait()
        return "waited"

    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("w", "wait", "{}")])], default="ok")
    async with (
        two_nodes(pg_dsn, agent(model, [wait]), agent(model, [wait])) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = (await ca.ok("run.start", agent="a", input="go", subscribe="all"))["run_id"]
        await ca.wait_event(run_id, lambda e: e["type"] == "tool.started")
        for n in range(5):
            await cb.ok("run.inject", run_id=run_id, items=f"note {n}")  # routed to A
        await until(lambda: count(pg_dsn, "SELECT count(*) FROM trio_agents_commands") == 0)
        release.set()


@pytest.mark.xfail(
    strict=True,
    reason="a finished run's rows (trio_agents_runs, its events, tool_starts) are never"
    " deleted, even once it is no longer visible (retain_finished passed)",
)
async def test_finished_runs_rows_are_deleted_after_retention(pg_dsn: str) -> None:
    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("t", "noop", "{}")])], default="ok")

    @ta.function_tool
    async def noop() -> str:
        """Nothing."""
        return "nothing"

    limits = Limits(ping_interval=None, shutdown_timeout=10.0, retain_finished=0.2)
    nodes = two_nodes(pg_dsn, agent(model, [noop]), agent(model, [noop]), limits=limits)
    async with nodes as (a, _b), client(a.url) as ca:
        run_id = (await ca.ok("run.start", agent="a", input="go", subscribe="all"))["run_id"]
        await ca.wait_terminal(run_id)

        def rows() -> int:
            return sum(
                count(pg_dsn, f"SELECT count(*) FROM {table} WHERE run_id = %s", run_id)
                for table in (
                    "trio_agents_runs",
                    "trio_agents_events",
                    "trio_agents_tool_starts",
                )
            )

        async def listed() -> bool:
            return any(r["run_id"] == run_id for r in (await ca.ok("runs.list"))["runs"])

        with trio.fail_after(10):
            while await listed():  # noqa: ASYNC110 (polls the server)
                await trio.sleep(0.1)
        await until(lambda: rows() == 0, limit=20.0)


# -- 7. routed ops during a takeover ------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="a scan claims several runs in one transaction but marks them 'resuming' one at"
    " a time: an op routed to the new owner for a claimed run not yet resumed answers"
    " not_found (wait_resumed only knows the run being resumed now)",
)
async def test_an_op_during_a_takeover_waits_for_the_resumed_run(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[str] = []
    forever = trio.Event()

    @ta.function_tool(idempotent=True)
    async def fetch(ctx: ta.ToolContext) -> str:
        """Fetch (safe to repeat)."""
        started.append(ctx.run_id)
        await forever.wait()
        return "fetched"

    model = ScriptedModel([], default=Turn(tool_calls=[ta.ToolCall("f", "fetch", "{}")]))
    async with two_nodes(pg_dsn, agent(model, [fetch]), agent(model, [fetch])) as (a, b):
        # B resumes the first claimed run slowly (as with many claimed runs).
        registry = b.server._registry
        real_resume = registry.resume_run
        gate, first_blocked = trio.Event(), trio.Event()
        order: list[str] = []

        async def resume_run(claimed: Any, resume: Any) -> Any:
            order.append(claimed.run_id)
            if len(order) == 1:
                first_blocked.set()
                await gate.wait()
            return await real_resume(claimed, resume)

        monkeypatch.setattr(registry, "resume_run", resume_run)
        async with client(a.url) as ca, client(b.url) as cb:
            run_ids = [
                (await ca.ok("run.start", agent="a", input=f"go {n}"))["run_id"] for n in range(2)
            ]
            await until(lambda: len(started) == 2, limit=30.0)
            a.crash()
            with trio.fail_after(30):
                await first_blocked.wait()
            # Both runs are B's in the table now; the second one is not resumed yet.
            other = next(r for r in run_ids if r != order[0])
            answers: list[dict[str, Any]] = []

            async def cancel() -> None:
                answers.append(await cb.request("run.cancel", run_id=other, reason="stop"))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel)
                await until(lambda: bool(answers) or bool(b.cluster.router._inflight))
                gate.set()
            forever.set()
            assert answers[0]["type"] == "ack", answers
