"""The wire format (unit tests, no sockets) and the server's limits (loopback)."""

from __future__ import annotations

import contextlib
import json

import pytest
import trio

import trio_agents as ta
from tests.support.control_support import ask, raw_client, serving, serving_alice, wait_until
from trio_agents.control import ERROR_CODES, ControlError, Limits, RunInfo, connect, event_from_json
from trio_agents.hosting._error_codes import ProtocolError
from trio_agents.hosting._requests import RunCancel, RunStart, parse_request
from trio_agents.models import ScriptedModel, Turn


@pytest.mark.parametrize(
    ("text", "code", "request_id"),
    [
        ("{", "invalid_json", None),
        (b"\x00binary", "invalid_json", None),
        ('{"id": 1, "op": "runs.list", "x": NaN}', "invalid_json", None),
        ("[1, 2]", "invalid_request", None),
        ('{"op": "runs.list"}', "invalid_request", None),
        ('{"id": true, "op": "runs.list"}', "invalid_request", None),
        ('{"id": "1"}', "invalid_request", "1"),
        ('{"id": "1", "op": "run.fly"}', "unknown_op", "1"),
        ('{"id": "1", "op": "run.get"}', "invalid_request", "1"),
        ('{"id": "1", "op": "run.get", "run_id": 5}', "invalid_request", "1"),
        ('{"id": "1", "op": "runs.list", "extra": 1}', "invalid_request", "1"),
        (
            '{"id": 2, "op": "run.start", "agent": "a", "input": [{"role": "x"}]}',
            "invalid_request",
            2,
        ),
        ('{"id": 2, "op": "run.start", "agent": "a", "input": []}', "invalid_request", 2),
        ('{"id": 2, "op": "run.subscribe", "run_id": "r", "from_seq": -1}', "invalid_request", 2),
        ('{"id": 2, "op": "run.cancel", "run_id": "r", "mode": "later"}', "invalid_request", 2),
        ("[" * 100000 + "]" * 100000, "invalid_json", None),
    ],
)
def test_parse_errors(text: str | bytes, code: str, request_id: object) -> None:
    with pytest.raises(ProtocolError) as error:
        parse_request(text)
    assert error.value.code == code
    assert error.value.request_id == request_id
    assert code in ERROR_CODES


def test_parse_defaults() -> None:
    request = parse_request('{"id": "9", "op": "run.start", "agent": "a", "input": "hi"}')
    assert request == RunStart(id="9", agent="a", input=(ta.UserMessage("hi"),))
    assert isinstance(request, RunStart)
    assert (request.on_disconnect, request.on_busy, request.subscribe) == (
        "continue",
        "reject",
        None,
    )
    cancel = parse_request('{"id": 1, "op": "run.cancel", "run_id": "r", "reason": null}')
    assert cancel == RunCancel(id=1, run_id="r", reason=None, mode="immediate")


def test_events_round_trip_through_json() -> None:
    events: list[ta.RunEvent] = [
        ta.RunUpdated("r", 1, ta.RunStatus.RUNNING, None, 0, 1.5, {"pending": ["c"]}),
        ta.ResponseTextDelta("r", 2, 1, "hi"),
        ta.RunItemEvent("r", 3, 1, ta.ToolCall("c", "f", "{}")),
        ta.ToolStarted("r", 4, "c", "f", "{}"),
        ta.ToolProgress("r", 5, "c", "f", "half", {"n": 1}),
        ta.ToolFinished("r", 6, "c", "f", "ok", "out"),
        ta.InboxInjected("r", 7, "inj_1", "now", (ta.UserMessage("x"),)),
        ta.InboxDelivered("r", 8, "inj_1", 2),
        ta.EventsDropped("r", 9, 3, 7),
    ]
    for event in events:
        assert event_from_json(json.loads(json.dumps(event.to_json()))) == event
    with pytest.raises(ValueError, match="unknown event type"):
        event_from_json({"type": "nope", "run_id": "r", "seq": 1})


