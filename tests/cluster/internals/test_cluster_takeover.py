"""Takeover after a node "crashes" (stops talking to the database at once, as a killed
process would, and stops renewing its leases), and graceful hand-over (DESIGN §12,
issue 17 items 2 and 4). The multi-process ``kill -9`` tests live elsewhere; these run
the nodes in one Trio process on one database with a short lease (2 s: short enough
for a quick takeover, long enough that a heartbeat delayed by a loaded machine does not
lose a live node its runs)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any, TypeAlias

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_internals import fetch_tool, until
from tests.support.cluster_nodes import agents, approval_tool, host_registry, waiting_tool
from tests.support.cluster_support import Client, Node, client, node
from trio_agents.cluster._queries import release_node
from trio_agents.models import Finish as FinishEvent
from trio_agents.models import ModelRequest, ScriptedModel, TextDelta, Turn
from trio_agents.sessions import PostgresSession


def stored_session(dsn: str, principal: str, session_id: str) -> PostgresSession:
    return PostgresSession(dsn, json.dumps([principal, session_id]))


def run_rows(dsn: str, run_id: str) -> tuple[list[int], tuple[Any, ...]]:
    with psycopg.connect(dsn) as conn:
        seqs = [
            int(r[0])
            for r in conn.execute(
                "SELECT seq FROM trio_agents_events WHERE run_id = %s ORDER BY seq", (run_id,)
            ).fetchall()
        ]
        row = conn.execute(
            "SELECT status, owner, attempt, finished, active_key FROM trio_agents_runs"
            " WHERE run_id = %s",
            (run_id,),
        ).fetchone()
        assert row is not None
        return seqs, tuple(row)


def check_stream(c: Client, run_id: str) -> list[dict[str, Any]]:
    """The subscriber saw every seq once, in order, one terminal update, last."""
    frames = c.events[run_id]
    assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
    terminal = [
        f
        for f in frames
        if f["event"]["type"] == "run.updated"
        and f["event"]["status"] in ("completed", "failed", "cancelled")
    ]
    assert terminal == [frames[-1]]
    return frames


async def completed(c: Client, run_id: str) -> list[dict[str, Any]]:
    """Wait for the run's terminal update: it completed, and ``check_stream`` holds."""
    done = await c.wait_terminal(run_id)
    assert done["event"]["status"] == "completed", done
    return check_stream(c, run_id)


Nodes: TypeAlias = tuple[Node, Node, Node]


@asynccontextmanager
async def three_nodes(
    model: ta.Model, tools: list[ta.Tool], dsn: str, lease_ttl: float = 2.0
) -> AsyncIterator[tuple[Nodes, Client, Client]]:
    """Nodes A, B and C, and a client of A and one of B."""
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, agents(model, tools), dsn, "A", lease_ttl=lease_ttl) as a,
            node(nursery, agents(model, tools), dsn, "B", lease_ttl=lease_ttl) as b,
            node(nursery, agents(model, tools), dsn, "C", lease_ttl=lease_ttl) as c,
            client(a.url) as ca,
            client(b.url) as cb,
        ):
            yield (a, b, c), ca, cb
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def run_on_a(
    model: ta.Model, tools: list[ta.Tool], dsn: str, lease_ttl: float = 2.0, **start: Any
) -> AsyncIterator[tuple[Nodes, Client, Client, str]]:
    """``three_nodes``, with a run of agent ``a`` (``start`` its other fields) started
    by A's client, subscribed there, and followed from seq 1 by B's: yields the run's
    id last."""
    async with three_nodes(model, tools, dsn, lease_ttl) as (nodes, ca, cb):
        run_id = await ca.start_run(agent="a", subscribe="all", **start)
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        yield nodes, ca, cb, run_id


