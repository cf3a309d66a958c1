"""Run trees in a cluster (DESIGN §12, §17): a tree runs on its root's node, and is as
reachable from any node as a single run — a client of another node subscribes to a
child run (from any seq, no gap, no duplicate) and to the whole tree, from the
cluster's persisted log.

In-process nodes on the suite's real PostgreSQL (``tests/support/cluster_nodes.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.cluster_nodes import (
    clients,
    dies_recording,
    open_nodes,
    request_as_owner_dies,
    row_of,
)
from tests.support.cluster_support import Client, Node
from trio_agents.models import ScriptedModel, Turn

_TERMINAL = ("completed", "failed", "cancelled")


def tree_agents(gate: trio.Event, *, resumed: bool = False) -> dict[str, ta.Agent]:
    """``root`` asks ``helper`` (an agent tool) once, then answers ``root done``;
    ``helper`` calls its tool ``wait`` (which waits for ``gate``), then answers
    ``helper done``. Fresh models per call: each node serves its own. ``resumed``:
    the agents of a node that takes the tree over mid-call (the root's next request
    comes after the helper's answer)."""

    @ta.function_tool
    async def wait() -> str:
        """Wait for the gate."""
        await gate.wait()
        return "waited"

    helper = ta.Agent(
        name="helper",
        model=ScriptedModel([Turn(tool_calls=[("wait", {})]), "helper done"]),
        tools=[wait],
    )
    root = ta.Agent(
        name="root",
        model=ScriptedModel(
            ["root done"] if resumed else [Turn(tool_calls=[("helper", {"input": "dig"})])],
            default="root done",
        ),
        tools=[helper.as_tool()],
    )
    return {"root": root, "helper": helper}


@asynccontextmanager
async def a_tree_on_a(
    dsn: str,
) -> AsyncIterator[tuple[trio.Event, tuple[Node, Node], Client, Client, str, str]]:
    """Nodes A and B, a client of each, and a tree started on A whose child is in its
    tool (held by the gate the block gets first), A's client subscribed to the tree:
    yields the gate, the nodes, the clients, the root's id and the child's."""
    gate = trio.Event()
    async with (
        open_nodes(dsn, {"A": tree_agents(gate), "B": tree_agents(gate)}) as (a, b),
        clients(a, b) as (ca, cb),
    ):
        root_id, child_id = await start_tree(ca)
        yield gate, (a, b), ca, cb, root_id, child_id


async def start_tree(ca: Client) -> tuple[str, str]:
    """Start ``root`` (session ``t``) through ``ca``, subscribed to its tree, until its
    child's tool has started: the root's id and the child's."""
    root_id = await ca.start_run(agent="root", input="go", session_id="t")
    await ca.ok("run.subscribe", run_id=root_id, tree=True)
    announced = await ca.wait_event(
        root_id, lambda e: e["type"] == "run.child" and e["status"] == "queued"
    )
    child_id = str(announced["event"]["child_id"])
    await ca.wait_event(child_id, lambda e: e["type"] == "tool.started")
    return root_id, child_id


def frames_of(c: Client, run_id: str) -> list[tuple[int, str]]:
    return [(f["seq"], f["event"]["type"]) for f in c.events.get(run_id, [])]


def check_log(c: Client, run_id: str) -> list[dict[str, Any]]:
    """Every seq once, in order, from 1, ending with the one terminal update."""
    events = [f["event"] for f in c.events[run_id]]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), frames_of(c, run_id)
    ends = [e for e in events if e["type"] == "run.updated" and e["status"] in _TERMINAL]
    assert ends == [events[-1]], frames_of(c, run_id)
    return events