def test_limits_validate() -> None:
    with pytest.raises(ValueError, match="send_timeout"):
        Limits(send_timeout=0)
    with pytest.raises(TypeError):
        Limits(max_message_size=1.5)  # type: ignore[arg-type]
    assert Limits().send_timeout == 10.0
    assert Limits().retain_finished == 600.0
    info = RunInfo("r", "a", None, ta.RunStatus.QUEUED, None, 1)
    assert RunInfo.from_json(info.to_json()) == info


def slow_agent() -> ta.Agent:
    model = ScriptedModel([], default=Turn(text="w " * 2000, delay=0.05))
    return ta.Agent(name="a", instructions="", model=model)


async def test_limits_runs_subscriptions_rate_and_inbox() -> None:
    limits = Limits(
        max_runs_per_principal=2,
        max_subscriptions_per_connection=1,
        start_rate=0.001,
        start_burst=2,
        ping_interval=None,
    )
    with trio.fail_after(20):
        async with (
            serving({"a": slow_agent()}, limits=limits, run_options={"inbox_capacity": 1}) as (
                _,
                url,
            ),
            connect(url, token="tok-alice") as client,
        ):
            first = await client.start("a", "1")  # subscribed: uses the one subscription
            with pytest.raises(ControlError) as subs:
                await client.start("a", "2", subscribe="status")
            assert subs.value.code == "limit_exceeded"
            second = await client.start("a", "2", subscribe=None)
            with pytest.raises(ControlError) as runs:
                await client.start("a", "3", subscribe=None)
            assert runs.value.code == "limit_exceeded"
            with pytest.raises(ControlError) as subscribe:
                await second.wait()
            assert subscribe.value.code == "limit_exceeded"
            await first.inject("one")
            with pytest.raises(ControlError) as full:
                await first.inject("two")
            assert full.value.code == "inbox_full"
            with pytest.raises(ControlError) as unknown_agent:
                await client.start("nobody", "x", subscribe=None)
            assert unknown_agent.value.code == "not_found"
            await first.cancel()
            await second.cancel()
            await first.wait()
            # 2 starts used the burst; the rate refills far too slowly for a 4th
            with pytest.raises(ControlError) as rate:
                await client.start("a", "4", subscribe=None)
            assert rate.value.code == "limit_exceeded"
            assert "per second" in rate.value.message


async def test_withdraw_and_run_closed_codes_on_the_wire() -> None:
    with trio.fail_after(20):
        async with serving({"a": slow_agent()}) as (_, url), raw_client(url) as ws:
            ack = await ask(ws, {"id": "s", "op": "run.start", "agent": "a", "input": "x"})
            run_id = ack["run_id"]
            inj = await ask(
                ws,
                {
                    "id": 1,
                    "op": "run.inject",
                    "run_id": run_id,
                    "items": "later",
                    "when": "when_idle",
                },
            )
            assert inj["type"] == "ack"
            withdrawn = await ask(
                ws,
                {
                    "id": 2,
                    "op": "run.withdraw",
                    "run_id": run_id,
                    "injection_id": inj["injection_id"],
                },
            )
            assert withdrawn == {"type": "ack", "id": 2, "withdrawn": True}
            assert (await ask(ws, {"id": 3, "op": "run.cancel", "run_id": run_id}))["type"] == "ack"
            got = await ask(
                ws, {"id": 4, "op": "run.subscribe", "run_id": run_id, "events": "status"}
            )
            assert got["type"] == "ack"
            statuses = []
            while True:
                frame = json.loads(await ws.get_message())
                assert frame["type"] == "event"
                assert frame["event"]["type"] == "run.updated"
                statuses.append(frame["event"]["status"])
                if frame["event"]["status"] == "cancelled":
                    break
            assert statuses[0] == "queued"
            closed = await ask(ws, {"id": 5, "op": "run.cancel", "run_id": run_id})
            assert (closed["type"], closed["code"]) == ("error", "run_closed")
            info = await ask(ws, {"id": 6, "op": "run.get", "run_id": run_id})
            assert info["run"]["status"] == "cancelled"
            assert info["run"]["reason"] == "cancelled"
            unsub = await ask(ws, {"id": 7, "op": "run.unsubscribe", "run_id": run_id})
            assert unsub == {"type": "ack", "id": 7, "unsubscribed": False}


