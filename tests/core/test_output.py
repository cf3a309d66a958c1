"""Structured output (``Agent(output_type=...)``) over the ScriptedModel, every run
checked by the harness's invariant checker (which checks the output too)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

import attrs
import hypothesis
import pytest
import trio
from hypothesis import strategies as st

import trio_agents as ta
import trio_agents.testing as tt
from trio_agents import AssistantMessage, RunStatus, ToolCall, ToolResult, UserMessage
from trio_agents.models import FINAL_ANSWER_TOOL, ScriptedModel, Turn


@attrs.frozen
class Point:
    """A point on the plane."""

    x: int
    y: int


@dataclasses.dataclass
class Order:
    item: str
    quantity: int = 1
    tags: list[str] = dataclasses.field(default_factory=list)


class Weather(TypedDict):
    city: str
    celsius: float


class Mood(enum.Enum):
    HAPPY = "happy"
    SAD = "sad"


RAW = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "sources": {"type": "array"}},
    "required": ["answer"],
}


def answer(arguments: dict[str, Any]) -> Turn:
    return Turn(tool_calls=[(FINAL_ANSWER_TOOL, arguments)])


def agent_for(output_type: object, *, native: bool = False, **kwargs: Any) -> Any:
    def factory(model: ta.Model) -> ta.Agent:
        if native:  # the ScriptedModel, as the harness hands it over (maybe watched)
            assert hasattr(model, "native_output")
            setattr(model, "native_output", True)  # noqa: B010
        return ta.Agent(name="out", model=model, output_type=output_type, **kwargs)

    return factory


def observe(
    output_type: object,
    script: Sequence[Turn | str],
    schedule: Sequence[tt.Op] = (),
    *,
    native: bool = False,
    **kwargs: Any,
) -> tt.Observation:
    obs = tt.run_schedule(
        agent_for(output_type, native=native, **kwargs), script, schedule, default_turn=None
    )
    tt.check_run(obs).raise_for_violations()
    return obs


# ------------------------------------------------------------------- every kind


KINDS: list[tuple[str, object, Turn | str, object]] = [
    ("attrs", Point, answer({"x": 1, "y": 2}), Point(1, 2)),
    ("dataclass", Order, answer({"item": "tea", "tags": ["hot"]}), Order("tea", 1, ["hot"])),
    ("typeddict", Weather, answer({"city": "Oslo", "celsius": 3}), {"city": "Oslo", "celsius": 3}),
    ("int", int, answer({"response": 42}), 42),
    ("float", float, answer({"response": 2}), 2.0),
    ("bool", bool, answer({"response": True}), True),
    ("str", str, answer({"response": "hi"}), "hi"),
    ("list", list[Point], answer({"response": [{"x": 1, "y": 2}]}), [Point(1, 2)]),
    ("tuple", tuple[int, ...], answer({"response": [1, 2]}), (1, 2)),
    ("literal", Literal["yes", "no"], answer({"response": "no"}), "no"),
    ("enum", Mood, answer({"response": "sad"}), Mood.SAD),
    ("optional", Point | None, answer({"response": None}), None),
    ("json-schema", ta.JSONSchema(RAW, name="cited"), answer({"answer": "a"}), {"answer": "a"}),
    ("mapping", RAW, answer({"answer": "b", "sources": [1]}), {"answer": "b", "sources": [1]}),
    # A model without native support may still answer in text; that counts too.
    ("text-json", Point, '{"x": 3, "y": 4}', Point(3, 4)),
    ("text-bare-int", int, "7", 7),
    ("text-str", str, "just words", "just words"),
]


@pytest.mark.parametrize(
    ("output_type", "turn", "expected"), [k[1:] for k in KINDS], ids=[k[0] for k in KINDS]
)
def test_each_kind_of_output_type(output_type: object, turn: Turn | str, expected: object) -> None:
    obs = observe(output_type, [turn])
    assert obs.result.status is RunStatus.COMPLETED, obs.result.reason
    assert obs.result.final_output == expected
    assert type(obs.result.final_output) is type(expected)
    (request,) = obs.requests
    assert request.output is not None
    assert [spec.name for spec in request.tools] == [FINAL_ANSWER_TOOL]
    assert request.tools[0].parameters == request.output.schema
    if isinstance(turn, Turn):  # the call has its result: the conversation stays valid
        assert obs.result.conversation[-1] == ToolResult("call_1_0", "final answer accepted")


def test_output_specs() -> None:
    point = ta.Agent(name="a", output_type=Point)._output
    assert point is not None
    assert point.spec.name == "Point"
    assert point.spec.description == "A point on the plane."
    assert point.spec.envelope is None
    assert point.spec.strict is True
    order = ta.Agent(name="a", output_type=Order)._output
    assert order is not None
    assert order.spec.strict is False  # optional fields: not OpenAI-strict
    assert order.spec.schema["required"] == ["item"]
    number = ta.Agent(name="a", output_type=int)._output
    assert number is not None
    assert number.spec.name == "output"
    assert number.spec.envelope == "response"
    assert number.spec.schema == {
        "type": "object",
        "properties": {"response": {"type": "integer"}},
        "required": ["response"],
        "additionalProperties": False,
    }
    raw = ta.Agent(name="a", output_type=ta.JSONSchema(RAW, name="cited", strict=False))._output
    assert raw is not None
    assert (raw.spec.name, raw.spec.strict, raw.spec.envelope) == ("cited", False, None)
    assert ta.Agent(name="a")._output is None


def test_agent_refuses_bad_output_settings() -> None:
    with pytest.raises(TypeError, match="output_type"):
        ta.Agent(name="a", output_type=set[int])
    with pytest.raises(ValueError, match="output_retries"):
        ta.Agent(name="a", output_type=int, output_retries=-1)
    with pytest.raises(TypeError, match="output_retries"):
        ta.Agent(name="a", output_type=int, output_retries=True)

    @ta.function_tool(name=FINAL_ANSWER_TOOL)
    def clash() -> str:
        """Clash."""
        return ""

    with pytest.raises(ValueError, match="final_answer"):
        ta.Agent(name="a", tools=[clash], output_type=int)
    ta.Agent(name="a", tools=[clash])  # without an output type the name is free
    with pytest.raises(ValueError, match="name"):
        ta.JSONSchema(RAW, name="has spaces")
    with pytest.raises(TypeError, match="mapping"):
        ta.JSONSchema([1, 2])  # type: ignore[arg-type]


def test_plain_text_runs_are_unchanged() -> None:
    obs = tt.run_schedule(lambda m: ta.Agent(name="t", model=m), ["hello"], default_turn=None)
    tt.check_run(obs).raise_for_violations()
    assert obs.result.final_output == "hello"
    assert obs.requests[0].output is None
    assert obs.requests[0].tools == ()


# ------------------------------------------------------------------ native path


def test_native_model_answers_in_text_and_gets_no_tool() -> None:
    obs = observe(Point, ['```json\n{"x": 5, "y": 6}\n```'], native=True)
    assert obs.result.final_output == Point(5, 6)
    (request,) = obs.requests
    assert request.tools == ()
    assert request.output is not None
    assert request.output.name == "Point"


def test_native_envelope_answer() -> None:
    obs = observe(list[int], ['{"response": [1, 2, 3]}'], native=True)
    assert obs.result.final_output == [1, 2, 3]


# -------------------------------------------------------------------- retries


def test_tool_answer_retry_then_success() -> None:
    obs = observe(Point, [answer({"x": "one", "y": 2}), answer({"x": 1, "y": 2})])
    result = obs.result
    assert result.status is RunStatus.COMPLETED
    assert result.final_output == Point(1, 2)
    error = result.conversation[2]
    assert isinstance(error, ToolResult)
    assert error.status == "error"
    assert error.output.startswith("invalid final answer: $.x: expected integer, got string")
    # The model saw the error before its second try.
    assert obs.requests[1].items[-1] == error


def test_text_answer_retry_then_success() -> None:
    obs = observe(Point, ["Sure! x is 1", '{"x": 1}', '{"x": 1, "y": 9}'], native=True)
    result = obs.result
    assert result.final_output == Point(1, 9)
    feedback = [i for i in result.new_items if isinstance(i, UserMessage)][1:]
    assert len(feedback) == 2
    assert "not JSON" in feedback[0].content
    assert "missing required property 'y'" in feedback[1].content
    assert "JSON value matching the schema 'Point'" in feedback[1].content
    assert obs.requests[2].items[-1] == feedback[1]


def test_text_answer_on_the_tool_path_is_told_to_call_the_tool() -> None:
    obs = observe(Point, ["no idea", answer({"x": 0, "y": 0})])
    assert obs.result.final_output == Point(0, 0)
    feedback = obs.result.new_items[2]
    assert isinstance(feedback, UserMessage)
    assert f"calling the {FINAL_ANSWER_TOOL} tool" in feedback.content


def test_retries_exhausted_fail_the_run() -> None:
    bad = answer({"x": "a", "y": "b"})
    obs = observe(Point, [bad, bad, bad])  # the default: 2 retries, 3 tries
    result = obs.result
    assert result.status is RunStatus.FAILED
    assert result.reason is not None
    assert result.reason.startswith("output validation failed: $.x: expected integer")
    assert result.final_output is None
    assert len(obs.requests) == 3
    # Every final_answer call has its (error) result: the conversation stays valid.
    assert [i.status for i in result.conversation if isinstance(i, ToolResult)] == ["error"] * 3


def test_output_retries_zero_and_text_failures() -> None:
    obs = observe(int, ["many"], native=True, output_retries=0)
    assert obs.result.status is RunStatus.FAILED
    assert obs.result.reason == (
        "output validation failed: the answer is not JSON"
        " (Expecting value: line 1 column 1 (char 0))"
    )
    assert obs.result.conversation[-1] == AssistantMessage("many")


def test_conversion_errors_are_validation_errors() -> None:
    @attrs.frozen
    class Positive:
        n: int = attrs.field(validator=attrs.validators.gt(0))

    obs = observe(Positive, [answer({"n": -1}), answer({"n": 1})])
    assert obs.result.final_output == Positive(1)
    error = obs.result.conversation[2]
    assert isinstance(error, ToolResult)
    assert "'n' must be > 0" in error.output


# ------------------------------------------------------------ mixed turns


@ta.function_tool
async def lookup(city: str) -> str:
    """Look up the weather of a city."""
    await trio.sleep(1)
    return f"{city}: 3 degrees"


def test_tools_then_final_answer() -> None:
    script = [
        Turn(tool_calls=[("lookup", {"city": "Oslo"})]),
        answer({"city": "Oslo", "celsius": 3.0}),
    ]
    obs = observe(Weather, script, tools=[lookup])
    assert obs.result.final_output == {"city": "Oslo", "celsius": 3.0}
    assert [s.name for s in obs.requests[0].tools] == ["lookup", FINAL_ANSWER_TOOL]


def test_tool_and_final_answer_in_one_turn() -> None:
    both = Turn(tool_calls=[("lookup", {"city": "Oslo"}), (FINAL_ANSWER_TOOL, {"x": 1, "y": 1})])
    obs = observe(Point, [both], tools=[lookup])
    result = obs.result
    assert result.final_output == Point(1, 1)
    results = {i.call_id: i for i in result.conversation if isinstance(i, ToolResult)}
    assert results["call_1_0"].output == "Oslo: 3 degrees"  # the other call ran
    assert results["call_1_1"].output == "final answer accepted"


def test_two_final_answers_in_one_turn() -> None:
    twice = Turn(
        tool_calls=[(FINAL_ANSWER_TOOL, {"response": 1}), (FINAL_ANSWER_TOOL, {"response": 2})]
    )
    obs = observe(int, [twice])
    assert obs.result.final_output == 1
    second = obs.result.conversation[-1]
    assert isinstance(second, ToolResult)
    assert second.status == "error"
    assert "more than once" in second.output


def test_when_idle_injection_after_a_final_answer_gets_one_more_turn() -> None:
    obs = observe(
        int,
        [Turn(tool_calls=[(FINAL_ANSWER_TOOL, {"response": 1})], delay=1), answer({"response": 2})],
        [tt.Op(0.5, "inject", when="when_idle")],
    )
    assert obs.result.final_output == 2
    assert len(obs.requests) == 2


# ---------------------------------------------------------------- cancellation


def test_cancel_while_the_final_answer_streams() -> None:
    slow = Turn(text="Here it comes", tool_calls=[(FINAL_ANSWER_TOOL, {"x": 1, "y": 2})], delay=1)
    obs = observe(Point, [slow], [tt.Op(1.5, "cancel", reason="stop")])
    result = obs.result
    assert (result.status, result.reason) == (RunStatus.CANCELLED, "stop")
    assert result.final_output is None
    assert not any(isinstance(i, ToolCall) for i in result.conversation)  # partial calls dropped
    assert result.conversation[-1] == AssistantMessage("Here ", status="incomplete")


def test_cancel_while_a_tool_runs_beside_the_final_answer() -> None:
    both = Turn(tool_calls=[("lookup", {"city": "Oslo"}), (FINAL_ANSWER_TOOL, {"x": 1, "y": 1})])
    obs = observe(Point, [both], [tt.Op(0.5, "cancel", reason="enough")], tools=[lookup])
    result = obs.result
    assert result.status is RunStatus.CANCELLED
    results = [i for i in result.conversation if isinstance(i, ToolResult)]
    assert [(r.call_id, r.status) for r in results] == [
        ("call_1_0", "cancelled"),
        ("call_1_1", "cancelled"),
    ]
    assert ta.conversation_problems(result.conversation) == []


def test_after_turn_cancel_keeps_a_valid_final_answer() -> None:
    slow = Turn(tool_calls=[(FINAL_ANSWER_TOOL, {"x": 1, "y": 2})], delay=1)
    obs = observe(Point, [slow], [tt.Op(0.5, "cancel_after_turn", reason="later")])
    assert obs.result.status is RunStatus.COMPLETED
    assert obs.result.final_output == Point(1, 2)


def test_after_turn_cancel_stops_a_retry() -> None:
    slow = Turn(tool_calls=[(FINAL_ANSWER_TOOL, {"x": "bad", "y": 2})], delay=1)
    obs = observe(Point, [slow], [tt.Op(0.5, "cancel_after_turn", reason="later")])
    assert (obs.result.status, obs.result.reason) == (RunStatus.CANCELLED, "later")
    assert obs.result.conversation[-1].status == "error"  # type: ignore[union-attr]


_turns = st.sampled_from(
    [
        answer({"x": 1, "y": 2}),
        answer({"x": "bad"}),
        Turn(tool_calls=[("lookup", {"city": "Rome"}), (FINAL_ANSWER_TOOL, {"x": 1, "y": 2})]),
        Turn(tool_calls=[("lookup", {"city": "Rome"})], delay=0.25),
        Turn(text="thinking about it", delay=0.5),
        '{"x": 4, "y": 4}',
    ]
)


@hypothesis.settings(max_examples=60)
@hypothesis.given(
    script=st.lists(_turns, min_size=1, max_size=4),
    cancel_at=st.none() | st.floats(0, 4),
    kind=st.sampled_from(["cancel", "cancel_after_turn"]),
)
def test_structured_runs_keep_every_invariant(
    script: list[Turn | str], cancel_at: float | None, kind: tt.OpKind
) -> None:
    schedule = [] if cancel_at is None else [tt.Op(cancel_at, kind, reason="x")]
    obs = tt.run_schedule(agent_for(Point, tools=[lookup]), script, schedule, default_turn=None)
    tt.check_run(obs).raise_for_violations()
    if obs.result.status is RunStatus.COMPLETED:
        assert isinstance(obs.result.final_output, Point)


# ------------------------------------------------------------------ the checker


async def _run_with_events(agent: ta.Agent) -> tuple[ta.RunResult, list[ta.RunEvent]]:
    async with ta.open_run(agent, "go") as run:
        events = [event async for event in run.events()]
    assert run.result is not None
    return run.result, events


async def test_checker_validates_final_output() -> None:
    agent = ta.Agent(name="t", model=ScriptedModel(["not a number"]))
    result, events = await _run_with_events(agent)
    assert tt.check_events(result, events).ok
    report = tt.check_events(result, events, output_type=int)
    assert report.invariants == ("output",)
    assert "final_output does not validate" in str(report)
    structured = ta.Agent(
        name="t", model=ScriptedModel([answer({"x": 1, "y": 2})]), output_type=Point
    )
    result, events = await _run_with_events(structured)
    assert tt.check_events(result, events, output_type=Point).ok
    assert tt.check_events(result, events, output_type=Weather).invariants == ("output",)


async def test_checker_accepts_a_none_output_when_the_schema_does() -> None:
    agent = ta.Agent(
        name="t", model=ScriptedModel([answer({"response": None})]), output_type=int | None
    )
    result, events = await _run_with_events(agent)
    assert result.final_output is None
    assert result.status is RunStatus.COMPLETED
    assert tt.check_events(result, events, output_type=int | None).ok


# ----------------------------------------------------------------- the demo model


async def test_demo_model_gives_structured_answers(autojump_clock: trio.abc.Clock) -> None:
    agent = ta.Agent(name="demo", model=ta.models.DemoModel(delay=0), output_type=Point)
    result = await ta.run(agent, "the point at 3 and 4")
    assert result.final_output == Point(3, 4)

    agent = ta.Agent(
        name="demo", model=ta.models.DemoModel(delay=0), output_type=Weather, tools=[lookup]
    )
    result = await ta.run(agent, "weather in Oslo")
    assert result.status is RunStatus.COMPLETED
    assert [i.name for i in result.conversation if isinstance(i, ToolCall)] == [
        "lookup",
        FINAL_ANSWER_TOOL,
    ]
    assert result.final_output == {"city": "Oslo", "celsius": 3}  # from the tool's result


def test_agents_with_raw_schemas_stay_hashable() -> None:
    raw = ta.Agent(name="a", output_type=RAW)
    wrapped = ta.Agent(name="a", output_type=ta.JSONSchema(RAW))
    assert hash(raw) == hash(wrapped)  # output_type is left out of the hash
    assert raw == ta.Agent(name="a", output_type=dict(RAW))
    assert raw != ta.Agent(name="a", output_type=int)
