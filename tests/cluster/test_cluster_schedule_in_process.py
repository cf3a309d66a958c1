"""A Hypothesis schedule over control ops and node kills on a small cluster (issue 17):
whatever the order of inject, approve, cancel, releasing a tool, crashing or stopping
the run's owner, the run ends once, its persisted event log has every seq once, a
non-idempotent tool never ran twice, and its session is valid."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.cluster_support import Client, Node, client, node
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import PostgresSession

OPS = st.lists(
    st.sampled_from(["inject", "approve", "release", "crash", "stop", "cancel"]),
    max_size=5,
)


def owner_of(dsn: str, run_id: str) -> str | None:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT owner FROM trio_agents_runs WHERE run_id = %s", (run_id,)
        ).fetchone()
    return None if row is None else row[0]


async def answer_ok(c: Client, op: str, **fields: Any) -> None:
    """An op on a run that may have ended: an ack, or the error one process gives."""
    answer = await c.request(op, **fields)
    assert answer["type"] == "ack" or answer["code"] in ("run_closed", "not_found"), answer


@settings(max_examples=6, deadline=None)
@given(ops=OPS)
async def test_ops_and_node_kills(pg_dsn: str, ops: list[str]) -> None:
    gate = trio.Event()
    started: list[str] = []

    @ta.function_tool
    async def work(ctx: ta.ToolContext) -> str:
        """Work (never twice)."""
        started.append(ctx.call_id)
        await gate.wait()
        return "worked"

    @ta.function_tool(needs_approval=True)
    async def ask(ctx: ta.ToolContext) -> str:
        """Something that needs approval."""
        return "asked"

    model = ScriptedModel(
        [Turn(tool_calls=[ta.ToolCall("w1", "work", "{}"), ta.ToolCall("a1", "ask", "{}")])],
        default="done",
    )
    agents = {"a": ta.Agent(name="a", instructions="", model=model, tools=[work, ask])}
    session_id = f"s{id(ops)}"
    async with trio.open_nursery() as nursery:
        nodes: dict[str, Node] = {}
        for name in ("N1", "N2", "N3"):
            nodes[name] = await nursery.start(_serve_node, agents, pg_dsn, name)
        # The observer's node is never killed (it may become the owner: then no kill).
        async with client(nodes["N1"].url) as starter:
            run_id = (await starter.ok("run.start", agent="a", input="go", session_id=session_id))[
                "run_id"
            ]
        async with client(nodes["N3"].url) as c:
            await c.ok("run.subscribe", run_id=run_id, from_seq=1)
            with trio.fail_after(60):
                for op in ops:
                    if op == "inject":
                        await answer_ok(c, "run.inject", run_id=run_id, items="more")
                    elif op == "approve":
                        await answer_ok(c, "run.approve", run_id=run_id, call_id="a1")
                    elif op == "release":
                        gate.set()
                    elif op == "cancel":
                        await answer_ok(c, "run.cancel", run_id=run_id, reason="asked")
                    else:
                        owner = owner_of(pg_dsn, run_id)
                        if owner in nodes and owner != "N3" and len(nodes) > 2:
                            victim = nodes.pop(owner)
                            if op == "crash":
                                victim.crash()
                            else:
                                await victim.stop()
                # Let it end: release the tool, approve whatever waits.
                gate.set()
                approved: set[int] = set()
                while not any(_terminal(f["event"]) for f in c.events.get(run_id, [])):
                    waiting = [
                        f["seq"]
                        for f in c.events.get(run_id, [])
                        if f["event"]["type"] == "run.updated"
                        and f["event"]["status"] == "awaiting_approval"
                        and f["seq"] not in approved
                    ]
                    if waiting:
                        approved.update(waiting)
                        await answer_ok(c, "run.approve", run_id=run_id, call_id="a1")
                        continue  # frames may have come meanwhile: look again first
                    await c.changed.wait()
        nursery.cancel_scope.cancel()
    assert started.count("w1") <= 1
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute(
            "SELECT seq, data FROM trio_agents_events WHERE run_id = %s ORDER BY seq", (run_id,)
        ).fetchall()
    seqs = [r[0] for r in rows]
    assert seqs == list(range(1, len(seqs) + 1))
    terminal = [r for r in rows if _terminal(json.loads(r[1]))]
    assert [r[0] for r in terminal] == [seqs[-1]]
    async with PostgresSession(pg_dsn, json.dumps(["alice", session_id])) as session:
        assert ta.conversation_problems(await session.get_items()) == []


def _terminal(event: dict[str, Any]) -> bool:
    return event["type"] == "run.updated" and event["status"] in (
        "completed",
        "failed",
        "cancelled",
    )


async def _serve_node(
    agents: dict[str, ta.Agent], dsn: str, name: str, *, task_status: trio.TaskStatus[Node]
) -> None:
    async with trio.open_nursery() as nursery, node(nursery, agents, dsn, name, lease_ttl=2.0) as n:
        task_status.started(n)
        await n.stopped.wait()
        nursery.cancel_scope.cancel()
