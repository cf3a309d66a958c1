"""Runs queued for capacity: a ``run.start`` when every node is full is acked, the run
``queued`` until a node has room (DESIGN §12, issue 17)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from tests.support.cluster_nodes import clients, open_nodes, waiting_agents
from tests.support.cluster_support import Client, Node, client
from trio_agents.control import Limits
from trio_agents.models import ScriptedModel

# Leases so long that no periodic scan comes during a test: a queued run is claimed
# because a run ended (room freed) or a run was queued (NOTIFY), or not at all.
SLOW = 600.0


def statuses(c: Client, run_id: str) -> list[str]:
    return [
        f["event"]["status"]
        for f in c.events.get(run_id, [])
        if f["event"]["type"] == "run.updated"
    ]


async def fill(ca: Client, cb: Client) -> tuple[str, str]:
    """One waiting run on each node (A and B, max_runs=1)."""
    held = []
    for c in (ca, cb):
        run_id = await c.start_until_tool(agent="a", input="hold")
        held.append(run_id)
    return held[0], held[1]


@asynccontextmanager
async def full_cluster(
    dsn: str, *, lease_ttl: float = 5.0, limits: Limits | None = None
) -> AsyncIterator[tuple[ScriptedModel, list[Node], list[Client], tuple[str, str]]]:
    """Nodes A and B (``max_runs=1``) whose runs call the tool ``wait`` every turn,
    each full with one run in that call: the model, the nodes, a client on each node
    and the two runs (:func:`fill`)."""
    model, served = waiting_agents(trio.Event(), every_turn=True)
    async with (
        open_nodes(
            dsn, dict.fromkeys("AB", served), lease_ttl=lease_ttl, max_runs=1, limits=limits
        ) as opened,
        clients(*opened) as connected,
    ):
        yield model, opened, connected, await fill(*connected)


def runs_on(n: Node, run_id: str) -> bool:
    registry = n.cluster._node.registry
    assert registry is not None
    entry = registry.runs.get(run_id)
    return entry is not None and not entry.done.is_set()


async def test_a_start_on_a_full_cluster_is_queued_and_runs_when_a_slot_frees(
    pg_dsn: str,
) -> None:
    async with full_cluster(pg_dsn, lease_ttl=SLOW) as (_, (a, b), (ca, cb), (held_a, held_b)):
        queued = await ca.start_run(agent="a", input="q", subscribe="all")
        first = await ca.wait_event(queued, lambda e: e["type"] == "run.updated")
        assert (first["seq"], first["event"]["status"]) == (1, "queued")
        for c in (ca, cb):  # any node shows it queued
            info = (await c.ok("run.get", run_id=queued))["run"]
            assert info["status"] == "queued"
            listed = {r["run_id"]: r["status"] for r in (await c.ok("runs.list"))["runs"]}
            assert listed[queued] == "queued"
        assert not runs_on(a, queued)
        assert not runs_on(b, queued)
        # A slot frees on B (the client is connected to A): the run starts there.
        await cb.end(held_b)
        await ca.wait_status(queued, "running")
        assert runs_on(b, queued)
        assert not runs_on(a, queued)
        await ca.wait_event(queued, lambda e: e["type"] == "tool.started")
        await ca.end(queued)
        await ca.end(held_a)
        seqs = ca.seqs(queued)
        assert seqs == list(range(1, len(seqs) + 1))
        assert statuses(ca, queued)[0] == "queued"


async def test_queued_starts_run_in_the_order_they_were_started(pg_dsn: str) -> None:
    async with full_cluster(pg_dsn, lease_ttl=SLOW) as (_, (a, b), (ca, cb), (held_a, held_b)):
        # Queued through B, then through A: B's goes first wherever room frees.
        first = await cb.start_run(agent="a", input="1", subscribe="all")
        await cb.wait_status(first, "queued")
        second = await ca.start_run(agent="a", input="2", subscribe="all")
        await ca.wait_status(second, "queued")
        await ca.end(held_a)
        await cb.wait_event(first, lambda e: e["type"] == "tool.started")
        assert runs_on(a, first)
        assert statuses(ca, second) == ["queued"]  # no room left for it
        assert (await cb.ok("run.get", run_id=second))["run"]["status"] == "queued"
        await cb.end(held_b)
        await ca.wait_event(second, lambda e: e["type"] == "tool.started")
        assert runs_on(b, second)
        for c, run_id in ((cb, first), (ca, second)):
            await c.end(run_id)


async def test_a_queued_run_cancelled_from_another_node_never_starts(pg_dsn: str) -> None:
    async with full_cluster(pg_dsn) as (model, (a, b), (ca, cb), (held_a, held_b)):
        queued = await ca.start_run(agent="a", input="q", subscribe="all")
        await ca.wait_status(queued, "queued")
        await cb.ok("run.cancel", run_id=queued, reason="changed my mind")
        terminal = (await ca.wait_terminal(queued))["event"]
        assert (terminal["status"], terminal["reason"]) == ("cancelled", "changed my mind")
        assert statuses(ca, queued) == ["queued", "cancelled"]
        answer = await ca.request("run.cancel", run_id=queued)
        assert (answer["type"], answer["code"]) == ("error", "run_closed")
        calls = len(model.requests)
        await cb.end(held_b)  # room frees: nothing is left to claim
        await ca.end(held_a)
        await b.cluster._node.leases.scan()
        assert not runs_on(a, queued)
        assert not runs_on(b, queued)
        assert len(model.requests) == calls
        assert (await cb.ok("run.get", run_id=queued))["run"]["status"] == "cancelled"


async def test_a_queued_run_of_a_disconnected_client_is_cancelled(pg_dsn: str) -> None:
    _, served = waiting_agents(trio.Event(), every_turn=True)
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", served), max_runs=1) as (a, _b),
        clients(a, a) as (ca, watcher),
    ):
        async with client(a.url) as cb:
            await fill(ca, cb)
            queued = (await cb.ok("run.start", agent="a", input="q", on_disconnect="cancel"))[
                "run_id"
            ]
        await watcher.ok("run.subscribe", run_id=queued, from_seq=1)
        terminal = (await watcher.wait_terminal(queued))["event"]
        assert (terminal["status"], terminal["reason"]) == ("cancelled", "client disconnected")
        assert not runs_on(a, queued)


async def test_runs_queued_for_capacity_are_bounded_per_principal(pg_dsn: str) -> None:
    limits = Limits(ping_interval=None, shutdown_timeout=10.0, max_runs_per_principal=2)
    async with (
        full_cluster(pg_dsn, limits=limits) as (_, (_a, b), (ca, cb), _),
        client(b.url, token="tok-bob") as bob,
    ):
        queued = [
            (await c.ok("run.start", agent="a", input=str(i)))["run_id"]
            for i, c in enumerate((ca, cb))
        ]
        over = await ca.request("run.start", agent="a", input="3")
        assert (over["type"], over["code"]) == ("error", "limit_exceeded")
        # The bound is per principal: another one still queues.
        await bob.ok("run.start", agent="a", input="b")
        # A queued run that ends makes room in the queue.
        await cb.ok("run.cancel", run_id=queued[0])
        await ca.ok("run.start", agent="a", input="4")