async def test_takeover_mid_tool(pg_dsn: str) -> None:
    started: list[str] = []
    forever = trio.Event()

    @ta.function_tool
    async def charge(ctx: ta.ToolContext) -> str:
        """Charge a card (never twice)."""
        started.append(f"charge:{ctx.call_id}")
        await forever.wait()
        return "charged"

    @ta.function_tool(idempotent=True)
    async def lookup(ctx: ta.ToolContext) -> str:
        """Read something (safe to repeat)."""
        started.append(f"lookup:{ctx.call_id}")
        if started.count(f"lookup:{ctx.call_id}") == 1:
            await forever.wait()
        return "looked up"

    model = ScriptedModel(
        [
            Turn(tool_calls=[ta.ToolCall("c1", "charge", "{}"), ta.ToolCall("c2", "lookup", "{}")]),
            "all done",
        ]
    )
    tools = [charge, lookup]
    async with run_on_a(model, tools, pg_dsn, input="pay", session_id="s") as (
        nodes,
        _,
        cb,
        run_id,
    ):
        a, _b, c = nodes
        # Both calls' starts are recorded before their tools run: wait until B has
        # seen both tool.started events (persisted), then "kill" A.
        await cb.wait_event(run_id, lambda e: e["type"] == "tool.started" and e["call_id"] == "c2")
        await cb.wait_event(run_id, lambda e: e["type"] == "tool.started" and e["call_id"] == "c1")
        a.crash()
        last = cb.seqs(run_id)[-1]
        # The subscriber moves to node C, from the next seq.
        async with client(c.url) as cc:
            await cc.ok("run.subscribe", run_id=run_id, from_seq=last + 1)
            done = await cc.wait_terminal(run_id)
            assert done["event"]["status"] == "completed", done
            frames = [*cb.events[run_id][:last], *cc.events[run_id]]
            assert [f["seq"] for f in frames] == list(range(1, len(frames) + 1))
            resumed = [
                f["event"]
                for f in cc.events[run_id]
                if f["event"]["type"] == "run.updated" and f["event"]["status"] == "running"
            ]
            assert resumed[0]["detail"] == {"resumed": True, "attempt": 2}
            finished = {
                f["event"]["call_id"]: f["event"]
                for f in cc.events[run_id]
                if f["event"]["type"] == "tool.finished"
            }
            assert finished["c1"]["status"] == "error"
            assert finished["c1"]["output"] == "interrupted: node A stopped"
            assert finished["c2"]["status"] == "ok"
    # The non-idempotent tool ran once; the idempotent one again.
    assert started.count("charge:c1") == 1
    assert started.count("lookup:c2") == 2
    seqs, (status, owner, attempt, is_finished, active) = run_rows(pg_dsn, run_id)
    assert seqs == list(range(1, len(seqs) + 1))
    assert (status, owner in ("B", "C"), attempt, is_finished, active) == (
        "completed",
        True,
        2,
        True,
        None,
    )
    async with stored_session(pg_dsn, "alice", "s") as session:
        items = await session.get_items()
    assert ta.conversation_problems(items) == []
    results = {i.call_id: i for i in items if isinstance(i, ta.ToolResult)}
    assert results["c1"].output == "interrupted: node A stopped"
    assert results["c2"].output == "looked up"


class StallingModel:
    """The first call streams some text, then stalls; later calls answer at once."""

    def __init__(self) -> None:
        self.calls = 0
        self.requests: list[ModelRequest] = []

    def stream(self, request: ModelRequest) -> aclosing[AsyncGenerator[Any]]:
        self.calls += 1
        self.requests.append(request)
        number = self.calls

        async def events() -> AsyncGenerator[Any]:
            if number == 1:
                yield TextDelta("partial ")
                yield TextDelta("text ")
                await trio.sleep_forever()
            yield TextDelta("resumed answer")
            yield FinishEvent("stop")

        return aclosing(events())


