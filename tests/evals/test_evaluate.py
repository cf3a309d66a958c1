"""trio_agents.evals in process: a dataset with known scores, the evaluators, a judge
that fails, a cancelled eval, and a comparison, all on offline models under Trio."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import attrs
import pytest
import sniffio
import trio
from pydantic_evals import Case, Dataset
from pydantic_evals.evaluators import Evaluator, EvaluatorContext

import trio_agents as ta
from tests.support.evals_app import route
from tests.support.evals_support import RoutedModel, first_user_text
from trio_agents.evals import (
    AgentInputs,
    CancelsCleanly,
    Evaluation,
    ExpectedCall,
    LLMJudge,
    OutputMatches,
    OutputValidates,
    ToolTrajectory,
    WithinBudget,
    case_run,
    compare,
    evaluate,
    load_report,
)
from trio_agents.models import ModelRequest, Turn

# ------------------------------------------------------------------ the agents


cancelled_tools: list[str] = []


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@ta.function_tool
async def slow() -> str:
    """Take an hour (and say when cancelled)."""
    try:
        await trio.sleep(3600)
    except trio.Cancelled:
        cancelled_tools.append("slow")
        raise
    return "done"


def calc(model: ta.Model) -> ta.Agent:
    return ta.Agent(name="calc", instructions="Add with the tool.", model=model, tools=[add, slow])


# --------------------------------------------------------- 50 cases, known scores


def fifty_cases() -> Dataset[Any, Any, Any]:
    """Five kinds, ten of each: the right sum with the right call (passes); a sum with
    an expected call whose arguments differ (trajectory 0.5, fails); an echo (passes);
    an echo expected wrong (fails); a slow tool cancelled at its start (passes)."""
    cases: list[Case[Any, Any, Any]] = []
    for i in range(50):
        kind, n = i % 5, i // 5
        if kind == 0:
            case = Case(
                name=f"add-{n}",
                inputs=f"add {n} 2",
                expected_output=f"It is {n + 2}.",
                evaluators=[ToolTrajectory([ExpectedCall("add", {"a": n, "b": 2})])],
            )
        elif kind == 1:
            case = Case(
                name=f"add-wrong-args-{n}",
                inputs=f"add {n} 2",
                expected_output=f"It is {n + 2}.",
                evaluators=[ToolTrajectory([{"name": "add", "arguments": {"a": n + 1}}])],
            )
        elif kind == 2:
            case = Case(name=f"echo-{n}", inputs=f"word{n}", expected_output=f"echo word{n}")
        elif kind == 3:
            case = Case(name=f"echo-wrong-{n}", inputs=f"word{n}", expected_output="nope")
        else:
            case = Case(
                name=f"cancel-{n}", inputs="slow", evaluators=[CancelsCleanly("tool.started")]
            )
        cases.append(case)
    return Dataset(name="fifty", cases=cases, evaluators=[WithinBudget(turns=5)])


class OutputWhenExpected(OutputMatches):
    """OutputMatches on the cases that have an expected output."""

    def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> Any:
        if ctx.expected_output is None:
            return {}
        return super().evaluate(ctx)


async def test_fifty_cases_score_exactly_as_known(autojump_clock: trio.abc.Clock) -> None:
    dataset = fifty_cases()
    dataset.evaluators.append(OutputWhenExpected())
    model = RoutedModel(route)
    agent = calc(model)
    outcomes: list[str] = []
    result = await evaluate(
        dataset,
        agent,
        max_concurrency=4,
        on_case=lambda outcome: outcomes.append(f"{outcome.done}:{outcome.verdict}"),
    )
    assert result.complete
    assert result.summary()["cases"] == 50
    assert (result.count("passed"), result.count("failed"), result.count("error")) == (30, 20, 0)
    assert result.score == 0.6
    verdicts = result.verdicts
    assert {n for n, v in verdicts.items() if v == "passed"} == {
        *(f"add-{n}" for n in range(10)),
        *(f"echo-{n}" for n in range(10)),
        *(f"cancel-{n}" for n in range(10)),
    }
    averages = result.report.averages()
    assert averages is not None
    # assertions: 50 WithinBudget, 40 OutputMatches, 20 ToolTrajectory, 10 CancelsCleanly
    # passing: 50 + 20 (add) + 10 (echo) + 10 (trajectory) + 10 (cancel) = 100 of 120
    assert averages.assertions == 100 / 120
    assert averages.scores == {"ToolTrajectory_score": (10 * 1.0 + 10 * 0.5) / 20}
    assert averages.metrics["turns"] == (20 * 2 + 30 * 1) / 50
    # progress: one call per case, counting up
    assert [o.split(":")[0] for o in outcomes] == [str(n) for n in range(1, 51)]
    # every case's run is kept whole: the conversation and every event, terminal last
    assert set(result.runs) == set(verdicts)
    for name, run in result.runs.items():
        assert run.result is not None, name
        assert run.events[-1].type == "run.updated"
        assert run.events[-1].seq == max(e.seq for e in run.events)
    cancelled = result.runs["cancel-3"]
    assert cancelled.result is not None
    assert cancelled.result.status == "cancelled"
    assert cancelled.cancel_reason == "eval: cancel at tool.started #1"
    assert isinstance(cancelled.result.conversation[-1], ta.ToolResult)
    assert cancelled.result.conversation[-1].status == "cancelled"
    assert len(model.requests) == 20 * 2 + 30
    # the whole result is JSON: the expected calls, each run with all its events
    data = json.loads(json.dumps(result.to_json()))
    assert data["summary"]["score"] == 0.6
    assert data["runs"]["cancel-3"]["cancel_reason"] == "eval: cancel at tool.started #1"
    (trajectory,) = next(c for c in data["report"]["cases"] if c["name"] == "add-wrong-args-1")[
        "scores"
    ].values()
    assert trajectory["value"] == 0.5


async def test_cases_run_at_most_max_concurrency_at_once(autojump_clock: trio.abc.Clock) -> None:
    # Each stream takes 1 s of virtual time, so the cases overlap as much as allowed;
    # the runs' hooks count how many are running at once.
    running = 0
    peak = 0

    def counting_route(request: ModelRequest) -> Turn:
        return Turn(f"echo {first_user_text(request)}", delay=1.0)

    agent = calc(RoutedModel(counting_route))
    dataset = Dataset(name="many", cases=[Case(name=f"c{i}", inputs=f"w{i}") for i in range(12)])

    class Hooks(ta.RunHooks):
        async def on_run_start(self, run: Any) -> None:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)

        async def on_run_end(self, run: Any, result: Any) -> None:
            nonlocal running
            running -= 1

    evaluation = Evaluation(dataset, agent, max_concurrency=3, run_options={"hooks": Hooks()})
    result = await evaluation.run()
    assert result.count("passed") == 12
    assert peak == 3


# ------------------------------------------------------------------ under Trio


async def test_the_eval_loop_runs_under_trio_and_never_builds_an_asyncio_loop(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.abc.Clock
) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("evaluate_sync builds an asyncio loop")

    monkeypatch.setattr(Dataset, "evaluate_sync", refuse)
    seen: list[str] = []

    class Library(Evaluator[Any, Any, Any]):
        async def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> bool:
            seen.append(sniffio.current_async_library())
            await trio.sleep(1)  # a Trio checkpoint inside pydantic-evals' task group
            return True

    dataset = Dataset(name="trio", cases=[Case(name="a", inputs="hi")], evaluators=[Library()])
    result = await evaluate(dataset, calc(RoutedModel(route)))
    assert result.verdicts == {"a": "passed"}
    assert seen == ["trio"]


# ------------------------------------------------------------------ evaluators


def made(*calls: tuple[str, dict[str, Any]]) -> list[ta.ToolCall]:
    return [ta.ToolCall(f"c{i}", name, json.dumps(args)) for i, (name, args) in enumerate(calls)]


def test_tool_trajectory_partial_credit() -> None:
    want = ToolTrajectory(["search", {"name": "add", "arguments": {"a": 1}}])
    assert want.score(made(("search", {}), ("add", {"a": 1, "b": 2}))) == 1.0
    # the right tool with other arguments: half credit
    assert want.score(made(("search", {}), ("add", {"a": 2}))) == 0.75
    # out of order: strict keeps the best in-order match, "any" pairs them all
    swapped = made(("add", {"a": 1}), ("search", {}))
    assert want.score(swapped) == 0.5
    assert ToolTrajectory(want.calls, order="any").score(swapped) == 1.0
    # an extra call costs as much as a missing one, unless allowed
    extra = made(("search", {}), ("add", {"a": 1}), ("search", {}))
    assert want.score(extra) == 2 / 3
    assert ToolTrajectory(want.calls, allow_extra=True).score(extra) == 1.0
    assert (
        ToolTrajectory(want.calls, arguments="exact").score(
            made(("search", {}), ("add", {"a": 1, "b": 2}))
        )
        == 0.75
    )
    assert ToolTrajectory([]).score([]) == 1.0
    assert want.score([]) == 0.0
    with pytest.raises(ValueError, match="order"):
        ToolTrajectory(["a"], order="sideways")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="list of expected calls"):
        ToolTrajectory("search")


@attrs.frozen
class City:
    name: str
    population: int


async def test_structured_output_budget_and_multi_turn(autojump_clock: trio.abc.Clock) -> None:
    def city_route(request: ModelRequest) -> Turn | str:
        if first_user_text(request) == "city":
            return Turn(
                tool_calls=[("final_answer", {"name": "Paris", "population": 2100000})],
                usage=ta.Usage(100, 20, cost=Decimal("0.002")),
            )
        return route(request)

    city = ta.Agent(name="city", instructions="", model=RoutedModel(city_route), output_type=City)
    chat = calc(RoutedModel(route))
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["name", "population"],
    }
    dataset = Dataset(
        name="mixed",
        cases=[
            Case(
                name="city",
                inputs=AgentInputs("city", agent="city"),
                expected_output={"name": "Paris"},
                evaluators=[
                    OutputMatches(mode="subset"),
                    OutputValidates(schema),
                    WithinBudget(total_tokens=120, cost="0.01", evaluation_name="cheap"),
                    WithinBudget(cost=Decimal("0.001"), evaluation_name="cheaper"),
                    WithinBudget(output_tokens=19, evaluation_name="short"),
                ],
            ),
            Case(
                name="chat",
                inputs={"input": "hi", "agent": "chat", "follow_ups": ["again", "more"]},
                evaluators=[
                    OutputMatches("echo hi"),
                    OutputMatches(
                        "ECHO", mode="contains", case_sensitive=False, evaluation_name="c"
                    ),
                    OutputMatches(r"^echo \w+$", mode="regex", evaluation_name="r"),
                    WithinBudget(cost="1", evaluation_name="unpriced"),
                ],
            ),
            Case(name="nobody", inputs=AgentInputs("hi", agent="nobody")),
        ],
    )
    result = await evaluate(dataset, {"city": city, "chat": chat})
    cases = {c.name: c for c in result.report.cases}
    got = {k: v.value for k, v in cases["city"].assertions.items()}
    assert got == {
        "OutputMatches": True,
        "OutputValidates": True,
        "cheap": True,
        "cheaper": False,
        "short": False,
    }
    assert cases["city"].assertions["cheaper"].reason == "over budget: cost $0.002 > $0.001"
    got = {k: v.value for k, v in cases["chat"].assertions.items()}
    assert got == {"OutputMatches": True, "c": True, "r": True, "unpriced": False}
    assert "cost: unknown" in (cases["chat"].assertions["unpriced"].reason or "")
    # the scripted user: one more turn per follow-up, each after the answer before it
    chat_run = result.runs["chat"].result
    assert chat_run is not None
    assert chat_run.turns == 3
    assert [type(i).__name__ for i in chat_run.conversation] == [
        "UserMessage",
        "AssistantMessage",
        "UserMessage",
        "AssistantMessage",
        "UserMessage",
        "AssistantMessage",
    ]
    assert [i.content for i in chat_run.conversation if isinstance(i, ta.UserMessage)] == [
        "hi",
        "again",
        "more",
    ]
    # a case naming no known agent is an error, with the reason
    (failure,) = result.report.failures
    assert failure.name == "nobody"
    assert "no agent named 'nobody'" in failure.error_message
    assert result.verdicts["nobody"] == "error"


async def test_an_evaluator_outside_the_runner_says_what_it_needs() -> None:
    ctx: Any = type("Ctx", (), {"attributes": {}})()
    with pytest.raises(LookupError, match=r"trio_agents\.evals\.evaluate"):
        case_run(ctx)


# ------------------------------------------------------------------ the judge


def judge_route(request: ModelRequest) -> Turn:
    question = first_user_text(request)
    if "<question>\nword-bad\n" in question:
        return Turn(fail="judge down")
    if "<question>\nword-slow\n" in question:
        return Turn("thinking", delay=3600)
    passed = "echo word-" in question
    verdict = {"passed": passed, "score": 0.9 if passed else 0.1, "reason": "looks right"}
    return Turn(tool_calls=[("final_answer", verdict)])


async def test_a_judge_that_fails_or_times_out_makes_that_case_an_error(
    autojump_clock: trio.abc.Clock,
) -> None:
    judge = LLMJudge(
        "The answer echoes the question.", model=RoutedModel(judge_route), score=True, timeout=10
    )
    names = ["word-1", "word-bad", "word-2", "word-slow", "word-3"]
    dataset = Dataset(
        name="judged",
        cases=[Case(name=n, inputs=n) for n in names],
        evaluators=[judge],
    )
    result = await evaluate(dataset, calc(RoutedModel(route)))
    assert result.verdicts == {
        "word-1": "passed",
        "word-bad": "error",
        "word-2": "passed",
        "word-slow": "error",
        "word-3": "passed",
    }
    cases = {c.name: c for c in result.report.cases}
    assert cases["word-1"].scores["LLMJudge_score"].value == 0.9
    assert cases["word-1"].assertions["LLMJudge"].reason == "looks right"
    (bad,) = cases["word-bad"].evaluator_failures
    assert bad.error_message.startswith("RunFailedError:")
    assert "judge down" in bad.error_message
    (slow_failure,) = cases["word-slow"].evaluator_failures
    assert slow_failure.error_message == "TimeoutError: the judge took longer than 10 s"
    assert result.summary()["errors"] == 2
    # the report names the judge's model by its class (a model object has no file form)
    data = json.loads(json.dumps(result.to_json()))
    source = data["report"]["cases"][0]["assertions"]["LLMJudge"]["source"]
    assert source["arguments"]["model"] == "RoutedModel"


def test_a_judge_needs_a_rubric_and_a_model() -> None:
    with pytest.raises(ValueError, match="rubric"):
        LLMJudge("", model="openai:gpt-4o-mini")
    with pytest.raises(ValueError, match="model"):
        LLMJudge("be right")


# ------------------------------------------------------------- cancel the eval


async def test_cancelling_the_eval_stops_every_run_and_leaves_a_partial_report(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    cancelled_tools.clear()
    cases = [Case(name=f"fast-{i}", inputs=f"w{i}", expected_output=f"echo w{i}") for i in range(4)]
    cases += [Case(name=f"slow-{i}", inputs="slow") for i in range(12)]
    dataset = Dataset(name="half", cases=cases, evaluators=[OutputWhenExpected()])
    evaluation = Evaluation(dataset, calc(RoutedModel(route)), max_concurrency=8)
    with trio.move_on_after(60) as scope:
        await evaluation.run()
    assert scope.cancelled_caught
    result = evaluation.result()
    assert not result.complete
    # Which cases got a slot first is the scheduler's choice; the 8 slots end up held by
    # slow cases (a fast one passes and frees its slot), the rest never start.
    verdicts = result.verdicts
    fast = {n for n in verdicts if n.startswith("fast-")}
    interrupted = {n for n, v in verdicts.items() if v == "error"}
    assert all(verdicts[n] == "passed" for n in fast)
    assert len(interrupted) == 8
    assert all(n.startswith("slow-") for n in interrupted)
    assert set(result.not_run) == {c.name for c in cases} - fast - interrupted
    # every run that started was stopped: its tool cancelled, the run ended cancelled
    assert cancelled_tools == ["slow"] * 8
    for name in interrupted:
        run = result.runs[name]
        assert run.result is not None
        assert (run.result.status, run.result.reason) == ("cancelled", "parent cancelled")
        assert run.events[-1].type == "run.updated"
        assert ta.conversation_problems(run.result.conversation) == []
    (failure, *_) = result.report.failures
    assert failure.error_message == (
        "interrupted: the eval was cancelled before this case finished"
    )
    assert result.summary_line() == (
        f"{len(fast)}/16 passed ({len(fast) / 16:.1%}), 0 failed, 8 errors,"
        f" {8 - len(fast)} not run (incomplete: the eval was cancelled)"
    )
    # the partial report is written like a whole one, and reads back
    path = tmp_path / "partial.json"
    result.write_json(path)
    data = json.loads(path.read_text())
    assert data["complete"] is False
    assert data["summary"]["not_run"] == 8 - len(fast)
    some = sorted(interrupted)[0]
    assert data["runs"][some]["status"] == "cancelled"
    assert data["runs"][some]["events"][-1]["status"] == "cancelled"
    assert len(load_report(path).failures) == 8


# ------------------------------------------------------------------ compare


async def test_compare_finds_the_regression(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    dataset = Dataset(
        name="calc",
        cases=[
            Case(name="add", inputs="add 2 3", expected_output="It is 5."),
            Case(name="echo", inputs="hello", expected_output="echo hello"),
            Case(name="wrong", inputs="add 1 5", expected_output="It is 6."),
        ],
        evaluators=[OutputMatches()],
    )
    good = await evaluate(dataset, calc(RoutedModel(route)))
    good.write_json(tmp_path / "good.json")
    broken = await evaluate(dataset, calc(RoutedModel(lambda r: route(r, broken=True))))
    comparison = compare(broken, load_report(tmp_path / "good.json"))
    assert [str(c) for c in comparison.regressions] == [
        "add: passed -> failed (OutputMatches: True -> False)"
    ]
    assert comparison.improvements == ()
    assert (comparison.score_before, comparison.score_after) == (1.0, 2 / 3)
    assert comparison.lines()[:2] == [
        "score: 100.0% -> 66.7%",
        "regression: add: passed -> failed (OutputMatches: True -> False)",
    ]
    back = compare(good, broken.report)
    assert [str(c) for c in back.improvements] == [
        "add: failed -> passed (OutputMatches: False -> True)"
    ]


def test_an_evaluation_refuses_what_it_cannot_run() -> None:
    agent = calc(RoutedModel(route))
    with pytest.raises(ValueError, match="no cases"):
        Evaluation(Dataset(name="empty", cases=[]), agent)
    one = Dataset(name="one", cases=[Case(inputs="x")])
    with pytest.raises(ValueError, match="max_concurrency"):
        Evaluation(one, agent, max_concurrency=0)
    with pytest.raises(TypeError, match="Agent"):
        Evaluation(one, {"a": "not an agent"})  # type: ignore[dict-item]


# ------------------------------------------------------------------ limits


async def test_each_case_runs_under_the_limits_its_own_replacing_the_evals(
    autojump_clock: trio.abc.Clock,
) -> None:
    def slow_route(request: ModelRequest) -> Turn:
        # ten chunks, ten seconds each: a hundred seconds of virtual time per answer
        return Turn([f"w{i} " for i in range(10)], delay=10)

    dataset = Dataset(
        name="limits",
        cases=[
            Case(name="eval deadline", inputs="hi"),
            Case(name="own deadline", inputs=AgentInputs("hi", limits={"deadline": 500})),
            Case(name="own tokens", inputs={"input": "hi", "limits": {"output_tokens": 1}}),
        ],
    )
    result = await evaluate(
        dataset, calc(RoutedModel(slow_route)), limits=ta.UsageLimits(deadline=30)
    )
    ends = {}
    for name, run in result.runs.items():
        assert run.result is not None
        ends[name] = (run.result.status, run.result.reason)
    assert ends["eval deadline"] == ("failed", "timeout")
    assert ends["own deadline"] == ("completed", None)
    assert ends["own tokens"][0] == "failed"
    assert (ends["own tokens"][1] or "").startswith("usage limit: output_tokens")


def test_agent_inputs_refuse_what_they_cannot_run() -> None:
    with pytest.raises(TypeError, match="unknown limits"):
        AgentInputs("hi", limits={"dedline": 3})
    with pytest.raises(ValueError, match="empty"):
        AgentInputs("")
    with pytest.raises(TypeError, match="not a str"):
        AgentInputs("hi", follow_ups="again")  # type: ignore[arg-type]


# ------------------------------------------------------------------ cancel points


@ta.function_tool(needs_approval=True)
async def delete(path: str) -> str:
    """Delete a file (asks first)."""
    return f"deleted {path}"


async def test_cancel_points_by_event_by_status_and_one_never_reached(
    autojump_clock: trio.abc.Clock,
) -> None:
    def approval_route(request: ModelRequest) -> Turn | str:
        if first_user_text(request) == "delete":
            return Turn(tool_calls=[("delete", {"path": "/tmp/x"})])
        # a second between chunks: the cancel lands as soon as the runner sees the
        # event, which is before the next chunk
        return Turn("echo hello there", delay=1)

    agent = ta.Agent(
        name="files", instructions="", model=RoutedModel(approval_route), tools=[delete, slow]
    )
    dataset = Dataset(
        name="cancels",
        cases=[
            Case(name="waiting", inputs="delete", evaluators=[CancelsCleanly("awaiting_approval")]),
            Case(
                name="mid-text",
                inputs="hello",
                evaluators=[CancelsCleanly("response.text.delta", nth=2)],
            ),
            Case(
                name="never",
                inputs="hello",
                evaluators=[CancelsCleanly("tool.started", tool="slow")],
            ),
        ],
    )
    result = await evaluate(dataset, agent)
    cases = {c.name: c.assertions["CancelsCleanly"] for c in result.report.cases}
    assert {n: a.value for n, a in cases.items()} == {
        "waiting": True,
        "mid-text": True,
        "never": False,
    }
    assert cases["never"].reason == "the run never reached the cancel point; it ended completed"
    waiting = result.runs["waiting"].result
    assert waiting is not None
    assert waiting.conversation[-1] == ta.ToolResult(
        "call_1_0", "cancelled: eval: cancel at awaiting_approval #1", status="cancelled"
    )
    mid = result.runs["mid-text"].result
    assert mid is not None
    assert mid.conversation[-1] == ta.AssistantMessage("echo hello ", status="incomplete")
