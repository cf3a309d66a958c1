"""trio_agents.mcp's client against the protocol's reference test server: npm
``@modelcontextprotocol/server-everything`` over stdio, whose elicitation and sampling
tools ask our client, in a run (the elicitation a question answered by ``run.approve`` /
``run.reject``, the sampling served by the run's model).

The server is a Node package, never fetched by the tests: they use
``$MCP_SERVER_EVERYTHING`` (the path of its ``mcp-server-everything`` script), or one on
``PATH``, or ``node_modules/.bin/mcp-server-everything`` in the repository
(``.ci/inspector.sh`` installs it, ``make test`` runs that); without one they are
skipped, with the reason, except under CI, where a missing one is a failure."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import trio

import trio_agents as ta
from tests.support.cli_support import ROOT
from tests.support.mcp_client import HANG_GUARD
from trio_agents.mcp import MCPServerStdio
from trio_agents.models import ScriptedModel, Turn


def _everything() -> str | None:
    for candidate in (
        os.environ.get("MCP_SERVER_EVERYTHING"),
        shutil.which("mcp-server-everything"),
        str(ROOT / "node_modules" / ".bin" / "mcp-server-everything"),
    ):
        if candidate and Path(candidate).is_file() and shutil.which("node"):
            return candidate
    return None


EVERYTHING = _everything()
if EVERYTHING is None:
    message = (
        "no MCP server-everything: `.ci/inspector.sh` (make test runs it) installs"
        " @modelcontextprotocol/server-everything into the repository, or set"
        " MCP_SERVER_EVERYTHING"
    )
    if os.environ.get("CI"):  # CI installs it (make test): missing there is a failure
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)


def everything() -> MCPServerStdio:
    assert EVERYTHING is not None
    return MCPServerStdio(EVERYTHING, ["stdio"], name="everything")


def results(result: ta.RunResult | None) -> list[ta.ToolResult]:
    assert result is not None
    return [item for item in result.new_items if isinstance(item, ta.ToolResult)]


async def _asked(run: ta.Run) -> ta.RunUpdated:
    async for update in run.updated:
        if update.status == "awaiting_approval":
            return update
    raise AssertionError(f"the run ended without asking: {run.result}")


def _raw(output: str) -> dict[str, object]:
    """The elicitation result the server echoes after ``Raw result:``."""
    raw: dict[str, object] = json.loads(output.split("Raw result:", 1)[1])
    return raw


async def test_its_elicitation_is_a_question_of_the_run() -> None:
    with trio.fail_after(HANG_GUARD):
        async with everything() as server:
            tools = await server.list_tools()
            # It offers the tool only to a client that declared the capability: we did.
            assert "trigger-elicitation-request" in {tool.name for tool in tools}
            script: list[Turn | str] = [Turn(tool_calls=[("trigger-elicitation-request", {})])]
            agent = ta.Agent(name="a", model=ScriptedModel([*script, "thanks"]), tools=tools)
            async with ta.open_run(agent, "go") as run:
                update = await _asked(run)
                [question] = update.detail["questions"]
                assert question["message"] == "Please provide inputs for the following fields:"
                schema = question["data"]["requested_schema"]
                assert schema["required"] == ["name"]
                run.approve(question["id"], content={"name": "Ada Lovelace", "check": True})
            [accepted] = results(run.result)
            assert accepted.status == "ok"
            assert "User provided the requested information" in accepted.output
            assert _raw(accepted.output) == {
                "action": "accept",
                "content": {"name": "Ada Lovelace", "check": True},
            }
            # Rejected: declined, the connection serves the next run as well.
            agent = ta.Agent(name="b", model=ScriptedModel([*script, "ok"]), tools=tools)
            async with ta.open_run(agent, "go") as run:
                update = await _asked(run)
                run.reject(update.detail["pending"][0], message="no")
            [declined] = results(run.result)
            assert "User declined" in declined.output
            assert _raw(declined.output)["action"] == "decline"


async def test_its_elicitation_approved_without_content_sends_the_forms_defaults() -> None:
    with trio.fail_after(HANG_GUARD):
        async with everything() as server:
            tools = await server.list_tools()
            script: list[Turn | str] = [
                Turn(tool_calls=[("trigger-elicitation-request", {})]),
                "ok",
            ]
            agent = ta.Agent(name="a", model=ScriptedModel(script), tools=tools)
            async with ta.open_run(agent, "go") as run:
                update = await _asked(run)
                run.approve(update.detail["pending"][0])
    [accepted] = results(run.result)
    content = _raw(accepted.output)["content"]
    assert isinstance(content, dict)
    assert content["firstLine"] == "It was a dark and stormy night."
    assert content["integer"] == 42
    assert content["untitledMultipleSelectEnum"] == ["Guitar"]
    assert "name" not in content  # no default: a form needing it wants content


async def test_its_sampling_is_served_by_the_runs_model() -> None:
    with trio.fail_after(HANG_GUARD):
        async with everything() as server:
            tools = await server.list_tools()
            call = ("trigger-sampling-request", {"prompt": "a colour?", "maxTokens": 5})
            model = ScriptedModel(
                [Turn(tool_calls=[call]), Turn("Blue", usage=ta.Usage(9, 1)), "it said Blue"]
            )
            agent = ta.Agent(name="a", model=model, tools=tools)
            result = await ta.run(agent, "go")
    assert result.status == "completed", result.reason
    [answer] = results(result)
    sampled = json.loads(answer.output.split("LLM sampling result:", 1)[1])
    assert sampled["content"] == {"type": "text", "text": "Blue"}
    assert sampled["role"] == "assistant"
    # The server's sampling request, as the run's model saw it (text, system prompt).
    [_, request, _] = model.requests
    assert request.instructions == "You are a helpful test server."
    assert request.items == (
        ta.UserMessage("Resource trigger-sampling-request context: a colour?"),
    )
    assert result.usage is not None
    assert result.usage.input_tokens >= 9  # the sampling's usage is the run's
