"""Approvals and rejections exactly-once across a takeover (issue 17, DESIGN §12), and
what a client's node dying does to its ``on_disconnect="cancel"`` runs.

In-process nodes on the suite's real PostgreSQL (tests/support/cluster_support.py, the review
tests' helpers); a crash is ``Node.crash`` (nothing more reaches the database, as with
``kill -9``). The real-process test of a killed client node is in
test_cluster_processes.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NoReturn

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.cluster.internals.test_cluster_crash_and_partition import (
    agent,
    local_entry,
    stored_items,
    two_nodes,
)
from tests.support.cluster_support import Client, client, node
from trio_agents.models import ScriptedModel, Turn

DELETE = ta.ToolCall("d1", "delete", "{}")


def delete_tool(node: str, ran: list[str], started: trio.Event | None = None) -> ta.Tool:
    """A tool that needs approval and records on which node it ran (then blocks on
    ``started``'s node until cancelled, if ``started`` is given)."""

    @ta.function_tool(needs_approval=True)
    async def delete() -> str:
        """Delete something (not idempotent)."""
        ran.append(node)
        if started is not None:
            started.set()
            await trio.sleep_forever()
        return f"deleted on {node}"

    return delete


def blocked_barrier(reached: trio.Event) -> Callable[..., Any]:
    """A ``before_tool`` factory whose barrier never lets a tool start."""

    def before_tool(run_id: str, attempt: int, fence: Any) -> Callable[[ta.ToolCall], Any]:
        async def barrier(call: ta.ToolCall) -> NoReturn:
            reached.set()
            await trio.sleep_forever()

        return barrier

    return before_tool


def reply_of(dsn: str, command_id: int) -> str | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT reply FROM trio_agents_commands WHERE command_id = %s", (command_id,)
        ).fetchone()
    assert row is not None
    return None if row[0] is None else str(row[0])


def results_of(model: ScriptedModel) -> list[ta.ToolResult]:
    return [i for i in model.requests[-1].items if isinstance(i, ta.ToolResult)]


def statuses_after_resume(c: Client, run_id: str) -> list[str]:
    """The statuses the client saw from the resumed attempt's first ``running`` on."""
    statuses = [
        frame["event"] for frame in c.events[run_id] if frame["event"]["type"] == "run.updated"
    ]
    first = next(i for i, e in enumerate(statuses) if e.get("detail", {}).get("resumed"))
    return [e["status"] for e in statuses[first:]]


def resumptions(c: Client, run_id: str) -> list[dict[str, Any]]:
    return [
        frame["event"]
        for frame in c.events[run_id]
        if frame["event"]["type"] == "run.updated"
        and frame["event"].get("detail", {}).get("resumed")
    ]


