"""``LLMJudge``: a model grades the output against a rubric.

The judge is a trio_agents run like any other (so any trio_agents model serves: a
provider's, a :class:`~trio_agents.models.FallbackModel`, the offline
:class:`~trio_agents.models.ScriptedModel` in tests), asked for a structured verdict
(DESIGN §15). A judge that fails or takes longer than ``timeout`` raises, and
pydantic-evals records that as the case's evaluator failure: the case is an error, the
other cases go on.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import attrs
import trio
from pydantic_evals.evaluators import EvaluationReason, Evaluator, EvaluatorContext

from .._agent import Agent
from .._entry import run
from .._model import Model
from ._case import as_inputs, case_run, json_safe

__all__ = ["JUDGE_INSTRUCTIONS", "JudgeVerdict", "LLMJudge"]

JUDGE_INSTRUCTIONS = """\
You grade the answer of an AI agent against a rubric. Read the rubric, the question and
the answer, then give your verdict: passed (true or false), a score from 0.0 (fails the
rubric entirely) to 1.0 (meets it fully), and a one-sentence reason.

Rubric:
{rubric}"""
"""The judge's instructions; ``{rubric}`` is replaced by the evaluator's rubric."""


@attrs.frozen
class JudgeVerdict:
    """What the judge answers (its structured output).

    Attributes:
        passed: whether the answer meets the rubric.
        score: from 0.0 to 1.0.
        reason: why, in a sentence.
    """

    passed: bool
    score: float
    reason: str


def _show(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(json_safe(value), indent=2)


@dataclass(repr=False)
class LLMJudge(Evaluator[Any, Any, Any]):
    """A model grades the case's final output against ``rubric``.

    Returns an assertion (the verdict's ``passed``, its reason as the reason) and, with
    ``score=True``, the verdict's score as ``<name>_score``.

    Args:
        rubric: what a good answer does.
        model: any trio_agents model, or a model string (``"openai:gpt-4o-mini"``).
        include_input: show the judge the case's input (default True).
        include_expected_output: show it the case's expected output (default False).
        score: also report the verdict's score.
        timeout: seconds the judge may take (default 60); past it the case is an error.
        evaluation_name: the name in the report (default ``LLMJudge``).
    """

    rubric: str = ""
    model: Model | str | None = None
    include_input: bool = True
    include_expected_output: bool = False
    score: bool = False
    timeout: float = 60.0
    evaluation_name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.rubric, str) or not self.rubric.strip():
            raise ValueError("LLMJudge needs a rubric (what a good answer does)")
        if self.model is None:
            raise ValueError("LLMJudge needs a model: a trio_agents Model or a model string")
        if not (self.timeout > 0):
            raise ValueError(f"LLMJudge.timeout must be > 0 seconds, not {self.timeout!r}")

    def get_default_evaluation_name(self) -> str:
        return self.evaluation_name or "LLMJudge"

    def build_serialization_arguments(self) -> dict[str, Any]:
        arguments = super().build_serialization_arguments()
        if not isinstance(self.model, str):
            # a model object has no file form; name its class so a report says who judged
            arguments["model"] = type(self.model).__name__
        return arguments

    def prompt(self, ctx: EvaluatorContext[Any, Any, Any]) -> str:
        """The judge's user message for the case ``ctx`` describes."""
        parts: list[str] = []
        if self.include_input:
            inputs = as_inputs(ctx.inputs)
            parts.append(f"<question>\n{_show(inputs.input)}\n</question>")
            for text in inputs.follow_ups:
                parts.append(f"<follow_up>\n{text}\n</follow_up>")
        run_ = case_run(ctx)
        result = run_.result
        output = None if result is None else result.final_output
        parts.append(f"<answer>\n{_show(output)}\n</answer>")
        if self.include_expected_output and ctx.expected_output is not None:
            parts.append(f"<expected_answer>\n{_show(ctx.expected_output)}\n</expected_answer>")
        return "\n".join(parts)

    async def evaluate(self, ctx: EvaluatorContext[Any, Any, Any]) -> dict[str, EvaluationReason]:
        assert self.model is not None
        judge = Agent(
            name="judge",
            instructions=JUDGE_INSTRUCTIONS.format(rubric=self.rubric),
            model=self.model,
            output_type=JudgeVerdict,
            max_turns=3,
        )
        prompt = self.prompt(ctx)
        try:
            with trio.fail_after(self.timeout):
                result = await run(judge, prompt)
        except trio.TooSlowError:
            raise TimeoutError(f"the judge took longer than {self.timeout:g} s") from None
        result.raise_for_status()  # a failed judge: RunFailedError, the case is an error
        verdict = result.final_output
        if not isinstance(verdict, JudgeVerdict):
            raise TypeError(f"the judge gave no verdict: {result.status} ({result.reason})")
        name = self.get_default_evaluation_name()
        found = {name: EvaluationReason(verdict.passed, verdict.reason)}
        if self.score:
            found[f"{name}_score"] = EvaluationReason(
                min(max(verdict.score, 0.0), 1.0), verdict.reason
            )
        return found
