"""``session.fork`` on a cluster's nodes (DESIGN §23): the cluster's sessions are forked
in PostgreSQL in one transaction, from any node, while a run on another node is inside
a tool call; a finished tree's child session comes along; another principal's session
is ``not_found``; an event position is refused clearly (the cluster cannot resolve one
yet); a fork never overwrites and never lands in a busy session."""

from __future__ import annotations

import json

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
        await ca.start_until_tool(agent="a", input="then wait", session_id="s1")
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
        event = await cb.request(
            "session.fork", session_id="s1", new_session_id="h", at={"run_id": first, "seq": 2}
        )
        assert event["code"] == "invalid_request"
        assert "event position" in event["message"]
        busy = await cb.request("session.fork", session_id="f", new_session_id="s1")
        assert busy["code"] == "session_busy"
        async with client(b.url, token="tok-bob") as bob:
            theirs = await bob.request("session.fork", session_id="s1", new_session_id="x")
            unknown = await ca.request("session.fork", session_id="nope", new_session_id="x")
        assert theirs["code"] == unknown["code"] == "not_found"
        gate.set()
