"""One active run per session across the cluster (``on_busy``), placement by capacity,
and PostgreSQL restarted under load (DESIGN §12, issue 17 items 3 and 5)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_nodes import clients, open_nodes, placed_runs, waiting_agents
from tests.support.cluster_support import Client, Node, client
from tests.support.pg_support import PostgresServer
from trio_agents.control import Limits
from trio_agents.hosting import StartRequest
from trio_agents.models import ScriptedModel


@asynccontextmanager
async def behind_a_full_node(
    dsn: str, *others: str, lease_ttl: float = 5.0
) -> AsyncIterator[tuple[list[Node], Client, str]]:
    """Nodes ``others`` and C, each running every turn's ``wait`` call until cancelled;
    C full (``max_runs=1``) with one run in its tool call. Yields the nodes (C last), a
    client on C and that run's id."""
    _, served = waiting_agents(trio.Event(), every_turn=True)
    async with (
        open_nodes(
            dsn, dict.fromkeys((*others, "C"), served), lease_ttl=lease_ttl, max_runs={"C": 1}
        ) as opened,
        clients(opened[-1]) as (cc,),
    ):
        yield opened, cc, await cc.start_until_tool(agent="a", input="1")


@pytest.mark.parametrize("on_busy", ["reject", "interrupt", "enqueue"])
async def test_on_busy_across_nodes(pg_dsn: str, on_busy: str) -> None:
    gate = trio.Event()
    model, served = waiting_agents(gate)
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", served)) as (a, b),
        clients(a, b) as (ca, cb),
    ):
        first = await ca.start_until_tool(agent="a", input="1", session_id="s")
        # Another principal's "s" is another session.
        async with client(b.url, token="tok-bob") as bob:
            other = await bob.ok("run.start", agent="a", input="x", session_id="s")
            assert other["run_id"] != first
            await bob.ok("run.cancel", run_id=other["run_id"])
        if on_busy == "reject":
            busy = await cb.request(
                "run.start", agent="a", input="2", session_id="s", on_busy="reject"
            )
            assert (busy["type"], busy["code"]) == ("error", "session_busy")
            gate.set()
            assert (await ca.wait_terminal(first))["event"]["status"] == "completed"
            # Free as soon as its terminal status is seen, from any node.
            second = await cb.ok("run.start", agent="a", input="2", session_id="s")
            assert second["run_id"] != first
        elif on_busy == "interrupt":
            second = await cb.ok(
                "run.start",
                agent="a",
                input="2",
                session_id="s",
                on_busy="interrupt",
                subscribe="all",
            )
            done = await ca.wait_terminal(first)
            assert (done["event"]["status"], done["event"]["reason"]) == (
                "cancelled",
                "superseded",
            )
            gate.set()
            assert (await cb.wait_terminal(second["run_id"]))["event"]["status"] == ("completed")
        else:
            async with trio.open_nursery() as waiting:
                answers: list[dict[str, object]] = []

                async def start_second() -> None:
                    answers.append(
                        await cb.ok(
                            "run.start",
                            agent="a",
                            input="2",
                            session_id="s",
                            on_busy="enqueue",
                            subscribe="all",
                        )
                    )

                waiting.start_soon(start_second)
                await trio.testing.wait_all_tasks_blocked()
                gate.set()
            assert (await ca.wait_terminal(first))["event"]["status"] == "completed"
            second_id = str(answers[0]["run_id"])
            assert (await cb.wait_terminal(second_id))["event"]["status"] == "completed"
            # The second run saw the first one's whole conversation.
            last = model.requests[-1].items
            assert [i.content for i in last if isinstance(i, ta.UserMessage)] == ["1", "2"]


