"""A cluster of nodes in one process on one database: a client on node B cancels,
injects into, approves and subscribes to a run owned by node A, with the answers and
events of a single process (DESIGN §12, issue 17 item 1)."""

from __future__ import annotations

from typing import Any

import trio

import trio_agents as ta
from tests.support.cluster_nodes import agents, approval_tool, clients, open_nodes, waiting_tool
from tests.support.cluster_support import client
from tests.support.helpers import book
from trio_agents.models import ScriptedModel, Turn


async def test_cancel_from_another_node(pg_dsn: str) -> None:
    wait = waiting_tool(trio.Event())  # never set: a run waits in its tool call
    model = ScriptedModel([Turn(tool_calls=[("wait", {})]), "finished"])
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", agents(model, [wait]))) as (a, b),
        clients(a, b) as (ca, cb),
    ):
        run_id = await ca.start_until_tool(agent="a", input="hi")
        got = await cb.ok("run.get", run_id=run_id)
        assert got["run"]["run_id"] == run_id
        assert got["run"]["agent"] == "a"
        listed = await cb.ok("runs.list")
        assert [r["run_id"] for r in listed["runs"]] == [run_id]
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        await cb.ok("run.cancel", run_id=run_id, reason="stop")
        done = await ca.wait_terminal(run_id)
        assert done["event"]["status"] == "cancelled"
        assert done["event"]["reason"] == "stop"
        assert await cb.wait_terminal(run_id) == done
        # Every event, same seqs and contents, whichever node the subscriber is on.
        assert cb.events[run_id] == ca.events[run_id]
        assert cb.seqs(run_id) == list(range(1, len(cb.seqs(run_id)) + 1))
        # Ops on the finished run answer as in one process, from either node.
        for c in (ca, cb):
            closed = await c.request("run.cancel", run_id=run_id)
            assert (closed["type"], closed["code"]) == ("error", "run_closed")
            closed = await c.request("run.inject", run_id=run_id, items="more")
            assert closed["code"] == "run_closed"
        got = await cb.ok("run.get", run_id=run_id)
        assert (got["run"]["status"], got["run"]["reason"]) == ("cancelled", "stop")


async def test_inject_approve_reject_and_withdraw_from_another_node(pg_dsn: str) -> None:
    ran: list[str] = []
    delete = approval_tool(ran)
    model = ScriptedModel(
        [
            Turn(tool_calls=[ta.ToolCall("c1", "delete", "{}"), ta.ToolCall("c2", "delete", "{}")]),
            "all done",
        ]
    )
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", agents(model, [delete]))) as (a, b),
        clients(a, b) as (ca, cb),
        client(b.url, token="tok-bob") as bob,
    ):
        run_id = await ca.start_run(agent="a", input="go", subscribe="all")
        await ca.wait_status(run_id, "awaiting_approval")
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        # Another principal: not found, from any node, for every op.
        for op, fields in [
            ("run.get", {}),
            ("run.cancel", {}),
            ("run.approve", {"call_id": "c1"}),
            ("run.inject", {"items": "x"}),
            ("run.subscribe", {}),
        ]:
            answer = await bob.request(op, run_id=run_id, **fields)
            assert (answer["type"], answer["code"]) == ("error", "not_found"), answer
        assert (await bob.ok("runs.list"))["runs"] == []
        # The owner's real answers come back.
        unknown = await cb.request("run.approve", run_id=run_id, call_id="nope")
        assert unknown["code"] == "not_found"
        injected = await cb.ok("run.inject", run_id=run_id, items="first", when="next_turn")
        injection_id = injected["injection_id"]
        second = await cb.ok("run.inject", run_id=run_id, items="second")
        withdrawn = await cb.ok("run.withdraw", run_id=run_id, injection_id=second["injection_id"])
        assert withdrawn["withdrawn"] is True
        got = await cb.ok("run.get", run_id=run_id)
        assert got["run"]["status"] == "awaiting_approval"
        await cb.ok("run.approve", run_id=run_id, call_id="c1")
        await cb.ok("run.reject", run_id=run_id, call_id="c2", message="no")
        done = await cb.wait_terminal(run_id)
        assert done["event"]["status"] == "completed", done
        await ca.wait_terminal(run_id)
        assert cb.events[run_id] == ca.events[run_id]
        kinds = {e["event"]["type"] for e in cb.events[run_id]}
        assert {"inbox.injected", "inbox.delivered", "tool.finished"} <= kinds
        delivered = [
            e["event"]["injection_id"]
            for e in cb.events[run_id]
            if e["event"]["type"] == "inbox.delivered"
        ]
        assert delivered == [injection_id]
        assert ran == ["c1"]
        again = await cb.request("run.approve", run_id=run_id, call_id="c1")
        assert again["code"] == "run_closed"