async def test_a_client_of_another_node_subscribes_to_a_child_run(pg_dsn: str) -> None:
    # Before: invalid_request ("a child's events are not in the cluster's log").
    async with a_tree_on_a(pg_dsn) as (gate, _nodes, ca, cb, root_id, child_id):
        await cb.ok("run.subscribe", run_id=child_id, from_seq=1)
        await cb.wait_event(child_id, lambda e: e["type"] == "tool.started")
        gate.set()
        await cb.wait_terminal(child_id)
        await ca.wait_terminal(root_id)
        seen_on_b = check_log(cb, child_id)
        assert seen_on_b[-1]["status"] == "completed"
        # The same log the node running the tree gave its own subscriber.
        assert seen_on_b == [f["event"] for f in ca.events[child_id]]
        # From a later seq: the rest of it, once each.
        start = len(seen_on_b) // 2
        async with clients(_nodes[1]) as (again,):
            await again.ok("run.subscribe", run_id=child_id, from_seq=start)
            await again.wait_terminal(child_id)
        assert [f["event"] for f in again.events[child_id]] == seen_on_b[start - 1 :]


async def test_a_client_of_another_node_subscribes_to_a_child_from_a_later_seq_live(
    pg_dsn: str,
) -> None:
    async with a_tree_on_a(pg_dsn) as (gate, _nodes, ca, cb, _root_id, child_id):
        on_a = frames_of(ca, child_id)
        await cb.ok("run.subscribe", run_id=child_id, from_seq=2)
        await cb.wait_event(child_id, lambda e: e["type"] == "tool.started")
        gate.set()
        await cb.wait_terminal(child_id)
        await ca.wait_terminal(child_id)
        seqs = [f["seq"] for f in cb.events[child_id]]
        assert seqs == list(range(2, seqs[-1] + 1))
        assert seqs[-1] == ca.events[child_id][-1]["seq"]
        assert frames_of(cb, child_id)[: len(on_a) - 1] == on_a[1:]


async def test_a_tree_subscription_on_another_node_sees_the_childrens_events(
    pg_dsn: str,
) -> None:
    # Before: invalid_request ("tree events are not in the cluster's log").
    async with a_tree_on_a(pg_dsn) as (gate, _nodes, ca, cb, root_id, child_id):
        await cb.ok("run.subscribe", run_id=root_id, tree=True)
        await cb.wait_event(child_id, lambda e: e["type"] == "tool.started")
        gate.set()
        await cb.wait_terminal(root_id)
        await ca.wait_terminal(root_id)
        for run_id in (root_id, child_id):
            events = check_log(cb, run_id)
            assert events == [f["event"] for f in ca.events[run_id]]
            assert events[-1]["status"] == "completed"
        # The root's terminal update ends the merged stream, after the child's.
        order = cb.order
        assert order[-1] == (root_id, cb.events[root_id][-1]["seq"])
        assert order.index((child_id, cb.events[child_id][-1]["seq"])) < len(order) - 1


@asynccontextmanager
async def a_tree_taken_over(
    dsn: str,
) -> AsyncIterator[tuple[dict[str, Client], Client, str, str]]:
    """Nodes A, B and C (a short lease), a client of each; a tree started on A, its
    child mid-tool, followed from seq 1 by a watcher (another client of B); A then
    "crashes" and B or C takes the tree over. Yields the clients of B and C by node id,
    the watcher, the root's id and the child's, once the child has been resumed (its
    next tool started)."""
    gate = trio.Event()  # never set: every child's tool waits until the test cancels
    serving = {
        "A": tree_agents(gate),
        "B": tree_agents(gate, resumed=True),
        "C": tree_agents(gate, resumed=True),
    }
    async with (
        open_nodes(dsn, serving, lease_ttl=1.0) as (a, b, c),
        clients(a, b, c, b) as (ca, cb, cc, watcher),
    ):
        root_id, child_id = await start_tree(ca)
        await watcher.ok("run.subscribe", run_id=child_id, from_seq=1)
        first = await watcher.wait_event(child_id, lambda e: e["type"] == "tool.started")
        a.crash()
        await watcher.wait_event(
            child_id, lambda e: e["type"] == "tool.started" and e["seq"] > first["event"]["seq"]
        )
        yield {"B": cb, "C": cc}, watcher, root_id, child_id