@pytest.mark.parametrize("holder_node", ["A", "B"])
async def test_an_enqueued_start_is_acked_at_once_and_queued(pg_dsn: str, holder_node: str) -> None:
    # As in one process (tests/control/internals/test_control_limits.py): run.start with on_busy="enqueue"
    # on a busy session is acked at once, the run is "queued" (on every node), can be
    # cancelled while queued (leaving the session alone), and gets the session once the
    # holder lets go; the holder on another node or on the same one.
    gate = trio.Event()
    model, served = waiting_agents(gate)
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", served)) as (a, b),
        client(a.url if holder_node == "A" else b.url) as holder,
        client(b.url) as cb,
    ):
        first = await holder.start_until_tool(agent="a", input="1", session_id="s")
        second = await cb.start_run(
            agent="a", input="2", session_id="s", on_busy="enqueue", subscribe="status"
        )
        dropped = await cb.start_run(
            agent="a", input="3", session_id="s", on_busy="enqueue", subscribe="status"
        )
        assert not gate.is_set()  # acked while the first run holds the session
        await cb.wait_status(second, "queued")
        async with client(a.url) as ca:
            for run_id in (second, dropped):
                info = (await ca.ok("run.get", run_id=run_id))["run"]
                assert info["status"] == "queued", info
        await cb.ok("run.cancel", run_id=dropped, reason="not needed")
        done = (await cb.wait_terminal(dropped))["event"]
        assert (done["status"], done["reason"]) == ("cancelled", "not needed")
        assert await holder.wait_status(first, "running")  # still holding it
        gate.set()
        assert (await holder.wait_terminal(first))["event"]["status"] == "completed"
        assert (await cb.wait_terminal(second))["event"]["status"] == "completed"
        statuses = [
            f["event"]["status"] for f in cb.events[second] if f["event"]["type"] == "run.updated"
        ]
        assert statuses[:2] == ["queued", "running"], statuses
    # The second run saw the first one's conversation; the cancelled one left no trace.
    last = model.requests[-1].items
    assert [i.content for i in last if isinstance(i, ta.UserMessage)] == ["1", "2"]


async def test_a_queued_run_whose_node_dies_is_queued_again_by_the_takeover(
    pg_dsn: str,
) -> None:
    # B dies while its run waits for the session A's run holds: A takes the run over,
    # still queued (it never touched the session), and runs it once the session is free.
    gate = trio.Event()
    started: list[str] = []
    model, served = waiting_agents(gate, started)
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", served), lease_ttl=0.5) as (a, b),
        clients(a, b) as (ca, cb),
    ):
        first = await ca.start_until_tool(agent="a", input="1", session_id="s")
        second = await cb.start_run(
            agent="a", input="2", session_id="s", on_busy="enqueue", subscribe="status"
        )
        await cb.wait_status(second, "queued")  # persisted (sent only then)
        b.crash()
        with trio.fail_after(30):
            while a.cluster._node.leases.takeovers == 0:  # noqa: ASYNC110 (no event)
                await trio.sleep(0.05)
        info = (await ca.ok("run.get", run_id=second))["run"]
        assert info["status"] == "queued", info
        assert len(started) == 1
        gate.set()
        await ca.ok("run.subscribe", run_id=second, from_seq=1)
        assert (await ca.wait_terminal(first))["event"]["status"] == "completed"
        done = await ca.wait_terminal(second)
        assert done["event"]["status"] == "completed", done
    last = model.requests[-1].items
    assert [i.content for i in last if isinstance(i, ta.UserMessage)] == ["1", "2"]


async def test_runs_queued_on_different_nodes_get_the_session_in_order(pg_dsn: str) -> None:
    # A holds the session; a run is enqueued on B, then one on C. When A's run ends,
    # B's gets the session first, then C's: first come, first served cluster-wide (as
    # in one process). B is made slow to claim (its claims wait until C has tried to
    # claim the free session), so that C would win a race if there were one.
    gate = trio.Event()
    model, served = waiting_agents(gate)
    async with (
        open_nodes(pg_dsn, dict.fromkeys("ABC", served)) as (a, b, c),
        clients(a, b, c) as (ca, cb, cc),
    ):
        holder = await ca.start_until_tool(agent="a", input="0", session_id="s")
        armed = trio.Event()  # both runs are queued
        c_tried = trio.Event()  # C tried to claim with the session free
        b_call, c_call = b.cluster._node.db.call, c.cluster._node.db.call

        def claims(fn: Any) -> bool:
            return "claim_queued" in getattr(fn, "__qualname__", "")

        async def b_slow(fn: Any) -> Any:
            if claims(fn) and armed.is_set():
                await c_tried.wait()
            return await b_call(fn)

        async def c_watched(fn: Any) -> Any:
            result = await c_call(fn)
            if claims(fn):
                claimed, blocker = result
                if claimed or (blocker is not None and blocker[0] != holder):
                    c_tried.set()
            return result

        b.cluster._node.db.call = b_slow  # type: ignore[method-assign]
        c.cluster._node.db.call = c_watched  # type: ignore[method-assign]
        queued = []
        for peer, text in ((cb, "1"), (cc, "2")):
            run_id = await peer.start_run(
                agent="a", input=text, session_id="s", on_busy="enqueue", subscribe="all"
            )
            await peer.wait_status(run_id, "queued")
            queued.append(run_id)
        armed.set()
        gate.set()
        assert (await ca.wait_terminal(holder))["event"]["status"] == "completed"
        for peer, run_id in zip((cb, cc), queued, strict=True):
            assert (await peer.wait_terminal(run_id))["event"]["status"] == "completed"
    last = model.requests[-1].items
    assert [i.content for i in last if isinstance(i, ta.UserMessage)] == ["0", "1", "2"]


