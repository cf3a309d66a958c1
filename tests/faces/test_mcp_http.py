"""The MCP face over Streamable HTTP (``/mcp`` on the HTTP faces' port), driven by the
official ``mcp`` client under Trio against a real loopback server (Hypercorn's Trio
worker): tools and their schemas, answers, structured output, failures as ``isError``,
cancel → a cancelled run with its repair in the session, progress, elicitation, a
cancel racing the answer, a client that goes away, principals, hostile arguments.

Both protocol eras the SDK speaks are exercised where they differ: the 2026-07-28 one
(``mode="auto"``: the client's default; a call's cancel closes its HTTP stream) and the
handshake era (``mode="legacy"``: an MCP session, ``notifications/cancelled``,
server-to-client ``elicitation/create``)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import mcp.types as types
import pytest
import trio
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

import trio_agents as ta
from tests.support.http_support import TOKENS, Served, client, serving
from tests.support.mcp_face_app import agents
from trio_agents.control import Limits, open_control_server
from trio_agents.faces import http_app, serve_http
from trio_agents.models import ScriptedModel, Turn

MODES = ["auto", "legacy"]
# What docs/mcp.md says: the reason of a run whose call the client cancelled, and
# the most characters of streamed text one progress message carries.
CANCEL_REASON = "mcp client cancelled"
PROGRESS_TEXT = 400

# The SDK's HTTP transport (httpx2 over httpcore2) leaves response-body async generators
# to the garbage collector when a stream ends, and Trio's finalizer warns about each one
# (as in tests/tools/internals/test_mcp.py). Only that warning, only from httpx2/httpcore2.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)2\.[^']*' was garbage collected:ResourceWarning"
)


@asynccontextmanager
async def mcp_client(
    served: Served, *, mode: str = "auto", token: str = "tok-alice", **options: Any
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=None)) as http:
        transport = streamable_http_client(served.base + "/mcp", http_client=http)
        async with Client(transport, mode=mode, **options) as mcp:
            yield mcp


def text_of(result: types.CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    return block.text


async def only_run(served: Served, principal: str = "alice") -> Any:
    (info,) = await served.server.host.list(principal)
    return info


@pytest.mark.parametrize("mode", MODES)
async def test_one_tool_per_agent_with_its_schemas(mode: str) -> None:
    async with serving(agents()) as served, mcp_client(served, mode=mode) as mcp:
        tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
    assert set(tools) == set(agents())
    echo = tools["echo"]
    assert echo.description == "Says hello."
    assert echo.input_schema["required"] == ["input"]
    assert set(echo.input_schema["properties"]) == {"input", "session_id"}
    assert echo.output_schema is None
    assert tools["point"].output_schema == {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    }
    # A type that is not an object is wrapped, as every model request carries it.
    assert tools["count"].output_schema is not None
    assert tools["count"].output_schema["properties"] == {"response": {"type": "integer"}}


@pytest.mark.parametrize("mode", MODES)
async def test_a_call_is_a_run_and_answers_its_final_output(mode: str) -> None:
    async with serving(agents()) as served, mcp_client(served, mode=mode) as mcp:
        result = await mcp.call_tool("echo", {"input": "hi"})
        info = await only_run(served)
    assert not result.is_error
    assert text_of(result) == "hello from echo"
    assert result.structured_content is None
    assert (info.agent, info.status.value) == ("echo", "completed")


async def test_structured_output_for_an_output_type() -> None:
    async with serving(agents()) as served, mcp_client(served) as mcp:
        point = await mcp.call_tool("point", {"input": "where?"})
        count = await mcp.call_tool("count", {"input": "how many?"})
    assert point.structured_content == {"x": 1, "y": 2}
    assert json.loads(text_of(point)) == {"x": 1, "y": 2}
    assert count.structured_content == {"response": 5}


@pytest.mark.parametrize("mode", MODES)
async def test_a_failed_run_is_a_tool_error_with_the_reason(mode: str) -> None:
    async with serving(agents()) as served, mcp_client(served, mode=mode) as mcp:
        result = await mcp.call_tool("broken", {"input": "hi"})
        info = await only_run(served)
    assert result.is_error
    assert info.status.value == "failed"
    assert text_of(result) == f"run {info.run_id} failed: {info.reason}"
    assert "the model is down" in text_of(result)


async def test_a_refused_start_is_a_tool_error_with_its_code() -> None:
    limits = Limits(max_runs_per_principal=1)
    async with open_control_server(agents(), auth=TOKENS, limits=limits) as server:
        app = http_app(server.host, auth=TOKENS)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            served = Served(server, app, f"http://127.0.0.1:{port}", "")
            async with mcp_client(served) as mcp, client(served.base) as rest:
                answer = await rest.post("/runs", json={"agent": "blocker", "input": "go"})
                assert answer.status_code == 201
                result = await mcp.call_tool("echo", {"input": "hi"})
            nursery.cancel_scope.cancel()
    assert result.is_error
    assert text_of(result).startswith("limit_exceeded: ")


async def test_a_call_on_a_busy_session_waits_for_its_run() -> None:
    async with serving(agents()) as served, mcp_client(served) as mcp, client(served.base) as rest:
        answer = await rest.post(
            "/runs", json={"agent": "blocker", "input": "go", "session_id": "s1"}
        )
        busy = answer.json()["run_id"]
        async with trio.open_nursery() as nursery:
            results: list[types.CallToolResult] = []
            queued = trio.Event()

            async def progress(progress: float, total: float | None, message: str | None) -> None:
                if message == "queued":
                    queued.set()

            async def call() -> None:
                results.append(
                    await mcp.call_tool(
                        "history",
                        {"input": "after", "session_id": "s1"},
                        progress_callback=progress,
                    )
                )

            nursery.start_soon(call)
            await queued.wait()
            await rest.post(f"/runs/{busy}/cancel", json={"reason": "make room"})
    words = json.loads(text_of(results[0]))
    assert words[3:] == ["result:cancelled:cancelled: make room", "user:after"]


@pytest.mark.parametrize("mode", MODES)
async def test_hostile_arguments_are_json_rpc_errors_and_start_nothing(mode: str) -> None:
    async with serving(agents()) as served, mcp_client(served, mode=mode) as mcp:
        # Past the body bound (HttpLimits.max_body_bytes, 1 MiB): refused unread (413),
        # which the client reports as a JSON-RPC error.
        with pytest.raises(MCPError):
            await mcp.call_tool("echo", {"input": "x" * (2 << 20)})
        for arguments in (
            {"input": "a\x00b"},
            {"input": 5},
            {"input": "hi", "session_id": ""},
            {"input": "hi", "extra": 1},
            {},
        ):
            with pytest.raises(MCPError) as caught:
                await mcp.call_tool("echo", arguments)
            assert caught.value.code == -32602
        with pytest.raises(MCPError):
            await mcp.call_tool("nobody", {"input": "hi"})
        assert await served.server.host.list("alice") == []
        # ...and the connection is still good.
        assert text_of(await mcp.call_tool("echo", {"input": "hi"})) == "hello from echo"


async def cancel_once_blocked(
    mcp: Client, progressed: Callable[[str], None] | None = None, session_id: str = "s1"
) -> None:
    """Call the blocker; cancel the call once its tool is running (progress says so)."""
    with trio.CancelScope() as scope:

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            if progressed is not None:
                progressed(message or "")
            if message == "tool wait_forever started":
                scope.cancel()

        await mcp.call_tool(
            "blocker", {"input": "go", "session_id": session_id}, progress_callback=progress
        )
    assert scope.cancelled_caught


@pytest.mark.parametrize("mode", MODES)
async def test_cancel_mid_run_ends_the_run_cancelled_with_its_repair_in_the_session(
    mode: str,
) -> None:
    async with serving(agents()) as served, mcp_client(served, mode=mode) as mcp:
        await cancel_once_blocked(mcp)
        run_id = (await only_run(served)).run_id
        info = await served.server.host.wait_terminal("alice", run_id)
        assert (info.status.value, info.reason) == ("cancelled", CANCEL_REASON)
        # The session holds the repaired conversation: what the next run is sent.
        seen = await mcp.call_tool("history", {"input": "and now?", "session_id": "s1"})
    assert json.loads(text_of(seen)) == [
        "user:go",
        "assistant:completed",
        "call:wait_forever",
        f"result:cancelled:cancelled: {CANCEL_REASON}",
        "user:and now?",
    ]


@pytest.mark.parametrize("mode", MODES)
async def test_progress_notifications_follow_the_run_in_order(mode: str) -> None:
    seen: list[tuple[float, str | None]] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        assert total is None
        seen.append((progress, message))

    async with serving(agents()) as served, mcp_client(served, mode=mode) as mcp:
        await mcp.call_tool("echo", {"input": "hi"}, progress_callback=progress)
    assert [message for _, message in seen] == [
        "queued",
        "running",
        "hello ",
        "hello from ",
        "hello from echo",
        "completed",
    ]
    values = [value for value, _ in seen]
    assert values == sorted(set(values))  # strictly increasing: the run's seqs


async def test_progress_text_is_bounded_to_its_tail() -> None:
    long = ta.Agent(name="long", model=ScriptedModel([Turn(text=["x" * 1000, "y" * 10])]))
    messages: list[str] = []

    async def progress(progress: float, total: float | None, message: str | None) -> None:
        messages.append(message or "")

    async with serving({"long": long}) as served, mcp_client(served) as mcp:
        result = await mcp.call_tool("long", {"input": "hi"}, progress_callback=progress)
    assert text_of(result) == "x" * 1000 + "y" * 10
    assert messages[3] == "…" + ("x" * 1000 + "y" * 10)[-PROGRESS_TEXT:]


def answering(action: str, content: dict[str, Any] | None = None) -> Any:
    asked: list[str] = []

    async def elicitation(
        _context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        asked.append(params.message)
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return elicitation, asked


async def tool_result(served: Served, run_id: str) -> dict[str, Any]:
    async with served.server.host.events("alice", run_id) as events:
        outputs = [
            e.event["item"]
            async for e in events
            if e.event.get("type") == "run.item"
            and e.event["item"].get("type") == "function_call_output"
        ]
    (output,) = outputs
    return dict(output)


@pytest.mark.parametrize("mode", MODES)
async def test_an_approval_is_elicited_and_accept_approves(mode: str) -> None:
    """Handshake era: an ``elicitation/create`` request on the call's stream;
    2026-07-28: an ``InputRequiredResult``, the call retried with the answer (the
    client's ``call_tool`` drives both)."""
    elicitation, asked = answering("accept")
    async with (
        serving(agents()) as served,
        mcp_client(served, mode=mode, elicitation_callback=elicitation) as mcp,
    ):
        result = await mcp.call_tool("deployer", {"input": "ship it"})
        run_id = (await only_run(served)).run_id
        output = await tool_result(served, run_id)
    assert not result.is_error
    assert text_of(result) == "done"
    (message,) = asked
    assert message.startswith('The agent wants to call deploy {"target": "prod"}')
    assert (output["status"], output["output"]) == ("ok", "deployed to prod")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("action", ["decline", "cancel"])
async def test_decline_or_cancel_of_the_elicitation_rejects(action: str, mode: str) -> None:
    elicitation, asked = answering(action)
    async with (
        serving(agents()) as served,
        mcp_client(served, mode=mode, elicitation_callback=elicitation) as mcp,
    ):
        result = await mcp.call_tool("deployer", {"input": "ship it"})
        output = await tool_result(served, (await only_run(served)).run_id)
    assert len(asked) == 1
    assert not result.is_error  # the run goes on: the model reads the rejection
    assert output["status"] == "error"
    assert f"{action}d by the user" in output["output"]


@pytest.mark.parametrize("mode", MODES)
async def test_an_accepted_elicitation_with_a_note_still_approves(mode: str) -> None:
    elicitation, _ = answering("accept", {"message": "go ahead"})
    async with (
        serving(agents()) as served,
        mcp_client(served, mode=mode, elicitation_callback=elicitation) as mcp,
    ):
        await mcp.call_tool("deployer", {"input": "ship it"})
        output = await tool_result(served, (await only_run(served)).run_id)
    assert output["status"] == "ok"


async def test_an_input_required_state_names_only_the_callers_own_run() -> None:
    """2026-07-28's retry carries a ``requestState`` the client could forge: it names
    a run, which must be the caller's (as any run id on any face)."""
    elicitation, _ = answering("accept")
    async with (
        serving(agents()) as served,
        mcp_client(served, elicitation_callback=elicitation) as alice,
        mcp_client(served, token="tok-bob", elicitation_callback=elicitation) as bob,
    ):
        first = await alice.session.call_tool(
            "deployer", {"input": "ship it"}, allow_input_required=True
        )
        assert isinstance(first, types.InputRequiredResult)
        assert first.input_requests is not None
        (call_id,) = first.input_requests
        info = await only_run(served)
        assert (info.status.value, info.pending_approvals) == ("awaiting_approval", (call_id,))
        yes: types.InputResponses = {call_id: types.ElicitResult(action="accept")}
        for who, state in ((bob, first.request_state), (alice, "garbage"), (alice, "run_x:1")):
            with pytest.raises(MCPError) as caught:
                await who.session.call_tool(
                    "deployer", {"input": "x"}, request_state=state, input_responses=yes
                )
            assert caught.value.code == -32602
        assert (await only_run(served)).status.value == "awaiting_approval"
        # A retry that answers nothing is asked again, from where it stopped.
        again = await alice.session.call_tool(
            "deployer",
            {"input": "ship it"},
            request_state=first.request_state,
            allow_input_required=True,
        )
        assert isinstance(again, types.InputRequiredResult)
        assert again.input_requests is not None
        assert list(again.input_requests) == [call_id]
        assert again.request_state == first.request_state
        done = await alice.session.call_tool(
            "deployer", {"input": "ship it"}, request_state=again.request_state, input_responses=yes
        )
    assert text_of(done) == "done"
    assert (await tool_result(served, info.run_id))["status"] == "ok"


@pytest.mark.parametrize("mode", MODES)
async def test_without_elicitation_the_approval_waits_for_another_face(mode: str) -> None:
    async with (
        serving(agents()) as served,
        mcp_client(served, mode=mode) as mcp,
        trio.open_nursery() as nursery,
        client(served.base) as rest,
    ):
        results: list[types.CallToolResult] = []
        waiting = trio.Event()

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            if (message or "").startswith("awaiting approval: deploy"):
                waiting.set()

        async def call() -> None:
            results.append(
                await mcp.call_tool("deployer", {"input": "ship it"}, progress_callback=progress)
            )

        nursery.start_soon(call)
        await waiting.wait()
        info = await only_run(served)
        (call_id,) = info.pending_approvals
        answer = await rest.post(f"/runs/{info.run_id}/approve", json={"call_id": call_id})
        assert answer.status_code == 200
    assert text_of(results[0]) == "done"
    assert (await tool_result(served, info.run_id))["status"] == "ok"


@pytest.mark.parametrize("mode", MODES)
async def test_a_cancel_racing_the_answer_leaves_one_consistent_end(mode: str) -> None:
    async with serving(agents()) as served, mcp_client(served, mode=mode) as mcp:
        with trio.CancelScope() as scope:

            async def progress(progress: float, total: float | None, message: str | None) -> None:
                if message == "completed":
                    scope.cancel()  # the answer is on its way: the cancel comes too late

            await mcp.call_tool("echo", {"input": "hi"}, progress_callback=progress)
        info = await served.server.host.wait_terminal("alice", (await only_run(served)).run_id)
        assert info.status.value == "completed"
        # The server is fine and the connection too.
        assert text_of(await mcp.call_tool("echo", {"input": "again"})) == "hello from echo"


class ClientGone(Exception):
    pass


@pytest.mark.parametrize("mode", MODES)
async def test_a_client_that_goes_away_mid_call_cancels_the_run(mode: str) -> None:
    """The client leaves its block mid-call (an error in it): the call's stream
    closes (2026-07-28) or the MCP session ends (DELETE, handshake era). The run
    follows the face's ``on_disconnect``, ``"cancel"``, and ends cancelled."""
    async with serving(agents()) as served:
        with pytest.RaisesGroup(ClientGone, flatten_subgroups=True):
            async with mcp_client(served, mode=mode) as mcp, trio.open_nursery() as nursery:
                blocked = trio.Event()

                async def progress(
                    progress: float, total: float | None, message: str | None
                ) -> None:
                    if message == "tool wait_forever started":
                        blocked.set()

                async def call() -> None:
                    await mcp.call_tool("blocker", {"input": "go"}, progress_callback=progress)

                nursery.start_soon(call)
                await blocked.wait()
                raise ClientGone
        info = await served.server.host.wait_terminal("alice", (await only_run(served)).run_id)
    # 2026-07-28: closing the call's stream is its cancel (DESIGN §22); handshake era:
    # the session's end is a disconnect, and the face's on_disconnect is "cancel".
    reason = {"auto": CANCEL_REASON, "legacy": "client disconnected"}[mode]
    assert (info.status.value, info.reason) == ("cancelled", reason)


async def test_another_principal_neither_sees_nor_cancels_the_run() -> None:
    async with (
        serving(agents()) as served,
        mcp_client(served) as alice,
        mcp_client(served, token="tok-bob") as bob,
        trio.open_nursery() as nursery,
    ):
        blocked = trio.Event()

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            if message == "tool wait_forever started":
                blocked.set()

        async def call() -> None:
            await alice.call_tool("blocker", {"input": "go"}, progress_callback=progress)

        nursery.start_soon(call)
        await blocked.wait()
        run_id = (await only_run(served)).run_id
        assert await served.server.host.list("bob") == []
        # Bob's call is his own run; hers he can neither see nor cancel.
        assert text_of(await bob.call_tool("echo", {"input": "hi"})) == "hello from echo"
        (his,) = await served.server.host.list("bob")
        assert his.agent == "echo"
        async with client(served.base, token="tok-bob") as rest:
            answer = await rest.post(f"/runs/{run_id}/cancel", json={})
            assert answer.status_code == 404
        assert (await served.server.host.get("alice", run_id)).status.value == "running"
        nursery.cancel_scope.cancel()


async def test_mcp_needs_a_token() -> None:
    async with serving(agents()) as served, client(served.base, token=None) as anonymous:
        answer = await anonymous.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert answer.status_code == 401


async def test_an_mcp_session_is_its_principals_alone() -> None:
    """A handshake-era session id is no capability: another principal's request for
    it answers 404, as an unknown session."""
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "raw", "version": "0"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
    async with (
        serving(agents()) as served,
        client(served.base) as alice,
        client(served.base, token="tok-bob") as bob,
    ):
        opened = await alice.post("/mcp", json=initialize, headers=accept)
        assert opened.status_code == 200
        session = {
            **accept,
            "Mcp-Session-Id": opened.headers["mcp-session-id"],
            "MCP-Protocol-Version": "2025-11-25",
        }
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await alice.post("/mcp", json=initialized, headers=session)).status_code == 202
        assert (await bob.post("/mcp", json=listing, headers=session)).status_code == 404
        theirs = await alice.post("/mcp", json=listing, headers=session)
    assert theirs.status_code == 200
    assert '"name":"echo"' in theirs.text.replace(" ", "")
