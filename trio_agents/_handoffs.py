"""Handoffs (DESIGN §17): ``Agent(handoffs=[...])`` offers the model one
``transfer_to_<name>`` tool per target; calling one hands the *same* run to that agent.

The call is answered ``"transferred to <name>"`` (``_toolcalls.hand_off``); once every
call of that turn has its result, the turn loop switches the run's agent
(:func:`switch_agent`): the next model request has the target's instructions, tools,
model and output type, on the same conversation; ``max_turns`` and the run's limits
count over the whole run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ._events import RunHandoff
from ._frozen import freeze_json
from ._model import ToolSpec

if TYPE_CHECKING:
    from ._agent import Agent
    from ._state import RunState

__all__ = ["handoff_specs", "index_handoffs", "switch_agent", "tool_name_for"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_NO_PARAMETERS: Mapping[str, Any] = freeze_json(
    {"type": "object", "properties": {}, "additionalProperties": False}
)


def tool_name_for(agent_name: str, prefix: str = "") -> str:
    """A valid tool name (1-64 of ``[A-Za-z0-9_-]``) for an agent: ``prefix`` + its
    name, other characters replaced by ``_``."""
    name = prefix + _UNSAFE.sub("_", agent_name)
    return name[:64] or "agent"


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
    state.log.append(
        RunHandoff(
            run_id=state.run_id,
            seq=state.log.next_seq,
            from_agent=source.name,
            to_agent=target.name,
        )
    )
