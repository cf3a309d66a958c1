"""What :meth:`Agent.as_tool` returns: a tool whose every call runs an agent as a child
run (DESIGN §17).

It needs nothing of the runs above it in the core's chain (docs/architecture.md): a
call starts its child with ``ctx.run``, through the starter the calling run handed its
:class:`~trio_agents.ToolContext`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ._events import RunStatus
from ._exceptions import MaxDepthExceeded
from ._handoffs import tool_name_for
from ._options import make_options
from ._result import RunResult, SubAgentFailed
from ._tools import CallOutcome, Tool, ToolContext, to_output

if TYPE_CHECKING:
    from ._agent import Agent

__all__ = ["agent_tool"]

_INPUT_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string", "description": "The task for the agent."}},
    "required": ["input"],
    "additionalProperties": False,
}


def _default_text(result: RunResult) -> str:
    """A completed child's output as the parent's model reads it: its text, or JSON
    for a parsed ``output_type`` value."""
    value = result.final_output
    if isinstance(value, str):
        return value
    return to_output(value)


def agent_tool(
    agent: Agent,
    name: str | None,
    description: str | None,
    output: Callable[[RunResult], str] | None,
    options: Mapping[str, Any],
) -> Tool:
    """What :meth:`Agent.as_tool` returns: a tool whose every call runs ``agent`` as a
    child run (its input: the call's ``input`` argument)."""
    tool_name = name if name is not None else tool_name_for(agent.name)
    if description is None:
        description = f"Ask the {agent.name} agent to do a task; it answers with its result."
        if isinstance(agent.instructions, str) and agent.instructions:
            description += f" Its instructions: {agent.instructions[:500]}"
    if output is not None and not callable(output):
        raise TypeError(
            f"output must be a callable taking a RunResult, not {type(output).__name__}"
        )
    make_options(options)  # refuse unknown or invalid options now, not at the first call

    async def call_agent(ctx: ToolContext, arguments: dict[str, Any]) -> CallOutcome:
        try:
            result = await ctx.run(agent, arguments["input"], **options)
        except MaxDepthExceeded as exc:
            if ctx.parent._options.on_tool_error == "fail":
                raise
            # The model reads why and can answer from what it has.
            return CallOutcome(str(exc), "error")
        if result.status is RunStatus.CANCELLED:
            return CallOutcome(f"sub-agent {agent.name} cancelled: {result.reason}", "cancelled")
        if result.status is RunStatus.FAILED:
            if ctx.parent._options.on_tool_error == "fail":
                raise SubAgentFailed(agent.name, result)
            return CallOutcome(f"sub-agent {agent.name} failed: {result.reason}", "error")
        if output is None:
            return CallOutcome(_default_text(result))
        text = output(result)
        if not isinstance(text, str):
            raise TypeError(f"as_tool(output=...) returned {type(text).__name__}, not str")
        return CallOutcome(text)

    tool = Tool.from_schema(tool_name, description, _INPUT_SCHEMA, call_agent)
    return attrs.evolve(tool, child_agent=agent)
