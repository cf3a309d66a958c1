"""The AG-UI face under hostile or careless clients: no token, another principal's
thread and interrupts, garbage and refused ``RunAgentInput``, oversized bodies, and a
client that disconnects mid-stream with each ``on_disconnect``."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support import agui_support as agui
from trio_agents.faces import HttpLimits
from trio_agents.models import ScriptedModel, Turn


def _launcher(model: ScriptedModel | None = None) -> ta.Agent:
    return ta.Agent(
        name="ops",
        instructions="test",
        model=model or ScriptedModel([Turn(tool_calls=[("launch", {})]), "done"]),
        tools=[agui.launch],
    )


def _error(answer: Any) -> tuple[int, str, str]:
    error = answer.json()["error"]
    return answer.status_code, error["code"], error["message"]


async def test_no_token_is_401_and_nothing_starts() -> None:
    with trio.fail_after(30):
        async with agui.agui_server({"ops": _launcher()}) as (host, _, client):
            for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}):
                answer = await client.post("/ag-ui/ops", json=agui.run_input(), headers=headers)
                assert answer.status_code == 401
                assert answer.json()["error"]["code"] == "unauthorized"
            assert await host.list("alice") == []


async def test_another_principals_thread_and_interrupts_are_not_theirs() -> None:
    model = ScriptedModel([Turn(tool_calls=[("launch", {})]), "bob's answer"])
    with trio.fail_after(30):
        async with agui.agui_server({"ops": _launcher(model)}) as (host, _, client):
            first, interrupt = await agui.until_interrupt(
                client, "ops", agui.run_input(thread="shared")
            )
            resume = agui.approve(interrupt, thread="shared")
            # Bob answering Alice's interrupt: not found, and nothing is approved.
            status, code, _ = _error(await client.post("/ag-ui/ops", json=resume, headers=agui.BOB))
            assert (status, code) == (404, "not_found")
            alice_run = agui.ours(first[0])["run_id"]
            assert (await host.get("alice", alice_run)).status == "awaiting_approval"
            # Bob's thread of the same name is his own session: Alice's busy run does
            # not make it busy, and his run does not see her conversation.
            async with agui.agui_stream(
                client, "ops", agui.run_input(thread="shared", run="bob-1"), headers=agui.BOB
            ) as stream:
                bobs = await stream.rest()
            agui.check_order(bobs)
            assert bobs[-1]["outcome"]["type"] == "success"
            assert [type(i).__name__ for i in model.requests[-1].items] == ["UserMessage"]
            assert [r.run_id for r in await host.list("bob")] == [agui.ours(bobs[0])["run_id"]]
            # An interrupt id naming Alice's run but another thread: not found either.
            resume["threadId"] = "other"
            status, code, _ = _error(
                await client.post("/ag-ui/ops", json=resume, headers=agui.ALICE)
            )
            assert (status, code) == (404, "not_found")


@pytest.mark.parametrize(
    ("body", "code", "names"),
    [
        (b"{not json", "invalid_json", "JSON"),
        (b"[1, 2]", "invalid_request", "RunAgentInput"),
        (b'{"runId": "r", "messages": []}', "invalid_request", "threadId"),
        (b'{"threadId": 5, "runId": "r", "messages": []}', "invalid_request", "threadId"),
        (
            b'{"threadId": "t", "runId": "r", "messages": [{"role": "robot", "id": "1"}]}',
            "invalid_request",
            "messages",
        ),
        (b'{"threadId": "t", "runId": "r", "messages": []}', "invalid_request", "user message"),
        (
            b'{"threadId": "t", "runId": "r", "messages": [{"id": "1", "role": "assistant",'
            b' "content": "hi"}]}',
            "invalid_request",
            "user message",
        ),
        (
            b'{"threadId": "t", "runId": "r", "messages": [{"id": "1", "role": "user",'
            b' "content": "hi"}], "tools": [{"name": "x", "description": "y"}]}',
            "invalid_request",
            "tools",
        ),
        (
            b'{"threadId": "t", "runId": "r", "messages": [{"id": "1", "role": "user",'
            b' "content": "hi"}], "context": [{"description": "d", "value": "v"}]}',
            "invalid_request",
            "context",
        ),
        (
            b'{"threadId": "t", "runId": "r", "messages": [{"id": "1", "role": "user",'
            b' "content": "hi"}], "state": {"x": 1}}',
            "invalid_request",
            "state",
        ),
        (
            b'{"threadId": "t", "runId": "r", "messages": [{"id": "1", "role": "user",'
            b' "content": "hi"}], "forwardedProps": {"onDisconnect": "explode"}}',
            "invalid_request",
            "onDisconnect",
        ),
        (
            b'{"threadId": "t", "runId": "r", "messages": [{"id": "1", "role": "user",'
            b' "content": [{"type": "image", "source": {"type": "url",'
            b' "value": "http://x/y.png"}}]}]}',
            "invalid_request",
            "text parts",
        ),
        (
            b'{"threadId": "t", "runId": "r", "messages": [], "resume": [{"interruptId":'
            b' "garbage", "status": "resolved", "payload": {"approved": true}}]}',
            "invalid_request",
            "interruptId",
        ),
        (
            b'{"threadId": "' + b"t" * 257 + b'", "runId": "r", "messages": [{"id": "1",'
            b' "role": "user", "content": "hi"}]}',
            "invalid_request",
            "threadId",
        ),
        (
            b'{"threadId": "", "runId": "r", "messages": [{"id": "1", "role": "user",'
            b' "content": "hi"}]}',
            "invalid_request",
            "threadId",
        ),
    ],
)
async def test_garbage_run_agent_input_is_a_clear_400(body: bytes, code: str, names: str) -> None:
    with trio.fail_after(30):
        async with agui.agui_server({"ops": _launcher()}) as (host, _, client):
            answer = await client.post(
                "/ag-ui/ops",
                content=body,
                headers={**agui.ALICE, "Content-Type": "application/json"},
            )
            status, got, message = _error(answer)
            assert (status, got) == (400, code), message
            assert names in message
            assert await host.list("alice") == []


async def test_a_resume_payload_that_is_not_an_approval_is_refused() -> None:
    with trio.fail_after(30):
        async with agui.agui_server({"ops": _launcher()}) as (host, _, client):
            first, interrupt = await agui.until_interrupt(client, "ops")
            forged = base64.urlsafe_b64encode(b'["run_x", 1, "run_x", ""]').decode()
            for entry in (
                {"interruptId": interrupt["id"], "status": "resolved", "payload": "yes"},
                {"interruptId": interrupt["id"], "status": "resolved"},
                {"interruptId": interrupt["id"], "status": "maybe"},
                {"interruptId": forged, "status": "cancelled"},
                {
                    "interruptId": interrupt["id"],
                    "status": "resolved",
                    "payload": {"approved": False, "message": "x" * 5000},
                },
            ):
                body = agui.run_input(run="ag-2")
                body["resume"] = [entry]
                status, code, _ = _error(
                    await client.post("/ag-ui/ops", json=body, headers=agui.ALICE)
                )
                assert (status, code) == (400, "invalid_request"), entry
            run_id = agui.ours(first[0])["run_id"]
            assert (await host.get("alice", run_id)).status == "awaiting_approval"


async def test_an_unknown_agent_is_404() -> None:
    with trio.fail_after(30):
        async with agui.agui_server({"ops": _launcher()}) as (_, _, client):
            answer = await client.post("/ag-ui/nobody", json=agui.run_input(), headers=agui.ALICE)
    assert _error(answer)[:2] == (404, "not_found")


async def test_an_oversized_body_is_413_and_nothing_starts() -> None:
    limits = HttpLimits(max_body_bytes=4096)
    with trio.fail_after(30):
        async with agui.agui_server({"ops": _launcher()}, limits=limits) as (host, _, client):
            big = agui.run_input(text="x" * 10_000)
            answer = await client.post("/ag-ui/ops", json=big, headers=agui.ALICE)
            assert _error(answer)[:2] == (413, "limit_exceeded")

            async def chunks() -> Any:
                for _ in range(10):  # no Content-Length: read until past the bound
                    yield b" " * 1024

            answer = await client.post("/ag-ui/ops", content=chunks(), headers=agui.ALICE)
            assert _error(answer)[:2] == (413, "limit_exceeded")
            assert await host.list("alice") == []


async def _disconnect_mid_stream(params: dict[str, str] | None, body: dict[str, Any]) -> Any:
    """Start the gated agent, read until its tool call, drop the connection, wait until
    the server finished the stream, open the gate; the run's end."""
    gate = agui.new_gate()
    agent = agui.scripted("gated", [Turn(tool_calls=[("gated", {})]), "finished"], agui.gated)
    async with agui.agui_server({"gated": agent}) as (host, app, client):
        async with agui.agui_stream(client, "gated", body, params=params) as stream:
            started = await stream.next()
            assert started is not None
            await stream.until("TOOL_CALL_END")
        # The client is gone (the response closed): the server decides on_disconnect.
        await agui.wait_streams_closed(app)
        gate.set()
        return await host.wait_terminal("alice", agui.ours(started)["run_id"])


