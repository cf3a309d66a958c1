"""The pytest integration of trio_agents.evals: one test per case of a dataset.

::

    from trio_agents.testing import eval_params

    @pytest.mark.parametrize("case", eval_params("tests/cases.yaml"))
    async def test_agent(case):
        await case.check(AGENTS)

Each case is a test named after it; ``check`` runs that case alone (its run, its
evaluators and the dataset's) and fails the test with every failed assertion and its
reason, the evaluator errors and the run's end. pydantic-evals (the ``evals`` extra) is
imported only when this is used, so ``trio_agents.testing`` works without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest

if TYPE_CHECKING:
    from pydantic_evals import Case, Dataset

    from .._agent import Agent
    from ..evals import EvalResult

__all__ = ["EvalCase", "eval_params"]


def _describe(result: EvalResult, name: str) -> str:
    from pydantic_evals.reporting import ReportCase

    lines = [f"eval case {name!r}: {result.verdicts.get(name, 'not run')}"]
    for case in result.report.cases:
        if case.name != name:
            continue
        assert isinstance(case, ReportCase)
        for key, assertion in case.assertions.items():
            mark = "ok" if assertion.value else "FAILED"
            lines.append(f"  {key}: {mark} ({assertion.reason})")
        for broken in case.evaluator_failures:
            lines.append(f"  {broken.name}: ERROR {broken.error_message}")
    for failure in result.report.failures:
        if failure.name == name:
            lines.append(f"  the case raised: {failure.error_message}")
    run = result.runs.get(name)
    if run is not None and run.result is not None:
        lines.append(f"  the run ended {run.result.status} ({run.result.reason})")
        for item in run.result.conversation[-6:]:
            lines.append(f"    {item!r}"[:200])
    return "\n".join(lines)


@attrs.frozen
class EvalCase:
    """One case of a dataset, as a pytest parameter (see :func:`eval_params`).

    Attributes:
        dataset: the dataset it is from (its dataset-wide evaluators apply).
        case: the pydantic-evals ``Case``.
        name: its name (the test's id).
    """

    dataset: Dataset[Any, Any, Any]
    case: Case[Any, Any, Any]
    name: str

    async def check(self, agents: Agent | Mapping[str, Agent], **options: Any) -> EvalResult:
        """Run this case against ``agents``; fail the test unless it passed.

        ``options`` are :func:`trio_agents.evals.evaluate`'s (``limits``,
        ``run_options``). Returns the :class:`~trio_agents.evals.EvalResult` of the one
        case (its run and events in ``result.runs[name]``).
        """
        from pydantic_evals import Dataset

        from ..evals import evaluate

        one = Dataset[Any, Any, Any](
            name=self.dataset.name or "eval",
            cases=[self.case],
            evaluators=self.dataset.evaluators,
        )
        result = await evaluate(one, agents, **options)
        if result.verdicts.get(self.name) != "passed":
            pytest.fail(_describe(result, self.name), pytrace=False)
        return result

    def __str__(self) -> str:
        return self.name


def eval_params(
    dataset: Dataset[Any, Any, Any] | str | Path, *, evaluators: tuple[type[Any], ...] = ()
) -> list[Any]:
    """One ``pytest.param`` per case of ``dataset`` (a pydantic-evals ``Dataset`` or a
    dataset file, read with :func:`trio_agents.evals.load_dataset` and ``evaluators``),
    its id the case's name, its value an :class:`EvalCase`.
    """
    if isinstance(dataset, str | Path):
        from ..evals import load_dataset

        dataset = load_dataset(dataset, evaluators=evaluators)
    params = []
    for index, case in enumerate(dataset.cases, 1):
        name = case.name or f"Case {index}"
        params.append(pytest.param(EvalCase(dataset, case, name), id=name))
    return params
