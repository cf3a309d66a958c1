"""Run trees for the run-core tests: scripted agents, and a root that calls its
children as tools in one turn."""

from __future__ import annotations

from typing import Any

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn


def tool_turn(*calls: tuple[str, dict[str, Any]]) -> Turn:
    """One turn calling each ``(tool, arguments)`` at once."""
    return Turn(tool_calls=list(calls))


def researcher(name: str, *turns: Turn | str, tools: list[ta.Tool] | None = None) -> ta.Agent:
    """An agent called ``name`` whose model answers with ``turns``, in order."""
    return ta.Agent(name=name, model=ScriptedModel(list(turns)), tools=tools or [])


def root_calling(
    *children: ta.Agent | ta.Tool, then: Turn | str = "root done", input: str = "x"
) -> ta.Agent:
    """An agent, ``root``, whose first turn calls every child (an agent, as a tool, or an
    agent's tool already made) with ``input``, all at once, and whose second is ``then``."""
    tools = [c.as_tool() if isinstance(c, ta.Agent) else c for c in children]
    turn = tool_turn(*[(tool.name, {"input": input}) for tool in tools])
    return ta.Agent(name="root", model=ScriptedModel([turn, then]), tools=tools)


async def run_events(run: ta.Run) -> list[ta.RunEvent]:
    """A run's events from the start, to its end."""
    return [e async for e in run.events()]
