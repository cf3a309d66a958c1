"""Run a dataset's cases against agents, under Trio, on pydantic-evals' own loop.

:meth:`Evaluation.run` hands pydantic-evals' ``Dataset.evaluate`` (AnyIO, so it runs
under Trio; never its ``evaluate_sync``, which builds an asyncio loop) a task that runs
the case's agent with :func:`~trio_agents.open_run`, watches every event (to cancel at a
:class:`~trio_agents.evals.CancelsCleanly` point, and to play a scripted user's
follow-ups) and keeps them all in a :class:`~trio_agents.evals.CaseRun`.

pydantic-evals hands a task only the case's ``inputs``; the task needs the case itself
(its name, its evaluators' cancel point). Its per-case lifecycle object sees the case
and is set up in the very task that then runs ours, so it passes itself on in a context
variable (pydantic-evals passes its own per-case state, ``set_eval_attribute``, the same
way).

Cancelling the eval (the caller's cancel scope, Ctrl-C in the command) cancels every
case's run (``"parent cancelled"``, repaired as always); :meth:`Evaluation.result` then
gives the partial report: the cases that finished, the ones cut short as errors, with
their runs, and the names of those never started.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias, final

import attrs
import trio
from pydantic_evals import Case, Dataset
from pydantic_evals.dataset import increment_eval_metric, set_eval_attribute
from pydantic_evals.lifecycle import CaseLifecycle
from pydantic_evals.reporting import (
    EvaluationReport,
    EvaluationReportAdapter,
    ReportCase,
    ReportCaseFailure,
)

from .._agent import Agent
from .._entry import open_run
from .._events import InboxDelivered, RunEvent
from .._limits import UsageLimits
from .._run import Run
from ._case import CASE_RUN_ATTRIBUTE, AgentInputs, CaseRun, as_inputs, json_safe
from ._evaluators import CancelsCleanly

__all__ = [
    "FORMAT",
    "CaseOutcome",
    "EvalResult",
    "Evaluation",
    "Verdict",
    "evaluate",
    "load_report",
    "verdict_of",
]

FORMAT: Final = "trio-agents-eval/1"
"""The ``format`` of the JSON an :class:`EvalResult` writes."""

Verdict: TypeAlias = Literal["passed", "failed", "error"]
"""A case's verdict: ``passed`` (every assertion true), ``failed`` (one is false) or
``error`` (the case or one of its evaluators raised, or it was cut short)."""

AnyReportCase: TypeAlias = ReportCase[Any, Any, Any] | ReportCaseFailure[Any, Any, Any]

# Bounds the replay of a finished run's log after a cancel: the log is in memory and
# complete, so this never binds unless something is badly wrong.
_CATCH_UP_BOUND: Final = 5.0

_INTERRUPTED: Final = "interrupted: the eval was cancelled before this case finished"


def verdict_of(case: AnyReportCase) -> Verdict:
    """The verdict of one case of a pydantic-evals report (a case without assertions
    passes)."""
    if isinstance(case, ReportCaseFailure) or case.evaluator_failures:
        return "error"
    return "passed" if all(a.value for a in case.assertions.values()) else "failed"


@attrs.frozen
class CaseOutcome:
    """A case finished (what :class:`Evaluation`'s ``on_case`` hears, for progress).

    Attributes:
        name: the case's name.
        verdict: ``passed``, ``failed`` or ``error``.
        status: its run's terminal status (None: no run).
        done: cases finished so far, this one included.
        total: cases in the dataset.
    """

    name: str
    verdict: Verdict
    status: str | None
    done: int
    total: int


@attrs.frozen
class EvalResult:
    """What an eval found: pydantic-evals' report, every case's run, and the score.

    Attributes:
        name: the eval's name.
        report: the pydantic-evals ``EvaluationReport`` (``report.render()``,
            ``report.averages()``); a run's ``final_output`` is each case's ``output``.
        runs: every case's :class:`CaseRun` by case name (result and every event).
        complete: False when the eval was cancelled before every case finished.
        total: the number of cases in the dataset.
        not_run: the cases never started (a cancelled eval).
    """

    name: str
    report: EvaluationReport[Any, Any, Any]
    runs: Mapping[str, CaseRun]
    complete: bool
    total: int
    not_run: tuple[str, ...] = ()

    @property
    def verdicts(self) -> dict[str, Verdict]:
        """Each case's verdict by name (cases never started are not in it)."""
        found: dict[str, Verdict] = {c.name: verdict_of(c) for c in self.report.cases}
        found.update((f.name, verdict_of(f)) for f in self.report.failures)
        return found

    def count(self, verdict: Verdict) -> int:
        """How many cases have ``verdict``."""
        return sum(1 for v in self.verdicts.values() if v == verdict)

    @property
    def score(self) -> float:
        """The share of the dataset's cases that passed (a case not run did not)."""
        return self.count("passed") / self.total if self.total else 1.0

    def summary(self) -> dict[str, Any]:
        """The figures: cases, passed, failed, errors, not run, the score, and the
        average of each score and metric over the cases that ran."""
        averages = self.report.averages()
        return {
            "cases": self.total,
            "passed": self.count("passed"),
            "failed": self.count("failed"),
            "errors": self.count("error"),
            "not_run": len(self.not_run),
            "score": self.score,
            "assertions": None if averages is None else averages.assertions,
            "scores": {} if averages is None else dict(averages.scores),
            "metrics": {} if averages is None else dict(averages.metrics),
        }

    def summary_line(self) -> str:
        """One line: ``42/50 passed (84.0%), 6 failed, 2 errors``."""
        s = self.summary()
        line = (
            f"{s['passed']}/{s['cases']} passed ({s['score']:.1%}),"
            f" {s['failed']} failed, {s['errors']} errors"
        )
        if s["not_run"]:
            line += f", {s['not_run']} not run"
        return line if self.complete else line + " (incomplete: the eval was cancelled)"

    def to_json(self) -> dict[str, Any]:
        """The whole result as JSON: summary, verdicts, the report (as pydantic-evals
        writes it) and every case's run with all its events."""
        return {
            "format": FORMAT,
            "name": self.name,
            "complete": self.complete,
            "summary": self.summary(),
            "verdicts": self.verdicts,
            "not_run": list(self.not_run),
            "report": EvaluationReportAdapter.dump_python(
                self.report, mode="json", fallback=json_safe
            ),
            "runs": {name: run.to_json() for name, run in self.runs.items()},
        }

    def write_json(self, path: str | Path) -> None:
        """Write :meth:`to_json` to ``path`` (UTF-8, indented)."""
        text = json.dumps(self.to_json(), indent=1, ensure_ascii=False, default=repr)
        Path(path).write_text(text + "\n", encoding="utf-8")


def load_report(path: str | Path) -> EvaluationReport[Any, Any, Any]:
    """The pydantic-evals report in a file :meth:`EvalResult.write_json` wrote (the
    baseline of :func:`~trio_agents.evals.compare`).

    Raises:
        ValueError: the file is not such a JSON file.
        OSError: it cannot be read.
    """
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or "report" not in data:
        raise ValueError(f"{path} is not an eval result written by trio-agents eval --json")
    return EvaluationReportAdapter.validate_python(data["report"])


# -------------------------------------------------------------------- one case


@attrs.frozen
class _Plan:
    """What the runner does for one case."""

    agent: Agent
    inputs: AgentInputs
    cancel: CancelsCleanly | None


@attrs.define
class _CancelMark:
    reason: str | None = None
    seq: int | None = None


async def _drive(run: Run, plan: _Plan, events: list[RunEvent], mark: _CancelMark) -> None:
    """Follow the run's events to its end: keep them, cancel at the cancel point, and
    inject each follow-up once the previous one was delivered."""
    pending = list(plan.inputs.follow_ups)
    waiting: str | None = None
    if pending:
        waiting = run.inject([{"role": "user", "content": pending.pop(0)}], when="when_idle")
    seen = 0
    async for event in run.events():
        events.append(event)
        cancel = plan.cancel
        if cancel is not None and mark.reason is None and cancel.matches(event):
            seen += 1
            if seen == cancel.nth:
                mark.reason, mark.seq = cancel.reason, event.seq
                run.cancel(cancel.reason)
        delivered = isinstance(event, InboxDelivered) and event.injection_id == waiting
        if delivered and pending and mark.reason is None:
            # when_idle: it waits for the answer to the message just delivered
            waiting = run.inject([{"role": "user", "content": pending.pop(0)}], when="when_idle")


async def _catch_up(run: Run, events: list[RunEvent]) -> None:
    after = events[-1].seq + 1 if events else None
    async for event in run.events(from_seq=after):
        events.append(event)


async def _play(
    name: str, plan: _Plan, options: Mapping[str, Any], keep: Callable[[CaseRun], None]
) -> CaseRun:
    """Run the case's agent; hand its :class:`CaseRun` to ``keep`` even when the run is
    cut short (an exception, the eval cancelled), then return it."""
    events: list[RunEvent] = []
    mark = _CancelMark()
    handle: Run | None = None
    kept: CaseRun | None = None
    try:
        async with open_run(plan.agent, plan.inputs.input, **options) as handle:
            await _drive(handle, plan, events, mark)
    finally:
        if handle is not None:
            # Cancelled or not, the run has ended (open_run waited for its repair): the
            # rest of its log is in memory, so the events are kept whole even then.
            with trio.CancelScope(shield=True), trio.move_on_after(_CATCH_UP_BOUND):
                await _catch_up(handle, events)
            kept = CaseRun(name, handle.result, tuple(events), mark.reason, mark.seq)
            keep(kept)
    assert kept is not None  # open_run yielded, or it raised and we never got here
    return kept


def _record_metrics(run: CaseRun) -> None:
    result = run.result
    if result is None:
        return
    increment_eval_metric("turns", result.turns)
    tools = sum(1 for e in run.events if e.type == "tool.started")
    increment_eval_metric("tool_calls", tools)
    usage = result.tree_usage if result.tree_usage is not None else result.usage
    if usage is not None:
        increment_eval_metric("input_tokens", usage.input_tokens)
        increment_eval_metric("output_tokens", usage.output_tokens)
        if usage.cost is not None:
            increment_eval_metric("cost", float(usage.cost))


# ------------------------------------------------------------------ evaluation


_CURRENT: ContextVar[_CaseLife] = ContextVar("trio_agents.evals.case")


class _CaseLife(CaseLifecycle[Any, Any, Any]):
    """pydantic-evals makes one per case: it carries the case to the task and tells the
    evaluation when the case is done."""

    def __init__(self, case: Case[Any, Any, Any], done: Callable[[_CaseLife, Any], None]):
        super().__init__(case)
        self.done = done
        self.run: CaseRun | None = None

    async def setup(self) -> None:
        _CURRENT.set(self)

    async def teardown(self, result: AnyReportCase | None) -> None:
        self.done(self, result)


def _case_names(dataset: Dataset[Any, Any, Any]) -> dict[int, str]:
    # pydantic-evals' own naming (Dataset._build_tasks_to_run): the name, else "Case i".
    return {id(case): case.name or f"Case {i}" for i, case in enumerate(dataset.cases, 1)}


def _check_agents(agents: object) -> None:
    if isinstance(agents, Agent):
        return
    if not isinstance(agents, Mapping) or not agents:
        raise TypeError("agents must be an Agent or a non-empty mapping of name -> Agent")
    for name, agent in agents.items():
        if not isinstance(name, str) or not isinstance(agent, Agent):
            raise TypeError(f"agents[{name!r}] is not an Agent")


@final
@attrs.define(eq=False)
class Evaluation:
    """One eval of a dataset against agents; :meth:`run` it once, read :meth:`result`.

    Cases run concurrently, at most ``max_concurrency`` at a time; each case's run gets
    ``limits`` (a :class:`~trio_agents.UsageLimits`: tokens, cost, and its ``deadline``
    for the case's run; a case's own ``AgentInputs.limits`` replace them) and
    ``run_options`` (any ``open_run`` option).

    Args:
        dataset: a pydantic-evals ``Dataset`` whose cases' ``inputs`` are a str (the
            user message), an :class:`AgentInputs` or a mapping of its fields.
        agents: the agent, or a mapping of name -> agent that ``AgentInputs.agent``
            picks from.
        max_concurrency: cases running at once (default 8).
        limits: each case's run's limits.
        run_options: more ``open_run`` options for every run.
        name: the eval's name in the report (default: the dataset's).
        on_case: called as each case finishes (a :class:`CaseOutcome`): progress.
    """

    dataset: Dataset[Any, Any, Any] = attrs.field(validator=attrs.validators.instance_of(Dataset))
    agents: Agent | Mapping[str, Agent] = attrs.field()
    max_concurrency: int = attrs.field(default=8, kw_only=True)
    limits: UsageLimits | None = attrs.field(
        default=None,
        kw_only=True,
        validator=attrs.validators.optional(attrs.validators.instance_of(UsageLimits)),
    )
    run_options: Mapping[str, Any] = attrs.field(factory=dict, kw_only=True)
    name: str | None = attrs.field(default=None, kw_only=True)
    on_case: Callable[[CaseOutcome], None] | None = attrs.field(default=None, kw_only=True)
    _names: dict[int, str] = attrs.field(init=False, factory=dict)
    _started: dict[str, _CaseLife] = attrs.field(init=False, factory=dict)
    _finished: dict[str, AnyReportCase] = attrs.field(init=False, factory=dict)
    _runs: dict[str, CaseRun] = attrs.field(init=False, factory=dict)
    _report: EvaluationReport[Any, Any, Any] | None = attrs.field(init=False, default=None)
    _ran: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        _check_agents(self.agents)
        if isinstance(self.max_concurrency, bool) or not isinstance(self.max_concurrency, int):
            raise TypeError("max_concurrency must be an int")
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, not {self.max_concurrency}")
        if not self.dataset.cases:
            raise ValueError(f"the dataset {self.dataset.name!r} has no cases")
        if "limits" in self.run_options:
            raise ValueError("give limits as Evaluation(limits=...), not in run_options")
        self._names = _case_names(self.dataset)
        if len(self._names) != len(self.dataset.cases):
            raise ValueError("the same Case object is in the dataset twice")

    @property
    def eval_name(self) -> str:
        """The eval's name in the report."""
        return self.name or self.dataset.name or "eval"

    def _agent_for(self, inputs: AgentInputs) -> Agent:
        if isinstance(self.agents, Agent):
            if inputs.agent is not None and inputs.agent != self.agents.name:
                raise LookupError(f"the case asks for agent {inputs.agent!r}; there is only one")
            return self.agents
        if inputs.agent is None:
            if len(self.agents) == 1:
                return next(iter(self.agents.values()))
            raise LookupError(f"the case names no agent; pick one of {sorted(self.agents)}")
        try:
            return self.agents[inputs.agent]
        except KeyError:
            raise LookupError(
                f"no agent named {inputs.agent!r}; the agents are {sorted(self.agents)}"
            ) from None

    def _plan(self, case: Case[Any, Any, Any]) -> _Plan:
        inputs = as_inputs(case.inputs)
        points = {
            (e.at, e.tool, e.nth): e
            for e in [*case.evaluators, *self.dataset.evaluators]
            if isinstance(e, CancelsCleanly)
        }
        if len(points) > 1:
            raise ValueError("a case can be cancelled at one point only (several CancelsCleanly)")
        cancel = next(iter(points.values()), None)
        return _Plan(self._agent_for(inputs), inputs, cancel)

    async def _task(self, inputs: object) -> Any:
        life = _CURRENT.get()
        name = self._names[id(life.case)]
        plan = self._plan(life.case)
        options = dict(self.run_options)
        limits = plan.inputs.usage_limits() or self.limits
        if limits is not None:
            options["limits"] = limits

        def keep(run: CaseRun) -> None:
            life.run = run
            self._runs[name] = run

        run = await _play(name, plan, options, keep)
        set_eval_attribute(CASE_RUN_ATTRIBUTE, run)
        _record_metrics(run)
        return None if run.result is None else run.result.final_output

    def _done(self, life: _CaseLife, result: AnyReportCase | None) -> None:
        name = self._names[id(life.case)]
        if result is None:
            return  # cut short by a cancel: result() reports it as interrupted
        if isinstance(result, ReportCase):
            # The CaseRun was for the evaluators; the report keeps only JSON-able attributes.
            result.attributes.pop(CASE_RUN_ATTRIBUTE, None)
        self._finished[name] = result
        if self.on_case is not None:
            status = None if life.run is None or life.run.result is None else life.run.result.status
            self.on_case(
                CaseOutcome(
                    name=name,
                    verdict=verdict_of(result),
                    status=None if status is None else str(status),
                    done=len(self._finished),
                    total=len(self.dataset.cases),
                )
            )

    def _lifecycle(self, case: Case[Any, Any, Any]) -> _CaseLife:
        life = _CaseLife(case, self._done)
        self._started[self._names[id(case)]] = life
        return life

    async def run(self) -> EvalResult:
        """Run every case; return the :class:`EvalResult`.

        A cancellation from outside cancels every case's run and propagates (read the
        partial result with :meth:`result` afterwards).

        Raises:
            RuntimeError: this evaluation already ran.
        """
        if self._ran:
            raise RuntimeError("an Evaluation runs once; make a new one")
        self._ran = True
        self._report = await self.dataset.evaluate(
            self._task,
            name=self.eval_name,
            max_concurrency=self.max_concurrency,
            progress=False,
            lifecycle=self._lifecycle,
        )
        return self.result()

    def result(self) -> EvalResult:
        """The result so far: complete once :meth:`run` returned, else partial (the
        cases that finished, those cut short as errors, the names of those not run)."""
        total = len(self.dataset.cases)
        if self._report is not None:
            return EvalResult(self.eval_name, self._report, dict(self._runs), True, total)
        cases: list[ReportCase[Any, Any, Any]] = []
        failures: list[ReportCaseFailure[Any, Any, Any]] = []
        not_run: list[str] = []
        for case in self.dataset.cases:
            name = self._names[id(case)]
            found = self._finished.get(name)
            if isinstance(found, ReportCase):
                cases.append(found)
            elif found is not None:
                failures.append(found)
            elif name in self._started:
                failures.append(_interrupted(name, case))
            else:
                not_run.append(name)
        report = EvaluationReport[Any, Any, Any](
            name=self.eval_name,
            cases=cases,
            failures=failures,
            dataset_name=self.dataset.name,
        )
        return EvalResult(self.eval_name, report, dict(self._runs), False, total, tuple(not_run))


def _interrupted(name: str, case: Case[Any, Any, Any]) -> ReportCaseFailure[Any, Any, Any]:
    return ReportCaseFailure[Any, Any, Any](
        name=name,
        inputs=case.inputs,
        metadata=case.metadata,
        expected_output=case.expected_output,
        error_message=_INTERRUPTED,
        error_stacktrace="",
    )


async def evaluate(
    dataset: Dataset[Any, Any, Any],
    agents: Agent | Mapping[str, Agent],
    *,
    max_concurrency: int = 8,
    limits: UsageLimits | None = None,
    run_options: Mapping[str, Any] | None = None,
    name: str | None = None,
    on_case: Callable[[CaseOutcome], None] | None = None,
) -> EvalResult:
    """Run the dataset's cases against ``agents`` and return the :class:`EvalResult`
    (``Evaluation(...).run()``; see :class:`Evaluation` for the arguments)."""
    evaluation = Evaluation(
        dataset,
        agents,
        max_concurrency=max_concurrency,
        limits=limits,
        run_options=dict(run_options or {}),
        name=name,
        on_case=on_case,
    )
    return await evaluation.run()
