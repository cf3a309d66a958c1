"""User code that misbehaves, and hostile values from the model, against the run.

Whatever a tool, a validator, an approval predicate or the model returns, the run
carries on: a misbehaving call becomes that call's error result, an invalid final
answer a validation error the model reads (issue 29, items 5 and 6). Every run is
checked by the harness's invariant checker.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pytest
import trio

import trio_agents as ta
import trio_agents.testing as tt
from trio_agents import RunStatus, ToolResult, UserMessage
from trio_agents.models import FINAL_ANSWER_TOOL, Turn


class BrokenStr(Exception):
    """An exception whose message cannot be read."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken too")


def observe(
    script: Sequence[Turn | str], *, tools: Sequence[ta.Tool] = (), **kwargs: Any
) -> tt.Observation:
    run_options = kwargs.pop("run_options", None)

    def factory(model: ta.Model) -> ta.Agent:
        return ta.Agent(name="hostile", model=model, tools=list(tools), **kwargs)

    obs = tt.run_schedule(factory, script, run_options=run_options, default_turn=None)
    tt.check_run(obs).raise_for_violations()
    return obs


def results(obs: tt.Observation) -> list[ToolResult]:
    return [item for item in obs.result.new_items if isinstance(item, ToolResult)]


def answer(arguments: str) -> Turn:
    return Turn(tool_calls=[(FINAL_ANSWER_TOOL, arguments)])


# ----------------------------------------------------------- item 5: user code


@ta.function_tool
async def broken_async() -> str:
    """Fails."""
    raise BrokenStr


@ta.function_tool
def broken_sync() -> str:
    """Fails in a thread."""
    raise BrokenStr


@pytest.mark.parametrize("tool", [broken_async, broken_sync], ids=["async", "sync"])
def test_a_tool_exception_whose_str_raises_is_an_error_result(tool: ta.Tool) -> None:
    obs = observe([Turn(tool_calls=[(tool.name, "{}")]), "done"], tools=[tool])
    assert obs.result.status is RunStatus.COMPLETED
    (result,) = results(obs)
    assert result.status == "error"
    assert result.output == "error: BrokenStr: <str() raised RuntimeError>"


@pytest.mark.parametrize("tool", [broken_async, broken_sync], ids=["async", "sync"])
def test_on_tool_error_fail_with_an_exception_whose_str_raises(tool: ta.Tool) -> None:
    obs = observe(
        [Turn(tool_calls=[(tool.name, "{}")])],
        tools=[tool],
        run_options={"on_tool_error": "fail"},
    )
    assert obs.result.status is RunStatus.FAILED
    assert obs.result.reason is not None
    assert f"tool {tool.name!r} raised BrokenStr: <str() raised RuntimeError>" in (
        obs.result.reason
    )


class BrokenHooks(ta.RunHooks):
    async def on_model_start(self, run: ta.Run, turn: int, request: ta.ModelRequest) -> None:
        raise BrokenStr


def test_a_hook_exception_whose_str_raises_still_names_the_hook() -> None:
    obs = observe(["hello"], run_options={"hooks": BrokenHooks()})
    assert obs.result.status is RunStatus.FAILED
    assert obs.result.reason == (
        "hook error: on_model_start raised BrokenStr: <str() raised RuntimeError>"
    )


@attrs.frozen
class Span:
    start: int = attrs.field()
    end: int = attrs.field()

    @end.validator
    def _after_start(self, _attribute: object, value: int) -> None:
        assert value >= self.start, "end before start"


@ta.function_tool
async def measure(span: Span) -> int:
    """Measure a span."""
    return span.end - span.start


def test_an_assert_in_an_argument_validator_is_invalid_arguments() -> None:
    script: list[Turn | str] = [
        Turn(tool_calls=[("measure", '{"span": {"start": 5, "end": 1}}')]),
        Turn(tool_calls=[("measure", '{"span": {"start": 1, "end": 5}}')]),
        "done",
    ]
    obs = observe(script, tools=[measure])
    assert obs.result.status is RunStatus.COMPLETED
    bad, good = results(obs)
    assert bad.status == "error"
    assert bad.output.startswith(
        "invalid arguments for tool 'measure': $.span: AssertionError: end before start"
    )
    assert good.output == "4"


def _refuses(arguments: Mapping[str, Any]) -> bool:
    raise BrokenStr


@ta.function_tool(needs_approval=_refuses)
async def guarded() -> str:
    """Needs a decision nobody can make."""
    return "ran"