async def test_a_full_node_places_runs_on_a_node_with_room(pg_dsn: str) -> None:
    gate = trio.Event()
    _, served = waiting_agents(gate, every_turn=True)
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", served), max_runs=1) as (a, b),
        clients(a) as (ca,),
    ):
        first = await ca.start_until_tool(agent="a", input="1")
        # B's heartbeat has told the cluster it has room; A is full.
        second = await ca.start_run(agent="a", input="2", subscribe="status")
        assert b.server.statistics().active_runs == 1
        assert a.server.statistics().active_runs == 1
        await ca.wait_status(second, "running")
        # Every node full: queued for capacity (tests/cluster/test_cluster_capacity.py).
        third = await ca.start_run(agent="a", input="3", subscribe="status")
        await ca.wait_status(third, "queued")
        for run_id in (third, first, second):
            await ca.end(run_id)


async def test_a_placed_run_is_cancelled_when_its_client_disconnects(pg_dsn: str) -> None:
    # on_disconnect="cancel" holds for a run.start that a full node placed on another
    # node (DESIGN §10): the disconnect from B cancels the run on A.
    gate = trio.Event()
    _, served = waiting_agents(gate, every_turn=True)
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", served), max_runs={"A": 2, "B": 1}) as (
            a,
            b,
        ),
        clients(a, b) as (ca, cb),
    ):
        first = await cb.start_until_tool(agent="a", input="1")
        async with client(b.url) as leaving:
            placed = await leaving.start_run(agent="a", input="2", on_disconnect="cancel")
            assert a.server.statistics().active_runs == 1  # B is full: placed on A
            kept = await leaving.start_run(agent="a", input="3")
            await ca.ok("run.subscribe", run_id=placed)
            await ca.ok("run.subscribe", run_id=kept)
            await ca.wait_event(placed, lambda e: e["type"] == "tool.started")
            await ca.wait_event(kept, lambda e: e["type"] == "tool.started")
        done = (await ca.wait_terminal(placed))["event"]
        assert (done["status"], done["reason"]) == ("cancelled", "client disconnected")
        # on_disconnect="continue" (the default): the other placed run goes on.
        assert ca.events[kept][-1]["event"]["type"] == "tool.started"
        assert a.server.statistics().active_runs == 1
        for watcher, run_id in ((cb, first), (ca, kept)):
            await cb.ok("run.cancel", run_id=run_id)
            await watcher.wait_terminal(run_id)


