"""trio_agents.mcp making a server's elicitation requests questions of the calling run
(answered by ``run.approve`` / ``run.reject`` of their id), against a real MCP server
(tests/support/mcp_server.py: the SDK's MCPServer) in a subprocess, over stdio and
Streamable HTTP, under Trio."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.http_support import client, messages, serving, start
from tests.support.mcp_client import HANG_GUARD, SERVER, TRANSPORTS, call_text, open_server
from tests.support.mcp_server import ELICIT_SCHEMA
from trio_agents.mcp import MCPServerStdio
from trio_agents.models import ScriptedModel, Turn


def results(result: ta.RunResult) -> list[ta.ToolResult]:
    return [item for item in result.new_items if isinstance(item, ta.ToolResult)]


def asking(tools: list[ta.Tool], *then: str, question: str = "Your colour?") -> ta.Agent:
    """An agent whose first turn calls the server's ``elicit`` tool."""
    script: list[Turn | str] = [Turn(tool_calls=[("elicit", {"question": question})]), *then]
    return ta.Agent(name="asker", model=ScriptedModel(script), tools=tools)


async def question_of(run: ta.Run) -> ta.RunUpdated:
    """The run's first ``awaiting_approval`` update (the elicitation's question)."""
    async for update in run.updated:
        if update.status == "awaiting_approval":
            return update
    raise AssertionError(f"the run ended without asking: {run.result}")


@asynccontextmanager
async def asked(server: Any, *then: str) -> AsyncIterator[tuple[ta.Run, ta.RunUpdated]]:
    agent = asking(await server.list_tools(), *then)
    async with ta.open_run(agent, "go") as run:
        yield run, await question_of(run)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_approve_accepts_with_the_forms_defaults(transport: str) -> None:
    with trio.fail_after(HANG_GUARD):
        async with open_server(transport) as server, asked(server, "thanks") as (run, update):
            # What a face shows: the question's id is pending; what it asks beside it.
            [pending] = update.detail["pending"]
            [question] = update.detail["questions"]
            assert question["id"] == pending
            assert question["name"] == "elicit"
            assert question["message"] == "Your colour?"
            assert question["data"] == {
                "type": "mcp.elicitation",
                "server": server.name,
                "mode": "form",
                "requested_schema": ELICIT_SCHEMA,
            }
            assert run.statistics().pending_approvals == (pending,)
            run.approve(pending)
    assert run.result is not None
    assert run.result.status == "completed", run.result.reason
    [answer] = results(run.result)
    assert answer.call_id == question["call_id"]
    assert json.loads(answer.output) == {
        "action": "accept",
        "content": {"colour": "blue", "count": 3},
        "meta": None,
    }


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_reject_declines_with_the_message(transport: str) -> None:
    with trio.fail_after(HANG_GUARD):
        async with open_server(transport) as server, asked(server, "fine") as (run, update):
            [pending] = update.detail["pending"]
            run.reject(pending, message="not telling")
            # Answered once: a second answer finds nothing pending.
            with pytest.raises(ta.UnknownCallError):
                run.approve(pending)
    assert run.result is not None
    assert run.result.status == "completed"
    [answer] = results(run.result)
    assert json.loads(answer.output) == {
        "action": "decline",
        "content": None,
        "meta": {"trio-agents/reason": "not telling"},
    }
    statuses = [u.status for u in await _updates(run)]
    assert statuses == ["queued", "running", "awaiting_approval", "running", "completed"]


async def _updates(run: ta.Run) -> list[ta.RunUpdated]:
    """A finished run's status updates, replayed from its log."""
    return [e async for e in run.events() if isinstance(e, ta.RunUpdated)]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_cancel_while_the_question_is_pending(transport: str) -> None:
    with trio.fail_after(HANG_GUARD):
        async with open_server(transport) as server:
            async with asked(server) as (run, update):
                [pending] = update.detail["pending"]
                run.cancel("user pressed stop")
            assert run.result is not None
            assert run.result.status == "cancelled"
            assert run.result.reason == "user pressed stop"
            [answer] = results(run.result)
            assert answer.status == "cancelled"
            # The server was told: its tool (waiting for the answer) was cancelled...
            assert await call_text(server, "elicitation_was_cancelled") == "cancelled"
            # ...the question is gone with the run...
            with pytest.raises(ta.RunClosedError):
                run.approve(pending)
            # ...and the connection serves the next run's question.
            async with asked(server, "again") as (again, second):
                again.approve(second.detail["pending"][0])
            assert again.result is not None
            assert again.result.status == "completed"


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_the_calls_timeout_ends_the_question(transport: str) -> None:
    """The call times out while its question waits: the question is withdrawn (the
    run shows ``running`` again), the server's tool is cancelled, and the run goes on."""
    with trio.fail_after(HANG_GUARD):
        async with open_server(transport, call_timeout=5) as server:
            agent = asking(await server.list_tools(), "went on")
            async with ta.open_run(agent, "go") as run:
                await question_of(run)
            assert await call_text(server, "elicitation_was_cancelled") == "cancelled"
    result = run.result
    assert result is not None
    assert result.status == "completed"
    assert result.final_output == "went on"
    [answer] = results(result)
    assert (answer.status, answer.output) == ("error", "timed out after 5 s")
    statuses = [u.status for u in await _updates(run)]
    assert statuses == ["queued", "running", "awaiting_approval", "running", "completed"]


