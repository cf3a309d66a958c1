"""The Agent: a frozen, stateless description of what a run does."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from ._model import Model, ToolSpec
from ._tools import Tool, function_tool

__all__ = ["Agent"]


def _to_tools(value: Iterable[Tool | Callable[..., Any]]) -> tuple[Tool, ...]:
    if callable(value):  # a Tool is callable too
        raise TypeError("tools must be a list of tools, not a single tool")
    tools = tuple(t if isinstance(t, Tool) else function_tool(t) for t in value)
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate tool names: {', '.join(duplicates)}")
    return tools


def _to_settings(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise TypeError("model_settings must be a mapping")
    return MappingProxyType(dict(value))


def _check_model(_instance: object, _attribute: object, value: object) -> None:
    if not callable(getattr(value, "stream", None)):
        raise TypeError(
            f"model must implement the Model protocol (a stream(request) method),"
            f" not {type(value).__name__}"
        )


def _check_max_turns(_instance: object, _attribute: object, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("max_turns must be an int")
    if value < 1:
        raise ValueError("max_turns must be at least 1")


def _default_model() -> Model:
    from .models._demo import DemoModel

    return DemoModel()


@attrs.frozen
class Agent:
    """What a run does: instructions, a model, tools and limits.

    Agents are frozen and hold no run state: one agent may serve any number of
    concurrent runs, and a cancelled run leaves nothing behind on it.

    Args:
        name: a name for logs, the control channel and traces.
        instructions: the system prompt.
        model: any :class:`~trio_agents.models.Model`; defaults to the offline
            :class:`~trio_agents.models.DemoModel`.
        tools: :class:`~trio_agents.Tool` objects (from :func:`~trio_agents.function_tool`)
            or plain functions, which are wrapped with ``function_tool``.
        max_turns: the most model calls one run may make; a run that needs more ends
            ``failed`` with reason ``"max_turns"``.
        model_settings: provider settings passed to every model call
            (``temperature``, ``max_tokens``, ...).
    """

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    instructions: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    model: Model = attrs.field(factory=_default_model, validator=_check_model)
    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_to_tools)
    max_turns: int = attrs.field(default=10, validator=_check_max_turns)
    model_settings: Mapping[str, Any] = attrs.field(default=None, converter=_to_settings, eq=False)
    _by_name: Mapping[str, Tool] = attrs.field(init=False, repr=False, eq=False)

    @_by_name.default
    def _index_tools(self) -> Mapping[str, Tool]:
        return MappingProxyType({tool.name: tool for tool in self.tools})

    def get_tool(self, name: str) -> Tool | None:
        """Return the tool called ``name``, or None."""
        return self._by_name.get(name)

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """Return what the model is told about the tools."""
        return tuple(tool.spec() for tool in self.tools)
