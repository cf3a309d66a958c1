"""Reading a dataset file (YAML or JSON) with trio_agents' evaluators known by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError
from pydantic_evals import Dataset
from pydantic_evals.evaluators import Evaluator

from ._case import AgentInputs
from ._evaluators import (
    CancelsCleanly,
    OutputMatches,
    OutputValidates,
    ToolTrajectory,
    WithinBudget,
)
from ._judge import LLMJudge

__all__ = ["EVALUATORS", "load_dataset"]

EVALUATORS: Final[tuple[type[Evaluator[Any, Any, Any]], ...]] = (
    CancelsCleanly,
    LLMJudge,
    OutputMatches,
    OutputValidates,
    ToolTrajectory,
    WithinBudget,
)
"""The evaluators a dataset file may name (beside pydantic-evals' own; ours win on a
clash of names, ``LLMJudge``)."""


def _one_line(exc: ValueError) -> str:
    """pydantic's many-line validation report as one line: ``where: what; ...``."""
    found = exc if isinstance(exc, ValidationError) else exc.__cause__
    if not isinstance(found, ValidationError):
        return " ".join(str(exc).split())
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"
        for error in found.errors()[:5]
    )


def load_dataset(
    path: str | Path, *, evaluators: tuple[type[Evaluator[Any, Any, Any]], ...] = ()
) -> Dataset[AgentInputs | str, Any, Any]:
    """Read a dataset file: YAML (``.yaml``/``.yml``) or JSON (``.json``), in
    pydantic-evals' format (``cases:`` with ``name``, ``inputs``, ``expected_output``,
    ``metadata``, ``evaluators``; dataset-wide ``evaluators:``). A case's ``inputs`` is the
    user message, or a mapping of :class:`AgentInputs` fields.

    Args:
        path: the file.
        evaluators: evaluator classes of your own that the file names.

    Raises:
        ValueError: the file does not describe a dataset (the message says where).
        OSError: it cannot be read.
    """
    file = Path(path)
    if file.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise ValueError(f"{file}: a dataset file ends in .yaml, .yml or .json")
    try:
        return Dataset[AgentInputs | str, Any, Any].from_file(
            file, custom_evaluator_types=(*EVALUATORS, *evaluators)
        )
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ValueError(f"{file}: {_one_line(exc)}") from None
    except ExceptionGroup as group:
        # pydantic-evals gathers the evaluators it could not load (up to three)
        text = "; ".join(" ".join(str(e).split()) for e in group.exceptions)
        raise ValueError(f"{file}: {text}") from None
    except Exception as exc:
        # PyYAML's own errors (bad syntax) derive from Exception only
        if type(exc).__module__.partition(".")[0] != "yaml":
            raise
        raise ValueError(f"{file}: not valid YAML: {' '.join(str(exc).split())}") from None