@ta.function_tool
async def sibling() -> str:
    """Runs beside it."""
    await trio.sleep(1)
    return "sibling ran"


def test_a_raising_needs_approval_predicate_fails_only_its_own_call() -> None:
    obs = observe(
        [Turn(tool_calls=[("guarded", "{}"), ("sibling", "{}")]), "done"],
        tools=[guarded, sibling],
    )
    assert obs.result.status is RunStatus.COMPLETED
    first, second = sorted(results(obs), key=lambda r: r.call_id)
    assert first.status == "error"
    assert first.output == "error: needs_approval raised BrokenStr: <str() raised RuntimeError>"
    assert second == ToolResult(second.call_id, "sibling ran")
    # The guarded tool never ran (nobody could say whether it needed approval).
    assert not any(e.name == "guarded" for e in obs.events if isinstance(e, ta.ToolStarted))


def test_a_raising_needs_approval_predicate_alone_in_its_turn() -> None:
    obs = observe([Turn(tool_calls=[("guarded", "{}")]), "done"], tools=[guarded])
    assert obs.result.status is RunStatus.COMPLETED
    (result,) = results(obs)
    assert result.status == "error"


@attrs.frozen
class Budget:
    amount: int = attrs.field()

    @amount.validator
    def _positive(self, _attribute: object, value: int) -> None:
        if value < 0:
            raise KeyError("amount")  # neither TypeError nor ValueError


@dataclasses.dataclass
class Checked:
    n: int

    def __post_init__(self) -> None:
        assert self.n % 2 == 0, "n must be even"


@attrs.frozen
class Loud:
    n: int = attrs.field()

    @n.validator
    def _never(self, _attribute: object, value: int) -> None:
        raise BrokenStr


@pytest.mark.parametrize(
    ("output_type", "bad", "good", "problem"),
    [
        (Budget, '{"amount": -1}', '{"amount": 1}', "$: KeyError: 'amount'"),
        (Checked, '{"n": 1}', '{"n": 2}', "$: AssertionError: n must be even"),
        (Loud | None, '{"response": {"n": 1}}', '{"response": null}', "BrokenStr"),
    ],
    ids=["KeyError", "assert", "broken-str"],
)
def test_an_output_validator_raising_anything_is_a_validation_error(
    output_type: object, bad: str, good: str, problem: str
) -> None:
    obs = observe([answer(bad), answer(good)], output_type=output_type)
    assert obs.result.status is RunStatus.COMPLETED
    rejected = results(obs)[0]
    assert rejected.status == "error"
    assert problem in rejected.output


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [100_000, 990], ids=["undecodable", "decodable"])
def test_a_deeply_nested_final_answer_is_a_validation_error(depth: int) -> None:
    nested = _deep(depth)
    obs = observe(
        [answer(f'{{"response": {nested}}}'), answer('{"response": []}')], output_type=list
    )
    assert obs.result.status is RunStatus.COMPLETED
    assert obs.result.final_output == []
    rejected = results(obs)[0]
    assert rejected.status == "error"
    assert "invalid final answer" in rejected.output


def test_a_deeply_nested_text_answer_is_a_validation_error() -> None:
    obs = observe([_deep(100_000), "[1]"], output_type=list[int])
    assert obs.result.status is RunStatus.COMPLETED
    assert obs.result.final_output == [1]
    feedback = [i for i in obs.result.new_items if isinstance(i, UserMessage)][1]
    assert "nested too deeply" in feedback.content


@ta.function_tool
async def count(items: list[Any]) -> int:
    """Count."""
    return len(items)


@pytest.mark.parametrize("depth", [100_000, 990], ids=["undecodable", "decodable"])
def test_deeply_nested_tool_arguments_are_invalid_arguments(depth: int) -> None:
    script: list[Turn | str] = [
        Turn(tool_calls=[("count", f'{{"items": {_deep(depth)}}}')]),
        "done",
    ]
    obs = observe(script, tools=[count])
    assert obs.result.status is RunStatus.COMPLETED
    (result,) = results(obs)
    assert result.status == "error"
    assert result.output.startswith("invalid arguments for tool 'count'")


# --------------------------------------------------- item 6: numbers JSON lacks


@attrs.frozen
class Reading:
    value: float


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
def test_a_non_finite_number_in_a_final_answer_is_a_validation_error(number: str) -> None:
    obs = observe([answer(f'{{"value": {number}}}'), answer('{"value": 1.5}')], output_type=Reading)
    assert obs.result.final_output == Reading(1.5)
    rejected = results(obs)[0]
    assert rejected.status == "error"
    assert "not JSON" in rejected.output


