"""Approvals and rejections exactly-once across a takeover (issue 17, DESIGN §12), and
what a client's node dying does to its ``on_disconnect="cancel"`` runs.

In-process nodes on the suite's real PostgreSQL (tests/support/cluster_support.py, the review
tests' helpers); a crash is ``Node.crash`` (nothing more reaches the database, as with
``kill -9``). The real-process test of a killed client node is in
test_cluster_processes.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, NoReturn

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_nodes import (
    agents,
    clients,
    dies_answering,
    dies_recording,
    host_registry,
    local_entry,
    open_nodes,
    request_as_owner_dies,
    two_nodes,
    waiting_agents,
    waiting_tool,
)
from tests.support.cluster_support import Client, Node
from tests.support.process_cluster import stored_items
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


@asynccontextmanager
async def approval_nodes(
    dsn: str, *, a_model: ScriptedModel | None = None, started: trio.Event | None = None
) -> AsyncIterator[tuple[list[str], ScriptedModel, list[Node], list[Client]]]:
    """Nodes A and B (:func:`two_nodes`), a client on each: A serves ``a_model`` (by
    default one whose first turn calls ``delete``) with ``delete_tool("A", ran,
    started)``; B, which resumes what A started, a model answering ``done`` with
    ``delete_tool("B", ran)``. Yields ``ran`` (the nodes the tool ran on), B's model,
    the nodes and the clients."""
    ran: list[str] = []
    a_agents = agents(
        a_model or ScriptedModel([Turn(tool_calls=[DELETE])]), [delete_tool("A", ran, started)]
    )
    b_model = ScriptedModel([], default="done")
    b_agents = agents(b_model, [delete_tool("B", ran)])
    async with two_nodes(dsn, a_agents, b_agents) as opened, clients(*opened) as connected:
        yield ran, b_model, opened, connected


async def awaiting_approval(c: Client) -> str:
    """Start a run (subscribed to all) that must reach ``awaiting_approval``: its id."""
    run_id = await c.start_run(agent="a", input="go", subscribe="all")
    await c.wait_status(run_id, "awaiting_approval")
    return run_id


def blocked_barrier(reached: trio.Event) -> Callable[..., Any]:
    """A ``before_tool`` factory whose barrier never lets a tool start."""

    def before_tool(run_id: str, attempt: int, fence: Any) -> Callable[[ta.ToolCall], Any]:
        async def barrier(call: ta.ToolCall) -> NoReturn:
            reached.set()
            await trio.sleep_forever()

        return barrier

    return before_tool


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
    reached = trio.Event()
    async with approval_nodes(pg_dsn) as (ran, b_model, (a, _b), (ca, cb)):
        monkeypatch.setattr(a.cluster._node, "before_tool", blocked_barrier(reached))
        run_id = await awaiting_approval(ca)
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
    async with approval_nodes(pg_dsn) as (ran, b_model, (a, _b), (ca, cb)):
        run_id = await awaiting_approval(ca)
        recorded = dies_recording(a, "record_decision", monkeypatch)
        answer = await request_as_owner_dies(
            a, cb, "run.reject", once=[recorded], run_id=run_id, call_id="d1", message="no"
        )
        assert answer["type"] == "ack", answer
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
    started = trio.Event()
    # After a rejection, A's model blocks: the run does nothing more on A.
    a_model = ScriptedModel([Turn(tool_calls=[DELETE]), Turn(text="late", delay=3600)])
    async with approval_nodes(pg_dsn, a_model=a_model, started=started) as (
        ran,
        b_model,
        (a, _b),
        (ca, cb),
    ):
        run_id = await awaiting_approval(ca)
        applied, stored = dies_answering(a, pg_dsn, monkeypatch)
        # Approved: A dies once its tool started too (recorded as started).
        once = [applied, started] if op == "run.approve" else [applied]
        answer = await request_as_owner_dies(a, cb, op, once=once, run_id=run_id, call_id="d1")
        assert stored[0] is not None
        assert json.loads(stored[0]) == {"ok": {}}
        assert answer["type"] == "ack", answer
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
    a_agents = agents(
        ScriptedModel([Turn(tool_calls=[DELETE])], default="done"), [delete_tool("A", ran)]
    )
    async with (
        two_nodes(pg_dsn, a_agents, a_agents) as (a, b),
        clients(a, b) as (ca, cb),
    ):
        run_id = await awaiting_approval(ca)
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
        for i in stored_items(pg_dsn, f"run:{run_id}", "alice")
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
    _, served = waiting_agents(trio.Event(), every_turn=True)  # never set
    async with (
        open_nodes(
            pg_dsn, dict.fromkeys("AB", served), lease_ttl=0.5, max_runs={"A": 3, "B": 1}
        ) as (a, b),
        clients(a, b) as (ca, cb),
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
        assert {placed, kept} <= set(host_registry(a).runs)
        b.crash()
        for run_id in (placed, on_b):
            done = (await ca.wait_terminal(run_id))["event"]
            assert (done["status"], done["reason"]) == ("cancelled", "client disconnected")
        assert ca.events[kept][-1]["event"]["type"] == "tool.started"
        assert kept in host_registry(a).runs  # taken over, or still A's: running
        await ca.ok("run.cancel", run_id=kept, reason="by hand")
        done = (await ca.wait_terminal(kept))["event"]
        assert (done["status"], done["reason"]) == ("cancelled", "by hand")


async def test_a_run_no_live_node_can_resume_ends_failed_with_a_terminal_event(
    pg_dsn: str,
) -> None:
    # (Leases.fail, the terminal write it shares with a cancelled queued run.) A dies;
    # B claims the run but does not serve its agent: the run ends failed, with one
    # terminal event a subscriber on B receives, and its session is released.
    a_agents = agents(
        ScriptedModel([Turn(tool_calls=[("wait", {})])]), [waiting_tool(trio.Event())]
    )
    b_agents = {"other": agents(ScriptedModel([], default="x"))["a"]}
    async with two_nodes(pg_dsn, a_agents, b_agents) as (a, b), clients(a, b) as (ca, cb):
        run_id = await ca.start_until_tool(agent="a", input="go", session_id="s")
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


# -- a question (ToolContext.request_approval) across a takeover ------------------------

_SEAT_FORM = {
    "type": "object",
    "properties": {"seat": {"type": "string", "enum": ["aisle", "window"]}},
    "required": ["seat"],
}


def asking_tool(node: str, answers: list[tuple[str, Any]]) -> ta.Tool:
    """An idempotent tool ``book`` whose call asks a question with a form (mid-call) and
    records on which node it got which answer."""

    @ta.function_tool(idempotent=True)
    async def book(ctx: ta.ToolContext) -> str:
        """Book a seat once a person picked one."""
        decision = await ctx.request_approval("Which seat?", schema=_SEAT_FORM)
        answers.append((node, decision.content))
        return f"booked {decision.content}"

    return book


async def test_a_question_answered_as_its_owner_dies_is_asked_again_after_takeover(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A question belongs to its running call, and a takeover does not resume a call
    # mid-way: the call is interrupted, or (idempotent) runs again from its start. So
    # an answer recorded by an owner that died before applying it is not applied
    # after the takeover (its content is not recorded: docs/cluster.md); the call
    # that runs again asks again, and that new question is answered like any other.
    answers: list[tuple[str, Any]] = []
    call = ta.ToolCall("b1", "book", "{}")
    a_agents = agents(ScriptedModel([Turn(tool_calls=[call])]), [asking_tool("A", answers)])
    b_model = ScriptedModel([], default="done")
    b_agents = agents(b_model, [asking_tool("B", answers)])
    async with two_nodes(pg_dsn, a_agents, b_agents) as (a, _b), clients(a, _b) as (ca, cb):
        run_id = await awaiting_approval(ca)
        [asked] = (await ca.ok("run.get", run_id=run_id))["run"]["detail"]["questions"]
        recorded = dies_recording(a, "record_decision", monkeypatch)
        answer = await request_as_owner_dies(
            a,
            cb,
            "run.approve",
            once=[recorded],
            run_id=run_id,
            call_id=asked["id"],
            content={"seat": "aisle"},
        )
        assert answer["type"] == "ack", answer
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        again = await cb.wait_event(
            run_id,
            lambda e: (
                e["type"] == "run.updated"
                and e["status"] == "awaiting_approval"
                and e["seq"] > asked_seq(cb, run_id)
            ),
        )
        [question] = again["event"]["detail"]["questions"]
        await cb.ok(
            "run.approve", run_id=run_id, call_id=question["id"], content={"seat": "window"}
        )
        done = await cb.wait_terminal(run_id)
        assert done["event"]["status"] == "completed", done
    assert answers == [("B", {"seat": "window"})]
    (result,) = results_of(b_model)
    assert (result.status, result.output) == ("ok", "booked {'seat': 'window'}")


def asked_seq(c: Client, run_id: str) -> int:
    """The seq of the resumed attempt's first ``running`` status (0 before it)."""
    for frame in c.events.get(run_id, []):
        event = frame["event"]
        if event["type"] == "run.updated" and event.get("detail", {}).get("resumed"):
            return int(frame["seq"])
    return 1 << 62
