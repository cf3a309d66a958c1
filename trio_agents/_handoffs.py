"""Handoffs (DESIGN §17): ``Agent(handoffs=[...])`` offers the model one
``transfer_to_<name>`` tool per target; calling one hands the *same* run to that agent.

The call is answered ``"transferred to <name>"`` (``_toolcalls.hand_off``); once every
call of that turn has its result, the turn loop switches the run's agent
(:func:`switch_agent`): the next model request has the target's instructions, tools,
model and output type, on the same conversation; ``max_turns`` and the run's limits
count over the whole run.

Agents are frozen, so two that hand off to each other (triage ⇄ billing) cannot both
hold the other when made: a target may be given *lazily*, as a callable of no
arguments returning the agent, called once, when the agent's handoff tools are first
needed (``_agent.resolve_targets``; a run resolves every agent it can reach when it is
made). A cycle lets a run bounce between agents forever: the ``max_handoffs`` run
option bounds the switches of one run, and a transfer past it is answered with an error
the model reads (``_toolcalls.hand_off``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypeAlias

from ._events import RunHandoff
from ._frozen import freeze_json
from ._items import Item, ToolCall, ToolResult
from ._model import ToolSpec

if TYPE_CHECKING:
    from ._agent import Agent
    from ._state import RunState

__all__ = [
    "Handoff",
    "agent_after",
    "agent_named",
    "handoff_specs",
    "index_handoffs",
    "reachable",
    "switch_agent",
    "tool_name_for",
]

# An element of Agent(handoffs=[...]): an agent, or a callable of no arguments returning
# one (for agents that hand off to each other).
Handoff: TypeAlias = "Agent | Callable[[], Agent]"

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_NO_PARAMETERS: Mapping[str, Any] = freeze_json(
    {"type": "object", "properties": {}, "additionalProperties": False}
)


def tool_name_for(agent_name: str, prefix: str = "") -> str:
    """A valid tool name (1-64 of ``[A-Za-z0-9_-]``) for an agent: ``prefix`` + its
    name, other characters replaced by ``_``."""
    name = prefix + _UNSAFE.sub("_", agent_name)
    return name[:64] or "agent"


def reachable(agent: Agent) -> list[Agent]:
    """``agent`` and every agent it can hand off to, directly or not, each once (a cycle
    ends where it meets an agent already seen), resolving lazy targets on the way."""
    seen: set[int] = {id(agent)}
    found = [agent]
    for current in found:  # grows as targets are found: a breadth-first walk
        for target in current._handoff_index().values():
            if id(target) not in seen:
                seen.add(id(target))
                found.append(target)
    return found


def agent_named(agent: Agent, name: str) -> Agent:
    """The agent called ``name`` among ``agent`` and those it can reach by handoffs (a
    resumed run's current agent, ``Resume.agent``)."""
    for candidate in reachable(agent):
        if candidate.name == name:
            return candidate
    raise ValueError(
        f"resume=Resume(agent={name!r}): no agent of that name is {agent.name!r} or one it"
        " can hand off to"
    )


def agent_after(agent: Agent, items: Sequence[Item]) -> Agent:
    """The agent a run that started as ``agent`` works as after ``items`` (all of them
    its own: a child run's session), following each transfer that succeeded: the one
    ``ok`` result of a turn's ``transfer_to_<name>`` calls (the others are errors)."""
    names = {item.call_id: item.name for item in items if isinstance(item, ToolCall)}
    current = agent
    for item in items:
        if isinstance(item, ToolResult) and item.status == "ok":
            target = current._handoff_index().get(names.get(item.call_id, ""))
            if target is not None:
                current = target
    return current


def index_handoffs(targets: Iterable[Agent]) -> Mapping[str, Agent]:
    """``transfer_to_<name>`` → target agent; two targets with one tool name raise."""
    found: dict[str, Agent] = {}
    for target in targets:
        name = tool_name_for(target.name, "transfer_to_")
        if name in found and found[name] is not target:
            raise ValueError(
                f"Agent(handoffs=...) has two targets whose tool is {name!r};"
                " give the agents distinct names"
            )
        found[name] = target
    return MappingProxyType(found)


def handoff_specs(handoffs: Mapping[str, Agent]) -> tuple[ToolSpec, ...]:
    """What the model is told about each handoff tool."""
    specs = []
    for name, target in handoffs.items():
        description = f"Hand the conversation over to the {target.name} agent."
        if isinstance(target.instructions, str) and target.instructions:
            description += f" It handles: {target.instructions[:300]}"
        specs.append(ToolSpec(name, description, _NO_PARAMETERS))
    return tuple(specs)


def switch_agent(state: RunState) -> None:
    """After a turn with a ``transfer_to_<name>`` call: the run continues as that agent."""
    target = state.handoff_to
    if target is None:
        return
    state.handoff_to = None
    source = state.agent
    state.agent = target
    state.handoffs_made += 1  # bounded by the max_handoffs run option (hand_off)
    state.log.append(
        RunHandoff(
            run_id=state.run_id,
            seq=state.log.next_seq,
            from_agent=source.name,
            to_agent=target.name,
        )
    )
