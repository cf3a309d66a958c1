"""Hypothesis strategies: tool sets, scripts, operation schedules and injectable items.

Times are multiples of 1/8 s, and so are every delay and sleep the strategies draw;
:func:`~trio_agents.testing.run_schedule` then shifts the ``i``-th operation by
``(i + 1) / 1024`` s. So an operation never lands in the same Trio tick as a model
chunk or a tool finishing, and every cancellation the checker sees is unambiguous.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias, final

import attrs
from hypothesis import strategies as st

from .. import (
    Agent,
    AssistantMessage,
    InjectWhen,
    Item,
    Model,
    Tool,
    ToolCall,
    ToolResult,
    UserMessage,
)
from ..models import Turn
from ._fakes import (
    GARBAGE,
    HOSTILE_TEXTS,
    ToolRecorder,
    blocking_tool,
    broken_str_tool,
    failing_tool,
    garbage_tool,
    hostile_text_tool,
    process_tool,
    shielding_tool,
    sleeping_tool,
    stray_cancel_tool,
    stubborn_thread_tool,
    swallowing_tool,
    thread_tool,
)
from ._faults import (
    HOOK_NAMES,
    MODEL_FAULT_KINDS,
    SESSION_FAULT_KINDS,
    Faults,
    HookFault,
    ModelFault,
    SessionFault,
)

__all__ = [
    "OP_KINDS",
    "AgentTree",
    "FakeTools",
    "Op",
    "OpKind",
    "agent_trees",
    "faults",
    "hostile_items",
    "hostile_texts",
    "items",
    "schedules",
    "scripts",
    "tool_sets",
]

OpKind: TypeAlias = Literal[
    "cancel",
    "cancel_in_tool",
    "cancel_after_turn",
    "outer_cancel",
    "inject",
    "withdraw",
    "approve",
    "reject",
    "subscribe",
    "status_subscribe",
    "release",
]
"""What an :class:`Op` does to the run (see :class:`Op`)."""

OP_KINDS: tuple[OpKind, ...] = (
    "cancel",
    "cancel_in_tool",
    "cancel_after_turn",
    "outer_cancel",
    "inject",
    "withdraw",
    "approve",
    "reject",
    "subscribe",
    "status_subscribe",
    "release",
)
"""Every :data:`OpKind`, in the order :func:`schedules` draws from (and shrinks to)."""

DEFAULT_TIMES: tuple[float, ...] = (0.0, 0.125, 0.25, 0.5, 1.0, 1.5, 2.5, 4.0, 8.0, 30.0)
"""The virtual times :func:`schedules` picks from by default."""

_WHENS: tuple[InjectWhen, ...] = ("next_turn", "now", "when_idle")


@final
@attrs.frozen
class Op:
    """One operation of a schedule, applied to the run at virtual time ``at``.

    ``kind`` is one of:

    - ``"cancel"`` / ``"cancel_after_turn"``: ``run.cancel(reason, mode=...)``;
    - ``"cancel_in_tool"``: from ``at`` on, wait for a tool call that is still running
      ``(i + 1) / 1024`` s after it was seen running (or for the run's end), then
      ``run.cancel(reason)`` — a cancel that lands in a tool call, whatever the tool's
      timing (the other operations do not wait for it);
    - ``"outer_cancel"``: cancel the scope around ``open_run`` (the caller's scope);
    - ``"inject"``: ``run.inject(items, when=when)``;
    - ``"withdraw"``: withdraw the latest accepted injection not withdrawn yet;
    - ``"approve"`` / ``"reject"``: answer the first call waiting for approval
      (``reject`` with ``reason`` as the message);
    - ``"subscribe"`` / ``"status_subscribe"``: start a ``run.events()`` /
      ``run.updated`` reader;
    - ``"release"``: ``recorder.release()``, ending :func:`blocking_tool` calls.

    Operations at time 0 run before the run takes its first step.

    ``target`` (run trees, :func:`~trio_agents.testing.run_tree_schedule`) names the
    agent whose first live run in the tree a ``cancel``, ``cancel_after_turn``,
    ``cancel_in_tool``, ``inject``, ``withdraw``, ``approve`` or ``reject`` acts on
    (None: the root). If no run of that agent is live at that moment, the operation
    does nothing (and is recorded as such). The other kinds always act on the root.
    """

    at: float
    kind: OpKind
    reason: str = "stop"
    when: InjectWhen = "next_turn"
    items: tuple[Item, ...] = (UserMessage("more, please"),)
    target: str | None = None

    def describe(self) -> str:
        """A short human-readable form, as used in reports."""
        text = self._describe()
        return text if self.target is None else f"{text} @{self.target}"

    def _describe(self) -> str:
        if self.kind in ("cancel", "cancel_after_turn", "cancel_in_tool"):
            return f"{self.at:g}: {self.kind}({self.reason!r})"
        if self.kind == "reject":
            return f"{self.at:g}: reject({self.reason!r})"
        if self.kind == "inject":
            return f"{self.at:g}: inject({list(self.items)!r}, when={self.when!r})"
        return f"{self.at:g}: {self.kind}"


@final
@attrs.frozen(eq=False)
class FakeTools:
    """A set of fake tools sharing one recorder, with argument strategies for them.

    Attributes:
        tools: the tools, to give to an :class:`~trio_agents.Agent`.
        recorder: the :class:`ToolRecorder` they report to.
        arguments: per tool name, a strategy for the arguments a script passes it.
    """

    tools: tuple[Tool, ...]
    recorder: ToolRecorder
    arguments: Mapping[str, st.SearchStrategy[dict[str, Any]]]

    def names(self) -> tuple[str, ...]:
        """The tool names."""
        return tuple(tool.name for tool in self.tools)


_SLEEPS = st.sampled_from([0.0, 0.5, 2.0, 50.0])


def standard_tools(
    recorder: ToolRecorder | None = None,
    *,
    threads: bool = True,
    processes: bool = False,
    faults: bool = False,
) -> FakeTools:
    """The full fake tool set: ``block``, ``sleep``, ``fail``, ``guarded`` (a sleep that
    needs approval), ``slow`` (a sleep with a 1 s timeout), ``crunch`` (a thread tool,
    unless ``threads=False``) and ``proc`` (a process tool, if ``processes=True``).

    With ``faults=True`` it adds the fault tools, which misbehave on purpose:
    ``swallow`` (swallows ``trio.Cancelled``), ``stray`` (raises a stray
    ``trio.Cancelled``), ``shield`` (works in a shielded scope for 0.5, 2 or 8 s),
    ``garbage`` (returns values JSON cannot encode), ``hostile`` (returns lone
    surrogates, NUL, 100,000 characters: :data:`HOSTILE_TEXTS`), ``brokenstr`` (raises
    an exception whose ``str()`` raises) and, with ``threads``, ``brokenstr_thread``
    (the same from a worker thread) and ``stubborn`` (a thread that ignores
    ``ctx.cancelled`` until released).
    """
    recorder = recorder or ToolRecorder()
    tools = [
        blocking_tool(recorder),
        sleeping_tool(recorder),
        failing_tool(recorder),
        sleeping_tool(recorder, name="guarded", needs_approval=True),
        sleeping_tool(recorder, name="slow", timeout=1.0),
    ]
    arguments: dict[str, st.SearchStrategy[dict[str, Any]]] = {
        "block": st.just({}),
        "sleep": st.fixed_dictionaries({"seconds": _SLEEPS}),
        "fail": st.fixed_dictionaries({"after": st.sampled_from([0.0, 0.25, 1.0])}),
        "guarded": st.fixed_dictionaries({"seconds": _SLEEPS}),
        "slow": st.fixed_dictionaries({"seconds": _SLEEPS}),
    }
    if threads:
        tools.append(thread_tool(recorder))
        arguments["crunch"] = st.fixed_dictionaries({"steps": st.integers(0, 5)})
    if processes:
        tools.append(process_tool(recorder))
        arguments["proc"] = st.fixed_dictionaries({"seconds": st.sampled_from([0.0, 3600.0])})
    if faults:
        tools += [
            swallowing_tool(recorder),
            stray_cancel_tool(recorder),
            shielding_tool(recorder),
            garbage_tool(recorder),
        ]
        arguments["swallow"] = st.fixed_dictionaries({"seconds": _SLEEPS})
        arguments["stray"] = st.fixed_dictionaries({"after": st.sampled_from([0.0, 0.5, 2.0])})
        arguments["shield"] = st.fixed_dictionaries({"seconds": st.sampled_from([0.5, 2.0, 8.0])})
        arguments["garbage"] = st.fixed_dictionaries({"kind": st.integers(0, len(GARBAGE) - 1)})
        tools += [hostile_text_tool(recorder), broken_str_tool(recorder)]
        arguments["hostile"] = st.fixed_dictionaries(
            {"kind": st.integers(0, len(HOSTILE_TEXTS) - 1)},
            optional={"echo": st.sampled_from(["\ud83d", "\udce9!", "\x00"])},
        )
        arguments["brokenstr"] = st.just({})
        if threads:
            tools.append(broken_str_tool(recorder, name="brokenstr_thread", thread=True))
            arguments["brokenstr_thread"] = st.just({})
        if threads:
            tools.append(stubborn_thread_tool(recorder))
            arguments["stubborn"] = st.just({})
    return FakeTools(tuple(tools), recorder, arguments)


@st.composite
def _tool_sets(draw: st.DrawFn, threads: bool, processes: bool, faults: bool) -> FakeTools:
    full = standard_tools(threads=threads, processes=processes, faults=faults)
    keep = draw(st.lists(st.sampled_from(full.names()), min_size=1, unique=True))
    tools = tuple(tool for tool in full.tools if tool.name in keep)
    arguments = {name: full.arguments[name] for name in keep}
    return FakeTools(tools, full.recorder, arguments)


def tool_sets(
    *, threads: bool = True, processes: bool = False, faults: bool = False
) -> st.SearchStrategy[FakeTools]:
    """Non-empty subsets of :func:`standard_tools`, each with a fresh recorder.

    It shrinks towards the first tools: ``block``, then ``sleep``, ``fail``, ...
    """
    return _tool_sets(threads, processes, faults)


# ------------------------------------------------------------------ JSON arguments


def _from_schema(schema: Mapping[str, Any], depth: int = 0) -> st.SearchStrategy[Any]:
    """Values that fit a (simple) JSON schema; ``{}`` for what it does not understand."""
    if "enum" in schema:
        return st.sampled_from(list(schema["enum"]))
    if "const" in schema:
        return st.just(schema["const"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([_from_schema(s, depth + 1) for s in schema[key]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([_from_schema({**schema, "type": k}, depth + 1) for k in kind])
    if kind == "integer":
        return st.integers(-10, 10)
    if kind == "number":
        return st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0])
    if kind == "string":
        return st.text(max_size=8)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array" and depth < 3:
        return st.lists(_from_schema(schema.get("items", {}), depth + 1), max_size=3)
    if kind == "object" and depth < 3:
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {k: _from_schema(v, depth + 1) for k, v in properties.items() if k in required},
            optional={
                k: _from_schema(v, depth + 1) for k, v in properties.items() if k not in required
            },
        )
    return st.just({})


def _call(
    tool_names: Sequence[str],
    arguments: Mapping[str, st.SearchStrategy[Any]],
    *,
    unknown_tools: bool,
    invalid_arguments: bool,
) -> st.SearchStrategy[tuple[str, dict[str, Any] | str]]:
    valid = [st.tuples(st.just(name), arguments[name]) for name in tool_names]
    # Mostly real calls (a lifecycle needs tools that run); now and then a broken one.
    options: list[st.SearchStrategy[tuple[str, dict[str, Any] | str]]] = [*valid, *valid, *valid]
    if invalid_arguments and tool_names:
        options.append(st.tuples(st.sampled_from(list(tool_names)), st.just('{"not json')))
    if unknown_tools:
        options.append(st.tuples(st.just("no_such_tool"), st.just({})))
    return st.one_of(options)


_CHUNKS = st.lists(st.sampled_from(["a ", "b ", "c ", "dd "]), max_size=4)
_DELAYS = st.sampled_from([0.0, 0.25, 1.0])
_FAILS = st.sampled_from([None] * 7 + ["model fell over"])


@st.composite
def _turn(
    draw: st.DrawFn,
    calls: st.SearchStrategy[list[tuple[str, dict[str, Any] | str]]] | None,
    failures: bool,
    chunks_from: st.SearchStrategy[list[str]] = _CHUNKS,
) -> Turn:
    chunks = draw(chunks_from)
    tool_calls = draw(calls) if calls is not None else []
    delay = draw(_DELAYS)
    fail = draw(_FAILS) if failures else None
    fail_after = draw(st.integers(0, len(chunks))) if fail else None
    return Turn(text=chunks, tool_calls=tool_calls, delay=delay, fail=fail, fail_after=fail_after)


def scripts(
    tools: FakeTools | Sequence[Tool] = (),
    *,
    arguments: Mapping[str, st.SearchStrategy[Any]] | None = None,
    min_turns: int = 1,
    max_turns: int = 4,
    max_calls: int = 3,
    failures: bool = True,
    unknown_tools: bool = True,
    invalid_arguments: bool = True,
    hostile_text: bool = False,
) -> st.SearchStrategy[list[Turn]]:
    """Scripts for a :class:`~trio_agents.testing.ScriptedModel`: lists of turns.

    Each turn streams a few text chunks with a delay of 0, 0.25 or 1 s each, may call
    tools (``tools``; arguments from ``arguments``, from the ``FakeTools``' own
    strategies, or else drawn from each tool's JSON schema), may call an unknown tool
    or pass invalid JSON, and may fail part-way (``failures``). With ``hostile_text``
    the chunks include :func:`hostile_texts` (an emoji's surrogate halves in two
    chunks, lone surrogates, NUL, 100,000 characters).
    """
    if isinstance(tools, FakeTools):
        chosen: dict[str, st.SearchStrategy[Any]] = dict(tools.arguments)
        names = list(tools.names())
    else:
        chosen = {tool.name: _from_schema(tool.parameters) for tool in tools}
        names = [tool.name for tool in tools]
    chosen.update(arguments or {})
    call = (
        _call(names, chosen, unknown_tools=unknown_tools, invalid_arguments=invalid_arguments)
        if names or unknown_tools
        else None
    )
    calls = st.lists(call, max_size=max_calls) if call is not None else None
    chunks = _HOSTILE_CHUNKS if hostile_text else _CHUNKS
    return st.lists(_turn(calls, failures, chunks), min_size=min_turns, max_size=max_turns)


# ------------------------------------------------------------------ items and ops

_texts = st.sampled_from(["also this", "be brief", "stop that", "one more thing"])


@st.composite
def _pair(draw: st.DrawFn) -> tuple[Item, ...]:
    call_id = f"inj_{draw(st.integers(0, 9))}"
    output = draw(st.sampled_from(["42", "ok", ""]))
    return (ToolCall(call_id, "lookup", json.dumps({"q": "x"})), ToolResult(call_id, output))


_SINGLE: st.SearchStrategy[tuple[Item, ...]] = st.one_of(
    _texts.map(lambda text: (UserMessage(text),)),
    _texts.map(lambda text: (AssistantMessage(text),)),
)
_PARTS = {
    True: st.lists(st.one_of(_SINGLE, _pair()), min_size=1, max_size=3),
    False: st.lists(_SINGLE, min_size=1, max_size=3),
}


@st.composite
def _items(draw: st.DrawFn, pairs: bool) -> tuple[Item, ...]:
    parts = draw(_PARTS[pairs])
    out: list[Item] = []
    seen: set[str] = set()
    for part in parts:
        ids = {item.call_id for item in part if isinstance(item, ToolCall | ToolResult)}
        if ids & seen:
            continue  # one injection never repeats a call id
        seen |= ids
        out.extend(part)
    return tuple(out)


def items(*, pairs: bool = True) -> st.SearchStrategy[tuple[Item, ...]]:
    """What one ``run.inject`` call may carry: 1-3 user or assistant messages and
    (if ``pairs``) complete tool call/result pairs.

    Call ids repeat between draws; :func:`~trio_agents.testing.run_schedule` makes them
    unique per injection.
    """
    return _items(pairs)


@st.composite
def _op(
    draw: st.DrawFn,
    kinds: st.SearchStrategy[OpKind],
    times: st.SearchStrategy[float],
    early: st.SearchStrategy[float],
    rest: st.SearchStrategy[Op],
) -> Op:
    kind = draw(kinds)
    # cancel_in_tool waits for the next tool call from `at` on: an early `at` (mostly
    # the first time) catches the first tool calls too.
    at = draw(early if kind == "cancel_in_tool" else times)
    return attrs.evolve(draw(rest), at=at, kind=kind)


def schedules(
    *,
    kinds: Sequence[OpKind] = OP_KINDS,
    times: Sequence[float] = DEFAULT_TIMES,
    max_ops: int = 8,
    reasons: Sequence[str] = ("r1", "r2", "r3"),
    injected: st.SearchStrategy[tuple[Item, ...]] | None = None,
    targets: Sequence[str] = (),
) -> st.SearchStrategy[tuple[Op, ...]]:
    """Schedules: up to ``max_ops`` operations (:class:`Op`) at virtual ``times``.

    The result is sorted by time (ties keep their drawn order). Keep ``times`` to
    multiples of 1/8 s (see the module notes) and ``max_ops`` below 128. When
    ``kinds`` includes ``"cancel_in_tool"`` (the default does), about a third of the
    operations drawn are cancels that land in a tool call. With ``targets`` (agent
    names of a run tree), each operation's :attr:`Op.target` is drawn from them and
    None (the root), shrinking towards None.
    """
    if not 0 <= max_ops < 128:
        raise ValueError("max_ops must be between 0 and 127")
    drawn = list(kinds)
    if "cancel_in_tool" in drawn:
        # A cancel that lands while a tool runs is what finds a tool that swallows
        # trio.Cancelled: make it about a third of the ops drawn.
        drawn += ["cancel_in_tool"] * max(1, len(drawn) // 2 - 1)
    first = min(times) if times else 0.0
    early = [first, first, first, *(t for t in times if first < t <= 1.0)]
    op = _op(
        st.sampled_from(drawn),
        st.sampled_from(list(times)),
        st.sampled_from(early),
        st.builds(
            Op,
            at=st.just(0.0),
            kind=st.just("inject"),
            reason=st.sampled_from(list(reasons)),
            when=st.sampled_from(_WHENS),
            items=injected if injected is not None else items(),
            target=st.sampled_from([None, *targets]) if targets else st.none(),
        ),
    )
    ops = st.lists(op, max_size=max_ops)
    if "cancel_in_tool" in drawn and max_ops:
        # ... and half the schedules get one more, from the start.
        extra = st.sampled_from([(), (Op(0.0, "cancel_in_tool", reason=reasons[0]),)])
        ops = st.tuples(extra, ops).map(lambda pair: [*pair[1], *pair[0]][:max_ops])
    return ops.map(lambda drawn_ops: tuple(sorted(drawn_ops, key=lambda o: o.at)))


# ------------------------------------------------------------------ faults


@st.composite
def _faults(draw: st.DrawFn, model: bool, hooks: bool, session: bool, max_turn: int) -> Faults:
    model_faults: list[ModelFault] = []
    if model:
        turns = draw(st.lists(st.integers(1, max_turn), max_size=2, unique=True), label="turns")
        for turn in turns:
            kind = draw(st.sampled_from(MODEL_FAULT_KINDS))
            model_faults.append(ModelFault(turn, kind, draw(st.integers(0, 3))))
    hook_faults: list[HookFault] = []
    if hooks:
        hook_faults = draw(
            st.lists(
                st.builds(
                    HookFault,
                    hook=st.sampled_from(HOOK_NAMES),
                    kind=st.sampled_from(("raise", "block")),
                    call=st.integers(1, 3),
                ),
                max_size=2,
                unique_by=lambda f: f.hook,
            )
        )
    session_fault = None
    if session:
        session_fault = draw(
            st.none()
            | st.builds(
                SessionFault, kind=st.sampled_from(SESSION_FAULT_KINDS), call=st.integers(1, 3)
            )
        )
    return Faults(tuple(model_faults), tuple(hook_faults), session_fault)


def faults(
    *, model: bool = True, hooks: bool = True, session: bool = True, max_turn: int = 4
) -> st.SearchStrategy[Faults]:
    """What misbehaves in one example (:class:`Faults`): up to two model calls (among
    the first ``max_turn``), up to two hooks, and maybe the session.

    It shrinks towards no fault at all. Fault tools are not drawn here: give the agent
    ``standard_tools(faults=True)`` and the scripts call them.
    """
    return _faults(model, hooks, session, max_turn)


# ------------------------------------------------------------------ hostile text


def hostile_texts() -> st.SearchStrategy[str]:
    """Text that is hard to encode: :data:`~trio_agents.testing.HOSTILE_TEXTS` (lone
    surrogates, a split pair, NUL, 100,000 characters), an emoji's halves on their own,
    and plain words, which it shrinks to."""
    return st.sampled_from(["a ", "\ud83d", "\ude00 ", *HOSTILE_TEXTS])


# The halves of one emoji in two chunks (the run must join them), among the rest.
_HOSTILE_CHUNKS = st.lists(
    st.one_of(hostile_texts().map(lambda text: [text]), st.just(["\ud83d", "\ude00"])),
    max_size=4,
).map(lambda groups: [chunk for group in groups for chunk in group])


@st.composite
def _hostile_items(draw: st.DrawFn) -> tuple[Item, ...]:
    text = draw(hostile_texts())
    kind = draw(st.sampled_from(["user", "assistant", "pair"]))
    if kind == "user":
        return (UserMessage(text),)
    if kind == "assistant":
        return (AssistantMessage(text),)
    call_id = f"inj_{draw(st.integers(0, 9))}"
    return (
        ToolCall(call_id, "lookup", json.dumps({"q": text})),
        ToolResult(call_id, text),
    )


def hostile_items() -> st.SearchStrategy[tuple[Item, ...]]:
    """What one ``run.inject`` call may carry, with :func:`hostile_texts` in it: a user
    or an assistant message, or a tool call/result pair (the call's arguments hold the
    text JSON-escaped, its result holds it as is). For ``schedules(injected=...)``."""
    return _hostile_items()


# ------------------------------------------------------------------ run trees (§17)


@final
@attrs.frozen(eq=False)
class AgentTree:
    """A small tree of agents, drawn by :func:`agent_trees`, for
    :func:`~trio_agents.testing.run_tree_schedule`: who has whom as a tool
    (:meth:`~trio_agents.Agent.as_tool`), every agent's script and faults.

    Attributes:
        root: the root agent's name.
        children: agent name → the names of the agents it calls as tools.
        tools: the fake tools every agent has besides its agent tools (one recorder).
        scripts: agent name → its script (every run of that agent plays from it).
        faults: agent name → what misbehaves in its runs (:class:`Faults`).
        max_turns: every agent's ``max_turns``.
    """

    root: str
    children: Mapping[str, tuple[str, ...]]
    tools: FakeTools
    scripts: Mapping[str, tuple[Turn, ...]]
    faults: Mapping[str, Faults] = attrs.Factory(dict)
    max_turns: int = 10

    def names(self) -> tuple[str, ...]:
        """Every agent's name, the root first, then depth first."""
        out: list[str] = []
        pending = [self.root]
        while pending:
            name = pending.pop()
            out.append(name)
            pending.extend(reversed(self.children.get(name, ())))
        return tuple(out)

    def build(self, models: Mapping[str, Model]) -> Agent:
        """The root agent, each agent on its model from ``models`` (by name)."""

        def make(name: str) -> Agent:
            kids = [make(kid).as_tool() for kid in self.children.get(name, ())]
            return Agent(
                name=name,
                model=models[name],
                tools=[*self.tools.tools, *kids],
                max_turns=self.max_turns,
            )

        return make(self.root)

    def describe(self) -> list[str]:
        """The tree, its scripts and faults, readably."""
        lines = []
        for name in self.names():
            kids = self.children.get(name, ())
            lines.append(f"{name}" + (f" -> {', '.join(kids)}" if kids else ""))
            lines += [f"  {index + 1}. {turn!r}" for index, turn in enumerate(self.scripts[name])]
            faults = self.faults.get(name)
            if faults:
                lines += [f"  fault: {text}" for text in faults.describe()]
        return lines


_AGENT_INPUT = st.fixed_dictionaries({"input": st.sampled_from(["task a", "task b", "more"])})


def _agent_script(
    tools: FakeTools, kids: Sequence[str], max_turns: int, max_calls: int, failures: bool
) -> st.SearchStrategy[list[Turn]]:
    general = _call(tools.names(), tools.arguments, unknown_tools=True, invalid_arguments=True)
    if not kids:
        turn = _turn(st.lists(general, max_size=max_calls), failures)
        return st.lists(turn, min_size=1, max_size=max_turns)
    # Calls of the agent tools are what a tree is about: the first turn calls at least
    # one (and never fails), and half the calls of the later turns are theirs.
    agent_call = st.tuples(st.sampled_from(list(kids)), _AGENT_INPUT)
    first = _turn(
        st.tuples(
            st.lists(agent_call, min_size=1, max_size=max_calls),
            st.lists(general, max_size=1),
        ).map(lambda pair: [*pair[0], *pair[1]]),
        failures=False,
    )
    later = _turn(st.lists(st.one_of(agent_call, general), max_size=max_calls), failures)
    return st.tuples(first, st.lists(later, max_size=max_turns - 1)).map(
        lambda pair: [pair[0], *pair[1]]
    )


@st.composite
def _agent_trees(
    draw: st.DrawFn,
    tools: FakeTools,
    max_children: int,
    grandchildren: bool,
    with_faults: bool,
    max_turns: int,
    max_calls: int,
) -> AgentTree:
    count = draw(st.integers(1, max_children), label="children")
    kids = tuple(f"c{index + 1}" for index in range(count))
    children: dict[str, tuple[str, ...]] = {"root": kids}
    names = ["root", *kids]
    if grandchildren and draw(st.booleans(), label="grandchild"):
        parent = draw(st.sampled_from(kids), label="grandchild's parent")
        children[parent] = ("g1",)
        names.append("g1")
    scripts: dict[str, tuple[Turn, ...]] = {}
    agent_faults: dict[str, Faults] = {}
    for name in names:
        below = children.get(name, ())
        script = _SCRIPTS.get((id(tools), below, max_turns, max_calls, with_faults))
        if script is None:
            script = _agent_script(tools, below, max_turns, max_calls, with_faults)
            _SCRIPTS[(id(tools), below, max_turns, max_calls, with_faults)] = script
        scripts[name] = tuple(draw(script, label=f"script of {name}"))
        if with_faults:
            drawn = draw(_TREE_FAULTS[name == "root"], label=f"faults of {name}")
            if drawn:
                agent_faults[name] = drawn
    return AgentTree("root", children, tools, scripts, agent_faults)


# Built once: a strategy made inside a draw is validated again at every example.
_SCRIPTS: dict[tuple[int, tuple[str, ...], int, int, bool], st.SearchStrategy[list[Turn]]] = {}
_MODEL_FAULTS = st.lists(
    st.builds(
        ModelFault,
        turn=st.integers(1, 3),
        kind=st.sampled_from(MODEL_FAULT_KINDS),
        after=st.integers(0, 3),
    ),
    max_size=2,
    unique_by=lambda f: f.turn,
)
_HOOK_FAULTS = st.lists(
    st.builds(
        HookFault,
        hook=st.sampled_from(HOOK_NAMES),
        kind=st.sampled_from(("raise", "block")),
        call=st.integers(1, 3),
    ),
    max_size=2,
    unique_by=lambda f: f.hook,
)
_SESSION_FAULT = st.none() | st.builds(
    SessionFault, kind=st.sampled_from(SESSION_FAULT_KINDS), call=st.integers(1, 3)
)
_TREE_FAULTS = {
    root: st.builds(
        Faults,
        model=_MODEL_FAULTS.map(tuple),
        hooks=_HOOK_FAULTS.map(tuple),
        session=_SESSION_FAULT if root else st.none(),
    )
    for root in (True, False)
}
# The faults below the root are what the tree examples are for: a root that fails at
# once never starts a child, so the root's faults come in a quarter of the examples.
_TREE_FAULTS[True] = st.one_of(
    st.just(Faults()), st.just(Faults()), st.just(Faults()), _TREE_FAULTS[True]
)


def agent_trees(
    *,
    tools: FakeTools | None = None,
    max_children: int = 3,
    grandchildren: bool = True,
    faults: bool = True,
    max_turns: int = 3,
    max_calls: int = 3,
) -> st.SearchStrategy[AgentTree]:
    """Small trees of agents (:class:`AgentTree`): a ``root`` with 1 to
    ``max_children`` agent tools ``c1``, ``c2``, ... and maybe (``grandchildren``) a
    grandchild ``g1`` below one of them; a script per agent whose turns call the fake
    ``tools`` (default: :func:`standard_tools` without threads, with the fault tools
    if ``faults``), unknown tools, and the agent's own agent tools; and (``faults``)
    model turns that fail part-way plus :func:`faults` per agent — a child's model
    that raises or sends garbage, a child's hook that raises or blocks, the root's
    session. With the fault tools, a child's tool may also hang in a shield past
    ``cleanup_timeout`` or swallow its cancellation.

    Each example shrinks towards one child, no grandchild, short scripts, no fault.
    Draw schedules for it with ``schedules(targets=tree.names()[1:])``; the tools'
    recorder is shared by the examples (:func:`run_tree_schedule` resets it).
    """
    chosen = tools if tools is not None else standard_tools(threads=False, faults=faults)
    return _agent_trees(chosen, max_children, grandchildren, faults, max_turns, max_calls)
