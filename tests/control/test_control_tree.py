"""Run trees over the control channel (DESIGN §17, §10), end to end over real loopback
websockets: every op on any node's id, the tree fields of ``run.get``, ``runs.list``
with ``all``, tree subscriptions, principal isolation, and the Python client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.control_support import (
    answer,
    ask,
    launch,
    memory_client,
    raw_client,
    serving,
    serving_alice,
    sleep_hour,
)
from trio_agents.control import ControlError, Limits, connect
from trio_agents.models import ScriptedModel, Turn


def _calls(*calls: tuple[str, dict[str, Any]]) -> Turn:
    return Turn(tool_calls=list(calls))


def sleeper(name: str) -> ta.Agent:
    """An agent whose every run calls a tool that sleeps for an hour."""
    return ta.Agent(
        name=name, model=ScriptedModel([], default=_calls(("sleep_hour", {}))), tools=[sleep_hour]
    )


def delegating(name: str, child: ta.Agent, final: str) -> ta.Agent:
    """An agent that asks ``child`` (as a tool) once, then answers ``final``."""
    return ta.Agent(
        name=name,
        model=ScriptedModel([_calls((child.name, {"input": "dig"})), final]),
        tools=[child.as_tool()],
    )


async def until_a_child_tool_starts(
    tree: AsyncIterator[ta.RunEvent], root_id: str
) -> list[ta.RunEvent]:
    """Read a tree's events until a child run's tool starts (the last one returned)."""
    seen: list[ta.RunEvent] = []
    async for event in tree:
        seen.append(event)
        if isinstance(event, ta.ToolStarted) and event.run_id != root_id:
            return seen
    raise AssertionError("the tree ended before a child's tool started")


def by_run(events: list[ta.RunEvent]) -> dict[str, list[ta.RunEvent]]:
    runs: dict[str, list[ta.RunEvent]] = {}
    for event in events:
        runs.setdefault(event.run_id, []).append(event)
    return runs


async def test_get_list_subscribe_and_cancel_a_child_by_id() -> None:
    root = delegating("root", sleeper("helper"), "root done")
    with trio.fail_after(30):
        async with (
            serving({"root": root}) as (_, url),
            connect(url, token="tok-alice") as alice,
            connect(url, token="tok-bob") as bob,
        ):
            run = await alice.start("root", "go", subscribe=None)
            tree = run.events(tree=True)
            seen = await until_a_child_tool_starts(tree, run.id)
            child_id = seen[-1].run_id

            info = await run.get()
            assert (info.parent_id, info.root_id, info.children) == (None, run.id, (child_id,))
            assert info.agent == "root"
            child = alice.attach(child_id)
            child_info = await child.get()
            assert child_info.run_id == child_id
            assert (child_info.parent_id, child_info.root_id) == (run.id, run.id)
            assert (child_info.agent, child_info.status, child_info.children) == (
                "helper",
                "running",
                (),
            )
            assert [c.id for c in await run.children()] == [child_id]
            assert [r.run_id for r in await alice.list_runs()] == [run.id]
            assert [r.run_id for r in await alice.list_runs(all=True)] == [run.id, child_id]

            # Another principal: the child's id is not found, whatever the op.
            other = bob.attach(child_id)
            for attempt in (
                other.get(),
                other.cancel("mine now"),
                other.inject("hello"),
                other.approve("call_1_0"),
                other.withdraw("inj"),
            ):
                with pytest.raises(ControlError) as refused:
                    await attempt
                assert refused.value.code == "not_found"
            assert await bob.list_runs(all=True) == []

            # Cancel the child alone: the root gets a cancelled result and goes on.
            await child.cancel("enough")
            child_end = await child.wait()
            assert (child_end.status, child_end.reason) == ("cancelled", "enough")
            end = await run.wait()
            assert end.status == "completed"
            seen.extend([e async for e in tree])

            # Ops that change a finished child answer run_closed; it stays visible.
            with pytest.raises(ta.RunClosedError):
                await child.cancel("again")
            with pytest.raises(ta.RunClosedError):
                await child.inject("more")
            assert (await child.get()).status == "cancelled"
            assert [r.run_id for r in await alice.list_runs(all=True)] == [run.id, child_id]
            with pytest.raises(ControlError) as refused:
                await other.get()
            assert refused.value.code == "not_found"

    runs = by_run(seen)
    assert set(runs) == {run.id, child_id}
    for events in runs.values():  # each with its own seqs, in order, from 1
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert seen[-1] == end  # the root's terminal update ends the tree's stream
    results = [
        e.item
        for e in runs[run.id]
        if isinstance(e, ta.RunItemEvent) and isinstance(e.item, ta.ToolResult)
    ]
    assert [(r.status, r.output) for r in results] == [
        ("cancelled", "sub-agent helper cancelled: enough")
    ]
    assert runs[child_id][-1] == child_end


async def test_approve_a_grandchilds_call_by_its_id() -> None:
    leaf = ta.Agent(
        name="leaf", model=ScriptedModel([_calls(("launch", {})), "leaf done"]), tools=[launch]
    )
    root = delegating("root", delegating("mid", leaf, "mid done"), "root done")
    with trio.fail_after(30):
        async with (
            serving({"root": root}) as (_, url),
            connect(url, token="tok-alice") as alice,
            connect(url, token="tok-bob") as bob,
        ):
            run = await alice.start("root", "go")
            async for update in run.updated:
                if update.status == "awaiting_approval":
                    break
            ((waiting),) = update.detail["waiting"]
            leaf_id, call_id = waiting["run_id"], waiting["call_id"]
            (mid_id,) = (await run.get()).children or ()
            leaf_info = await alice.attach(leaf_id).get()
            assert (leaf_info.parent_id, leaf_info.root_id) == (mid_id, run.id)
            assert leaf_info.pending_approvals == (call_id,)
            listed = await alice.list_runs(all=True)
            assert [(r.run_id, r.parent_id) for r in listed] == [
                (run.id, None),
                (mid_id, run.id),
                (leaf_id, mid_id),
            ]
            with pytest.raises(ControlError) as refused:
                await bob.attach(leaf_id).approve(call_id)
            assert refused.value.code == "not_found"
            with pytest.raises(ControlError) as unknown:  # not the leaf's call to approve
                await alice.attach(mid_id).approve(call_id)
            assert unknown.value.code == "not_found"
            await alice.attach(leaf_id).approve(call_id)
            end = await run.wait()
            leaf_end = await alice.attach(leaf_id).get()
    assert end.status == "completed"
    assert (leaf_end.status, leaf_end.pending_approvals) == ("completed", ())


async def test_tree_subscription_frames_over_the_wire() -> None:
    root = delegating("root", sleeper("helper"), "root done")
    with trio.fail_after(30):
        async with serving({"root": root}) as (_, url), raw_client(url) as ws:
            started = await ask(ws, {"id": 1, "op": "run.start", "agent": "root", "input": "go"})
            run_id = started["run_id"]
            for bad in (
                {"tree": True, "from_seq": 3},
                {"tree": 1},
                {"tree": "yes"},
            ):
                refused = await ask(ws, {"id": 2, "op": "run.subscribe", "run_id": run_id, **bad})
                assert (refused["type"], refused["code"]) == ("error", "invalid_request"), bad
            refused = await ask(ws, {"id": 3, "op": "runs.list", "all": "yes"})
            assert refused["code"] == "invalid_request"
            acked = await ask(
                ws, {"id": 4, "op": "run.subscribe", "run_id": run_id, "tree": True, "from_seq": 0}
            )
            assert acked == {"type": "ack", "id": 4}
            frames: list[dict[str, Any]] = []
            while True:  # until the child's tool runs
                frame = json.loads(await ws.get_message())
                frames.append(frame)
                if frame["run_id"] != run_id and frame["event"]["type"] == "tool.started":
                    break
            child_id = frames[-1]["run_id"]
            await ws.send_message(json.dumps({"id": 5, "op": "run.cancel", "run_id": run_id}))
            while not (
                frames[-1]["run_id"] == run_id
                and frames[-1]["event"]["type"] == "run.updated"
                and frames[-1]["event"]["status"] == "cancelled"
            ):
                frame = json.loads(await ws.get_message())
                if frame["type"] == "event":
                    frames.append(frame)
            # The subscription ended with the root's terminal update.
            gone = await ask(ws, {"id": 6, "op": "run.unsubscribe", "run_id": run_id, "tree": True})
            assert gone == {"type": "ack", "id": 6, "unsubscribed": False}
    assert all(f["type"] == "event" and f["tree"] == run_id for f in frames)
    assert {f["run_id"] for f in frames} == {run_id, child_id}
    for rid in (run_id, child_id):
        seqs = [f["seq"] for f in frames if f["run_id"] == rid]
        assert seqs == list(range(1, len(seqs) + 1))
        assert all(f["event"]["seq"] == f["seq"] for f in frames if f["run_id"] == rid)
    child_end = next(
        f["event"]
        for f in frames
        if f["run_id"] == child_id
        and f["event"]["type"] == "run.updated"
        and f["event"]["status"] == "cancelled"
    )
    assert child_end["reason"] == "parent cancelled"
    assert child_end["detail"]["by"] == run_id


async def test_a_finished_child_is_visible_as_long_as_its_root(autojump_clock: Any) -> None:
    helper = ta.Agent(name="helper", model=ScriptedModel(["found it"]))
    root = delegating("root", helper, "root done")
    async with (
        serving({"root": root}, limits=Limits(retain_finished=60.0, ping_interval=None)) as (
            server,
            _,
        ),
        memory_client(server) as ws,
    ):
        started = await ask(
            ws, {"id": 1, "op": "run.start", "agent": "root", "input": "go", "subscribe": "all"}
        )
        run_id = started["run_id"]
        while True:  # until the root's terminal update
            frame = json.loads(await ws.get_message())
            event = frame.get("event", {})
            if frame["run_id"] == run_id and event.get("status") == "completed":
                break
        got = await ask(ws, {"id": 2, "op": "run.get", "run_id": run_id})
        (child_id,) = got["run"]["children"]
        child = await ask(ws, {"id": 3, "op": "run.get", "run_id": child_id})
        assert child["run"]["status"] == "completed"
        assert child["run"]["parent_id"] == run_id
        await trio.sleep(59)
        # Retained with its root, and counted with it: 1 KiB per run of the tree.
        assert server.principal_statistics("alice").retained_bytes >= 2 * 1024
        assert (await ask(ws, {"id": 4, "op": "run.get", "run_id": child_id}))["type"] == "ack"
        await trio.sleep(2)
        for rid in (run_id, child_id):
            await ws.send_message(json.dumps({"id": 5, "op": "run.get", "run_id": rid}))
            gone = await answer(ws)
            assert (gone["type"], gone["code"]) == ("error", "not_found")


async def test_cluster_routes_ops_on_a_child_id_to_the_node_running_its_tree(
    pg_dsn: str,
) -> None:
    """In a cluster a tree lives on its root's node, and only roots have rows in the
    runs table: another node finds a child's id on the nodes running the principal's
    runs and routes the op there; a child's events, persisted under its id, are
    followed from any node (tests/cluster/test_cluster_trees.py)."""
    from tests.support.cluster_nodes import clients, open_nodes
    from tests.support.cluster_support import client

    agents = {"root": delegating("root", sleeper("helper"), "root done"), "other": sleeper("x")}
    async with (
        open_nodes(pg_dsn, {"A": agents, "B": agents}) as (a, b),
        clients(a, b) as (ca, cb),
        client(a.url, token="tok-bob") as bob_a,
        client(b.url, token="tok-bob") as bob_b,
    ):
        ack = await ca.ok("run.start", agent="root", input="go", subscribe="all")
        run_id = ack["run_id"]
        announced = await ca.wait_event(run_id, lambda e: e["type"] == "run.child")
        child_id = announced["event"]["child_id"]
        await ca.ok("run.subscribe", run_id=run_id, tree=True)
        await ca.wait_event(child_id, lambda e: e["type"] == "tool.started")
        # Bob has a run on A too: B asks A for his ids, and A finds none of Alice's.
        await bob_a.ok("run.start", agent="other", input="mine")

        got = await ca.ok("run.get", run_id=child_id)
        assert (got["run"]["parent_id"], got["run"]["root_id"]) == (run_id, run_id)
        listed = await ca.ok("runs.list", all=True)
        assert [r["run_id"] for r in listed["runs"]] == [run_id, child_id]
        got = await ca.ok("run.get", run_id=run_id)
        assert got["run"]["children"] == [child_id]

        # Node B: the root from its row (its children are known on A only) ...
        got = await cb.ok("run.get", run_id=run_id)
        assert (got["run"]["root_id"], got["run"]["children"]) == (run_id, None)
        listed = await cb.ok("runs.list", all=True)
        assert [r["run_id"] for r in listed["runs"]] == [run_id]
        # ... the child by asking A.
        got = await cb.ok("run.get", run_id=child_id)
        assert (got["run"]["parent_id"], got["run"]["status"]) == (run_id, "running")
        assert got["run"]["agent"] == "helper"
        await cb.ok("run.subscribe", run_id=child_id)
        await cb.wait_event(child_id, lambda e: e["type"] == "tool.started")
        checks: tuple[tuple[str, dict[str, Any]], ...] = (
            ("run.get", {}),
            ("run.cancel", {}),
            ("run.inject", {"items": "x"}),
            ("run.approve", {"call_id": "call_1_0"}),
            ("run.subscribe", {}),
            ("run.subscribe", {"tree": True}),
        )
        for op, fields in checks:
            for other in (bob_a, bob_b):
                refused = await other.request(op, run_id=child_id, **fields)
                assert (refused["type"], refused["code"]) == ("error", "not_found"), op
        missing = await cb.request("run.cancel", run_id="run_nope")
        assert missing["code"] == "not_found"
        unknown_call = await cb.request("run.approve", run_id=child_id, call_id="call_9")
        assert unknown_call["code"] == "not_found"

        injected = await cb.ok("run.inject", run_id=child_id, items="hurry up")
        assert injected["injection_id"]
        await cb.ok("run.cancel", run_id=child_id, reason="enough")
        for c in (ca, cb):  # B follows the child's persisted log
            child_end = await c.wait_terminal(child_id)
            assert (child_end["event"]["status"], child_end["event"]["reason"]) == (
                "cancelled",
                "enough",
            )
        done = await ca.wait_terminal(run_id)
        assert done["event"]["status"] == "completed"
        for c in (ca, cb):
            closed = await c.request("run.cancel", run_id=child_id)
            assert closed["code"] == "run_closed"
            got = await c.ok("run.get", run_id=child_id)
            assert got["run"]["status"] == "cancelled"


def triage_and_billing() -> tuple[ta.Agent, ta.Agent]:
    """A triage agent that hands off to billing at once; billing's tool sleeps."""
    billing = sleeper("billing")
    triage = ta.Agent(
        name="triage",
        model=ScriptedModel([_calls(("transfer_to_billing", {}))]),
        handoffs=[billing],
    )
    return triage, billing