async def test_a_placed_start_whose_node_dies_before_answering_is_acked_with_its_run(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # C is full and places a run.start (on_disconnect="cancel") on A or B; that node
    # starts the run and dies before it could answer. C's wait for the answer ends
    # (shortened here): the run exists, so the client gets its id (not "internal",
    # which a retry would answer with a second run), and its disconnect cancels the
    # run on the node that took it over.
    monkeypatch.setattr("trio_agents.cluster._routing.ROUTE_TIMEOUT", 3.0)
    async with behind_a_full_node(pg_dsn, "A", "B", lease_ttl=0.5) as ((a, b, c), cc, first):
        started: list[Any] = []
        crashed = trio.Event()

        def dying(target: Any) -> Any:
            execute = target.cluster._node.router.execute

            async def started_then_dies(*args: Any) -> Any:
                if not isinstance(args[0], StartRequest):
                    return await execute(*args)
                await execute(*args)  # the run starts there
                started.append(target)
                target.crash()
                crashed.set()
                await trio.sleep_forever()

            return started_then_dies

        for target in (a, b):
            monkeypatch.setattr(target.cluster._node.router, "execute", dying(target))
        async with client(c.url) as leaving:
            placed = await leaving.start_run(agent="a", input="2", on_disconnect="cancel")
            # C may answer once the run's row is there, before execute() has returned
            with trio.fail_after(30):
                await crashed.wait()
            (dead,) = started
            alive = b if dead is a else a
            async with client(alive.url) as watcher:
                await watcher.ok("run.subscribe", run_id=placed, from_seq=1)
                await watcher.wait_event(
                    placed,
                    lambda e: e["type"] == "run.updated" and e.get("detail", {}).get("resumed"),
                )
                await leaving.ws.aclose()  # the client leaves: its run is cancelled
                done = (await watcher.wait_terminal(placed))["event"]
        assert (done["status"], done["reason"]) == ("cancelled", "client disconnected")
        await cc.end(first)


async def test_a_placed_start_its_node_gave_up_on_never_starts(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # C is full and places a run.start on A, which is slow: C gives up waiting
    # (shortened here) and answers "internal" (retry). The start A then gets to must
    # not start a run nobody knows of: it finds the command withdrawn and refuses.
    monkeypatch.setattr("trio_agents.cluster._routing.ROUTE_TIMEOUT", 1.0)
    async with behind_a_full_node(pg_dsn, "A") as ((a, _c), cc, first):
        gave_up = trio.Event()
        late: list[Any] = []
        execute = a.cluster._node.router.execute
        assert execute is not None

        async def slow(*args: Any) -> Any:
            await gave_up.wait()
            try:
                return await execute(*args)
            except Exception as exc:
                late.append(exc)
                raise
            finally:
                late.append("done")

        monkeypatch.setattr(a.cluster._node.router, "execute", slow)
        answer = await cc.request("run.start", agent="a", input="2")
        assert (answer["type"], answer["code"]) == ("error", "internal"), answer
        gave_up.set()
        with trio.fail_after(30):
            while "done" not in late:  # noqa: ASYNC110 (no event to wait for)
                await trio.sleep(0.05)
        assert a.server.statistics().active_runs == 0
        with psycopg.connect(pg_dsn) as conn:
            rows = conn.execute("SELECT run_id FROM trio_agents_runs").fetchall()
        assert [row[0] for row in rows] == [first]
        await cc.end(first)


async def test_a_connection_forgets_its_finished_placed_runs(pg_dsn: str) -> None:
    # What a connection remembers of the runs it placed elsewhere stays bounded.
    gate = trio.Event()
    _, served = waiting_agents(gate)
    limits = Limits(ping_interval=None, shutdown_timeout=10.0, max_runs_per_principal=1)
    async with (
        open_nodes(
            pg_dsn,
            dict.fromkeys("AB", served),
            max_runs={"B": 1},
            limits=limits,
        ) as (a, b),
        client(b.url, token="tok-bob") as bob,
        client(b.url) as alice,
    ):
        held = await bob.ok("run.start", agent="a", input="1", subscribe="all")
        # B is full from now on (and the scripted tool call is bob's).
        await bob.wait_event(held["run_id"], lambda e: e["type"] == "tool.started")
        for n in range(5):
            run_id = (
                await alice.ok(
                    "run.start",
                    agent="a",
                    input=str(n),
                    on_disconnect="cancel",
                    subscribe="status",
                )
            )["run_id"]
            await alice.wait_terminal(run_id)
        assert len(placed_runs(b, "alice")) <= 2
        assert a.server.statistics().active_runs == 0
        gate.set()
        await bob.wait_terminal(held["run_id"])


async def test_postgresql_restarted_under_load(
    pg_dsn: str, postgres_server: PostgresServer
) -> None:
    gate = trio.Event()
    started: list[str] = []
    model, served = waiting_agents(gate, started, every_turn=True)
    done_model = ScriptedModel([], default="finished")
    count = 6
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", served), lease_ttl=15.0) as (a, b),
        clients(a, b) as (ca, cb),
    ):
        runs: list[str] = []
        for i in range(count):
            c = ca if i % 2 else cb
            runs.append(
                await c.start_run(agent="a", input=f"{i}", session_id=f"s{i}", subscribe="all")
            )
        for i, run_id in enumerate(runs):
            await (ca if i % 2 else cb).wait_event(run_id, lambda e: e["type"] == "tool.started")
        assert len(started) == count
        # Subscribers on the other node follow every run through the restart.
        for i, run_id in enumerate(runs):
            await (cb if i % 2 else ca).ok("run.subscribe", run_id=run_id, from_seq=1)
        await trio.to_thread.run_sync(postgres_server.restart)
        model._default = done_model._default  # the next turns answer
        gate.set()
        for i, run_id in enumerate(runs):
            for c in (ca, cb):
                done = await c.wait_terminal(run_id)
                assert done["event"]["status"] == "completed", done
            follower = cb if i % 2 else ca
            seqs = follower.seqs(run_id)
            assert seqs == list(range(1, len(seqs) + 1))
        assert a.cluster.statistics().reconnects >= 1
        assert b.cluster.statistics().reconnects >= 1
        assert a.cluster.statistics().takeovers == b.cluster.statistics().takeovers == 0
    assert len(set(started)) == len(started) == count
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT status, attempt, finished FROM trio_agents_runs ORDER BY run_id"
        ).fetchall()
        assert rows == [("completed", 1, True)] * count
        for run_id in runs:
            seqs = [
                r[0]
                for r in conn.execute(
                    "SELECT seq FROM trio_agents_events WHERE run_id = %s ORDER BY seq",
                    (run_id,),
                ).fetchall()
            ]
            assert seqs == list(range(1, len(seqs) + 1))
