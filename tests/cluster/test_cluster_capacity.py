"""Runs queued for capacity: a ``run.start`` when every node is full is acked, the run
``queued`` until a node has room (DESIGN §12, issue 17)."""

from __future__ import annotations

import trio

import trio_agents as ta
from tests.support.cluster_support import Client, Node, client, node
from trio_agents.control import Limits
from trio_agents.models import ScriptedModel, Turn

# Leases so long that no periodic scan comes during a test: a queued run is claimed
# because a run ended (room freed) or a run was queued (NOTIFY), or not at all.
SLOW = 600.0


def agents(model: ta.Model, tools: list[ta.Tool]) -> dict[str, ta.Agent]:
    return {"a": ta.Agent(name="a", instructions="", model=model, tools=tools)}


def gated_tool(gate: trio.Event) -> ta.Tool:
    @ta.function_tool
    async def wait() -> str:
        """Wait for the gate."""
        await gate.wait()
        return "done"

    return wait


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
        run_id = await c.start_run(agent="a", input="hold", subscribe="all")
        await c.wait_event(run_id, lambda e: e["type"] == "tool.started")
        held.append(run_id)
    return held[0], held[1]


async def end(c: Client, run_id: str) -> None:
    await c.ok("run.cancel", run_id=run_id)
    await c.wait_terminal(run_id)


def runs_on(n: Node, run_id: str) -> bool:
    registry = n.cluster._registry
    assert registry is not None
    entry = registry.runs.get(run_id)
    return entry is not None and not entry.done.is_set()


async def test_a_start_on_a_full_cluster_is_queued_and_runs_when_a_slot_frees(
    pg_dsn: str,
) -> None:
    gate = trio.Event()
    model = ScriptedModel([], default=Turn(tool_calls=[("wait", {})]))
    tools = [gated_tool(gate)]
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, agents(model, tools), pg_dsn, "A", max_runs=1, lease_ttl=SLOW) as a,
            node(nursery, agents(model, tools), pg_dsn, "B", max_runs=1, lease_ttl=SLOW) as b,
            client(a.url) as ca,
            client(b.url) as cb,
        ):
            held_a, held_b = await fill(ca, cb)
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
            await end(cb, held_b)
            await ca.wait_status(queued, "running")
            assert runs_on(b, queued)
            assert not runs_on(a, queued)
            await ca.wait_event(queued, lambda e: e["type"] == "tool.started")
            await end(ca, queued)
            await end(ca, held_a)
            seqs = ca.seqs(queued)
            assert seqs == list(range(1, len(seqs) + 1))
            assert statuses(ca, queued)[0] == "queued"
        nursery.cancel_scope.cancel()


async def test_queued_starts_run_in_the_order_they_were_started(pg_dsn: str) -> None:
    gate = trio.Event()
    model = ScriptedModel([], default=Turn(tool_calls=[("wait", {})]))
    tools = [gated_tool(gate)]
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, agents(model, tools), pg_dsn, "A", max_runs=1, lease_ttl=SLOW) as a,
            node(nursery, agents(model, tools), pg_dsn, "B", max_runs=1, lease_ttl=SLOW) as b,
            client(a.url) as ca,
            client(b.url) as cb,
        ):
            held_a, held_b = await fill(ca, cb)
            # Queued through B, then through A: B's goes first wherever room frees.
            first = await cb.start_run(agent="a", input="1", subscribe="all")
            await cb.wait_status(first, "queued")
            second = await ca.start_run(agent="a", input="2", subscribe="all")
            await ca.wait_status(second, "queued")
            await end(ca, held_a)
            await cb.wait_event(first, lambda e: e["type"] == "tool.started")
            assert runs_on(a, first)
            assert statuses(ca, second) == ["queued"]  # no room left for it
            assert (await cb.ok("run.get", run_id=second))["run"]["status"] == "queued"
            await end(cb, held_b)
            await ca.wait_event(second, lambda e: e["type"] == "tool.started")
            assert runs_on(b, second)
            for c, run_id in ((cb, first), (ca, second)):
                await end(c, run_id)
        nursery.cancel_scope.cancel()


async def test_a_queued_run_cancelled_from_another_node_never_starts(pg_dsn: str) -> None:
    gate = trio.Event()
    model = ScriptedModel([], default=Turn(tool_calls=[("wait", {})]))
    tools = [gated_tool(gate)]
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, agents(model, tools), pg_dsn, "A", max_runs=1) as a,
            node(nursery, agents(model, tools), pg_dsn, "B", max_runs=1) as b,
            client(a.url) as ca,
            client(b.url) as cb,
        ):
            held_a, held_b = await fill(ca, cb)
            queued = await ca.start_run(agent="a", input="q", subscribe="all")
            await ca.wait_status(queued, "queued")
            await cb.ok("run.cancel", run_id=queued, reason="changed my mind")
            terminal = (await ca.wait_terminal(queued))["event"]
            assert (terminal["status"], terminal["reason"]) == ("cancelled", "changed my mind")
            assert statuses(ca, queued) == ["queued", "cancelled"]
            answer = await ca.request("run.cancel", run_id=queued)
            assert (answer["type"], answer["code"]) == ("error", "run_closed")
            calls = len(model.requests)
            await end(cb, held_b)  # room frees: nothing is left to claim
            await end(ca, held_a)
            await b.cluster._leases.scan()
            assert not runs_on(a, queued)
            assert not runs_on(b, queued)
            assert len(model.requests) == calls
            assert (await cb.ok("run.get", run_id=queued))["run"]["status"] == "cancelled"
        nursery.cancel_scope.cancel()


async def test_a_queued_run_of_a_disconnected_client_is_cancelled(pg_dsn: str) -> None:
    gate = trio.Event()
    model = ScriptedModel([], default=Turn(tool_calls=[("wait", {})]))
    tools = [gated_tool(gate)]
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, agents(model, tools), pg_dsn, "A", max_runs=1) as a,
            node(nursery, agents(model, tools), pg_dsn, "B", max_runs=1),
            client(a.url) as ca,
            client(a.url) as watcher,
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
        nursery.cancel_scope.cancel()


async def test_runs_queued_for_capacity_are_bounded_per_principal(pg_dsn: str) -> None:
    gate = trio.Event()
    model = ScriptedModel([], default=Turn(tool_calls=[("wait", {})]))
    tools = [gated_tool(gate)]
    limits = Limits(ping_interval=None, shutdown_timeout=10.0, max_runs_per_principal=2)
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, agents(model, tools), pg_dsn, "A", max_runs=1, limits=limits) as a,
            node(nursery, agents(model, tools), pg_dsn, "B", max_runs=1, limits=limits) as b,
            client(a.url) as ca,
            client(b.url) as cb,
            client(b.url, token="tok-bob") as bob,
        ):
            await fill(ca, cb)
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
        nursery.cancel_scope.cancel()
