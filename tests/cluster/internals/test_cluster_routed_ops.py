"""Routed ops are typed values: the codec of the cluster's wire (``_routing.to_wire`` /
``from_wire``) round-trips every op a node sends another, hostile strings included, and
a command no node can read is refused with a clear error while the node goes on."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_nodes import agents, clients, open_nodes, reply_of, waiting_tool
from trio_agents.cluster._routing import WIRE_VERSION, RoutedOp, from_wire, to_wire
from trio_agents.cluster._schema import CHANNEL
from trio_agents.hosting import StartRequest
from trio_agents.hosting._error_codes import ProtocolError
from trio_agents.hosting._requests import (
    RunApprove,
    RunCancel,
    RunGet,
    RunInject,
    RunReject,
    RunWithdraw,
)
from trio_agents.hosting._server_limits import MAX_NAME_LENGTH, MAX_REASON_LENGTH
from trio_agents.models import ScriptedModel, Turn

# Strings a client may send (a lone surrogate or NUL is refused at a wire face, but
# a host's own callers may pass one), and the longest ones the faces accept.
HOSTILE = [
    "plain",
    "\ud800 lone \udfff surrogates",
    "nul \x00 inside",
    "emoji 🦀 and \u2028 line separator",
    '"quotes" \\ backslashes \n newlines',
    "x" * MAX_REASON_LENGTH,
]
LONG_ID = "r" * MAX_NAME_LENGTH


def every_op(text: str) -> list[RoutedOp]:
    items = (
        ta.UserMessage(text),
        ta.ToolCall("call_1", "tool", json.dumps({"arg": text})),
        ta.ToolResult("call_1", text, status="error"),
    )
    return [
        StartRequest(agent="a", input=items),
        StartRequest(
            agent=LONG_ID,
            input=items,
            session_id=text[:MAX_NAME_LENGTH],
            on_disconnect="continue",
            on_busy="interrupt",
            limits={"max_turns": 3, "deadline": 1.5, "cost": 0.25},
            input_overlap="skip",
        ),
        RunCancel(run_id=LONG_ID, reason=text, mode="after_turn"),
        RunCancel(run_id="r1"),
        RunInject(run_id="r1", items=items, when="now"),
        RunWithdraw(run_id="r1", injection_id=text[:MAX_NAME_LENGTH]),
        RunApprove(run_id="r1", call_id=text[:MAX_NAME_LENGTH]),
        RunReject(run_id="r1", call_id="call_1", message=text),
        RunReject(run_id="r1", call_id="call_1"),
        RunGet(run_id=text[:MAX_NAME_LENGTH]),
    ]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_every_routed_op_round_trips_through_the_wire(text: str) -> None:
    for op in every_op(text):
        wire = to_wire(op)
        # What a command row and its NOTIFY hold: JSON text, ASCII (lone surrogates
        # escaped), so PostgreSQL stores it whatever the strings are.
        carried = json.dumps(wire)
        assert carried.isascii()
        assert from_wire(json.loads(carried)) == op
        assert wire["v"] == WIRE_VERSION
        assert "id" not in wire  # the client's request id stays with its face


def test_a_version_1_command_without_a_version_is_read() -> None:
    # The shape a node wrote before the codec (rows of a cluster being upgraded).
    old = {"id": 0, "op": "run.cancel", "run_id": "r1", "reason": "stop", "mode": "immediate"}
    assert from_wire(old) == RunCancel(run_id="r1", reason="stop")
    old_start = {
        "id": 0,
        "op": "run.start",
        "agent": "a",
        "input": [ta.UserMessage("hi").to_json()],
        "session_id": None,
        "on_disconnect": "cancel",
        "on_busy": "reject",
        "input_overlap": "keep",
        "subscribe": None,
        "limits": None,
    }
    start = from_wire(old_start)
    assert isinstance(start, StartRequest)
    assert (start.agent, start.on_disconnect, start.input) == (
        "a",
        "cancel",
        (ta.UserMessage("hi"),),
    )
    # A key a newer node adds is ignored; a field left out takes its default.
    assert from_wire({"op": "run.approve", "run_id": "r1", "call_id": "c", "new": 1}) == (
        RunApprove(run_id="r1", call_id="c")
    )


GARBLED: list[tuple[Any, str]] = [
    ("not an object", "must be a JSON object"),
    ([{"op": "run.cancel"}], "must be a JSON object"),
    ({"run_id": "r1"}, "None is not a routed op"),
    ({"op": "run.nope", "run_id": "r1"}, "'run.nope' is not a routed op"),
    ({"op": "run.subscribe", "run_id": "r1"}, "'run.subscribe' is not a routed op"),
    ({"op": "x" * 10_000}, "is not a routed op"),
    ({"op": "run.cancel"}, "run.cancel: run_id must be a string"),
    ({"op": "run.cancel", "run_id": 7}, "run.cancel: run_id must be a string"),
    ({"op": "run.cancel", "run_id": "r", "reason": []}, "reason must be a string or null"),
    ({"op": "run.cancel", "run_id": "r", "mode": "later"}, "mode must be one of"),
    ({"op": "run.inject", "run_id": "r", "items": "hi"}, "items must be a list of items"),
    ({"op": "run.inject", "run_id": "r", "items": [{"type": "?"}]}, "bad items: item 0"),
    ({"op": "run.start", "agent": "a", "input": [], "limits": 5}, "limits must be an object"),
    ({"op": "run.start", "input": []}, "agent must be a string"),
    ({"v": 2, "op": "run.cancel", "run_id": "r"}, "wire version 2 is newer than this node's"),
    ({"v": "1", "op": "run.cancel", "run_id": "r"}, "bad wire version"),
    ({"v": True, "op": "run.cancel", "run_id": "r"}, "bad wire version"),
]


@pytest.mark.parametrize(("data", "says"), GARBLED, ids=range(len(GARBLED)))
def test_an_unreadable_routed_op_is_refused_by_name(data: Any, says: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        from_wire(data)
    assert refused.value.code == "invalid_request"
    assert refused.value.message.startswith("unreadable routed op: ")
    assert says in refused.value.message
    assert len(refused.value.message) < 300  # a huge op name is not echoed whole


def _insert_command(dsn: str, node: str, args: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO trio_agents_commands (run_id, target_node, origin_node, principal,"
            " op, args) VALUES (NULL, %s, 'elsewhere', 'alice', 'run.cancel', %s)"
            " RETURNING command_id",
            (node, args),
        ).fetchone()
        assert row is not None
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps({"k": "cmd", "n": node})))
        return int(row[0])


async def _answer(dsn: str, command_id: int) -> str:
    """The reply stored with a command (written by a node's transaction: polled)."""
    while True:
        reply = await trio.to_thread.run_sync(reply_of, dsn, command_id)
        if reply is not None:
            return reply
        await trio.sleep(0.05)


def _notify(dsn: str, note: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps(note)))