async def test_a_childs_log_continues_under_its_id_after_a_takeover(pg_dsn: str) -> None:
    # Before: the resumed tree ran the child under a new id; the old id's log stopped
    # where the dead node left it, and a subscriber of it never saw the child end.
    async with a_tree_taken_over(pg_dsn) as (on, watcher, root_id, child_id):
        cb, cc = on["B"], on["C"]
        await cc.ok("run.subscribe", run_id=root_id, tree=True)  # from its start
        await cb.ok("run.cancel", run_id=child_id, reason="enough")
        await cc.wait_terminal(root_id)
        await watcher.wait_terminal(child_id)
        events = check_log(watcher, child_id)  # one subscription across the takeover
        assert check_log(cc, child_id) == events  # the tree's, replayed and live
        resumed = [e for e in events if (e.get("detail") or {}).get("resumed")]
        assert [e["status"] for e in resumed] == ["running"], events
        assert (events[-1]["status"], events[-1]["reason"]) == ("cancelled", "enough")
        results = [
            e["item"]
            for e in events
            if e["type"] == "run.item" and e["item"]["type"] == "function_call_output"
        ]
        assert results[0]["output"].startswith("interrupted"), results  # never ran twice
        root_events = [f for f in cc.events[root_id] if f["event"]["type"] == "run.child"]
        assert {f["event"]["child_id"] for f in root_events} == {child_id}
        assert root_events[-1]["event"]["status"] == "cancelled"
        assert check_log(cc, root_id)[-1]["status"] == "completed"
        assert cc.order[-1] == (root_id, cc.events[root_id][-1]["seq"])


async def test_an_op_on_a_child_by_its_id_is_routed_to_the_node_that_took_its_tree_over(
    pg_dsn: str,
) -> None:
    # A client holding the child's id sends ops to it after its node died: they reach
    # the node running the tree now (whichever of B and C took it over), answered for
    # real. Before: not_found (the resumed child had another id).
    async with a_tree_taken_over(pg_dsn) as (on, _watcher, root_id, child_id):
        owner = (await row_of(pg_dsn, root_id))["owner"]
        other = on["C" if owner == "B" else "B"]
        got = await other.ok("run.get", run_id=child_id)
        assert (got["run"]["status"], got["run"]["parent_id"]) == ("running", root_id)
        injected = await other.ok("run.inject", run_id=child_id, items="hurry")
        assert injected["injection_id"]
        await other.ok("run.subscribe", run_id=child_id, from_seq=1)
        await other.ok("run.cancel", run_id=child_id, reason="enough")
        end = (await other.wait_terminal(child_id))["event"]
        assert (end["status"], end["reason"]) == ("cancelled", "enough")
        check_log(other, child_id)
        injections = [
            e for e in (f["event"] for f in other.events[child_id]) if e["type"] == "inbox.injected"
        ]
        assert [e["injection_id"] for e in injections] == [injected["injection_id"]]


async def test_a_cancel_of_a_child_acked_before_its_node_died_holds_after_the_takeover(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client of B cancels the child A runs; A records the cancel (with its answer)
    # and dies before applying it. The client has its ack; B resumes the tree and the
    # child ends cancelled, with that reason, before its model is asked anything.
    # Before: nothing was recorded, and the resumed child ran on (its tool again).
    gate = trio.Event()
    b_agents = tree_agents(gate, resumed=True)
    serving = {"A": tree_agents(gate), "B": b_agents}
    async with (
        open_nodes(pg_dsn, serving, lease_ttl=1.0) as (a, _b),
        clients(a, _b) as (ca, cb),
    ):
        root_id, child_id = await start_tree(ca)
        await cb.ok("run.subscribe", run_id=child_id, from_seq=1)
        recorded = dies_recording(a, "record_child_cancel", monkeypatch)
        answer = await request_as_owner_dies(
            a, cb, "run.cancel", once=[recorded], run_id=child_id, reason="enough"
        )
        assert answer["type"] == "ack", answer
        end = (await cb.wait_terminal(child_id))["event"]
        assert (end["status"], end["reason"]) == ("cancelled", "enough")
        check_log(cb, child_id)
        await cb.ok("run.subscribe", run_id=root_id, from_seq=1)
        assert (await cb.wait_terminal(root_id))["event"]["status"] == "completed"
    helper_model = b_agents["helper"].model
    assert isinstance(helper_model, ScriptedModel)
    assert helper_model.requests == []  # the resumed child never asked its model
