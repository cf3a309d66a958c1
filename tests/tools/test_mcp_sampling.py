"""trio_agents.mcp serving a server's sampling requests with the calling run's model, against
a real MCP server (tests/support/mcp_server.py: the SDK's MCPServer) in a subprocess, over
stdio and Streamable HTTP, under Trio."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.mcp_client import HANG_GUARD, SERVER, TRANSPORTS, call_text, open_server
from trio_agents.mcp import MCPServerStdio
from trio_agents.models import ScriptedModel, Turn


class Recording:
    """A model: ``script``'s answers, each request recorded; the call numbered
    ``hang_on`` (1-based) blocks until cancelled instead, and says so."""

    def __init__(self, script: list[Turn | str], hang_on: int | None = None) -> None:
        self._inner = ScriptedModel(script)
        self._hang_on = hang_on
        self.requests: list[ta.ModelRequest] = []
        self.hanging = trio.Event()
        self.cancelled = trio.Event()

    @asynccontextmanager
    async def stream(self, request: ta.ModelRequest) -> AsyncIterator[Any]:
        self.requests.append(request)
        if len(self.requests) == self._hang_on:
            self.hanging.set()
            try:
                await trio.sleep_forever()
            finally:
                self.cancelled.set()
        async with self._inner.stream(request) as events:
            yield events


def results(result: ta.RunResult) -> list[ta.ToolResult]:
    return [item for item in result.new_items if isinstance(item, ta.ToolResult)]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_sampling_is_served_by_the_runs_model_and_counted(transport: str) -> None:
    model = Recording(
        [
            Turn(tool_calls=[("sample", {"prompt": "Name a colour."})], usage=ta.Usage(5, 1)),
            Turn("Blue", usage=ta.Usage(11, 2, "scripted-1"), finish="length"),
            Turn("the server heard Blue", usage=ta.Usage(20, 4)),
        ]
    )
    with trio.fail_after(HANG_GUARD):
        async with open_server(transport) as server:
            agent = ta.Agent(
                name="sampler",
                model=model,
                tools=await server.list_tools(),
                model_settings={"max_tokens": 100, "temperature": 0},
            )
            result = await ta.run(agent, "go")
            assert await call_text(server, "client_can_sample") == "True"
    assert result.status == "completed", result.reason
    [answer] = results(result)
    assert answer.status == "ok"
    assert answer.output == "scripted-1|maxTokens|Blue"
    # The sampling request, as the model saw it: the server's messages and system prompt,
    # the agent's settings with maxTokens lowering its length limit; no tools.
    sampling = model.requests[1]
    assert sampling.instructions == "Answer in one word."
    assert sampling.items == (ta.UserMessage("Name a colour."),)
    assert sampling.tools == ()
    assert dict(sampling.settings) == {"max_tokens": 7, "temperature": 0}
    # Its usage is the run's, beside the two turns'; nothing of it in the conversation.
    assert result.usage is not None
    assert (result.usage.input_tokens, result.usage.output_tokens) == (36, 7)
    assert [type(item).__name__ for item in result.new_items] == [
        "UserMessage",
        "ToolCall",
        "ToolResult",
        "AssistantMessage",
    ]


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_cancel_while_the_server_waits_for_sampling(transport: str) -> None:
    model = Recording([Turn(tool_calls=[("sample", {"prompt": "hm?"})])], hang_on=2)
    with trio.fail_after(HANG_GUARD):
        async with open_server(transport) as server:
            tools = await server.list_tools()
            agent = ta.Agent(name="sampler", model=model, tools=tools)
            async with ta.open_run(agent, "go") as run:
                await model.hanging.wait()
                run.cancel("user pressed stop")
            # The sampling's model call was cancelled with the run...
            assert model.cancelled.is_set()
            assert run.result is not None
            assert run.result.status == "cancelled"
            assert run.result.reason == "user pressed stop"
            [answer] = results(run.result)
            assert answer.status == "cancelled"
            # ...the server's tool with it (the call's notifications/cancelled)...
            assert await call_text(server, "sampling_was_cancelled") == "cancelled"
            # ...and the connection serves the next run.
            again = await ta.run(
                ta.Agent(
                    name="again",
                    model=ScriptedModel(
                        [Turn(tool_calls=[("sample", {"prompt": "x"})]), "yes", "done"]
                    ),
                    tools=tools,
                ),
                "go",
            )
            assert [r.output for r in results(again)] == ["ScriptedModel|endTurn|yes"]


async def test_sampling_outside_a_run_is_refused_not_a_crash() -> None:
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"]) as server:
            tools = {tool.name: tool for tool in await server.list_tools()}
            # A call from a ToolContext built by hand: no run, so no model to serve it.
            ctx = ta.ToolContext(run_id="r", call_id="c", tool_name="sample")
            output = await tools["sample"].invoke(ctx, '{"prompt": "hi"}')
            assert output.startswith("sampling refused: ")
            assert "made by a run" in output
            # The connection lives on.
            assert await call_text(server, "pid")


async def test_without_the_capability_sampling_is_refused() -> None:
    model = Recording([Turn(tool_calls=[("sample", {"prompt": "hi"})]), "ok"])
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"], sampling=False) as server:
            assert await call_text(server, "client_can_sample") == "False"
            agent = ta.Agent(name="s", model=model, tools=await server.list_tools())
            result = await ta.run(agent, "go")
    [answer] = results(result)
    assert answer.output.startswith("sampling refused: ")
    assert len(model.requests) == 2  # the two turns; no sampling call


async def test_sampling_while_two_runs_call_tools_is_refused() -> None:
    """Nothing on the wire says which call a sampling request is for: with calls of two
    runs in flight on one connection it is refused, never served by the wrong run."""
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"]) as server:
            tools = await server.list_tools()
            busy = ta.Agent(
                name="busy", model=ScriptedModel([Turn(tool_calls=[("slow", {})])]), tools=tools
            )
            asker = Recording([Turn(tool_calls=[("sample", {"prompt": "hi"})]), "ok"])
            async with ta.open_run(busy, "go") as other:
                assert await call_text(server, "wait_started") == "started"
                result = await ta.run(ta.Agent(name="a", model=asker, tools=tools), "go")
                other.cancel("done")
    [answer] = results(result)
    assert answer.output.startswith("sampling refused: ")
    assert "several runs" in answer.output
    assert len(asker.requests) == 2


async def test_sampling_counts_against_the_runs_limits() -> None:
    """The sampling call is one of the run's requests: the one past the limit is never
    sent, and the run fails as for its own model calls."""
    model = Recording([Turn(tool_calls=[("sample", {"prompt": "hi"})]), "never", "never"])
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"]) as server:
            agent = ta.Agent(name="s", model=model, tools=await server.list_tools())
            result = await ta.run(agent, "go", limits=ta.UsageLimits(requests=1))
    assert result.status == "failed"
    assert result.reason == "usage limit: requests 2/1"
    assert len(model.requests) == 1
    [answer] = results(result)
    assert answer.status == "cancelled"


async def test_sampling_tokens_count_against_the_runs_limits() -> None:
    model = Recording(
        [
            Turn(tool_calls=[("sample", {"prompt": "hi"})], usage=ta.Usage(3, 1)),
            Turn("long answer", usage=ta.Usage(3, 50)),
            "never",
        ]
    )
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"]) as server:
            agent = ta.Agent(name="s", model=model, tools=await server.list_tools())
            result = await ta.run(agent, "go", limits=ta.UsageLimits(output_tokens=20))
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason.startswith("usage limit: output_tokens"), result.reason
    assert len(model.requests) == 2
    assert result.usage is not None
    assert result.usage.output_tokens == 51


async def test_a_call_timeout_ends_the_sampling_and_the_run_goes_on() -> None:
    model = Recording([Turn(tool_calls=[("sample", {"prompt": "hm?"})]), "went on"], hang_on=2)
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"], call_timeout=0.5) as server:
            agent = ta.Agent(name="s", model=model, tools=await server.list_tools())
            result = await ta.run(agent, "go")
    assert model.cancelled.is_set()
    assert result.status == "completed", result.reason
    [answer] = results(result)
    assert answer.status == "error"
    assert answer.output == "timed out after 0.5 s"
    assert result.final_output == "went on"


async def test_a_model_that_answers_sampling_with_a_tool_call_is_an_error_to_the_server() -> None:
    model = Recording(
        [
            Turn(tool_calls=[("sample", {"prompt": "hi"})]),
            Turn("half", tool_calls=[("sample", {"prompt": "again"})]),
            "done",
        ]
    )
    with trio.fail_after(HANG_GUARD):
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"]) as server:
            agent = ta.Agent(name="s", model=model, tools=await server.list_tools())
            result = await ta.run(agent, "go")
    assert result.status == "completed", result.reason
    [answer] = results(result)
    assert answer.output.startswith("sampling refused: sampling failed: ")
    assert "ToolCallDone" in answer.output
