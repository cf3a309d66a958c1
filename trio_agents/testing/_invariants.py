"""What the checker knows and what it reports: :data:`INVARIANTS`, every rule a run
obeys (one table, in checking order), and a :class:`Report` of :class:`Violation`."""

from __future__ import annotations

from typing import final

import attrs

__all__ = [
    "EPSILON",
    "INVARIANTS",
    "Found",
    "LifecycleViolation",
    "Report",
    "Violation",
    "in_order",
]


INVARIANTS: dict[str, str] = {
    "run-ends": "wait(), updated and events() end; only the caller's own cancel escapes open_run",
    "statuses": "statuses start queued and follow queued → running ⇄ awaiting_approval → terminal"
    " (running again only with a changed detail: throttled)",
    "one-terminal": "exactly one terminal run.updated, the last event, matching the result",
    "seq": "seqs start at 1 and strictly increase (contiguous unless events were dropped)",
    "result": "the result is coherent (reason for failed/cancelled, output for completed, input kept)",
    "output": "a completed run with an output_type has a final_output that validates",
    "conversation": "result.conversation is valid model input and ends with new_items",
    "items-events": "the run.item events are exactly result.new_items, in order (but for"
    " the rejected_by marks the run's end puts on what guardrails did not pass)",
    "clean-text": "every text streamed, committed, published in an event or sent to the model"
    " encodes as UTF-8",
    "streamed-text": "text streamed in a turn is kept (as an incomplete message if the turn broke)",
    "tools-balanced": "each tool.started has one tool.finished matching the call's result",
    "tool-cancellation": "a tool running when the run is cancelled ends 'cancelled'",
    "injection-accounting": "each accepted injection is delivered once or unconsumed, in order",
    "model-input": "every model request is valid and a prefix of the final conversation"
    " (without the items rejected before the run: they are never sent)",
    "model-events": "a model stream that breaks fails the run (malformed: a ModelError reason)",
    "model-streams-closed": "no model stream is left open",
    "subscribers": "every subscriber sees the log in order and ends with the terminal update",
    "cancel-reason": "a cancelled run carries the reason of the cancel that ended it",
    "cancel-wins": "a run cancelled (not after_turn) before its last item never ends completed",
    "cancel-before-start": "a run cancelled while queued makes no model call",
    "cancel-latency": "a cancel reaches the terminal update within cleanup_timeout",
    "cleanup-latency": "a run that ends by itself reaches its terminal update within cleanup_timeout",
    "hooks-balanced": "each start hook called gets exactly one end hook call",
    "hook-errors": "a hook that raises during the run fails it, and the reason names the hook",
    "session-stored": "the session holds the final conversation (written before on_run_end) and loads valid",
    "session-error": "a run whose conversation could not be stored says so: failed, 'session error: …'",
    "session-released": "the next run on the session starts (no SessionBusyError) and completes",
    "rejected-unsent": "no item a guardrail rejected (marked rejected_by) is in a later run's request",
    "task-leak": "no task started during the run is alive after it",
    "process-leak": "no process started by the run is alive after it",
    "thread-leak": "no worker thread of the run keeps running after it",
    "op-error": "operations on a live run raise only documented errors",
    "tree-call-scope": "no run of a tree, nor any task of one, outlives its parent's call",
    "tree-bottom-up": "a child's terminal update precedes its parent's result for that call"
    " (and the run.child event saying how it ended); the root's terminal update is last",
    "tree-conversations": "every conversation in the tree is valid; every child's call is answered",
    "tree-subtree-cancel": "cancelling a subtree leaves its ancestors running (the parent goes on)",
    # Run policies (DESIGN §18), checked by check_policies (_policy_check.py).
    "gate-prefix": "with streaming guardrails, a turn publishes a prefix of what the model streamed",
    "gate-passed": "every published delta was passed by every streaming guardrail (a trip's text never is)",
    "gate-kept": "a guarded turn keeps exactly the text it published (released text is never withheld)",
    "guardrail-trip": "a trip fails the run with 'guardrail <name>: <info>' (a GuardrailTripped); never completed",
    "guardrail-fault": "a guardrail that raises or returns garbage fails the run, naming it",
    "guardrail-input-pending": "a run never completes while an input guardrail is still running",
    "guardrail-stops": "after a guardrail trips or fails, no model call opens and no tool starts",
    "limit-requests": "the request past a requests limit is never sent (the run fails naming it)",
    "limit-tool-calls": "the tool call past a tool_calls limit never starts",
    "limit-reason": "a run failed by a limit carries its UsageLimitExceeded (used > limit) and reason",
    "limit-completed": "a completed run stayed within its token limits and its deadline",
    "limit-deadline": "a run with a deadline ends by deadline + cleanup_timeout",
    "limit-wrap-up": "the wrap-up request arrives only at deadline - wrap_up or later",
}
"""Every invariant the checker knows: name → what it means, in checking order."""


@final
@attrs.frozen
class Violation:
    """One broken invariant.

    Attributes:
        invariant: its name (a key of :data:`INVARIANTS`).
        message: what exactly is wrong.
    """

    invariant: str
    message: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.message}"


@final
@attrs.frozen
class Report:
    """What :func:`check_run` found: an empty report means every invariant held.

    ``str(report)`` names the first broken invariant, lists the others and describes
    the example; :meth:`raise_for_violations` turns a failed report into an
    ``AssertionError`` (:class:`LifecycleViolation`).

    Attributes:
        violations: the broken invariants, in checking order.
        example: a readable description of the example (script, schedule, outcome).
    """

    violations: tuple[Violation, ...] = ()
    example: str = ""

    @property
    def ok(self) -> bool:
        """True when no invariant is broken."""
        return not self.violations

    @property
    def first(self) -> Violation | None:
        """The first broken invariant, or None."""
        return self.violations[0] if self.violations else None

    @property
    def invariants(self) -> tuple[str, ...]:
        """The names of the broken invariants (each once, in checking order)."""
        return tuple(dict.fromkeys(v.invariant for v in self.violations))

    def __str__(self) -> str:
        if self.ok:
            return "all lifecycle invariants hold"
        first = self.violations[0]
        lines = [f"lifecycle invariant broken: {first}"]
        lines += [f"  also: {v}" for v in self.violations[1:10]]
        if len(self.violations) > 10:
            lines.append(f"  ... and {len(self.violations) - 10} more")
        if self.example:
            lines += ["", self.example]
        return "\n".join(lines)

    def raise_for_violations(self) -> Report:
        """Raise :class:`LifecycleViolation` if an invariant is broken; else return self."""
        if not self.ok:
            raise LifecycleViolation(self)
        return self


class LifecycleViolation(AssertionError):
    """An ``AssertionError`` naming the first broken lifecycle invariant.

    Attributes:
        report: the full :class:`Report`.
    """

    def __init__(self, report: Report) -> None:
        super().__init__(str(report))
        self.report = report


Found = list[Violation]
"""Where a check appends what it finds."""

EPSILON = 1e-6
"""Slack for comparing virtual times (sums of binary fractions, but still floats)."""


def in_order(found: Found) -> tuple[Violation, ...]:
    """``found`` in checking order: the order of :data:`INVARIANTS` (stable within one)."""
    order = list(INVARIANTS)
    return tuple(sorted(found, key=lambda v: order.index(v.invariant)))