async def test_a_server_that_dies_ends_the_question() -> None:
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"]) as server:
            pid = int(await call_text(server, "pid"))
            async with asked(server, "carried on") as (run, update):
                assert len(update.detail["questions"]) == 1
                os.kill(pid, signal.SIGKILL)
                # Withdrawn once the connection is gone: the run goes on by itself.
                async for after in run.updated:
                    if after.status != "awaiting_approval":
                        break
    assert run.result is not None
    assert run.result.status == "completed"
    [answer] = results(run.result)
    assert answer.status == "error"
    assert "MCPToolError" in answer.output


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_url_mode_approved_is_accepted(transport: str) -> None:
    with trio.fail_after(HANG_GUARD):
        async with open_server(transport) as server:
            tools = await server.list_tools()
            agent = ta.Agent(
                name="asker",
                model=ScriptedModel(
                    [Turn(tool_calls=[("elicit_url", {"url": "https://example.com/login"})]), "ok"]
                ),
                tools=tools,
            )
            async with ta.open_run(agent, "go") as run:
                update = await question_of(run)
                [question] = update.detail["questions"]
                assert question["message"] == "Sign in, please."
                assert question["data"]["mode"] == "url"
                assert question["data"]["url"] == "https://example.com/login"
                run.approve(question["id"])
    assert run.result is not None
    assert [r.output for r in results(run.result)] == ["accept"]


async def test_without_the_capability_elicitation_is_refused() -> None:
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"], elicitation=False) as server:
            result = await ta.run(asking(await server.list_tools(), "ok"), "go")
    [answer] = results(result)
    assert answer.output.startswith("elicitation refused: ")
    assert result.status == "completed"


async def test_elicitation_outside_a_run_is_refused_not_a_crash() -> None:
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"]) as server:
            tools = {tool.name: tool for tool in await server.list_tools()}
            ctx = ta.ToolContext(run_id="r", call_id="c", tool_name="elicit")
            output = await tools["elicit"].invoke(ctx, '{"question": "hi"}')
            assert output.startswith("elicitation refused: ")
            assert "made by a run" in output
            assert await call_text(server, "pid")


async def test_elicitation_with_two_calls_in_flight_is_refused() -> None:
    """Nothing on the wire says which call asked: with two calls in flight on one
    connection the question is refused, never pinned on the wrong call."""
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"]) as server:
            tools = await server.list_tools()
            busy = ta.Agent(
                name="busy", model=ScriptedModel([Turn(tool_calls=[("slow", {})])]), tools=tools
            )
            async with ta.open_run(busy, "go") as other:
                assert await call_text(server, "wait_started") == "started"
                result = await ta.run(asking(tools, "ok"), "go")
                other.cancel("done")
    [answer] = results(result)
    assert answer.output.startswith("elicitation refused: ")
    assert "several runs" in answer.output


async def test_approve_with_content_answers_it_checked_against_the_form() -> None:
    with trio.fail_after(HANG_GUARD):
        async with (
            MCPServerStdio(sys.executable, [SERVER, "stdio"]) as server,
            asked(server, "thanks") as (run, update),
        ):
            [pending] = update.detail["pending"]
            with pytest.raises(ValueError, match=r"\$\.count: expected integer"):
                run.approve(pending, content={"colour": "red", "count": "many"})
            run.approve(pending, content={"colour": "red", "agree": True})
    assert run.result is not None
    [answer] = results(run.result)
    assert json.loads(answer.output)["content"] == {"colour": "red", "agree": True}


# A client leaving an SSE stream mid-way abandons httpx's nested body generators, which
# the garbage collector finalizes, and Trio warns (CONVENTIONS, "httpx aiter_lines()"):
# exactly those warnings, as in tests/faces/test_http_rest.py.
@pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)\._[^']*' was garbage collected:ResourceWarning"
)
async def test_the_question_is_answered_through_the_rest_face() -> None:
    """Answerable from every face that answers approvals: here the REST face's
    ``/approve``, on a served host, as a client sees it."""
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"]) as server:
            agents = {"asker": asking(await server.list_tools(), "thanks")}
            async with serving(agents) as served, client(served.base) as alice:
                run_id = await start(alice, "asker")
                statuses = f"/runs/{run_id}/events?events=status"
                async with (
                    alice.stream("GET", statuses) as stream,
                    aclosing(messages(stream)) as got,
                ):
                    async for message in got:
                        if message.data["event"]["status"] == "awaiting_approval":
                            detail = message.data["event"]["detail"]
                            break
                [question] = detail["questions"]
                assert detail["pending"] == [question["id"]]
                assert question["message"] == "Your colour?"
                assert question["data"]["requested_schema"] == ELICIT_SCHEMA
                record = (await alice.get(f"/runs/{run_id}")).json()["run"]
                assert record["detail"] == detail
                answer = await alice.post(
                    f"/runs/{run_id}/approve", json={"call_id": question["id"]}
                )
                assert answer.status_code == 200, answer.text
                async with alice.stream("GET", f"/runs/{run_id}/events") as stream:
                    events = [m.data["event"] async for m in messages(stream)]
    assert events[-1]["status"] == "completed"
    [finished] = [e for e in events if e["type"] == "tool.finished"]
    assert json.loads(finished["output"])["action"] == "accept"