async def test_run_get_reports_the_current_agent_after_a_handoff() -> None:
    for served, expected in ((True, "money"), (False, "billing")):
        triage, billing = triage_and_billing()
        agents = {"front": triage, "money": billing} if served else {"front": triage}
        with trio.fail_after(30):
            async with serving_alice(agents) as (_, alice):
                run = await alice.start("front", "refund please")
                async for event in run.events():
                    if isinstance(event, ta.ToolStarted) and event.name == "sleep_hour":
                        break
                # The agent it works as now: its name on the server, else its own.
                info = await run.get()
                assert (info.agent, info.parent_id, info.children) == (expected, None, ())
                (listed,) = await alice.list_runs()
                assert listed.agent == expected
                await run.cancel("done")
                await run.wait()


async def test_inject_and_withdraw_into_a_child_count_against_its_root() -> None:
    release = trio.Event()

    @ta.function_tool
    async def wait_a_bit() -> str:
        """Wait until released."""
        await release.wait()
        return "waited"

    helper = ta.Agent(
        name="helper",
        model=ScriptedModel([_calls(("wait_a_bit", {})), "helper done"]),
        tools=[wait_a_bit],
    )
    root = delegating("root", helper, "root done")
    limits = Limits(max_inject_bytes_per_run=300, ping_interval=None)
    with trio.fail_after(30):
        async with serving_alice({"root": root}, limits=limits) as (_, alice):
            run = await alice.start("root", "go")
            async for event in run.events(tree=True):
                if isinstance(event, ta.ToolStarted) and event.name == "wait_a_bit":
                    break
            child = alice.attach(event.run_id)
            kept = await child.inject("mind the budget")
            dropped = await child.inject("never mind")
            assert await child.withdraw(dropped) is True
            with pytest.raises(ControlError) as full:  # the tree's bytes, at its root
                await run.inject("x" * 200)
            assert full.value.code == "limit_exceeded"
            release.set()
            child_events = [e async for e in child.events()]
            assert (await run.wait()).status == "completed"
    delivered = [e.injection_id for e in child_events if isinstance(e, ta.InboxDelivered)]
    assert delivered == [kept]
    last = child_events[-1]
    assert isinstance(last, ta.RunUpdated)
    assert last.status == "completed"