@pytest.mark.parametrize("number", ["NaN", "Infinity", "1e400"])
def test_a_non_finite_number_in_a_text_answer_is_a_validation_error(number: str) -> None:
    obs = observe([f'{{"value": {number}}}', '{"value": 2.5}'], output_type=Reading)
    assert obs.result.final_output == Reading(2.5)


@pytest.mark.parametrize("number", ["NaN", "1e400"])
def test_a_non_finite_number_in_a_raw_schema_answer(number: str) -> None:
    schema = {"type": "object", "properties": {"v": {}}, "required": ["v"]}
    obs = observe([answer(f'{{"v": {number}}}'), answer('{"v": 1}')], output_type=schema)
    assert obs.result.final_output == {"v": 1}


@ta.function_tool
async def scale(factor: float) -> float:
    """Scale."""
    return factor * 2


def test_a_number_too_large_for_a_float_is_invalid_tool_arguments() -> None:
    obs = observe([Turn(tool_calls=[("scale", '{"factor": 1e400}')]), "done"], tools=[scale])
    (result,) = results(obs)
    assert result.status == "error"
    assert "1e400 is out of range" in result.output


def test_validate_refuses_non_finite_floats() -> None:
    from trio_agents._validator import validate

    assert validate({"type": "number"}, float("nan")) == ["$: expected number, got nan"]
    assert validate({"type": "integer"}, float("inf")) == ["$: expected integer, got inf"]
    assert validate({"type": "number"}, 1.5) == []


# -------------------------------------------------------- past the list: more


def test_a_huge_integer_in_a_final_answer_is_a_validation_error() -> None:
    huge = "9" * 5000  # past Python's int-string conversion limit
    obs = observe([answer(f'{{"response": {huge}}}'), answer('{"response": 1}')], output_type=int)
    assert obs.result.final_output == 1
    assert results(obs)[0].status == "error"


def test_surrogate_escapes_in_a_final_answer_are_cleaned() -> None:
    arguments = json.dumps({"\ud83d": "a\ud83d\ude00b\udce9"})
    assert "\\ud83d" in arguments
    obs = observe([answer(arguments)], output_type=dict[str, str])
    assert obs.result.final_output == {"\ufffd": "a\U0001f600b\ufffd"}


def test_duplicate_keys_in_a_final_answer_keep_the_last() -> None:
    obs = observe([answer('{"value": 1, "value": 2}')], output_type=Reading)
    assert obs.result.final_output == Reading(2.0)


def test_an_integer_too_large_for_a_float_parameter_is_invalid_arguments() -> None:
    huge = "9" * 400  # a valid JSON number, under the int-string limit, over a float's
    obs = observe([Turn(tool_calls=[("scale", f'{{"factor": {huge}}}')]), "done"], tools=[scale])
    assert obs.result.status is RunStatus.COMPLETED
    (result,) = results(obs)
    assert result == ToolResult(
        result.call_id,
        "invalid arguments for tool 'scale': $.factor: the number is too large for a float",
        "error",
    )


def test_an_integer_too_large_for_a_float_answer_is_a_validation_error() -> None:
    huge = "9" * 400
    obs = observe([answer(f'{{"value": {huge}}}'), answer('{"value": 1}')], output_type=Reading)
    assert obs.result.final_output == Reading(1.0)
    assert "$.value: the number is too large for a float" in results(obs)[0].output


def test_an_async_needs_approval_predicate_is_refused_up_front() -> None:
    async def predicate(arguments: Mapping[str, Any]) -> bool:
        return True

    with pytest.raises(TypeError, match="not async"):
        ta.function_tool(needs_approval=predicate)(sibling.fn)  # type: ignore[arg-type]


async def _decide(arguments: Mapping[str, Any]) -> bool:
    return False


def _sneaky_predicate(arguments: Mapping[str, Any]) -> bool:
    return _decide(arguments)  # type: ignore[return-value]  # the bug under test


@ta.function_tool(needs_approval=_sneaky_predicate)
async def sneaky() -> str:
    """Its predicate returns a coroutine."""
    return "ran"


def test_a_needs_approval_predicate_returning_a_coroutine_fails_its_call() -> None:
    obs = observe([Turn(tool_calls=[("sneaky", "{}")]), "done"], tools=[sneaky])
    assert obs.result.status is RunStatus.COMPLETED
    (result,) = results(obs)
    assert result.output == (
        "error: needs_approval raised TypeError: needs_approval returned an awaitable, not a bool"
    )