async def test_session_cancel_and_subscribe_status_from_another_node(pg_dsn: str) -> None:
    wait = waiting_tool(trio.Event())  # never set: a run waits in its tool call
    model = ScriptedModel([Turn(tool_calls=[("wait", {})])], default="ok")
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", agents(model, [wait]))) as (a, b),
        clients(a, b) as (ca, cb),
    ):
        none = await cb.request("session.cancel", session_id="s1")
        assert none["code"] == "no_active_run"
        run_id = await ca.start_until_tool(agent="a", input="hi", session_id="s1")
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1, events="status")
        answer = await cb.ok("session.cancel", session_id="s1", reason="bye")
        assert answer["run_id"] == run_id
        done = await cb.wait_terminal(run_id)
        assert (done["event"]["status"], done["event"]["reason"]) == ("cancelled", "bye")
        assert {e["event"]["type"] for e in cb.events[run_id]} == {"run.updated"}
        none = await cb.request("session.cancel", session_id="s1")
        assert none["code"] == "no_active_run"
        # The session is the cluster's: the next run, on B, continues it.
        second = await cb.start_run(agent="a", input="again", session_id="s1", subscribe="all")
        assert (await cb.wait_terminal(second))["event"]["status"] == "completed"
        request = model.requests[-1]
        assert [type(i).__name__ for i in request.items][:1] == ["UserMessage"]
        assert any(isinstance(i, ta.ToolResult) and i.status == "cancelled" for i in request.items)


async def test_a_routed_cancel_is_made_durable_by_the_node_that_sends_it(pg_dsn: str) -> None:
    # The client's node records the cancel in the run's row in the transaction that
    # routes it, before the owner sees it; the owner then acks without writing it again.
    import json

    import psycopg

    wait = waiting_tool(trio.Event())  # never set: a run waits in its tool call

    def recorded(run_id: str) -> Any:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT options FROM trio_agents_runs WHERE run_id = %s", (run_id,)
            ).fetchone()
        assert row is not None
        return json.loads(row[0]).get("cancel")

    def ended(run_id: str) -> tuple[Any, ...]:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT finished, status, reason FROM trio_agents_runs WHERE run_id = %s",
                (run_id,),
            ).fetchone()
        assert row is not None
        return tuple(row)

    # Two runs, each cancelled in its tool call.
    model = ScriptedModel([Turn(tool_calls=[("wait", {})]), Turn(tool_calls=[("wait", {})])])
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", agents(model, [wait]))) as (a, b),
        clients(a, b) as (ca, cb),
    ):
        run_id = await ca.start_until_tool(agent="a", input="hi")
        # The owner holds every routed op until the test has looked at the row.
        execute = a.cluster._node.router.execute
        assert execute is not None
        arrived, looked = trio.Event(), trio.Event()

        async def held(request: Any, origin: Any) -> Any:
            arrived.set()
            await looked.wait()
            assert execute is not None
            return await execute(request, origin)

        a.cluster._node.router.execute = held
        writes: list[str] = []
        call = a.cluster._node.db.call

        async def counting(fn: Any) -> Any:
            writes.append(getattr(fn, "__qualname__", ""))
            return await call(fn)

        a.cluster._node.db.call = counting  # type: ignore[method-assign]
        async with trio.open_nursery() as inner:
            inner.start_soon(lambda: cb.ok("run.cancel", run_id=run_id, reason="stop"))
            with trio.fail_after(30):
                await arrived.wait()
            assert await trio.to_thread.run_sync(recorded, run_id) == {
                "reason": "stop",
                "mode": "immediate",
            }
            looked.set()
        # The owner answered in the transaction that stored its answer (with the
        # NOTIFY to the sender): no second transaction just to send it.
        assert [w for w in writes if "record_cancel" in w], writes
        assert not [w for w in writes if "answer_it" in w], writes
        done = await ca.wait_terminal(run_id)
        assert (done["event"]["status"], done["event"]["reason"]) == ("cancelled", "stop")
        # The owner wrote only the command's reply (kept for a takeover), not the
        # cancel again: that was the sender's, checked above before the owner acted.
        writes.clear()
        # A cancel on the owner itself is still recorded there, before its ack.
        run_id = await ca.start_until_tool(agent="a", input="hi")
        await ca.ok("run.cancel", run_id=run_id, reason="here")
        assert [w for w in writes if "record_cancel" in w]
        # Durable either way: recorded in the row, or (the run's terminal flush
        # committed first, so the record found it finished) the row is terminal
        # with that reason.
        if (await trio.to_thread.run_sync(recorded, run_id)) is None:
            assert await trio.to_thread.run_sync(ended, run_id) == (True, "cancelled", "here")
        else:
            assert (await trio.to_thread.run_sync(recorded, run_id))["reason"] == "here"
        assert b.cluster._node.router.routed == 1


