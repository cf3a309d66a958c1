"""Evals: measure agents over a dataset of cases, on pydantic-evals, under Trio.

Needs the ``evals`` extra (``pip install 'trio-agents[evals]'``: pydantic-evals);
importing this package without it fails with a message saying so. A dataset is
pydantic-evals' ``Dataset`` of ``Case`` s (or a YAML/JSON file, :func:`load_dataset`);
:func:`evaluate` runs every case's agent concurrently, keeps each run whole
(:class:`CaseRun`: result and every event), runs the evaluators and returns an
:class:`EvalResult` (pydantic-evals' report, the verdicts, the score, JSON).

The evaluators here check what the run knows beyond its output:
:class:`ToolTrajectory` (expected calls, order, arguments, partial credit),
:class:`OutputMatches` / :class:`OutputValidates` (final and structured output),
:class:`WithinBudget` (tokens, turns, cost), :class:`CancelsCleanly` (cancel at an
event; the run must end ``cancelled`` with a valid conversation), :class:`LLMJudge`
(any trio_agents model grades the answer). pydantic-evals' own evaluators work beside
them. A case's :class:`AgentInputs` may script a user's follow-ups.

:func:`compare` says what changed since a previous result (:func:`load_report`). The
command ``trio-agents eval`` and the pytest integration
(:func:`trio_agents.testing.eval_params`) are built on these. See ``docs/evals.md``.
"""

try:
    import pydantic_evals as _pydantic_evals
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "trio_agents.evals needs pydantic-evals: pip install 'trio-agents[evals]'"
    ) from exc

from ._case import AgentInputs as AgentInputs
from ._case import CaseRun as CaseRun
from ._case import case_run as case_run
from ._compare import CaseChange as CaseChange
from ._compare import Comparison as Comparison
from ._compare import compare as compare
from ._eval_runner import FORMAT as FORMAT
from ._eval_runner import CaseOutcome as CaseOutcome
from ._eval_runner import EvalResult as EvalResult
from ._eval_runner import Evaluation as Evaluation
from ._eval_runner import Verdict as Verdict
from ._eval_runner import evaluate as evaluate
from ._eval_runner import load_report as load_report
from ._eval_runner import verdict_of as verdict_of
from ._evaluators import CancelsCleanly as CancelsCleanly
from ._evaluators import ExpectedCall as ExpectedCall
from ._evaluators import OutputMatches as OutputMatches
from ._evaluators import OutputValidates as OutputValidates
from ._evaluators import ToolTrajectory as ToolTrajectory
from ._evaluators import WithinBudget as WithinBudget
from ._files import EVALUATORS as EVALUATORS
from ._files import load_dataset as load_dataset
from ._judge import JUDGE_INSTRUCTIONS as JUDGE_INSTRUCTIONS
from ._judge import JudgeVerdict as JudgeVerdict
from ._judge import LLMJudge as LLMJudge

__all__ = [
    "EVALUATORS",
    "FORMAT",
    "JUDGE_INSTRUCTIONS",
    "AgentInputs",
    "CancelsCleanly",
    "CaseChange",
    "CaseOutcome",
    "CaseRun",
    "Comparison",
    "EvalResult",
    "Evaluation",
    "ExpectedCall",
    "JudgeVerdict",
    "LLMJudge",
    "OutputMatches",
    "OutputValidates",
    "ToolTrajectory",
    "Verdict",
    "WithinBudget",
    "case_run",
    "compare",
    "evaluate",
    "load_dataset",
    "load_report",
    "verdict_of",
]

del _pydantic_evals