@pytest.mark.parametrize("via", ["A", "B"])
async def test_an_approval_acked_before_the_owner_dies_runs_the_tool_once_after_takeover(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    # The approval is acked (by A, or routed from B); A dies before the call's tool
    # could start. B resumes the run, which asks for the call's approval again: B
    # applies the recorded approval, so the tool runs once, on B, with no new approval.
    ran: list[str] = []
    reached = trio.Event()
    a_agents = agent(ScriptedModel([Turn(tool_calls=[DELETE])]), [delete_tool("A", ran)])
    b_model = ScriptedModel([], default="done")
    b_agents = agent(b_model, [delete_tool("B", ran)])
    async with (
        two_nodes(pg_dsn, a_agents, b_agents) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        monkeypatch.setattr(a.cluster, "_before_tool", blocked_barrier(reached))
        run_id = await ca.start_run(agent="a", input="go", subscribe="all")
        await ca.wait_status(run_id, "awaiting_approval")
        await (ca if via == "A" else cb).ok("run.approve", run_id=run_id, call_id="d1")
        with trio.fail_after(30):
            await reached.wait()  # approved on A; its tool is about to start
        a.crash()
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        done = await cb.wait_terminal(run_id)
        assert done["event"]["status"] == "completed", done
    assert ran == ["B"]
    (result,) = results_of(b_model)
    assert (result.status, result.output) == ("ok", "deleted on B")
    assert len(resumptions(cb, run_id)) == 1
    # Answered by the resumed run itself: its client is never shown the call as
    # awaiting an approval again.
    assert statuses_after_resume(cb, run_id) == ["running", "completed"]


async def test_a_rejection_recorded_by_a_dying_owner_is_answered_and_applied_once(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client on B rejects a call of A's run; A records the rejection (with its
    # answer) and dies before applying it. The client gets that answer; B resumes
    # the run and applies the recorded rejection to the call asked again.
    ran: list[str] = []
    a_agents = agent(ScriptedModel([Turn(tool_calls=[DELETE])]), [delete_tool("A", ran)])
    b_model = ScriptedModel([], default="done")
    b_agents = agent(b_model, [delete_tool("B", ran)])
    async with (
        two_nodes(pg_dsn, a_agents, b_agents) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = await ca.start_run(agent="a", input="go", subscribe="all")
        await ca.wait_status(run_id, "awaiting_approval")
        recorded = trio.Event()
        real = a.cluster._record_decision

        async def record_then_die(*args: Any, **kwargs: Any) -> NoReturn:
            await real(*args, **kwargs)
            recorded.set()
            await trio.sleep_forever()

        monkeypatch.setattr(a.cluster, "_record_decision", record_then_die)
        answers: list[dict[str, Any]] = []
        async with trio.open_nursery() as waiting:

            async def send() -> None:
                answers.append(
                    await cb.request("run.reject", run_id=run_id, call_id="d1", message="no")
                )

            waiting.start_soon(send)
            with trio.fail_after(30):
                await recorded.wait()
            a.crash()
        assert answers[0]["type"] == "ack", answers
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        done = await cb.wait_terminal(run_id)
        assert done["event"]["status"] == "completed", done
    assert ran == []
    (result,) = results_of(b_model)
    assert (result.status, result.output) == ("error", "rejected: no")
    assert statuses_after_resume(cb, run_id) == ["running", "completed"]


@pytest.mark.parametrize("op", ["run.approve", "run.reject"])
async def test_a_routed_decision_is_answered_once_when_its_owner_dies_answering_it(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    # Like test_a_routed_op_is_applied_once_when_its_owner_dies_answering_it, for
    # approvals and rejections: a client on B decides a call of A's run; A applies
    # it (the approved tool starts on A) and dies before it could answer. The client
    # gets A's answer, stored with the decision; B does not apply the command again
    # (it would answer not_found: the call is no longer waiting).
    ran: list[str] = []
    started = trio.Event()
    # After a rejection, A's model blocks: the run does nothing more on A.
    a_model = ScriptedModel([Turn(tool_calls=[DELETE]), Turn(text="late", delay=3600)])
    a_agents = agent(a_model, [delete_tool("A", ran, started)])
    b_model = ScriptedModel([], default="done")
    b_agents = agent(b_model, [delete_tool("B", ran)])
    async with (
        two_nodes(pg_dsn, a_agents, b_agents) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = await ca.start_run(agent="a", input="go", subscribe="all")
        await ca.wait_status(run_id, "awaiting_approval")
        applied = trio.Event()
        stored: list[str | None] = []
        execute = a.cluster._router.execute
        assert execute is not None

        async def answered_by_a_dying_node(*args: Any) -> NoReturn:
            await execute(*args)  # applied (and, with the fix, durable with its answer)
            stored.append(await trio.to_thread.run_sync(reply_of, pg_dsn, args[2]))
            applied.set()
            await trio.sleep_forever()  # A dies before its answer is written

        monkeypatch.setattr(a.cluster._router, "execute", answered_by_a_dying_node)
        answers: list[dict[str, Any]] = []
        async with trio.open_nursery() as waiting:

            async def send() -> None:
                answers.append(await cb.request(op, run_id=run_id, call_id="d1"))

            waiting.start_soon(send)
            with trio.fail_after(30):
                await applied.wait()
                if op == "run.approve":
                    await started.wait()  # its tool started on A (recorded as started)
            a.crash()
        assert stored[0] is not None
        assert json.loads(stored[0]) == {"ok": {}}
        assert answers[0]["type"] == "ack", answers
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        done = await cb.wait_terminal(run_id)
        assert done["event"]["status"] == "completed", done
    assert ran == (["A"] if op == "run.approve" else [])
    (result,) = results_of(b_model)
    assert result.status == "error"
    if op == "run.approve":  # started on A, not idempotent: interrupted, never re-run
        assert result.output.startswith("interrupted")
    else:
        assert result.output == "rejected: the user rejected this tool call"


async def test_a_second_decision_for_a_call_answers_not_found_on_every_node(
    pg_dsn: str,
) -> None:
    # The first decision recorded for a call is the one applied; a later one (from
    # any node) answers not_found, as in one process, and changes nothing.
    ran: list[str] = []
    a_agents = agent(
        ScriptedModel([Turn(tool_calls=[DELETE])], default="done"), [delete_tool("A", ran)]
    )
    async with (
        two_nodes(pg_dsn, a_agents, a_agents) as (a, b),
        client(a.url) as ca,
        client(b.url) as cb,
    ):
        run_id = await ca.start_run(agent="a", input="go", subscribe="all")
        await ca.wait_status(run_id, "awaiting_approval")
        await cb.ok("run.reject", run_id=run_id, call_id="d1")
        again = await ca.request("run.approve", run_id=run_id, call_id="d1")
        assert (again["type"], again.get("code")) in (
            ("error", "not_found"),
            ("error", "run_closed"),
        )
        await ca.wait_terminal(run_id)
    assert ran == []
    assert [
        i.output
        for i in stored_items(pg_dsn, "alice", f"run:{run_id}")
        if isinstance(i, ta.ToolResult)
    ] == ["rejected: the user rejected this tool call"]


# -- a client whose node dies ---------------------------------------------------------


async def test_the_cancel_on_disconnect_runs_of_a_dead_nodes_clients_are_cancelled(
    pg_dsn: str,
) -> None:
    # A client on B starts three runs: one on B (B is then full) and two that B places
    # on A, all with on_disconnect="cancel" but the last. B dies with the client still
    # connected (its connection ends with no node left to apply on_disconnect). A,
    # once B's lease has expired, cancels the placed run it owns, and cancels the run
    # it takes over from B at once: reason "client disconnected", as a disconnect.
    # The on_disconnect="continue" run goes on.

    @ta.function_tool
    async def wait() -> str:
        """Wait (not idempotent)."""
        await trio.sleep_forever()

    model = ScriptedModel([], default=Turn(tool_calls=[("wait", {})]))
    agents = agent(model, [wait])
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, agents, pg_dsn, "A", lease_ttl=0.5, max_runs=3) as a,
            node(nursery, agents, pg_dsn, "B", lease_ttl=0.5, max_runs=1) as b,
            client(a.url) as ca,
            client(b.url) as cb,
        ):
            starts = [("1", "cancel"), ("2", "cancel"), ("3", "continue")]
            ids = []
            for text, on_disconnect in starts:
                ack = await cb.ok("run.start", agent="a", input=text, on_disconnect=on_disconnect)
                ids.append(ack["run_id"])
                await ca.ok("run.subscribe", run_id=ack["run_id"], from_seq=1)
                await ca.wait_event(ack["run_id"], lambda e: e["type"] == "tool.started")
            on_b, placed, kept = ids
            assert local_entry(b, on_b) is not None
            assert {placed, kept} <= set(a.server._registry.runs)
            b.crash()
            for run_id in (placed, on_b):
                done = (await ca.wait_terminal(run_id))["event"]
                assert (done["status"], done["reason"]) == ("cancelled", "client disconnected")
            assert ca.events[kept][-1]["event"]["type"] == "tool.started"
            assert kept in a.server._registry.runs  # taken over, or still A's: running
            await ca.ok("run.cancel", run_id=kept, reason="by hand")
            done = (await ca.wait_terminal(kept))["event"]
            assert (done["status"], done["reason"]) == ("cancelled", "by hand")
        nursery.cancel_scope.cancel()


async def test_a_run_no_live_node_can_resume_ends_failed_with_a_terminal_event(
    pg_dsn: str,
) -> None:
    # (Leases.fail, the terminal write it shares with a cancelled queued run.) A dies;
    # B claims the run but does not serve its agent: the run ends failed, with one
    # terminal event a subscriber on B receives, and its session is released.
    gate = trio.Event()

    @ta.function_tool
    async def wait() -> str:
        """Wait."""
        await gate.wait()
        return "done"

    a_agents = agent(ScriptedModel([Turn(tool_calls=[("wait", {})])]), [wait])
    b_agents = {"other": agent(ScriptedModel([], default="x"), [])["a"]}
    async with (
        two_nodes(pg_dsn, a_agents, b_agents) as (a, _b),
        client(a.url) as ca,
        client(_b.url) as cb,
    ):
        run_id = (await ca.ok("run.start", agent="a", input="go", session_id="s", subscribe="all"))[
            "run_id"
        ]
        await ca.wait_event(run_id, lambda e: e["type"] == "tool.started")
        a.crash()
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        with trio.fail_after(60):
            done = await cb.wait_terminal(run_id)
        assert done["event"]["status"] == "failed", done
        assert "is not served by node" in done["event"]["reason"], done
        seqs = cb.seqs(run_id)
        assert seqs == list(range(1, len(seqs) + 1)), seqs
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT status, finished, active_key, last_seq FROM trio_agents_runs"
                " WHERE run_id = %s",
                (run_id,),
            ).fetchone()
        assert row == ("failed", True, None, seqs[-1]), row