async def test_a_subscriber_on_a_node_whose_attempt_stopped_follows_the_run_elsewhere(
    pg_dsn: str,
) -> None:
    # Node A loses its lease (alive, but its attempt of the run is stopped: "lease
    # lost") and the run goes on in a new attempt. A client subscribed on A stays
    # subscribed: it gets every later event, through the terminal one, each seq once.
    # (It used to get nothing more, silently: its subscription read A's stopped run.)
    wait = waiting_tool(trio.Event())  # never set: a run waits in its tool call
    model = ScriptedModel([Turn(tool_calls=[("wait", {})]), "finished elsewhere"])
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", agents(model, [wait]))) as (a, _b),
        clients(a) as (ca,),
    ):
        run_id = await ca.start_until_tool(agent="a", input="hi")
        assert a.cluster._node.lose_all("lease lost") == 1
        with trio.fail_after(60):
            done = await ca.wait_terminal(run_id)
        assert done["event"]["status"] == "completed", done
        seqs = ca.seqs(run_id)
        assert seqs == sorted(set(seqs)), seqs  # each seq once, in order
        resumed = [
            f["event"]
            for f in ca.events[run_id]
            if f["event"]["type"] == "run.updated" and f["event"].get("detail", {}).get("resumed")
        ]
        assert len(resumed) == 1, resumed


def _records(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``run`` objects of ``run.get`` acks, without ``children``: a root's child
    runs are known on the node running its tree only (None elsewhere, as documented)."""
    return [{k: v for k, v in a["run"].items() if k != "children"} for a in answers]


async def test_a_runs_record_is_the_same_on_every_node(pg_dsn: str) -> None:
    # Before: a node answering for a run of another node (from the run's row) gave
    # an empty detail, where the owner gave the status's (the question asked, its
    # pending id; after a takeover, resumed/attempt): a client behind a load balancer
    # got different records depending on the node it reached.
    model = ScriptedModel(
        [Turn(tool_calls=[("book", {})]), Turn(tool_calls=[("wait", {})])], default="x"
    )
    served = agents(model, [book, waiting_tool(trio.Event())])  # the gate never opens
    async with (
        open_nodes(pg_dsn, dict.fromkeys("ABC", served), lease_ttl=0.5) as (a, b, c),
        clients(a, b, c) as (ca, cb, cc),
    ):
        run_id = await ca.start_run(agent="a", input="go", subscribe="all")
        # A client on the owner is sent an event once it is persisted (the run's row
        # is written in the same transaction).
        asked = (await ca.wait_status(run_id, "awaiting_approval"))["event"]["detail"]
        assert [q["message"] for q in asked["questions"]] == ["Which seat?"]
        got = [await x.ok("run.get", run_id=run_id) for x in (ca, cb, cc)]
        owner, *others = _records(got)
        assert owner["detail"] == asked
        assert others == [owner, owner]
        listed = [(await x.ok("runs.list"))["runs"] for x in (cb, cc)]
        assert [[r["detail"] for r in runs] for runs in listed] == [[asked], [asked]]
        # A dies with the question open; B or C resumes the run (the asking call
        # started, so it is interrupted) and waits in its next call.
        a.crash()
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        resumed = await cb.wait_event(
            run_id, lambda e: e["type"] == "run.updated" and e.get("detail", {}).get("resumed")
        )
        await cb.wait_event(
            run_id, lambda e: e["type"] == "tool.started" and e["seq"] > resumed["seq"]
        )
        first, second = _records([await x.ok("run.get", run_id=run_id) for x in (cb, cc)])
        assert first["detail"] == {"resumed": True, "attempt": 2}
        assert first == second
