"""``compare``: what changed between an eval and a previous one (``--compare``)."""

from __future__ import annotations

from typing import Any, Final

import attrs
from pydantic_evals.reporting import EvaluationReport, ReportCase

from ._eval_runner import AnyReportCase, EvalResult, Verdict, verdict_of

__all__ = ["CaseChange", "Comparison", "compare"]

_RANK: Final[dict[Verdict, int]] = {"error": 0, "failed": 1, "passed": 2}


@attrs.frozen
class CaseChange:
    """One case whose outcome changed.

    Attributes:
        name: the case.
        before: its verdict in the baseline.
        after: its verdict now.
        assertions: the assertions that changed, as ``"name: True -> False"``.
    """

    name: str
    before: Verdict
    after: Verdict
    assertions: tuple[str, ...] = ()

    def __str__(self) -> str:
        detail = f" ({', '.join(self.assertions)})" if self.assertions else ""
        return f"{self.name}: {self.before} -> {self.after}{detail}"


@attrs.frozen
class Comparison:
    """An eval against its baseline.

    Attributes:
        score_before, score_after: the share of cases that passed, then and now.
        regressions: cases whose verdict got worse, or with an assertion that passed
            and now fails.
        improvements: cases whose verdict got better, or with an assertion that failed
            and now passes (and none the other way).
        added, removed: case names only now, or only in the baseline.
    """

    score_before: float
    score_after: float
    regressions: tuple[CaseChange, ...]
    improvements: tuple[CaseChange, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]

    def lines(self) -> list[str]:
        """The comparison for people, one line each."""
        out = [f"score: {self.score_before:.1%} -> {self.score_after:.1%}"]
        out += [f"regression: {change}" for change in self.regressions]
        out += [f"improvement: {change}" for change in self.improvements]
        out += [f"new case: {name}" for name in self.added]
        out += [f"removed case: {name}" for name in self.removed]
        if not (self.regressions or self.improvements or self.added or self.removed):
            out.append("no case changed")
        return out


def _cases(report: EvaluationReport[Any, Any, Any]) -> dict[str, AnyReportCase]:
    found: dict[str, AnyReportCase] = {c.name: c for c in report.cases}
    found.update((f.name, f) for f in report.failures)
    return found


def _assertions(case: AnyReportCase) -> dict[str, bool]:
    if not isinstance(case, ReportCase):
        return {}
    return {name: bool(result.value) for name, result in case.assertions.items()}


def _change(name: str, before: AnyReportCase, after: AnyReportCase) -> tuple[int, CaseChange]:
    """(-1 worse, 0 same, 1 better) and the change."""
    old, new = _assertions(before), _assertions(after)
    flipped = [
        f"{n}: {old[n]} -> {new[n]}" for n in sorted(old.keys() & new.keys()) if old[n] != new[n]
    ]
    was, now = verdict_of(before), verdict_of(after)
    change = CaseChange(name, was, now, tuple(flipped))
    if _RANK[now] != _RANK[was]:
        return (1 if _RANK[now] > _RANK[was] else -1), change
    if any(old[n] and not new[n] for n in old.keys() & new.keys()):
        return -1, change
    return (1 if flipped else 0), change


def _score(cases: dict[str, AnyReportCase]) -> float:
    if not cases:
        return 1.0
    return sum(1 for c in cases.values() if verdict_of(c) == "passed") / len(cases)


def compare(current: EvalResult, baseline: EvaluationReport[Any, Any, Any]) -> Comparison:
    """What changed from ``baseline`` (a previous report: :func:`load_report`) to
    ``current``. Cases are matched by name."""
    before, after = _cases(baseline), _cases(current.report)
    regressions: list[CaseChange] = []
    improvements: list[CaseChange] = []
    for name in sorted(before.keys() & after.keys()):
        direction, change = _change(name, before[name], after[name])
        if direction < 0:
            regressions.append(change)
        elif direction > 0:
            improvements.append(change)
    return Comparison(
        score_before=_score(before),
        score_after=current.score,
        regressions=tuple(regressions),
        improvements=tuple(improvements),
        added=tuple(sorted(after.keys() - before.keys())),
        removed=tuple(sorted(before.keys() - after.keys())),
    )