async def test_a_finished_tree_replays_the_same_merged_stream() -> None:
    helpers = [ta.Agent(name=f"r{i}", model=ScriptedModel([f"found {i}"])) for i in range(3)]
    root = ta.Agent(
        name="root",
        model=ScriptedModel(
            [_calls(*[(f"r{i}", {"input": f"topic {i}"}) for i in range(3)]), "summary"]
        ),
        tools=[h.as_tool() for h in helpers],
    )
    with trio.fail_after(30):
        async with serving({"root": root}) as (_, url):
            async with connect(url, token="tok-alice") as alice:
                run = await alice.start("root", "go")
                live = [e async for e in run.events(tree=True)]
                again = [e async for e in run.events(tree=True)]  # this client's buffer
                status_only = alice.attach(run.id)
                assert await status_only.unsubscribe(tree=True) is False
            async with connect(url, token="tok-alice") as later:
                replayed = [e async for e in later.attach(run.id).events(tree=True)]
                children = await later.attach(run.id).children()
                assert len(await later.list_runs(all=True)) == 4
    assert live == again == replayed
    assert {e.run_id for e in live} == {run.id, *(c.id for c in children)}
    assert isinstance(live[-1], ta.RunUpdated)
    assert (live[-1].run_id, live[-1].status) == (run.id, "completed")