async def test_garbled_commands_are_refused_and_the_node_goes_on(pg_dsn: str) -> None:
    wait = waiting_tool(trio.Event())  # never set: a run waits in its tool call
    model = ScriptedModel([Turn(tool_calls=[("wait", {})]), "finished"])
    async with (
        open_nodes(pg_dsn, dict.fromkeys("AB", agents(model, [wait]))) as (a, b),
        clients(a, b) as (ca, cb),
    ):
        node = a.cluster.node_id
        # Notes no node wrote: a command without its sender or principal, ids of the
        # wrong type. Each makes the node read its table instead of crashing it.
        for note in (
            {"k": "cmd", "n": node, "c": 10**9, "a": {"op": "run.cancel"}, "t": 1},
            {"k": "cmd", "n": node, "c": 10**9 + 1, "a": {}, "p": 1, "o": None, "t": 1},
            {"k": "cmd", "n": node, "c": "x", "a": [], "r": 5},
            {"k": "reply", "n": node, "c": None, "a": "x"},
        ):
            await trio.to_thread.run_sync(_notify, pg_dsn, note)
        # Rows no node can read, addressed to A.
        garbled = {
            "{not json": "its JSON does not parse",
            "[1, 2]": "must be a JSON object",
            '{"op": "run.nope"}': "'run.nope' is not a routed op",
            '{"v": 99, "op": "run.cancel", "run_id": "r"}': "wire version 99 is newer",
        }
        commands = {
            await trio.to_thread.run_sync(_insert_command, pg_dsn, node, args): says
            for args, says in garbled.items()
        }
        with trio.fail_after(30):
            for command_id, says in commands.items():
                reply = await _answer(pg_dsn, command_id)
                code, message = json.loads(reply)["error"]
                assert code == "invalid_request"
                assert message.startswith("unreadable routed op: ")
                assert says in message
        # The node goes on: a cancel routed to it from B is applied and answered.
        run_id = await ca.start_until_tool(agent="a", input="hi")
        await cb.ok("run.cancel", run_id=run_id, reason="stop")
        done = await ca.wait_terminal(run_id)
        assert (done["event"]["status"], done["event"]["reason"]) == ("cancelled", "stop")
