"""Adversarial review of the cluster-ops changes (approvals exactly-once, a dead
client's node, cluster-wide queue order, placed starts cut before their ack, leases
renewed only for the runs a process runs): each test proves a defect that was found,
against the real PostgreSQL the suite starts, with in-process nodes
(tests/support/cluster_support.py).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_nodes import agents, server_connections
from tests.support.cluster_support import client, node
from trio_agents.cluster._cluster_placement import ClusterPlacement
from trio_agents.models import ScriptedModel, Turn


def blocking_tool(started: trio.Event) -> ta.Tool:
    @ta.function_tool
    async def wait() -> str:
        """Wait until cancelled (not idempotent)."""
        started.set()
        await trio.sleep_forever()

    return wait


def row_of(dsn: str, run_id: str) -> tuple[Any, ...] | None:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT owner, attempt, lease_expires_at > now() FROM trio_agents_runs"
            " WHERE run_id = %s",
            (run_id,),
        ).fetchone()


def queued_rows(dsn: str, other_than: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [
            str(r[0])
            for r in conn.execute(
                "SELECT run_id FROM trio_agents_runs WHERE run_id <> %s AND NOT finished",
                (other_than,),
            ).fetchall()
        ]


async def test_a_run_whose_start_waits_for_its_holders_cancel_keeps_its_lease(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # run.start with on_busy="interrupt" inserts the run's row, then cancels the
    # session's holder before the run is tracked; that cancel is routed to the
    # holder's node and may wait for a while (up to 30 s: the holder's node died and
    # its runs wait for their takeover, say). Meanwhile the new run's lease must be
    # renewed like any run this node runs: it was not (the heartbeat renewed only
    # the tracked runs), so the row expired and a node took the run over while its
    # first attempt was still being started.
    started = trio.Event()
    model = ScriptedModel([Turn(tool_calls=[("wait", {})])], default="done")
    served = agents(model, [blocking_tool(started)])
    ttl = 1.0
    seen: list[tuple[Any, ...] | None] = []
    real = ClusterPlacement.supersede

    async def slow_supersede(
        placement: ClusterPlacement, principal: str, run_id: str, node: Any
    ) -> None:
        # The holder's cancel takes well over lease_ttl to be answered.
        (new,) = await trio.to_thread.run_sync(queued_rows, pg_dsn, run_id)
        leases = a.cluster._node.leases
        until = trio.current_time() + 2 * ttl
        while leases.renewed_at <= until:  # noqa: ASYNC110 (a heartbeat sent after it)
            await trio.sleep(ttl / 6)
        seen.append(await trio.to_thread.run_sync(row_of, pg_dsn, new))
        await real(placement, principal, run_id, node)

    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, served, pg_dsn, "A", lease_ttl=ttl) as a,
            node(nursery, served, pg_dsn, "B", lease_ttl=ttl),
            client(a.url) as ca,
        ):
            await ca.ok("run.start", agent="a", input="1", session_id="s")
            with trio.fail_after(30):
                await started.wait()
            monkeypatch.setattr(ClusterPlacement, "supersede", slow_supersede)
            second = await ca.start_run(
                agent="a", input="2", session_id="s", on_busy="interrupt", subscribe="all"
            )
            assert seen == [("A", 1, True)]  # still its first attempt, its lease renewed
            done = (await ca.wait_terminal(second))["event"]
            assert done["status"] == "completed", done
            assert not [f for f in ca.events[second] if f["event"].get("detail", {}).get("resumed")]
        nursery.cancel_scope.cancel()


async def test_a_placed_start_cut_on_its_clients_node_is_still_cancelled_with_its_client(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client on B (full) starts an on_disconnect="cancel" run, placed on A; A starts
    # it but is slow to answer. Meanwhile B cuts the client's connection (a ping or
    # send timeout: a dead client), which cancels the request being served. The run
    # on A must be cancelled like any run of that client ("client disconnected"): it
    # went on forever (B, alive, never knew of it; A's check only covers dead nodes).
    started = trio.Event()
    model = ScriptedModel([], default=Turn(tool_calls=[("wait", {})]))
    served = agents(model, [blocking_tool(started)])
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, served, pg_dsn, "A", lease_ttl=1.0) as a,
            node(nursery, served, pg_dsn, "B", lease_ttl=1.0, max_runs=1) as b,
            client(a.url) as ca,
        ):
            async with client(b.url) as cb:
                await cb.ok("run.start", agent="a", input="1")  # B is full now
                with trio.fail_after(30):
                    await started.wait()
                execute = a.cluster._node.router.execute
                assert execute is not None
                answered = trio.Event()
                placed: list[str] = []

                async def slow_answer(request: Any, origin: Any) -> Any:
                    assert execute is not None
                    fields = await execute(request, origin)
                    placed.append(fields.fields["run_id"])
                    await answered.wait()
                    return fields

                monkeypatch.setattr(a.cluster._node.router, "execute", slow_answer)
                await cb.ws.send_message(
                    '{"id": "p", "op": "run.start", "agent": "a", "input": "2",'
                    ' "on_disconnect": "cancel"}'
                )
                with trio.fail_after(30):
                    while not placed:  # noqa: ASYNC110 (started on A, not answered yet)
                        await trio.sleep(0.01)
                (connection,) = server_connections(b)
                connection._stop()  # B cuts the client off mid-request
                answered.set()
            (run_id,) = placed
            await ca.ok("run.subscribe", run_id=run_id, from_seq=1)
            done = (await ca.wait_terminal(run_id))["event"]
            assert (done["status"], done["reason"]) == ("cancelled", "client disconnected")
        nursery.cancel_scope.cancel()