async def test_takeover_mid_stream(pg_dsn: str) -> None:
    model = StallingModel()
    async with run_on_a(model, [], pg_dsn, input="talk") as ((a, _b, _c), _ca, cb, run_id):
        # Deltas are flushed within 100 ms: B sees the second one, then A dies.
        await cb.wait_event(
            run_id, lambda e: e["type"] == "response.text.delta" and e["text"] == "text "
        )
        a.crash()
        frames = await completed(cb, run_id)
        texts = [f["event"]["text"] for f in frames if f["event"]["type"] == "response.text.delta"]
        assert texts == ["partial ", "text ", "resumed answer"]
    assert model.calls == 2
    seqs, row = run_rows(pg_dsn, run_id)
    assert seqs == list(range(1, len(seqs) + 1))
    assert (row[0], row[2]) == ("completed", 2)


async def test_takeover_while_awaiting_approval(pg_dsn: str) -> None:
    ran: list[str] = []
    delete = approval_tool(ran)
    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("d1", "delete", "{}")]), "done"])
    async with run_on_a(model, [delete], pg_dsn, input="rm", session_id="s") as (
        (a, _b, c),
        _ca,
        cb,
        run_id,
    ):
        await cb.wait_status(run_id, "awaiting_approval")
        a.crash()
        # Re-asked by the new owner after the takeover.
        resumed = await cb.wait_event(
            run_id, lambda e: e["type"] == "run.updated" and e["detail"].get("resumed")
        )
        again = await cb.wait_event(
            run_id,
            lambda e: (
                e["type"] == "run.updated"
                and e["status"] == "awaiting_approval"
                and e["seq"] > resumed["seq"]
            ),
        )
        assert again["event"]["detail"]["pending"] == ["d1"]
        async with client(c.url) as cc:
            await cc.ok("run.approve", run_id=run_id, call_id="d1")
        await completed(cb, run_id)
    assert ran == ["d1"]
    async with stored_session(pg_dsn, "alice", "s") as session:
        items = await session.get_items()
    assert ta.conversation_problems(items) == []


async def test_an_injection_acked_before_a_crash_is_delivered_after_takeover(pg_dsn: str) -> None:
    wait = waiting_tool(trio.Event())  # works for a long time
    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("w1", "wait", "{}")])], default="done")
    async with run_on_a(model, [wait], pg_dsn, input="go") as ((a, _b, _c), ca, cb, run_id):
        await ca.wait_event(run_id, lambda e: e["type"] == "tool.started")
        await cb.ok("run.inject", run_id=run_id, items="remember this")
        a.crash()
        await completed(cb, run_id)
    texts = [i.content for i in model.requests[-1].items if isinstance(i, ta.UserMessage)]
    assert texts == ["go", "remember this"]


async def test_graceful_shutdown_hands_runs_over_without_waiting_for_the_lease(
    pg_dsn: str,
) -> None:
    started: list[str] = []
    fetch = fetch_tool(started, trio.Event(), first_only=True)
    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("f1", "fetch", "{}")]), "done"])
    # A lease of an hour: only the hand-over can move the run within the test's bound.
    async with run_on_a(model, [fetch], pg_dsn, 3600.0, input="go", session_id="s") as (
        (a, _b, _c),
        ca,
        cb,
        run_id,
    ):
        await cb.wait_event(run_id, lambda e: e["type"] == "tool.started")
        with trio.fail_after(30):
            await a.stop()
        # A's subscriber saw no terminal event: the run goes on.
        assert not any(
            f["event"]["type"] == "run.updated"
            and f["event"]["status"] in ("completed", "failed", "cancelled")
            for f in ca.events[run_id]
        )
        await completed(cb, run_id)
    assert started == ["f1", "f1"]
    _, row = run_rows(pg_dsn, run_id)
    assert row[1] in ("B", "C")
    assert row[2] == 2


