"""The Agent: a frozen, stateless description of what a run does."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import attrs

from ._agent_tool import agent_tool
from ._guardrails import InputGuardrail, OutputGuardrail
from ._handoffs import Handoff, handoff_specs, index_handoffs
from ._model import FINAL_ANSWER_TOOL, Model, ToolSpec, model_strings
from ._output import OutputType, compile_output
from ._tools import Tool, function_tool
from ._window import HistoryPolicy, Summarize

if TYPE_CHECKING:
    from ._result import RunResult

__all__ = ["Agent", "compiled_output"]


def _to_tools(value: Iterable[Tool | Callable[..., Any]]) -> tuple[Tool, ...]:
    if callable(value):  # a Tool is callable too
        name = getattr(value, "name", None) or getattr(value, "__name__", "tool")
        raise TypeError(
            f"Agent(tools=...) takes a list of tools, not a single tool: tools=[{name}]"
        )
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Iterable):
        raise TypeError(
            f"Agent(tools=...) takes a list of tools, not {type(value).__name__}"
            f" ({value!r:.60}); tools must be @function_tool-decorated functions or Tool objects"
        )
    tools = tuple(_to_tool(index, element) for index, element in enumerate(value))
    names = [t.name for t in tools]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"Agent(tools=...) has several tools named {', '.join(map(repr, duplicates))};"
            " tool names must be unique (rename one: @function_tool(name=...))"
        )
    return tools


def _to_tool(index: int, element: object) -> Tool:
    """One element of ``tools``: a Tool as is, a plain function wrapped."""
    if isinstance(element, Tool):
        return element
    what = f"Agent(tools=...): element {index} is {type(element).__name__} ({element!r:.60})"
    if not callable(element) or inspect.isclass(element):
        raise TypeError(f"{what}; tools must be @function_tool-decorated functions or Tool objects")
    try:
        return function_tool(element)
    except TypeError as exc:
        raise TypeError(f"{what} and cannot be made a tool: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{what} and cannot be made a tool: {exc}") from exc


def _to_settings(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    if value is None:
        return MappingProxyType({})
    if not isinstance(value, Mapping):
        raise TypeError("model_settings must be a mapping")
    return MappingProxyType(dict(value))


def _to_model(value: Model | str) -> Model:
    if isinstance(value, str):
        strings = model_strings()
        try:
            return strings.resolve(value)
        except ValueError as exc:
            raise ValueError(f"Agent(model={strings.redact(value)!r}): {exc}") from None
    return value


def _check_model(_instance: object, _attribute: object, value: object) -> None:
    if not callable(getattr(value, "stream", None)):
        raise TypeError(
            f"Agent(model=...) got {type(value).__name__} ({value!r:.60}); pass a model"
            ' string such as "openai:gpt-4o-mini" or an object with a stream(request)'
            " method (the Model protocol, e.g. trio_agents.models.OpenAIChatModel)"
        )


def _check_instructions(_instance: object, _attribute: object, value: object) -> None:
    if not isinstance(value, str) and not callable(value):
        raise TypeError(
            "instructions must be a str or a callable of the Run returning one,"
            f" not {type(value).__name__}"
        )


def _check_history(_instance: object, _attribute: object, value: Any) -> None:
    if value is not None and not isinstance(value, Summarize) and not callable(value):
        raise TypeError(
            "history must be None, a callable (items) -> items, or KeepLastTurns,"
            f" TokenWindow or Summarize; not {type(value).__name__}"
        )


def _guardrail_list(value: Any, kind: type, maker: str, field: str) -> tuple[Any, ...]:
    if isinstance(value, (kind, str)) or not isinstance(value, Iterable):
        raise TypeError(f"Agent({field}=...) takes a list of guardrails, e.g. {field}=[check]")
    found = tuple(value)
    for index, element in enumerate(found):
        if not isinstance(element, kind):
            raise TypeError(
                f"Agent({field}=...): element {index} is {type(element).__name__};"
                f" make guardrails with @ta.{maker}"
            )
    return found


def _to_input_guardrails(value: Any) -> tuple[InputGuardrail, ...]:
    return _guardrail_list(value, InputGuardrail, "input_guardrail", "input_guardrails")


def _to_output_guardrails(value: Any) -> tuple[OutputGuardrail, ...]:
    return _guardrail_list(value, OutputGuardrail, "output_guardrail", "output_guardrails")


def _check_max_turns(_instance: object, _attribute: object, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("max_turns must be an int")
    if value < 1:
        raise ValueError("max_turns must be at least 1")


def _check_output_retries(_instance: object, _attribute: object, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError("output_retries must be an int")
    if value < 0:
        raise ValueError("output_retries must be at least 0")


def _to_handoffs(value: Iterable[Handoff]) -> tuple[Handoff, ...]:
    if isinstance(value, Agent | str) or callable(value) or not isinstance(value, Iterable):
        raise TypeError("Agent(handoffs=...) takes a list of agents, e.g. handoffs=[billing]")
    targets = tuple(value)
    for index, element in enumerate(targets):
        _check_handoff(index, element)
    return targets


def _check_handoff(index: int, element: object) -> None:
    """An element of ``Agent(handoffs=...)`` as given: an agent or a callable."""
    if isinstance(element, Agent):
        return
    if not callable(element) or inspect.isclass(element):
        raise TypeError(
            f"Agent(handoffs=...): element {index} is {type(element).__name__}, not an Agent"
            " (nor a callable of no arguments returning one, e.g. lambda: billing)"
        )


def _resolve_targets(owner: str, handoffs: Iterable[Handoff]) -> tuple[Agent, ...]:
    """The agents ``handoffs`` name: an agent as is, a callable called (once per agent:
    the caller caches the result). A callable that raises or returns anything but an
    Agent raises a ``TypeError`` naming ``owner`` and the element."""
    found = []
    for index, element in enumerate(handoffs):
        if isinstance(element, Agent):
            found.append(element)
            continue
        what = f"Agent {owner!r}, handoffs element {index} ({element!r:.60})"
        try:
            target = element()
        except Exception as exc:
            raise TypeError(f"{what} raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(target, Agent):
            raise TypeError(f"{what} returned {type(target).__name__}, not an Agent")
        found.append(target)
    return tuple(found)


def _default_model() -> Model:
    return model_strings().default()


@attrs.frozen
class Agent:
    """What a run does: instructions, a model, tools and limits.

    Agents are frozen and hold no run state: one agent may serve any number of
    concurrent runs, and a cancelled run leaves nothing behind on it.

    Args:
        name: a name for logs, the control channel and traces.
        instructions: the system prompt: a str, or a callable taking the
            :class:`Run` (``run.context`` holds the run's dependencies) and returning
            it, sync or async, called before every model request. One that raises
            fails the run (reason ``"hook error: instructions raised …"``).
        model: any :class:`~trio_agents.models.Model`, or a model string resolved
            at construction with :func:`~trio_agents.models.from_string`
            (``"openai:gpt-4o-mini"``, ``"anthropic:claude-3-5-haiku-latest"``,
            ``"openai:NAME@http://host:port/v1"``, ``"demo"``); an unknown string
            raises ``ValueError``. Defaults to the offline
            :class:`~trio_agents.models.DemoModel`.
        tools: a list of :class:`~trio_agents.Tool` objects (from
            :func:`~trio_agents.function_tool`) or plain functions, which are wrapped
            with ``function_tool``; anything else raises ``TypeError`` naming the
            element.
        max_turns: the most model calls one run may make; a run that needs more ends
            ``failed`` with reason ``"max_turns"``.
        model_settings: provider settings passed to every model call
            (``temperature``, ``max_tokens``, ...).
        output_type: what the final answer is (docs/output.md). None (the default): the
            answer's text, and ``result.final_output`` is a ``str``. Otherwise an attrs
            class, a dataclass, a ``TypedDict``, a type such as ``int`` or
            ``list[Point]``, or a raw JSON schema (:class:`~trio_agents.JSONSchema`, or
            a plain mapping): the model is asked for JSON matching it, the answer is
            validated, and ``result.final_output`` is the parsed value. An unsupported
            type raises ``TypeError``.
        output_retries: how many times a final answer that does not validate is sent
            back to the model, with the errors, for another try; once they are used up
            the run ends ``failed`` with reason ``"output validation failed: …"``.
        handoffs: agents this one may hand the conversation to (DESIGN §17): the model
            is offered a ``transfer_to_<name>`` tool per target, and calling one makes
            the *same* run continue as that agent (its instructions, tools, model and
            output type) on the same conversation; ``run.agent`` is the current agent
            and a ``run.handoff`` event marks the switch. A target may also be a
            callable of no arguments returning the agent (``lambda: triage``), called
            once, when a run first needs it: so two agents can hand off to each other.
            The ``max_handoffs`` run option bounds the switches of one run. See
            docs/multi-agent.md.
        history: what each model request is sent (never what is stored; DESIGN §18):
            a callable ``(items) -> items`` (sync or async), or
            :class:`~trio_agents.KeepLastTurns`, :class:`~trio_agents.TokenWindow` or
            :class:`~trio_agents.Summarize`. A result that is not a valid conversation
            fails the run (``"invalid conversation: history …"``); one that raises
            fails it naming the policy (``"hook error: history raised …"``).
        input_guardrails: checks of each turn's new user input, made with
            :func:`~trio_agents.input_guardrail`; they run beside the model call, and a
            trip stops the run (``failed``, ``"guardrail <name>: <info>"``).
        output_guardrails: checks of the final answer, made with
            :func:`~trio_agents.output_guardrail`; ``stream=True`` ones gate the text
            as it streams (see docs/policies.md).
        description: what the agent does, for the people and programs that pick one
            (keyword only): a server's ``GET /agents`` and the web UI's picker, the
            skills of the A2A agent card. None (the default): nothing is shown. Never
            taken from ``instructions``: the system prompt is not for every caller.
    """

    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    # A str, or a callable of the Run returning one (sync or async), called before
    # every model request (DESIGN §18).
    instructions: str | Callable[[Any], str | Awaitable[str]] = attrs.field(
        default="", validator=_check_instructions
    )
    model: Model = attrs.field(factory=_default_model, converter=_to_model, validator=_check_model)
    tools: tuple[Tool, ...] = attrs.field(default=(), converter=_to_tools)
    max_turns: int = attrs.field(default=10, validator=_check_max_turns)
    model_settings: Mapping[str, Any] = attrs.field(default=None, converter=_to_settings, eq=False)
    # Any: a class, a typing form (list[int], a union) or a JSON schema; see above.
    # Left out of the hash (a raw schema is a dict), kept in equality.
    output_type: Any = attrs.field(default=None, hash=False)
    output_retries: int = attrs.field(default=2, validator=_check_output_retries)
    # Left out of equality and the hash: agents that hand off to each other would make
    # both recurse through the graph. Agents, or callables returning one (lazy targets).
    handoffs: tuple[Handoff, ...] = attrs.field(default=(), converter=_to_handoffs, eq=False)
    history: HistoryPolicy | None = attrs.field(default=None, validator=_check_history, eq=False)
    input_guardrails: tuple[InputGuardrail, ...] = attrs.field(
        default=(), converter=_to_input_guardrails, eq=False
    )
    output_guardrails: tuple[OutputGuardrail, ...] = attrs.field(
        default=(), converter=_to_output_guardrails, eq=False
    )
    description: str | None = attrs.field(
        default=None,
        kw_only=True,
        validator=attrs.validators.optional(attrs.validators.instance_of(str)),
    )
    _by_name: Mapping[str, Tool] = attrs.field(init=False, repr=False, eq=False)
    # transfer_to_<name> -> target agent. None until resolved when a target is lazy
    # (_handoff_index); made at construction otherwise.
    _handoffs: Mapping[str, Agent] | None = attrs.field(init=False, repr=False, eq=False)
    # What every request is told about the tools: one tuple of the tools' own (read-only)
    # specs, shared by every run of the agent. None while _handoffs is.
    _tool_specs: tuple[ToolSpec, ...] | None = attrs.field(init=False, repr=False, eq=False)
    # The compiled output_type (None: plain text), read by the turn engine.
    _output: OutputType | None = attrs.field(init=False, repr=False, eq=False)

    @_by_name.default
    def _index_tools(self) -> Mapping[str, Tool]:
        return MappingProxyType({tool.name: tool for tool in self.tools})

    @_handoffs.default
    def _index_handoffs(self) -> Mapping[str, Agent] | None:
        agents = tuple(target for target in self.handoffs if isinstance(target, Agent))
        if len(agents) < len(self.handoffs):
            return None  # a lazy target: resolved when a run first needs it
        return self._index(agents)

    def _index(self, targets: tuple[Agent, ...]) -> Mapping[str, Agent]:
        handoffs = index_handoffs(targets)
        clash = sorted(set(handoffs) & set(self._by_name))
        if clash:
            raise ValueError(
                f"Agent(tools=...) has a tool named {clash[0]!r}, the name of a handoff"
                " tool; rename the tool"
            )
        return handoffs

    @_tool_specs.default
    def _collect_specs(self) -> tuple[ToolSpec, ...] | None:
        if self._handoffs is None:
            return None
        return (*(tool.spec() for tool in self.tools), *handoff_specs(self._handoffs))

    def _handoff_index(self) -> Mapping[str, Agent]:
        """``transfer_to_<name>`` → target, lazy targets resolved (once: cached on the
        frozen agent; two threads resolving at once both build the same thing)."""
        handoffs = self._handoffs
        if handoffs is None:
            handoffs = self._index(_resolve_targets(self.name, self.handoffs))
            specs = (*(tool.spec() for tool in self.tools), *handoff_specs(handoffs))
            # A cache, not a change of what the agent is: the targets were fixed when it
            # was made, only named lazily.
            object.__setattr__(self, "_tool_specs", specs)
            object.__setattr__(self, "_handoffs", handoffs)
        return handoffs

    @_output.default
    def _compile_output(self) -> OutputType | None:
        output = compile_output(self.output_type)
        if output is not None and FINAL_ANSWER_TOOL in self._by_name:
            raise ValueError(
                f"Agent(tools=...) has a tool named {FINAL_ANSWER_TOOL!r}, which an agent"
                " with an output_type uses for its final answer; rename the tool"
            )
        return output

    def as_tool(
        self,
        name: str | None = None,
        description: str | None = None,
        *,
        output: Callable[[RunResult], str] | None = None,
        **options: Any,
    ) -> Tool:
        """This agent as a tool another agent can call (DESIGN §17).

        Each call runs this agent as a *child run* of the calling run, on the call's
        ``input`` argument (the schema is ``{"input": str}``); the calls of one turn
        run concurrently, so parallel branches are just several calls. The result is
        the child's final output — its text, or JSON for an ``output_type`` — or
        ``output(result)`` when given. A child cancelled on its own gives a
        ``cancelled`` result (``"sub-agent <name> cancelled: <reason>"``) and the
        parent goes on; a failed child an error result naming it and its reason (with
        the parent's ``on_tool_error="fail"``, the parent fails instead).

        Args:
            name: the tool's name (default: the agent's name, made a valid tool name).
            description: what the calling model is told (default: from the agent's
                name and instructions).
            output: maps the child's :class:`RunResult` to the text the parent reads.
            options: run options for every child (those of :func:`open_run`);
                ``cleanup_timeout``, ``hooks`` and the like default to the parent's.
        """
        return agent_tool(self, name, description, output, options)

    def get_tool(self, name: str) -> Tool | None:
        """Return the tool called ``name``, or None."""
        return self._by_name.get(name)

    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """Return what the model is told about the tools (shared and read-only: see
        :meth:`Tool.spec`), the handoff tools included (lazy targets resolved)."""
        specs = self._tool_specs
        if specs is None:
            self._handoff_index()
            specs = self._tool_specs
            assert specs is not None
        return specs


def compiled_output(agent: Agent) -> OutputType | None:
    """The agent's compiled ``output_type`` (None: plain text): what the turn engine
    and the answer step read, through this one accessor of the module that owns it."""
    return agent._output
