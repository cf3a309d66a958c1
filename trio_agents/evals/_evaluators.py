"""The evaluators of trio_agents.evals: what only a structured run can check.

Each is a pydantic-evals :class:`~pydantic_evals.evaluators.Evaluator` (a dataclass, so a
dataset file can name it and give its arguments) reading the case's
:class:`~trio_agents.evals.CaseRun` through :func:`~trio_agents.evals.case_run`.
Each returns an assertion (a bool with the reason) named after the evaluator (or its
``evaluation_name``); :class:`ToolTrajectory` also returns its partial credit as a score.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

from pydantic_evals.evaluators import EvaluationReason, Evaluator, EvaluatorContext

from .._events import RunEvent, RunStatus, RunUpdated, ToolFinished, ToolStarted
from .._items import ToolCall, conversation_problems
from .._model import FINAL_ANSWER_TOOL
from .._output import compile_output, output_problems
from .._result import RunResult
from .._validator import json_equal
from ._case import CaseRun, case_run, json_safe, tool_calls_of

__all__ = [
    "CancelsCleanly",
    "ExpectedCall",
    "OutputMatches",
    "OutputValidates",
    "ToolTrajectory",
    "WithinBudget",
]

# ------------------------------------------------------------------ tool trajectory


@dataclass(frozen=True)
class ExpectedCall:
    """One tool call a :class:`ToolTrajectory` expects.

    Args:
        name: the tool's name.
        arguments: the arguments it must be called with (compared as the trajectory's
            ``arguments`` says); None: any arguments.
    """

    name: str
    arguments: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("ExpectedCall.name must be a non-empty str")
        if self.arguments is not None and not isinstance(self.arguments, Mapping):
            raise TypeError(
                f"ExpectedCall.arguments must be a mapping or None,"
                f" not {type(self.arguments).__name__}"
            )

    def __str__(self) -> str:
        if self.arguments is None:
            return self.name
        return f"{self.name}({json.dumps(dict(self.arguments), sort_keys=True)})"


def _as_expected(value: object, index: int) -> ExpectedCall:
    if isinstance(value, ExpectedCall):
        return value
    if isinstance(value, str):
        return ExpectedCall(value)
    if isinstance(value, Mapping):
        unknown = set(value) - {"name", "arguments"}
        if unknown or "name" not in value:
            raise ValueError(
                f"ToolTrajectory.calls[{index}]: a call is {{name: ..., arguments: {{...}}}},"
                f" got the keys {sorted(value)}"
            )
        return ExpectedCall(value["name"], value.get("arguments"))
    raise TypeError(
        f"ToolTrajectory.calls[{index}] must be a tool name, an ExpectedCall or a mapping,"
        f" not {type(value).__name__}"
    )


def _arguments_of(call: ToolCall) -> object:
    try:
        return json.loads(call.arguments)
    except ValueError:
        return None  # not JSON: matches no expected arguments


def _subset(expected: object, actual: object) -> bool:
    """``expected`` is found in ``actual``: every key of an object, recursively; other
    values (arrays included) are compared whole, as JSON."""
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and all(
            key in actual and _subset(value, actual[key]) for key, value in expected.items()
        )
    return json_equal(expected, actual)


@dataclass(repr=False)
class ToolTrajectory(Evaluator[Any, Any, Any]):
    """The tools the run called: which, in what order, with what arguments.

    Partial credit: an expected call the run made with the expected arguments counts 1,
    with other arguments 0.5. The score is the credit over the number of expected calls
    or, unless ``allow_extra``, the number of calls made if that is larger (a call nobody
    expected costs as much as one missing). ``order="strict"`` counts the best matching
    in order (a common subsequence); ``"any"`` pairs calls regardless of order. The
    structured-output ``final_answer`` tool is not a call of the trajectory.

    Returns an assertion (score >= ``min_score``) and the score, as
    ``<name>`` and ``<name>_score``.

    Args:
        calls: the expected calls: tool names, :class:`ExpectedCall` or mappings
            ``{name: ..., arguments: {...}}``.
        order: ``"strict"`` (default) or ``"any"``.
        arguments: ``"subset"`` (default: the expected keys with equal values; more are
            fine), ``"exact"`` (equal as JSON) or ``"ignore"``.
        allow_extra: calls beyond the expected ones cost nothing.
        min_score: the score the assertion needs (default 1.0: the exact trajectory).
        evaluation_name: the name in the report (default ``ToolTrajectory``).
    """

    calls: Sequence[ExpectedCall | str | Mapping[str, Any]] = field(default_factory=list)
    order: Literal["strict", "any"] = "strict"
    arguments: Literal["subset", "exact", "ignore"] = "subset"
    allow_extra: bool = False
    min_score: float = 1.0
    evaluation_name: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.calls, str | bytes) or not isinstance(self.calls, Sequence):
            raise TypeError("ToolTrajectory.calls must be a list of expected calls")
        self.calls = [_as_expected(call, i) for i, call in enumerate(self.calls)]
        if self.order not in ("strict", "any"):
            raise ValueError(f"ToolTrajectory.order must be 'strict' or 'any', not {self.order!r}")
        if self.arguments not in ("subset", "exact", "ignore"):
            raise ValueError(
                "ToolTrajectory.arguments must be 'subset', 'exact' or 'ignore',"
                f" not {self.arguments!r}"
            )
        if not (0.0 <= self.min_score <= 1.0):
            raise ValueError(f"ToolTrajectory.min_score must be in [0, 1], not {self.min_score}")

    def get_default_evaluation_name(self) -> str:
        return self.evaluation_name or "ToolTrajectory"

    def _credit(self, expected: ExpectedCall, call: ToolCall) -> float:
        if expected.name != call.name:
            return 0.0
        if self.arguments == "ignore" or expected.arguments is None:
            return 1.0
        actual = _arguments_of(call)
        if self.arguments == "exact":
            matched = json_equal(dict(expected.arguments), actual)
        else:
            matched = _subset(expected.arguments, actual)
        return 1.0 if matched else 0.5

    def _strict_credit(self, expected: Sequence[ExpectedCall], made: Sequence[ToolCall]) -> float:
        # The heaviest common subsequence: best[i][j] over expected[:i] and made[:j].
        best = [[0.0] * (len(made) + 1) for _ in range(len(expected) + 1)]
        for i, want in enumerate(expected, 1):
            for j, call in enumerate(made, 1):
                credit = self._credit(want, call)
                pair = best[i - 1][j - 1] + credit if credit else 0.0
                best[i][j] = max(best[i - 1][j], best[i][j - 1], pair)
        return best[-1][-1]

    def _any_credit(self, expected: Sequence[ExpectedCall], made: Sequence[ToolCall]) -> float:
        # Full matches first, so a half match never takes a call a full one needs.
        free = list(made)
        total = 0.0
        left: list[ExpectedCall] = []
        for want in expected:
            found = next((c for c in free if self._credit(want, c) == 1.0), None)
            if found is None:
                left.append(want)
            else:
                free.remove(found)
                total += 1.0
        for want in left:
            found = next((c for c in free if self._credit(want, c) > 0), None)
            if found is not None:
                free.remove(found)
                total += self._credit(want, found)
        return total

    def score(self, made: Sequence[ToolCall]) -> float:
        """The partial credit of a run that made ``made`` (0.0 to 1.0)."""
        expected = [c for c in self.calls if isinstance(c, ExpectedCall)]
        denominator = len(expected) if self.allow_extra else max(len(expected), len(made))
        if denominator == 0:
            return 1.0
        if self.order == "strict":
            credit = self._strict_credit(expected, made)
        else:
            credit = self._any_credit(expected, made)
        return credit / denominator

    def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> dict[str, EvaluationReason]:
        run = case_run(ctx)
        made = [] if run.result is None else tool_calls_of(run.result, (FINAL_ANSWER_TOOL,))
        score = self.score(made)
        shown = ", ".join(f"{c.name}({c.arguments})" for c in made) or "no calls"
        wanted = ", ".join(str(c) for c in self.calls) or "no calls"
        reason = f"expected {wanted}; the run made {shown}"
        name = self.get_default_evaluation_name()
        return {
            name: EvaluationReason(score >= self.min_score, reason),
            f"{name}_score": EvaluationReason(score, reason),
        }


# ------------------------------------------------------------------------ outputs


def _not_completed(result: RunResult | None) -> str | None:
    if result is None:
        return "the run never started"
    if result.status != RunStatus.COMPLETED:
        return f"the run ended {result.status}: {result.reason}"
    return None


def _as_text(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(json_safe(value), sort_keys=True)


@dataclass(repr=False)
class OutputMatches(Evaluator[Any, Any, Any]):
    """The run completed and its final output matches what was expected.

    Structured outputs (attrs classes, dataclasses, ``TypedDict`` s) are compared as
    JSON, so a case file's ``expected_output: {city: Paris}`` matches ``City("Paris")``.

    Args:
        expected: the expected output; None (default): the case's ``expected_output``.
        mode: ``"equals"`` (default; equal as JSON), ``"subset"`` (every expected key of
            an object has an equal value in the output; other keys are fine),
            ``"contains"`` (the expected text is in the output's text) or ``"regex"``
            (the expected pattern is found in the output's text).
        case_sensitive: for text comparisons (default True).
        evaluation_name: the name in the report (default ``OutputMatches``).
    """

    expected: Any = None
    mode: Literal["equals", "subset", "contains", "regex"] = "equals"
    case_sensitive: bool = True
    evaluation_name: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("equals", "subset", "contains", "regex"):
            raise ValueError(
                "OutputMatches.mode must be 'equals', 'subset', 'contains' or 'regex',"
                f" not {self.mode!r}"
            )
        if self.mode == "regex" and self.expected is not None:
            re.compile(self.expected)  # a bad pattern fails here, not per case

    def get_default_evaluation_name(self) -> str:
        return self.evaluation_name or "OutputMatches"

    def _matches(self, expected: object, output: object) -> bool:
        if self.mode in ("contains", "regex"):
            text, wanted = _as_text(output), _as_text(expected)
            if self.mode == "regex":
                flags = 0 if self.case_sensitive else re.IGNORECASE
                return re.search(wanted, text, flags) is not None
            if not self.case_sensitive:
                text, wanted = text.casefold(), wanted.casefold()
            return wanted in text
        actual, wanted_json = json_safe(output), json_safe(expected)
        if not self.case_sensitive and isinstance(actual, str) and isinstance(wanted_json, str):
            return actual.casefold() == wanted_json.casefold()
        if self.mode == "subset":
            return _subset(wanted_json, actual)
        return json_equal(wanted_json, actual)

    def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> EvaluationReason:
        expected = self.expected if self.expected is not None else ctx.expected_output
        if expected is None:
            raise ValueError("OutputMatches needs expected= or the case's expected_output")
        run = case_run(ctx)
        problem = _not_completed(run.result)
        if problem is not None:
            return EvaluationReason(False, problem)
        assert run.result is not None
        output = run.result.final_output
        ok = self._matches(expected, output)
        verb = {"equals": "equal", "subset": "hold", "contains": "contain", "regex": "match"}
        shown = _as_text(output)
        if len(shown) > 200:
            shown = shown[:197] + "..."
        reason = (
            f"the output {'does' if ok else 'does not'} {verb[self.mode]} {_as_text(expected)!r}"
        )
        return EvaluationReason(ok, f"{reason}: {shown!r}")


@dataclass(repr=False)
class OutputValidates(Evaluator[Any, Any, Any]):
    """The run completed and its final output validates against a JSON schema, with
    the validator the run checks structured answers with (docs/output.md).

    Args:
        schema: the JSON schema (the keywords docs/output.md lists).
        evaluation_name: the name in the report (default ``OutputValidates``).
    """

    schema: Mapping[str, Any] = field(default_factory=dict)
    evaluation_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.schema, Mapping):
            raise TypeError("OutputValidates.schema must be a JSON schema (a mapping)")

    def get_default_evaluation_name(self) -> str:
        return self.evaluation_name or "OutputValidates"

    def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> EvaluationReason:
        run = case_run(ctx)
        problem = _not_completed(run.result)
        if problem is not None:
            return EvaluationReason(False, problem)
        assert run.result is not None
        compiled = compile_output(dict(self.schema))
        assert compiled is not None
        problems = output_problems(compiled.spec, run.result.final_output)
        if problems:
            return EvaluationReason(False, "; ".join(problems))
        return EvaluationReason(True, "the output validates")


# ------------------------------------------------------------------------- budget


def _check_limit(name: str, value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"WithinBudget.{name} must be an int >= 0 or None, not {value!r}")


@dataclass(repr=False)
class WithinBudget(Evaluator[Any, Any, Any]):
    """The run (with its child runs: ``RunResult.tree_usage``) kept to a budget.

    A limit left None is not checked. A cost limit needs a priced model: a run whose
    cost is unknown (``Usage.cost`` None) fails it, since nothing shows it was kept.

    Args:
        input_tokens, output_tokens, total_tokens: token budgets.
        cost: USD (a number or a decimal string, converted exactly).
        turns: model calls of the run.
        evaluation_name: the name in the report (default ``WithinBudget``).
    """

    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    cost: Decimal | float | str | None = None
    turns: int | None = None
    evaluation_name: str | None = None

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens", "total_tokens", "turns"):
            _check_limit(name, getattr(self, name))
        if self.cost is not None:
            try:
                cost = (
                    Decimal(str(self.cost)) if isinstance(self.cost, float) else Decimal(self.cost)
                )
            except ArithmeticError:
                raise ValueError(f"WithinBudget.cost is not a number: {self.cost!r}") from None
            if not cost.is_finite() or cost < 0:
                raise ValueError(f"WithinBudget.cost must be a finite number >= 0: {self.cost!r}")

    def get_default_evaluation_name(self) -> str:
        return self.evaluation_name or "WithinBudget"

    def _over(self, result: RunResult) -> list[str]:
        over: list[str] = []
        usage = result.tree_usage if result.tree_usage is not None else result.usage
        if self.turns is not None and result.turns > self.turns:
            over.append(f"turns {result.turns} > {self.turns}")
        tokens = {
            "input_tokens": None if usage is None else usage.input_tokens,
            "output_tokens": None if usage is None else usage.output_tokens,
            "total_tokens": None if usage is None else usage.total_tokens,
        }
        for name, used in tokens.items():
            limit = getattr(self, name)
            if limit is None:
                continue
            if used is None:
                over.append(f"{name}: the model reported no usage")
            elif used > limit:
                over.append(f"{name} {used} > {limit}")
        if self.cost is not None:
            limit_cost = Decimal(str(self.cost))
            if usage is None or usage.cost is None:
                over.append("cost: unknown (no price for the model)")
            elif usage.cost > limit_cost:
                over.append(f"cost ${usage.cost} > ${limit_cost}")
        return over

    def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> EvaluationReason:
        run = case_run(ctx)
        if run.result is None:
            return EvaluationReason(False, "the run never started")
        over = self._over(run.result)
        if over:
            return EvaluationReason(False, "over budget: " + "; ".join(over))
        return EvaluationReason(True, "within budget")


# ------------------------------------------------------------------------- cancel


def _terminal_problems(events: Sequence[RunEvent]) -> list[str]:
    problems: list[str] = []
    terminal = [
        i for i, e in enumerate(events) if isinstance(e, RunUpdated) and e.status.is_terminal
    ]
    if len(terminal) != 1:
        problems.append(f"{len(terminal)} terminal updates (one expected)")
    elif terminal[0] != len(events) - 1:
        problems.append("events follow the terminal update")
    seqs = [e.seq for e in events]
    if any(b <= a for a, b in itertools.pairwise(seqs)):
        problems.append("event seqs do not increase")
    started = {e.call_id for e in events if isinstance(e, ToolStarted)}
    finished = {e.call_id for e in events if isinstance(e, ToolFinished)}
    if started - finished:
        problems.append(f"tool calls started and never finished: {sorted(started - finished)}")
    return problems


@dataclass(repr=False)
class CancelsCleanly(Evaluator[Any, Any, Any]):
    """Cancel the run at a given event; it must end ``cancelled`` and clean.

    The eval's runner watches the run's events and calls ``run.cancel(...)`` at the
    ``nth`` event of type ``at`` (of tool ``tool``, for the ``tool.*`` events); ``at``
    may also be a status (``"awaiting_approval"``: the ``run.updated`` entering it).
    The runner follows the events as a subscriber does, so the cancel lands within a
    scheduler tick of the event: a run with nothing to wait on (an offline model
    streaming with no delay) may be a step past it, or even over.
    The check: the run ended ``cancelled`` with that reason, its conversation is valid
    (every call answered, DESIGN §4), exactly one terminal update came last, seqs
    increased, and every tool that started finished.

    Args:
        at: an event type (``"tool.started"``, ``"response.text.delta"``,
            ``"run.item"``, ...) or a status.
        tool: only events of this tool count (``tool.started``, ``tool.progress``,
            ``tool.finished``).
        nth: which matching event (default 1: the first).
        evaluation_name: the name in the report (default ``CancelsCleanly``).
    """

    at: str = "tool.started"
    tool: str | None = None
    nth: int = 1
    evaluation_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.at, str) or not self.at:
            raise ValueError("CancelsCleanly.at must be an event type or a status")
        if isinstance(self.nth, bool) or not isinstance(self.nth, int) or self.nth < 1:
            raise ValueError(f"CancelsCleanly.nth must be an int >= 1, not {self.nth!r}")

    def get_default_evaluation_name(self) -> str:
        return self.evaluation_name or "CancelsCleanly"

    @property
    def reason(self) -> str:
        """The reason the run is cancelled with."""
        where = self.at if self.tool is None else f"{self.at} of {self.tool}"
        return f"eval: cancel at {where} #{self.nth}"

    def matches(self, event: RunEvent) -> bool:
        """Whether ``event`` is one the cancel point counts."""
        if isinstance(event, RunUpdated) and event.status == self.at:
            return True
        if event.type != self.at:
            return False
        return self.tool is None or getattr(event, "name", None) == self.tool

    def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> EvaluationReason:
        return _cancel_verdict(case_run(ctx), self.reason)


def _cancel_verdict(run: CaseRun, reason: str) -> EvaluationReason:
    result = run.result
    if result is None:
        return EvaluationReason(False, "the run never started")
    if run.cancel_reason is None:
        return EvaluationReason(
            False, f"the run never reached the cancel point; it ended {result.status}"
        )
    problems: list[str] = []
    if result.status != RunStatus.CANCELLED or result.reason != reason:
        problems.append(f"it ended {result.status} ({result.reason}), not cancelled ({reason})")
    problems.extend(conversation_problems(result.conversation))
    problems.extend(_terminal_problems(run.events))
    if problems:
        return EvaluationReason(False, "; ".join(problems))
    return EvaluationReason(True, f"cancelled at seq {run.cancelled_at}, conversation valid")
