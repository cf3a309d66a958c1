"""``session.fork`` on a cluster's nodes (DESIGN §23): the cluster's sessions are forked
in PostgreSQL in one transaction, from any node, while a run on another node is inside
a tool call; a finished tree's child session comes along; another principal's session
is ``not_found``; an event position of a run of the session, ended or live, is
resolved from the run's ``run.item`` events on any node; a fork never overwrites and
never lands in a busy session."""

from __future__ import annotations

import json
from typing import Any

import trio

import trio_agents as ta
from tests.support.cluster_nodes import agents, clients, open_nodes, waiting_tool
from tests.support.cluster_support import client
from trio_agents import ToolCall, UserMessage, conversation_problems
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import PostgresSession


async def _stored(dsn: str, key: str) -> list[ta.Item]:
    async with PostgresSession(dsn, key) as session:
        return await session.get_stored_items()


def _key(principal: str, session_id: str) -> str:
    return json.dumps([principal, session_id])


def _at(run_id: str, seq: int) -> dict[str, Any]:
    return {"run_id": run_id, "seq": seq}


async def test_fork_on_another_node_while_a_run_waits_in_a_tool(pg_dsn: str) -> None:
    gate = trio.Event()
    wait = waiting_tool(gate)
    helper = ta.Agent(name="helper", model=ScriptedModel([], default="helped"))
    model = ScriptedModel(
        [
            Turn(tool_calls=[("helper", {"input": "x"})]),
            "first done",
            Turn(text="now waiting", tool_calls=[("wait", {})]),
        ],
        default="ok",
    )
    served = agents(model, [wait, helper.as_tool(name="helper")])
    async with (
        open_nodes(pg_dsn, {"A": served, "B": served}) as (a, b),
        clients(a, b) as (ca, cb),
    ):
        first = await ca.start_run(agent="a", input="tree", session_id="s1", subscribe="all")
        assert (await ca.wait_terminal(first))["event"]["status"] == "completed"
        second = await ca.start_until_tool(agent="a", input="then wait", session_id="s1")
        answer = await cb.ok("session.fork", session_id="s1", new_session_id="f")
        whole = await _stored(pg_dsn, _key("alice", "s1"))
        forked = await _stored(pg_dsn, _key("alice", "f"))
        # Everything up to the open call: the first run, the second's input and text.
        assert answer["items"] == len(forked) == 6
        assert forked == whole[:6]
        assert forked[-2:] == [UserMessage("then wait"), ta.AssistantMessage("now waiting")]
        assert isinstance(whole[6], ToolCall)
        assert conversation_problems(forked) == []
        child = _key("alice", "s1") + "/call_1_0"
        assert await _stored(pg_dsn, _key("alice", "f") + "/call_1_0") == await _stored(
            pg_dsn, child
        )
        assert await _stored(pg_dsn, child)
        # An item index, from node A.
        at_one = await ca.ok("session.fork", session_id="s1", new_session_id="g", at=1)
        assert at_one["items"] == 1
        assert await _stored(pg_dsn, _key("alice", "g") + "/call_1_0") == []
        # Refusals.
        again = await cb.request("session.fork", session_id="s1", new_session_id="f")
        assert again["code"] == "invalid_request"
        # Event positions, from node B, resolved from the runs' run.item events (each
        # says where its item is in the session). The ended first run: up to its call
        # (rounded down: the result came later), and up to its last item.
        first_items = [f for f in ca.events[first] if f["event"]["type"] == "run.item"]
        call = next(f for f in first_items if f["event"]["item"]["type"] == "function_call")
        at_call = await cb.ok(
            "session.fork", session_id="s1", new_session_id="h1", at=_at(first, call["seq"])
        )
        assert at_call["items"] == 1
        at_end = await cb.ok(
            "session.fork",
            session_id="s1",
            new_session_id="h2",
            at=_at(first, first_items[-1]["seq"]),
        )
        assert at_end["items"] == 4
        assert await _stored(pg_dsn, _key("alice", "h2")) == whole[:4]
        assert await _stored(pg_dsn, _key("alice", "h2") + "/call_1_0") == await _stored(
            pg_dsn, child
        )
        # The live second run, inside its tool: what it had stored, its open call cut.
        live = await ca.ok(
            "session.fork", session_id="s1", new_session_id="h3", at=_at(second, 10_000)
        )
        assert live["items"] == 6
        # Before the second run's first item: the session as that run found it.
        before = await ca.ok(
            "session.fork", session_id="s1", new_session_id="h4", at=_at(second, 1)
        )
        assert before["items"] == 4
        # A run of another session, and an unknown run, are refused.
        other = await cb.request(
            "session.fork", session_id="f", new_session_id="h5", at=_at(first, 2)
        )
        assert other["code"] == "invalid_request"
        assert "did not run in session" in other["message"]
        nowhere = await cb.request(
            "session.fork", session_id="s1", new_session_id="h5", at=_at("run_nope", 2)
        )
        assert nowhere["code"] == "not_found"
        busy = await cb.request("session.fork", session_id="f", new_session_id="s1")
        assert busy["code"] == "session_busy"
        async with client(b.url, token="tok-bob") as bob:
            theirs = await bob.request("session.fork", session_id="s1", new_session_id="x")
            unknown = await ca.request("session.fork", session_id="nope", new_session_id="x")
        assert theirs["code"] == unknown["code"] == "not_found"
        gate.set()