async def test_finished_runs_are_forgotten_after_retention() -> None:
    model = ScriptedModel([], default=Turn(text="done"))
    agent = ta.Agent(name="a", instructions="", model=model)
    limits = Limits(retain_finished=0.05, ping_interval=None)
    with trio.fail_after(20):
        async with serving_alice({"a": agent}, limits=limits) as (server, client):
            run = await client.start("a", "x")
            await run.wait()
            await wait_until(lambda: server.statistics().retained_runs == 0)
            with pytest.raises(ControlError) as gone:
                await run.get()
            assert gone.value.code == "not_found"


async def test_dead_peer_is_detected_by_keepalive_pings() -> None:
    limits = Limits(ping_interval=0.05, ping_timeout=0.2)
    with trio.fail_after(20):
        async with serving({"a": slow_agent()}, limits=limits) as (server, url):
            port = int(url.rsplit(":", 1)[1].strip("/"))
            # A peer that completes the handshake, then never answers a ping. Driven by
            # what the socket sees, not by how long things take: the server's 101, then
            # (after unanswered pings) its end of the connection.
            with trio.socket.socket() as sock:
                await sock.connect(("127.0.0.1", port))
                await sock.send(
                    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: trio-agents.v1\r\n"
                    b"Authorization: Bearer tok-alice\r\n\r\n"
                )
                received = b""
                with contextlib.suppress(ConnectionResetError):
                    while chunk := await sock.recv(65536):
                        received += chunk
                assert received.startswith(b"HTTP/1.1 101 ")
                assert b"\x89" in received  # at least one ping frame (opcode 0x9) came
            await wait_until(lambda: server.statistics().connections == 0)


async def test_oversized_message_closes_with_1009() -> None:
    limits = Limits(max_message_size=1000, ping_interval=None)
    with trio.fail_after(20):
        async with serving({"a": slow_agent()}, limits=limits) as (_, url), raw_client(url) as ws:
            await ws.send_message(json.dumps({"id": 1, "op": "runs.list", "pad": "x" * 2000}))
            from trio_websocket import ConnectionClosed

            with pytest.raises(ConnectionClosed) as closed:
                await ws.get_message()
            assert closed.value.reason is not None
            assert closed.value.reason.code == 1009


@pytest.mark.parametrize("bad", ["\x00", "a\x00", "\ud800", "x\udfffy"])
@pytest.mark.parametrize(
    "frame",
    [
        {"id": "{bad}", "op": "runs.list"},
        {"id": 1, "op": "run.cancel", "run_id": "r", "reason": "{bad}"},
        {"id": 1, "op": "run.get", "run_id": "{bad}"},
        {"id": 1, "op": "session.cancel", "session_id": "{bad}"},
        {"id": 1, "op": "run.start", "agent": "a", "input": "{bad}"},
        {"id": 1, "op": "run.start", "agent": "a", "input": "hi", "session_id": "{bad}"},
        {"id": 1, "op": "run.start", "agent": "{bad}", "input": "hi"},
        {
            "id": 1,
            "op": "run.inject",
            "run_id": "r",
            "items": [{"type": "user", "content": "{bad}"}],
        },
        {"id": 1, "op": "run.reject", "run_id": "r", "call_id": "c", "message": "{bad}"},
        {"id": 1, "op": "runs.list", "{bad}": 1},
    ],
)
def test_strings_with_nul_or_a_lone_surrogate_are_refused(
    frame: dict[str, object], bad: str
) -> None:
    """Anywhere in a request (docs/protocol.md): ``invalid_request``, the id echoed."""
    text = json.dumps(frame).replace("{bad}", json.dumps(bad)[1:-1])
    with pytest.raises(ProtocolError) as error:
        parse_request(text)
    assert error.value.code == "invalid_request"
    assert error.value.request_id == json.loads(text)["id"]


def test_a_surrogate_pair_is_one_character_and_accepted() -> None:
    request = parse_request('{"id": 1, "op": "run.start", "agent": "a", "input": "\\ud83d\\ude00"}')
    assert isinstance(request, RunStart)
    assert request.input == (ta.UserMessage("\U0001f600"),)
