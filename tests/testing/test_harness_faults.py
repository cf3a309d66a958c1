"""The run core under faults (DESIGN §5 "Fault safety"), on the public harness.

Whatever a model, tool, hook or session does — raise, yield a malformed event, return
garbage, raise a stray ``trio.Cancelled``, block — the run reaches exactly one terminal
update, releases its session, keeps a valid conversation, and ``wait()``, ``updated``
and ``events()`` end. Two layers:

- one small, fixed example per fault (``test_one_fault``): each is a minimal repro;
- property tests that combine faults with random scripts and schedules.

Select them with ``-m faults``. The rebuilt run core (issue 13) passes every one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.helpers import count_example, lifecycle_settings
from trio_agents.testing import (
    FakeTools,
    Faults,
    HookFault,
    ModelFault,
    Op,
    SessionFault,
    Turn,
    check_run,
    faults,
    hostile_items,
    run_schedule,
    schedules,
    scripts,
    standard_tools,
)

pytestmark = pytest.mark.faults

TOOLS = standard_tools(faults=True)
CLEANUP = 1.0


def _agent(tools: FakeTools, max_turns: int = 4) -> Any:
    def factory(model: ta.Model) -> ta.Agent:
        return ta.Agent(name="f", model=model, tools=list(tools.tools), max_turns=max_turns)

    return factory


def _observe(
    script: Sequence[Turn | str],
    schedule: tuple[Op, ...] | list[Op] = (),
    fault: Faults | None = None,
    *,
    tools: FakeTools = TOOLS,
    max_turns: int = 4,
    agent: Callable[[ta.Model], ta.Agent] | None = None,
    run_options: dict[str, Any] | None = None,
    default_turn: Turn | str | None = "the end",
) -> Any:
    """One example with a session, ``tools`` recorded and the short cleanup bound;
    ``agent`` replaces the default agent over ``tools``."""
    return run_schedule(
        agent or _agent(tools, max_turns),
        script,
        schedule,
        recorder=tools.recorder,
        faults=fault,
        session=True,
        run_options={"cleanup_timeout": CLEANUP, **(run_options or {})},
        default_turn=default_turn,
    )


# A turn that streams text and calls two tools, then a final answer.
TWO_TURNS: list[Turn | str] = [
    Turn(
        text="hello there",
        tool_calls=[("sleep", {"seconds": 0.5}), ("sleep", {"seconds": 2.0})],
        delay=0.25,
    ),
    Turn(text="final answer", delay=0.25),
]


# A final answer, streamed slowly: a cancel that its stream swallows must not make
# the cut-off text the run's final output.
ANSWER: list[Turn | str] = [Turn(text="the answer is forty two", delay=0.25)]


def _calling(name: str, arguments: dict[str, Any]) -> list[Turn | str]:
    return [Turn(text="on it", tool_calls=[(name, arguments), ("sleep", {"seconds": 0.5})]), "done"]


def _model(turn: int, kind: Any, after: int = 1) -> Faults:
    return Faults(model=(ModelFault(turn, kind, after),))


def _hook(hook: Any, kind: Any) -> Faults:
    return Faults(hooks=(HookFault(hook, kind),))


def _session(kind: Any, call: int = 1) -> Faults:
    return Faults(session=SessionFault(kind, call))


CANCEL_AT_1 = (Op(1.0, "cancel", reason="user stop"),)
CANCEL_AT_1_5 = (Op(1.5, "cancel", reason="user stop"),)
CANCEL_AT_2 = (Op(2.0, "cancel", reason="user stop"),)
CANCEL_IN_TOOL = (Op(0.0, "cancel_in_tool", reason="user stop"),)
# The hooks called before the run's end (a fault in on_run_end has cases of its own).
HOOKS_IN_A_TURN = ("on_run_start", "on_model_start", "on_model_end", "on_tool_start", "on_tool_end")

# id → (script, schedule, faults); each one fault (or two), minimal.
CASES: list[Any] = [
    # -- models
    pytest.param(TWO_TURNS, (), _model(1, "raise"), id="model-raises-mid-stream"),
    pytest.param(TWO_TURNS, (), _model(2, "raise_on_open"), id="model-raises-on-open"),
    pytest.param(TWO_TURNS, (), _model(1, "bytes_text"), id="model-bytes-text"),
    pytest.param(TWO_TURNS, (), _model(1, "unknown_event"), id="model-unknown-event"),
    pytest.param(TWO_TURNS, (), _model(1, "duplicate_id"), id="model-duplicate-id"),
    pytest.param(TWO_TURNS, (), _model(2, "reused_id"), id="model-reuses-an-earlier-id"),
    pytest.param(TWO_TURNS, CANCEL_AT_1, _model(1, "never_ends"), id="model-never-ends"),
    pytest.param(TWO_TURNS, (), _model(1, "stray_cancel"), id="model-stray-cancelled"),
    # -- models that swallow their cancellation (issue 29): still cancelled, or still
    #    interrupted by a when="now" injection
    *(
        pytest.param(script, schedule, _model(1, kind), id=f"model-{kind}-{name}")
        for kind in ("swallow_cancel", "swallow_cancel_on_exit")
        for script, schedule, name in (
            (TWO_TURNS, CANCEL_AT_1, "then-tools"),
            (ANSWER, CANCEL_AT_1, "in-an-answer"),
            (ANSWER, (Op(1.0, "outer_cancel"),), "outer-cancel-in-an-answer"),
        )
    ),
    *(
        pytest.param(
            TWO_TURNS,
            (Op(1.0, "inject", when="now"),),
            _model(1, kind),
            id=f"model-{kind}-swallows-an-interruption",
        )
        for kind in ("swallow_cancel", "swallow_cancel_on_exit")
    ),
    # -- tools
    pytest.param(_calling("swallow", {"seconds": 2.0}), CANCEL_IN_TOOL, None, id="tool-swallows"),
    pytest.param(_calling("stray", {"after": 0.5}), (), None, id="tool-stray-cancelled"),
    pytest.param(_calling("shield", {"seconds": 8.0}), CANCEL_IN_TOOL, None, id="tool-shielded-8s"),
    *(
        pytest.param(_calling("garbage", {"kind": k}), (), None, id=f"tool-returns-garbage-{k}")
        for k in range(5)
    ),
    pytest.param(_calling("stubborn", {}), CANCEL_IN_TOOL, None, id="tool-thread-ignores-cancel"),
    # -- hooks that raise
    *(
        pytest.param(TWO_TURNS, (), _hook(hook, "raise"), id=f"hook-{hook}-raises")
        for hook in HOOKS_IN_A_TURN
    ),
    pytest.param(TWO_TURNS, (), _hook("on_run_end", "raise"), id="hook-on_run_end-raises"),
    # -- hooks that block (until cancelled)
    *(
        pytest.param(TWO_TURNS, CANCEL_AT_1, _hook(hook, "block"), id=f"hook-{hook}-blocks")
        for hook in HOOKS_IN_A_TURN
    ),
    pytest.param(TWO_TURNS, (), _hook("on_run_end", "block"), id="hook-on_run_end-blocks"),
    # -- sessions
    pytest.param(TWO_TURNS, (), _session("raise_on_get"), id="session-get-raises"),
    pytest.param(TWO_TURNS, (), _session("raise_on_add", 1), id="session-first-add-raises"),
    pytest.param(TWO_TURNS, (), _session("raise_on_add", 3), id="session-third-add-raises"),
    pytest.param(
        TWO_TURNS,
        CANCEL_AT_1,
        _session("block_on_add", 1),
        id="session-first-add-blocks",
    ),
    pytest.param(
        TWO_TURNS,
        CANCEL_AT_1,
        _session("block_on_add", 3),
        id="session-third-add-blocks",
    ),
    # -- sessions whose write stores its items, then raises or is cancelled (a commit
    #    whose answer was lost, a checkpoint after the commit): never written twice
    pytest.param(
        TWO_TURNS, (), _session("raise_after_add", 1), id="session-first-add-stored-raises"
    ),
    pytest.param(
        TWO_TURNS, (), _session("raise_after_add", 3), id="session-third-add-stored-raises"
    ),
    pytest.param(
        TWO_TURNS,
        CANCEL_AT_1_5,
        _session("block_after_add", 2),
        id="session-call-stored-then-cancelled",
    ),
    pytest.param(
        TWO_TURNS,
        CANCEL_AT_2,
        _session("block_after_add", 3),
        id="session-result-stored-then-cancelled",
    ),
    # -- two at once: the repair's one deadline covers on_run_end
    pytest.param(
        TWO_TURNS,
        CANCEL_AT_1,
        Faults(hooks=(HookFault("on_run_end", "block"),), session=SessionFault("block_on_add", 3)),
        id="session-blocks-and-on_run_end-blocks",
    ),
    # -- a fault in the run, then the write of its repair fails (found by `make fuzz`):
    #    the reason becomes the session error, the first cause stays in the detail
    pytest.param(
        [Turn(tool_calls=[("block", {})])],
        (),
        Faults(
            hooks=(HookFault("on_tool_start", "raise"),), session=SessionFault("raise_on_add", 3)
        ),
        id="hook-raises-then-the-repair-write-fails",
    ),
    pytest.param(
        ["a "],
        (),
        Faults(
            model=(ModelFault(1, "bytes_text", after=1),), session=SessionFault("raise_on_add", 2)
        ),
        id="model-malformed-then-the-repair-write-fails",
    ),
    pytest.param(
        [Turn(tool_calls=[("block", {})])],
        (),
        Faults(hooks=(HookFault("on_tool_end", "raise"),), session=SessionFault("raise_on_add", 3)),
        id="a-result-write-fails-then-on_tool_end-raises-in-the-repair",
    ),
    pytest.param(
        [Turn()],
        (),
        Faults(
            model=(ModelFault(1, "bytes_text", after=0),),
            hooks=(HookFault("on_model_end", "raise"),),
        ),
        id="a-malformed-event-then-on_model_end-raises-in-the-repair",
    ),
]


@pytest.mark.parametrize(("script", "schedule", "fault"), CASES)
def test_one_fault(
    script: list[Turn | str], schedule: tuple[Op, ...], fault: Faults | None
) -> None:
    count_example()
    observation = _observe(script, schedule, fault)
    check_run(observation).raise_for_violations()


# ------------------------------------------------------------------ properties


def _subset(*names: str) -> FakeTools:
    """Some tools of TOOLS (same recorder), with their argument strategies."""
    kept = tuple(tool for tool in TOOLS.tools if tool.name in names)
    return FakeTools(kept, TOOLS.recorder, {name: TOOLS.arguments[name] for name in names})


WELL_BEHAVED = _subset("block", "sleep", "fail", "guarded", "slow", "crunch")
MISBEHAVING = _subset("sleep", "swallow", "shield", "garbage", "stubborn")


def _property(
    tools: FakeTools, script: list[Turn], schedule: tuple[Op, ...], fault: Faults, max_turns: int
) -> None:
    count_example()
    observation = _observe(script, schedule, fault, tools=tools, max_turns=max_turns)
    check_run(observation).raise_for_violations()


@lifecycle_settings(weight=0.5)
@given(
    script=scripts(MISBEHAVING),
    schedule=schedules(),
    max_turns=st.integers(1, 4),
)
def test_tools_that_misbehave_never_break_the_run(
    script: list[Turn], schedule: tuple[Op, ...], max_turns: int
) -> None:
    """Tools that swallow a cancel, shield their work, return garbage or ignore
    ``ctx.cancelled`` in their thread."""
    _property(MISBEHAVING, script, schedule, Faults(), max_turns)


@lifecycle_settings(weight=0.5)
@given(script=scripts(_subset("sleep", "stray")), schedule=schedules(), max_turns=st.integers(1, 4))
def test_tools_that_raise_a_stray_cancelled_never_break_the_run(
    script: list[Turn], schedule: tuple[Op, ...], max_turns: int
) -> None:
    _property(_subset("sleep", "stray"), script, schedule, Faults(), max_turns)


# One part at a time breaks (its faults alone), under random scripts and schedules
# with well-behaved tools.
PART_FAULTS = [
    pytest.param(faults(hooks=False, session=False), id="models-that-break"),
    pytest.param(faults(model=False, session=False), id="hooks-that-raise-or-block"),
    pytest.param(faults(model=False, hooks=False), id="sessions-that-raise-or-block"),
]


@pytest.mark.parametrize("part_faults", PART_FAULTS)
@lifecycle_settings(weight=0.5)
@given(
    data=st.data(), script=scripts(WELL_BEHAVED), schedule=schedules(), max_turns=st.integers(1, 4)
)
def test_one_part_that_breaks_never_breaks_the_run(
    part_faults: st.SearchStrategy[Faults],
    data: st.DataObject,
    script: list[Turn],
    schedule: tuple[Op, ...],
    max_turns: int,
) -> None:
    fault = data.draw(part_faults, label="fault")
    _property(WELL_BEHAVED, script, schedule, fault, max_turns)


@lifecycle_settings(weight=1)
@given(script=scripts(TOOLS), schedule=schedules(), fault=faults(), max_turns=st.integers(1, 5))
def test_any_fault_under_any_schedule(
    script: list[Turn], schedule: tuple[Op, ...], fault: Faults, max_turns: int
) -> None:
    """Everything at once: every fault tool, model, hook and session fault."""
    _property(TOOLS, script, schedule, fault, max_turns)


# ------------------------------------------------ hostile text and broken errors
# Issue 29, items 2, 5 and 6: lone surrogates, a surrogate pair split across deltas,
# NUL and huge text from the model, a tool or an injection; a tool exception whose
# str() raises; an output validator that raises anything. The checker's "clean-text"
# invariant says no such text reaches the user, the session or the model.


HOSTILE_CASES: list[Any] = [
    pytest.param(
        [Turn(text=["smile \ud83d", "\ude00, r\udce9sum\udce9 \x00"]), "done"],
        None,
        id="model-streams-split-and-lone-surrogates",
    ),
    pytest.param([Turn(text=["cut \ud83d"], fail="fell over", fail_after=1)], None, id="cut"),
    pytest.param([Turn(text=["x" * 100_000, "\ud83d"])], None, id="model-huge-delta"),
    *(
        pytest.param(_calling("hostile", {"kind": k, "echo": "\ud83d"}), None, id=f"tool-{k}")
        for k in range(6)
    ),
    pytest.param(_calling("brokenstr", {}), None, id="tool-exception-str-raises"),
    pytest.param(_calling("brokenstr_thread", {}), None, id="thread-tool-exception-str-raises"),
    pytest.param(
        _calling("brokenstr", {}), {"on_tool_error": "fail"}, id="tool-exception-str-raises-fail"
    ),
    pytest.param(
        [Turn(tool_calls=[("lookup", '{"q": "\udce9"}')]), "done"], None, id="raw-surrogate-args"
    ),
]


@pytest.mark.parametrize(("script", "options"), HOSTILE_CASES)
def test_one_hostile_input(script: list[Turn | str], options: dict[str, Any] | None) -> None:
    count_example()
    inject = Op(0.0, "inject", items=(ta.UserMessage("r\udce9sum\udce9.pdf"),))
    observation = _observe(script, (inject,), run_options=options)
    check_run(observation).raise_for_violations()
    assert observation.result.status in (ta.RunStatus.COMPLETED, ta.RunStatus.FAILED)
    if options is None and "fell over" not in str(script):
        assert observation.result.status is ta.RunStatus.COMPLETED, observation.result.reason


HOSTILE = _subset("sleep", "hostile", "brokenstr", "brokenstr_thread")


@lifecycle_settings(weight=0.5)
@given(
    script=scripts(HOSTILE, hostile_text=True),
    schedule=schedules(injected=hostile_items()),
    fault=faults(hooks=False),
    max_turns=st.integers(1, 4),
)
def test_hostile_text_and_broken_errors_never_break_the_run(
    script: list[Turn], schedule: tuple[Op, ...], fault: Faults, max_turns: int
) -> None:
    """Hostile text streamed, returned by tools and injected; tool errors that cannot
    be described; with model and session faults on top."""
    _property(HOSTILE, script, schedule, fault, max_turns)


class _BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


@attrs.frozen
class Picky:
    """An output type whose validator raises whatever it likes."""

    x: int = attrs.field()

    @x.validator
    def _check(self, _attribute: object, value: int) -> None:
        if value < 0:
            raise KeyError("negative")
        assert value != 0, "zero"
        if value > 100:
            raise _BrokenStr


_ANSWERS = st.sampled_from(
    [
        *(f'{{"x": {x}}}' for x in (-1, 0, 7, 101)),
        '{"x": NaN}',
        '{"x": 1e400}',
        '{"x": ' + "[" * 5000 + "]" * 5000 + "}",
        '{"x": ' + "9" * 5000 + "}",
    ]
)
_ANSWER_TURNS = st.one_of(
    _ANSWERS.map(lambda arguments: Turn(tool_calls=[("final_answer", arguments)])),
    _ANSWERS,  # a text answer
    st.just(Turn(tool_calls=[("sleep", {"seconds": 0.5})])),
)


@lifecycle_settings(weight=0.5)
@given(
    script=st.lists(_ANSWER_TURNS, min_size=1, max_size=4),
    schedule=schedules(max_ops=3),
    max_turns=st.integers(1, 5),
)
def test_output_validators_that_raise_never_break_the_run(
    script: list[Turn | str], schedule: tuple[Op, ...], max_turns: int
) -> None:
    """Structured answers a validator refuses with any exception, NaN, numbers no float
    holds, nesting deeper than any recursion limit: each is a validation error."""
    count_example()

    def factory(model: ta.Model) -> ta.Agent:
        tools = list(_subset("sleep").tools)
        return ta.Agent(name="o", model=model, tools=tools, max_turns=max_turns, output_type=Picky)

    observation = _observe(script, schedule, agent=factory, default_turn=None)
    check_run(observation).raise_for_violations()
    result = observation.result
    if result.status is ta.RunStatus.FAILED:
        assert result.reason is not None
        assert not result.reason.startswith("internal error"), result.reason


def test_a_model_error_whose_str_raises() -> None:
    """The run's reason and the harness's own record both survive it."""
    count_example()
    script = [Turn(text=["a ", "b "], fail=_BrokenStr(), fail_after=1)]
    observation = _observe(script)
    check_run(observation).raise_for_violations()
    assert observation.result.reason == "_BrokenStr: <str() raised RuntimeError>"
    assert observation.streams[0].error == "_BrokenStr: <str() raised RuntimeError>"


def test_an_assistant_message_injected_into_a_swallowing_call_is_not_the_models() -> None:
    """Found by `make fuzz`: a `when="now"` assistant message interrupts a model call
    that swallows its cancellation, and max_turns ends the run. The delivered message
    (turn 1, completed) is the caller's, so the checker must not take it for the
    swallowing call's cut-off text kept as complete."""
    schedule = (
        Op(
            at=0.125,
            kind="inject",
            when="now",
            items=(ta.AssistantMessage(content="a ", status="completed"),),
        ),
    )
    fault = Faults(model=(ModelFault(turn=1, kind="swallow_cancel", after=0),))
    observation = _observe([Turn(text=())], schedule, fault, tools=HOSTILE, max_turns=1)
    assert any(isinstance(e, ta.InboxDelivered) for e in observation.events)
    check_run(observation).raise_for_violations()