@pytest.mark.parametrize("placed", [False, True], ids=["started-here", "placed"])
async def test_a_graceful_stop_cancels_the_runs_whose_client_it_disconnects(
    pg_dsn: str, placed: bool
) -> None:
    # The stopping node hands its runs over, but it also closes its connections: a run
    # started through it with on_disconnect="cancel" (run by it, or placed on another
    # node) is cancelled with reason "client disconnected", as that disconnect would.
    forever = trio.Event()
    started: list[str] = []
    fetch = fetch_tool(started, forever)
    model = ScriptedModel([], default=Turn(tool_calls=[("fetch", {})]))
    async with three_nodes(model, [fetch], pg_dsn, lease_ttl=3600.0) as ((a, _b, _c), ca, cb):
        a.cluster._node.max_runs = 1 if placed else 100
        if placed:  # A is full: its client's runs are placed on B or C
            await ca.ok("run.start", agent="a", input="filler")
            await until(lambda: bool(started), limit=30)
        cancelled = await ca.start_run(
            agent="a", input="go", session_id="s", on_disconnect="cancel"
        )
        kept = await ca.start_run(agent="a", input="go", session_id="t")
        for run_id in (cancelled, kept):
            await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
            await cb.wait_event(run_id, lambda e: e["type"] == "tool.started")
        with trio.fail_after(30):
            await a.stop()
        done = (await cb.wait_terminal(cancelled))["event"]
        assert (done["status"], done["reason"]) == ("cancelled", "client disconnected")
        await cb.ok("run.cancel", run_id=kept, reason="test over")
        done = (await cb.wait_terminal(kept))["event"]
        assert (done["status"], done["reason"]) == ("cancelled", "test over")


async def test_a_run_resumed_while_its_node_stops_is_stopped_and_handed_over_too(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # B is resuming a run (C handed it over) when its own shutdown begins: the hand-over
    # waits for that resumption, and the resumed run is stopped and handed over too.
    # It used to escape the shutdown (resumed after the shutdown listed the runs to
    # stop), which then never ended.
    forever = trio.Event()
    started: list[str] = []
    fetch = fetch_tool(started, forever)
    model = ScriptedModel([], default=Turn(tool_calls=[("fetch", {})]))
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, agents(model, [fetch]), pg_dsn, "B", lease_ttl=3600.0) as b,
            node(nursery, agents(model, [fetch]), pg_dsn, "C", lease_ttl=3600.0) as c,
            client(c.url) as cc,
        ):
            run_id = await cc.start_run(agent="a", input="go", subscribe="all")
            await cc.wait_event(run_id, lambda e: e["type"] == "tool.started")
            proceed, resuming = trio.Event(), trio.Event()
            resume = b.cluster._node.leases.resume

            async def slow_resume(claimed: Any) -> None:
                resuming.set()
                await proceed.wait()  # loading the session, say
                await resume(claimed)

            def stopped_here() -> bool:
                entry = host_registry(b).runs.get(run_id)
                return entry is not None and entry.fence.closed

            async def release_once_resumed(*args: Any) -> None:
                # The widest window: B releases its runs only once the resumed run has
                # started its tool again, or was stopped first.
                await until(lambda: len(started) >= 2 or stopped_here(), limit=30)
                await release_node(*args)

            monkeypatch.setattr(b.cluster._node.leases, "resume", slow_resume)
            with trio.fail_after(30):
                await c.stop()  # hands the run over: B claims it
                await resuming.wait()
            monkeypatch.setattr(
                "trio_agents.cluster._cluster_node.release_node", release_once_resumed
            )
            b.scope.cancel()  # B's shutdown begins while it resumes the run
            await until(lambda: b.cluster._node.leases.draining, limit=30)
            proceed.set()
            try:
                with trio.fail_after(30):
                    await b.stopped.wait()
            finally:
                forever.set()  # lets an escaped run end (the test has failed then)
            assert b.server.statistics().active_runs == 0
        nursery.cancel_scope.cancel()
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT finished, released, attempt FROM trio_agents_runs WHERE run_id = %s",
            (run_id,),
        ).fetchone()
    assert row is not None
    assert tuple(row) == (False, True, 2)  # handed over again, for the next node


