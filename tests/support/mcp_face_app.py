"""Agents for the MCP face's tests, in process and behind ``python -m trio_agents mcp
--app tests.support.mcp_face_app:AGENTS`` (a fresh set per process: the scripted
models are used up as they answer)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

import trio_agents as ta
from trio_agents.models import Finish, ModelEvent, ModelRequest, ScriptedModel, TextDelta, Turn


@ta.function_tool
async def wait_forever() -> str:
    """Wait until the run is cancelled."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


@ta.function_tool(needs_approval=True)
async def deploy(target: str) -> str:
    """Deploy to a target (asks for approval first)."""
    return f"deployed to {target}"


@attrs.frozen
class Point:
    x: int
    y: int


def describe(item: ta.Item) -> str:
    """One word for an item of a conversation the model was sent."""
    if isinstance(item, ta.UserMessage):
        return f"user:{item.content}"
    if isinstance(item, ta.AssistantMessage):
        return f"assistant:{item.status}"
    if isinstance(item, ta.ToolCall):
        return f"call:{item.name}"
    assert isinstance(item, ta.ToolResult)
    return f"result:{item.status}:{item.output}"


@attrs.define
class HistoryModel:
    """Answers with the conversation it was sent, one word per item, as JSON: what a
    test reads to see what a session holds."""

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[ModelEvent]]:
        text = json.dumps([describe(item) for item in request.items])

        async def events() -> AsyncIterator[ModelEvent]:
            yield TextDelta(text)
            yield Finish("stop")

        yield events()


def agents() -> dict[str, ta.Agent]:
    """A fresh set of the test agents."""
    blocker = ScriptedModel(
        [], default=Turn(text="thinking it over", tool_calls=[("wait_forever", {})])
    )
    deployer = ScriptedModel(
        [Turn(tool_calls=[("deploy", {"target": "prod"})])], default=Turn(text="done")
    )
    return {
        "echo": ta.Agent(
            name="echo",
            model=ScriptedModel([], default=Turn(text=["hello ", "from ", "echo"])),
            description="Says hello.",
        ),
        "point": ta.Agent(
            name="point",
            model=ScriptedModel([], default=Turn(tool_calls=[("final_answer", {"x": 1, "y": 2})])),
            output_type=Point,
        ),
        "count": ta.Agent(
            name="count",
            model=ScriptedModel([], default=Turn(text='{"response": 5}')),
            output_type=int,
        ),
        "broken": ta.Agent(
            name="broken", model=ScriptedModel([], default=Turn(fail="the model is down"))
        ),
        "blocker": ta.Agent(name="blocker", model=blocker, tools=[wait_forever]),
        "history": ta.Agent(name="history", model=HistoryModel()),
        "deployer": ta.Agent(name="deployer", model=deployer, tools=[deploy]),
    }


AGENTS = agents()