async def test_a_client_that_disconnects_cancels_its_run_by_default() -> None:
    with trio.fail_after(30):
        info = await _disconnect_mid_stream(None, agui.run_input())
    assert (info.status, info.reason) == ("cancelled", "client disconnected")


async def test_a_client_that_disconnects_with_continue_lets_its_run_finish() -> None:
    with trio.fail_after(30):
        by_query = await _disconnect_mid_stream({"on_disconnect": "continue"}, agui.run_input())
        by_props = await _disconnect_mid_stream(
            None, agui.run_input(forwardedProps={"onDisconnect": "continue"})
        )
        # forwardedProps overrides the route's default.
        overridden = await _disconnect_mid_stream(
            {"on_disconnect": "continue"}, agui.run_input(forwardedProps={"onDisconnect": "cancel"})
        )
    assert (by_query.status, by_props.status) == ("completed", "completed")
    assert (overridden.status, overridden.reason) == ("cancelled", "client disconnected")


async def test_an_interrupted_agui_run_leaves_its_run_waiting_not_cancelled() -> None:
    # The stream ends on the interrupt (the client did nothing wrong): the run waits.
    with trio.fail_after(30):
        async with agui.agui_server({"ops": _launcher()}) as (host, app, client):
            first, _ = await agui.until_interrupt(client, "ops")
            await agui.wait_streams_closed(app)
            run_id = agui.ours(first[0])["run_id"]
            assert (await host.get("alice", run_id)).status == "awaiting_approval"