async def test_an_op_for_a_dead_owner_waits_for_the_takeover(pg_dsn: str) -> None:
    ran: list[str] = []
    delete = approval_tool(ran)
    model = ScriptedModel([Turn(tool_calls=[ta.ToolCall("d1", "delete", "{}")]), "done"])
    async with run_on_a(model, [delete], pg_dsn, input="rm") as ((a, _b, _c), _ca, cb, run_id):
        await cb.wait_status(run_id, "awaiting_approval")
        a.crash()
        # Sent at once: answered by the node that takes the run over, once it has.
        await cb.ok("run.approve", run_id=run_id, call_id="d1")
        await completed(cb, run_id)
    assert ran == ["d1"]


async def test_a_run_whose_input_never_reached_its_session_is_resumed_with_it(
    pg_dsn: str,
) -> None:
    model = ScriptedModel(["hello again"])
    async with trio.open_nursery() as nursery:
        async with node(nursery, agents(model, []), pg_dsn, "B") as b, client(b.url) as cb:
            # What a node killed right after run.start leaves: its row, no session rows.
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                conn.execute(
                    "INSERT INTO trio_agents_runs (run_id, principal, session_key, active_key,"
                    " agent, options, status, owner, lease_expires_at) VALUES ('run_x',"
                    " 'alice', '[\"alice\", \"run:run_x\"]', NULL, 'a', %s, 'queued', 'ghost',"
                    " now() - interval '1 second')",
                    (json.dumps({"input": [ta.UserMessage("hi there").to_json()]}),),
                )
                conn.execute("SELECT pg_notify('trio_agents_cluster', '{\"k\": \"scan\"}')")
            await cb.ok("run.subscribe", run_id="run_x", from_seq=1)
            done = await cb.wait_terminal("run_x")
            assert done["event"]["status"] == "completed", done
            assert b.cluster.statistics().takeovers == 1
        nursery.cancel_scope.cancel()
    assert [i.content for i in model.requests[0].items if isinstance(i, ta.UserMessage)] == [
        "hi there"
    ]


async def test_a_node_restarted_under_the_same_id_does_not_keep_its_old_runs_leases(
    pg_dsn: str,
) -> None:
    # A dies with a run, and a new process comes back as "A" at once (a restarted
    # service keeps its --node-id). Its heartbeats renew the leases of its own runs
    # only: the old run's lease expires and the run is taken over (by the new A, the
    # only node), instead of staying "running" forever with nobody running it.
    model = ScriptedModel([Turn(tool_calls=[("wait", {})])], default="done")
    release = trio.Event()

    @ta.function_tool(idempotent=True)
    async def wait() -> str:
        """Wait (idempotent: it runs again after the takeover)."""
        await release.wait()
        return "waited"

    async with trio.open_nursery() as nursery:
        async with node(nursery, agents(model, [wait]), pg_dsn, "A", lease_ttl=1.0) as a:
            async with client(a.url) as ca:
                run_id = (await ca.ok("run.start", agent="a", input="go", subscribe="all"))[
                    "run_id"
                ]
                await ca.wait_event(run_id, lambda e: e["type"] == "tool.started")
            a.crash()
            await a.stopped.wait()
        async with (
            node(nursery, agents(model, [wait]), pg_dsn, "A", lease_ttl=1.0) as again,
            client(again.url) as c,
        ):
            await c.ok("run.subscribe", run_id=run_id, from_seq=1)
            await c.wait_event(
                run_id,
                lambda e: e["type"] == "run.updated" and e.get("detail", {}).get("resumed"),
            )
            release.set()
            done = await c.wait_terminal(run_id)
            assert done["event"]["status"] == "completed", done
        nursery.cancel_scope.cancel()
    _, row = run_rows(pg_dsn, run_id)
    assert row[1:4] == ("A", 2, True)