async def test_shutdown_ends_a_tree_subscription_after_the_terminal_updates() -> None:
    from tests.support.control_support import TOKENS
    from trio_agents.control import ControlServer

    server = ControlServer(
        {"root": delegating("root", sleeper("helper"), "root done")},
        auth=TOKENS,
        limits=Limits(ping_interval=None, shutdown_timeout=10.0),
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            serve_scope = trio.CancelScope()

            async def serve(task_status: trio.TaskStatus[int]) -> None:
                with serve_scope:
                    await server.serve("127.0.0.1", 0, task_status=task_status)

            port = await nursery.start(serve)
            async with connect(f"ws://127.0.0.1:{port}/", token="tok-alice") as alice:
                run = await alice.start("root", "go", subscribe=None)
                tree: list[ta.RunEvent] = []
                async for event in run.events(tree=True):
                    tree.append(event)
                    if isinstance(event, ta.ToolStarted) and event.run_id != run.id:
                        serve_scope.cancel()
    ends = [e for e in tree if isinstance(e, ta.RunUpdated) and e.status.is_terminal]
    assert [(e.run_id == run.id, e.status, e.reason) for e in ends] == [
        (False, "cancelled", "parent cancelled"),
        (True, "cancelled", "server shutdown"),
    ]
    assert ends[0].detail == {"by": run.id, "reason": "server shutdown"}
    assert tree[-1] is ends[-1]


async def test_client_tree_unsubscribe_then_subscribe_again_replays_without_duplicates() -> None:
    root = delegating("root", sleeper("helper"), "root done")
    with trio.fail_after(30):
        async with serving_alice({"root": root}) as (_, alice):
            run = await alice.start("root", "go", subscribe=None)
            first = run.events(tree=True)
            before = await until_a_child_tool_starts(first, run.id)
            assert await run.unsubscribe(tree=True) is True
            before.extend([e async for e in first])  # what came before; then it ends
            await run.cancel("stop")
            after = [e async for e in run.events(tree=True)]
    assert after[: len(before)] == before
    for events in by_run(after).values():
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert isinstance(after[-1], ta.RunUpdated)
    assert (after[-1].run_id, after[-1].reason) == (run.id, "stop")