async def test_bad_on_disconnect_query_is_400() -> None:
    with trio.fail_after(30):
        async with agui.agui_server({"ops": _launcher()}) as (_, _, client):
            answer = await client.post(
                "/ag-ui/ops",
                json=agui.run_input(),
                headers=agui.ALICE,
                params={"on_disconnect": "x"},
            )
    assert _error(answer)[:2] == (400, "invalid_request")


async def test_a_resume_answered_twice_is_refused_the_second_time() -> None:
    with trio.fail_after(30):
        async with agui.agui_server({"ops": _launcher()}) as (_, _, client):
            _, interrupt = await agui.until_interrupt(client, "ops")
            body = agui.approve(interrupt)
            async with agui.agui_stream(client, "ops", body) as stream:
                agui.check_order(await stream.rest())
            body["runId"] = "ag-3"
            answer = await client.post("/ag-ui/ops", json=body, headers=agui.ALICE)
    assert _error(answer)[:2] == (409, "run_closed")


async def test_a_resumed_agui_run_owns_the_run_too() -> None:
    gate = agui.new_gate()
    turns = [Turn(tool_calls=[("launch", {})]), Turn(tool_calls=[("gated", {})]), "done"]
    agent = agui.scripted("ops", turns, agui.launch, agui.gated)
    with trio.fail_after(30):
        async with agui.agui_server({"ops": agent}) as (host, app, client):
            first, interrupt = await agui.until_interrupt(client, "ops")
            async with agui.agui_stream(client, "ops", agui.approve(interrupt)) as stream:
                await stream.until("TOOL_CALL_START", toolCallName="gated")
            await agui.wait_streams_closed(app)
            gate.set()
            info = await host.wait_terminal("alice", agui.ours(first[0])["run_id"])
    assert (info.status, info.reason) == ("cancelled", "client disconnected")


def _interrupt_id(root: str, seq: int, run_id: str, call_id: str) -> str:
    """An interrupt id as a client could forge one (its format is base64url JSON)."""
    raw = json.dumps([root, seq, run_id, call_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decoded(value: str) -> list[Any]:
    decoded: list[Any] = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    return decoded


@pytest.mark.parametrize("second", ["unknown call", "unknown run", "the same again"])
async def test_a_refused_resume_applies_none_of_its_answers(second: str) -> None:
    """A resume whose first entry answers the real interrupt but whose second is
    refused (a call that waits nowhere, a run that is not there, or the first answered
    twice) changes nothing: the real call still waits, and a correct resume then
    continues the run as if the refused one had never come."""
    with trio.fail_after(30):
        async with agui.agui_server({"ops": _launcher()}) as (host, _, client):
            first, interrupt = await agui.until_interrupt(client, "ops")
            root, seq, run_id, call_id = _decoded(interrupt["id"])
            other = {
                "unknown call": _interrupt_id(root, seq, run_id, "call_nope"),
                "unknown run": _interrupt_id(root, seq, "run_nope", call_id),
                "the same again": interrupt["id"],
            }[second]
            body = agui.approve(interrupt)
            body["resume"].append(
                {"interruptId": other, "status": "resolved", "payload": {"approved": False}}
            )
            status, code, _ = _error(await client.post("/ag-ui/ops", json=body, headers=agui.ALICE))
            expected = (
                (400, "invalid_request") if second == "the same again" else (404, "not_found")
            )
            assert (status, code) == expected
            info = await host.get("alice", run_id)
            assert info.status == "awaiting_approval"
            assert info.pending_approvals == (call_id,)
            async with agui.agui_stream(client, "ops", agui.approve(interrupt)) as stream:
                second_run = await stream.rest()
    agui.check_order(second_run)
    assert second_run[-1]["outcome"] == {"type": "success"}
    result = next(e for e in second_run if e["type"] == "TOOL_CALL_RESULT")
    assert result["content"] == "launched"
    assert agui.ours(first[0])["run_id"] == run_id
