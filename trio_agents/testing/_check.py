"""The invariant checker: every rule a run obeys, whatever happened to it."""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import final

import attrs

from .. import (
    AssistantMessage,
    EventsDropped,
    InboxDelivered,
    InboxInjected,
    Item,
    ResponseTextDelta,
    Run,
    RunChild,
    RunEvent,
    RunItemEvent,
    RunResult,
    RunStatus,
    RunUpdated,
    ToolFinished,
    ToolResult,
    ToolStarted,
    UserMessage,
    conversation_problems,
)

# The output_type machinery has no public entry point (yet): the one private import.
from .._output import compile_output, output_problems
from .._util import clean_text
from ..models import ModelRequest, OutputSpec
from ._faults import MALFORMED, START_HOOKS, SWALLOWING, Faults, HookCall
from ._observation import FRESH_INPUT, NodeRecord, Observation, TreeObservation
from ._tree import height, tree_events, walk

__all__ = [
    "INVARIANTS",
    "LifecycleViolation",
    "Report",
    "Violation",
    "check_events",
    "check_run",
    "check_tree",
]

LEGAL_NEXT: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
    RunStatus.RUNNING: frozenset(
        {RunStatus.AWAITING_APPROVAL, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}
    ),
    # awaiting_approval again: the calls waiting below the run changed (§17).
    RunStatus.AWAITING_APPROVAL: frozenset(
        {RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL, RunStatus.FAILED, RunStatus.CANCELLED}
    ),
}

INVARIANTS: dict[str, str] = {
    "run-ends": "wait(), updated and events() end; only the caller's own cancel escapes open_run",
    "statuses": "statuses start queued and follow queued → running ⇄ awaiting_approval → terminal",
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

EPSILON = 1e-6
"""Slack for comparing virtual times (sums of binary fractions, but still floats)."""

SESSION_REASONS = ("session error:", "cleanup timed out")


def _is_session_reason(reason: str | None) -> bool:
    return reason is not None and (
        reason.startswith(SESSION_REASONS[0]) or reason == SESSION_REASONS[1]
    )


def _check_statuses(result: RunResult | None, events: Sequence[RunEvent], out: Found) -> None:
    updates = [e for e in events if isinstance(e, RunUpdated)]
    if not updates or updates[0].status is not RunStatus.QUEUED:
        out.append(Violation("statuses", "the first run.updated is not 'queued'"))
    for before, after in itertools.pairwise(updates):
        if before.status.is_terminal:
            continue  # reported as one-terminal
        if after.status not in LEGAL_NEXT[before.status]:
            out.append(
                Violation(
                    "statuses",
                    f"illegal transition {before.status.value} → {after.status.value}"
                    f" (seq {before.seq} → {after.seq})",
                )
            )
        if after.status is RunStatus.AWAITING_APPROVAL and not (
            after.detail.get("pending") or after.detail.get("waiting")
        ):
            out.append(Violation("statuses", f"awaiting_approval (seq {after.seq}) lists no calls"))
    terminal = [u for u in updates if u.status.is_terminal]
    if len(terminal) != 1:
        out.append(Violation("one-terminal", f"{len(terminal)} terminal updates"))
    elif events[-1] is not terminal[0]:
        out.append(
            Violation(
                "one-terminal",
                f"the terminal update (seq {terminal[0].seq}) is not the last event"
                f" (seq {events[-1].seq}, {events[-1].type})",
            )
        )
    elif result is None:
        out.append(
            Violation("one-terminal", "a terminal update was emitted, yet run.result is None")
        )
    elif (terminal[0].status, terminal[0].reason) != (result.status, result.reason):
        out.append(
            Violation(
                "one-terminal",
                f"terminal update says {terminal[0].status.value}/{terminal[0].reason!r},"
                f" the result {result.status.value}/{result.reason!r}",
            )
        )


def _check_seq(events: Sequence[RunEvent], out: Found) -> None:
    seqs = [e.seq for e in events]
    for a, b in itertools.pairwise(seqs):
        if b <= a:
            out.append(Violation("seq", f"seq {b} follows seq {a}"))
            return
    dropped = any(isinstance(e, EventsDropped) for e in events)
    if seqs and not dropped and seqs != list(range(1, len(seqs) + 1)):
        out.append(Violation("seq", f"seqs are not 1..{len(seqs)}: {seqs[:20]}..."))


def _check_result(result: RunResult, spec: OutputSpec | None, out: Found) -> None:
    if result.status in (RunStatus.FAILED, RunStatus.CANCELLED) and not result.reason:
        out.append(Violation("result", f"a {result.status.value} run has no reason"))
    if result.status is RunStatus.COMPLETED:
        if spec is not None:
            # None may be a valid output (Optional[...]): the schema decides.
            for problem in output_problems(spec, result.final_output)[:3]:
                out.append(Violation("output", f"final_output does not validate: {problem}"))
        elif result.final_output is None:
            out.append(Violation("result", "a completed run has no final_output"))
        if result.reason is not None:
            out.append(Violation("result", f"a completed run has reason {result.reason!r}"))
    elif result.final_output is not None:
        out.append(Violation("result", f"a {result.status.value} run has a final_output"))


def _check_conversation(result: RunResult, events: Sequence[RunEvent], out: Found) -> None:
    for problem in conversation_problems(result.conversation):
        out.append(Violation("conversation", problem))
    n = len(result.new_items)
    if tuple(result.conversation[len(result.conversation) - n :]) != result.new_items:
        out.append(Violation("conversation", "result.conversation does not end with new_items"))
    committed = tuple(e.item for e in events if isinstance(e, RunItemEvent))
    # An item goes out in its run.item event when it is committed; a guardrail's mark is
    # put on at the run's end (the repair), so the result's copy may carry one more.
    new_items = tuple(map(_unmarked, result.new_items))
    if tuple(map(_unmarked, committed)) != new_items:
        for index, (a, b) in enumerate(itertools.zip_longest(committed, new_items)):
            if a is None or b is None or _unmarked(a) != b:
                out.append(
                    Violation(
                        "items-events",
                        f"run.item #{index} is {a!r} but new_items[{index}] is {b!r}",
                    )
                )
                break


def _check_streamed_text(events: Sequence[RunEvent], out: Found) -> None:
    """Nothing the user saw streamed is thrown away (DESIGN §5)."""
    streamed: dict[int, list[str]] = {}
    kept: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ResponseTextDelta):
            text: object = event.text  # a broken core may pass a model's garbage on
            if not isinstance(text, str):
                out.append(
                    Violation(
                        "streamed-text",
                        f"response.text.delta seq {event.seq} carries"
                        f" {type(text).__name__}, not str",
                    )
                )
                continue
            streamed.setdefault(event.turn, []).append(text)
        elif isinstance(event, RunItemEvent) and isinstance(event.item, AssistantMessage):
            kept.setdefault(event.turn, []).append(event.item.content)
    for turn, parts in streamed.items():
        text = "".join(parts)
        if text and text not in kept.get(turn, []):
            out.append(
                Violation(
                    "streamed-text",
                    f"turn {turn} streamed {text!r}, but no assistant message of that turn"
                    f" holds it (kept: {kept.get(turn, [])!r})",
                )
            )


def _check_tools(result: RunResult, events: Sequence[RunEvent], out: Found) -> None:
    results = {i.call_id: i for i in result.conversation if isinstance(i, ToolResult)}
    started: dict[str, ToolStarted] = {}
    finished: dict[str, ToolFinished] = {}
    for event in events:
        if isinstance(event, ToolStarted):
            if event.call_id in started:
                out.append(Violation("tools-balanced", f"call {event.call_id!r} started twice"))
            started[event.call_id] = event
        elif isinstance(event, ToolFinished):
            if event.call_id not in started:
                out.append(
                    Violation("tools-balanced", f"call {event.call_id!r} finished, never started")
                )
            elif event.call_id in finished:
                out.append(Violation("tools-balanced", f"call {event.call_id!r} finished twice"))
            finished[event.call_id] = event
            answer = results.get(event.call_id)
            if answer is None or (answer.status, answer.output) != (event.status, event.output):
                out.append(
                    Violation(
                        "tools-balanced",
                        f"tool.finished of {event.call_id!r} ({event.status}: {event.output!r})"
                        f" does not match its result {answer!r}",
                    )
                )
    for call_id in started.keys() - finished.keys():
        out.append(Violation("tools-balanced", f"call {call_id!r} started and never finished"))


def _check_tool_cancellation(
    obs: Observation, out: Found, applied: Sequence[tuple[float, str]] | None = None
) -> None:
    """A call in flight when the run's scope was cancelled must end ``cancelled`` —
    except a sub-agent call whose child run had already ended (its terminal
    ``run.child`` came before the cancel): it keeps the child's answer, like a tool
    that returned before the cancel, however long the child's session takes to close;
    and a blocking tool released no later than the cancel (``applied``: the example's
    operations, the root's by default): Trio hands the release to its waiting task
    before the cancel, so it returns ``"released"`` at once, a completed tool."""
    hard = [c for c in obs.cancels if c.kind != "after_turn" and c.live]
    if not hard:
        return
    cut = hard[0].seq
    released = any(
        text.startswith("release") and at <= hard[0].at
        for at, text in (obs.applied if applied is None else applied)
    )
    exempt = {c.call_id for c in obs.tool_calls if c.fault is not None}
    if released:
        exempt.update(
            e.call_id
            for e in obs.events
            if isinstance(e, ToolFinished) and (e.status, e.output) == ("ok", "released")
        )
    exempt.update(
        e.call_id
        for e in obs.events
        if isinstance(e, RunChild) and e.status.is_terminal and e.seq <= cut
    )
    started = {e.call_id: e for e in obs.events if isinstance(e, ToolStarted) and e.seq <= cut}
    for event in obs.events:
        if (
            isinstance(event, ToolFinished)
            and event.seq > cut
            and event.call_id in started
            and event.call_id not in exempt
            and event.status != "cancelled"
        ):
            out.append(
                Violation(
                    "tool-cancellation",
                    f"tool {event.name!r} (call {event.call_id!r}) was running when the run"
                    f" was cancelled at t={hard[0].at:g} ({hard[0].kind}), yet it finished"
                    f" {event.status!r} with {event.output!r}: did it swallow trio.Cancelled?",
                )
            )


def _check_injections(obs: Observation, result: RunResult, out: Found) -> None:
    events = obs.events
    delivered_at = {e.injection_id: e.seq for e in events if isinstance(e, InboxDelivered)}
    delivered = [e.injection_id for e in events if isinstance(e, InboxDelivered)]
    by_id = {inj.id: inj for inj in obs.injections}
    if len(delivered) != len(set(delivered)):
        out.append(
            Violation("injection-accounting", f"an injection was delivered twice: {delivered}")
        )
    for injection_id in delivered:
        injection = by_id.get(injection_id)
        if injection is None:
            out.append(
                Violation("injection-accounting", f"{injection_id} delivered, never accepted")
            )
        elif injection.withdrawn:
            out.append(Violation("injection-accounting", f"withdrawn {injection_id} was delivered"))
    expected = [
        item
        for inj in obs.injections
        if not inj.withdrawn and inj.id not in delivered_at
        for item in inj.items
    ]
    if list(result.unconsumed) != expected:
        out.append(
            Violation(
                "injection-accounting",
                f"unconsumed is {list(result.unconsumed)!r}, expected {expected!r}"
                " (every accepted injection is delivered once or unconsumed)",
            )
        )
    new_items = [_unmarked(item) for item in result.new_items]
    for injection_id in delivered:
        for item in by_id[injection_id].items if injection_id in by_id else ():
            if item not in new_items:
                out.append(
                    Violation("injection-accounting", f"{injection_id} delivered but {item!r} lost")
                )
    for inj in obs.injections:
        failed = inj.withdraw_failed_at_seq
        if failed is not None and delivered_at.get(inj.id, 0) > failed:
            out.append(
                Violation(
                    "injection-accounting",
                    f"withdraw({inj.id}) returned False, yet it was delivered only later",
                )
            )
    order = [inj.id for inj in obs.injections]
    for steering in (True, False):
        ids = [i for i in delivered if i in by_id and (by_id[i].when != "when_idle") == steering]
        if ids != sorted(ids, key=order.index):
            mode = "steering" if steering else "when_idle"
            out.append(Violation("injection-accounting", f"{mode} injections out of order: {ids}"))
    if result.status is RunStatus.COMPLETED and result.unconsumed:
        out.append(
            Violation("injection-accounting", "the run completed with injected items pending")
        )


def _check_model(obs: Observation, out: Found) -> None:
    final = None if obs.outcome is None else _sent_of(obs.outcome)
    for number, request in enumerate(obs.requests, 1):
        problems = conversation_problems(request.items)
        if problems:
            out.append(
                Violation("model-input", f"model request {number} is invalid: {problems[0]}")
            )
            break
        if final is not None and tuple(final[: len(request.items)]) != request.items:
            out.append(
                Violation(
                    "model-input",
                    f"model request {number} is not a prefix of the final conversation",
                )
            )
            break
    result = obs.outcome
    for stream in obs.streams:
        fault = stream.fault
        if fault is None or stream.fired_at is None or fault.kind == "never_ends":
            continue
        if fault.kind in SWALLOWING:
            # It ends only by a cancel (the run's, or an interruption), which it hides
            # as a normal end: its text was cut, so it is never kept as complete (and
            # a cancelled run never completes: cancel-wins).
            # An assistant message delivered from the inbox (a `when="now"` injection
            # that interrupted this very call) is the caller's, not the model's.
            injected = _delivered_item_seqs(obs.events)
            complete = [
                e.seq
                for e in obs.events
                if isinstance(e, RunItemEvent)
                and e.turn == stream.number
                and isinstance(e.item, AssistantMessage)
                and e.item.status == "completed"
                and e.seq not in injected
            ]
            if complete:
                out.append(
                    Violation(
                        "model-events",
                        f"model call {stream.number} swallowed its cancellation (t="
                        f"{stream.fired_at:g}), yet its cut-off text was kept as a complete"
                        f" answer (seq {complete[0]})",
                    )
                )
            continue
        what = f"model call {stream.number} {fault.kind} (t={stream.fired_at:g})"
        if result is None or result.status is not RunStatus.FAILED:
            status = "no result" if result is None else f"{result.status.value} ({result.reason})"
            out.append(Violation("model-events", f"{what}, yet the run ended {status}"))
        elif fault.kind in MALFORMED and "ModelError" not in _failure_reasons(obs):
            out.append(
                Violation(
                    "model-events",
                    f"{what}: the run failed with {result.reason!r}, not a ModelError reason",
                )
            )
        break  # the first fault that fired decides the run
    if obs.open_streams:
        out.append(Violation("model-streams-closed", f"{obs.open_streams} stream(s) left open"))


def _check_subscribers(obs: Observation, out: Found) -> None:
    events = list(obs.events)
    updates = [e for e in events if isinstance(e, RunUpdated)]
    for number, view in enumerate(obs.subscribers, 1):
        seen = list(view.events)
        what = f"subscriber {number} ({view.kind})"
        if view.kind == "events":
            ok = seen == events if view.complete else seen == events[: len(seen)]
        else:
            ok = any(
                seen == updates[k : k + len(seen)] for k in range(len(updates) - len(seen) + 1)
            )
            if view.complete:
                ok = ok and bool(seen) and seen[-1] is updates[-1]
        if not ok:
            out.append(
                Violation(
                    "subscribers",
                    f"{what} saw seqs {[e.seq for e in seen]}, the log has"
                    f" {[e.seq for e in (events if view.kind == 'events' else updates)]}",
                )
            )


def _shield_end(obs: Observation, at: float) -> float:
    """When the last shielded fault tool running at ``at`` left its shield (in a tree,
    anywhere in the tree: a shield below a run holds its cancel up too)."""
    end = at
    for call in obs.tool_calls if obs.tree is None else obs.tree.tool_calls:
        if call.fault == "shield" and call.started_at is not None and call.started_at <= at:
            if call.ended_at is None:
                return float("inf")
            end = max(end, call.ended_at)
    return end


def _check_cancels(obs: Observation, max_latency: float, out: Found) -> None:
    result = obs.outcome
    live = [c for c in obs.cancels if c.live]
    if result is not None and result.status is RunStatus.CANCELLED:
        allowed = {live[0].reason} if live else set()
        allowed |= {c.reason for c in obs.cancels if c.kind in ("outer", "horizon")}
        # A reason is recorded as it enters the run: cleaned (a lone surrogate: U+FFFD).
        allowed = {clean_text(reason) for reason in allowed}
        if result.reason not in allowed:
            out.append(
                Violation(
                    "cancel-reason",
                    f"cancelled with reason {result.reason!r}; the cancels allow {sorted(allowed)}",
                )
            )
    if result is not None and result.status is RunStatus.COMPLETED:
        # Whatever the model, a tool or a hook did with the Cancelled (swallowed it),
        # a run cancelled before it committed its last item is not completed (a cancel
        # that lands while the run's repair runs, after the answer, may be).
        items = [e.seq for e in obs.events if e.type == "run.item"]
        early = [c for c in live if c.kind != "after_turn" and items and c.seq < items[-1]]
        if early:
            out.append(
                Violation(
                    "cancel-wins",
                    f"{early[0].kind} cancel at t={early[0].at:g} (after seq {early[0].seq}),"
                    f" yet the run went on to seq {items[-1]} and completed",
                )
            )
    for cancel in live:
        if cancel.kind != "after_turn" and cancel.status is RunStatus.QUEUED and obs.requests:
            out.append(
                Violation(
                    "cancel-before-start",
                    f"cancelled while queued, yet {len(obs.requests)} model call(s) were made",
                )
            )
            break
    if result is None or not obs.event_times:
        return
    terminal_at = obs.event_times[-1]
    hard = [c for c in live if c.kind != "after_turn"]
    if hard:
        start = _shield_end(obs, hard[0].at)
        latency = terminal_at - start
        if latency > max_latency + EPSILON:
            waited = f" (after a shielded tool, from t={start:g})" if start > hard[0].at else ""
            out.append(
                Violation(
                    "cancel-latency",
                    f"{hard[0].kind} cancel at t={hard[0].at:g} reached the terminal update"
                    f" {terminal_at - hard[0].at:g} virtual s later{waited}"
                    f" (bound {max_latency:g} s)",
                )
            )
        return
    _check_cleanup(obs, result, terminal_at, max_latency, out)


def _check_cleanup(
    obs: Observation, result: RunResult, terminal_at: float, bound: float, out: Found
) -> None:
    """The one cleanup deadline also bounds a run that ends by itself."""
    ended_at: float | None = None
    what = ""
    if result.status is RunStatus.COMPLETED:
        items = [
            t for e, t in zip(obs.events, obs.event_times, strict=True) if e.type == "run.item"
        ]
        if items:
            ended_at, what = items[-1], "its final answer"
    else:
        fired = [s for s in obs.streams if s.fired_at is not None and s.fault is not None]
        if fired and fired[0].fault is not None and fired[0].fault.kind != "never_ends":
            ended_at, what = fired[0].fired_at, f"model call {fired[0].number} broke"
    if ended_at is not None and terminal_at - ended_at > bound + EPSILON:
        out.append(
            Violation(
                "cleanup-latency",
                f"the run ended ({what}) at t={ended_at:g} but its terminal update came"
                f" {terminal_at - ended_at:g} virtual s later (bound {bound:g} s)",
            )
        )


_PAIRS = {
    "on_run_end": "on_run_start",
    "on_model_end": "on_model_start",
    "on_tool_end": "on_tool_start",
}


def _check_hooks(obs: Observation, out: Found) -> None:
    balance: dict[str, int] = {}
    for call in obs.hook_calls:
        if call.hook in START_HOOKS:
            balance[call.key] = balance.get(call.key, 0) + 1
        else:
            if balance.get(call.key, 0) <= 0:
                out.append(
                    Violation(
                        "hooks-balanced",
                        f"{call.hook} for {call.key!r} without {_PAIRS[call.hook]}",
                    )
                )
            balance[call.key] = balance.get(call.key, 0) - 1
    for key, count in balance.items():
        if count > 0:
            out.append(
                Violation("hooks-balanced", f"{key!r} started {count} time(s) more than ended")
            )
    result = obs.outcome
    hard = [c.at for c in obs.cancels if c.live and c.kind != "after_turn"]
    cut = hard[0] if hard else float("inf")
    for index, call in enumerate(obs.hook_calls):
        if call.fault != "raise" or call.hook == "on_run_end":
            continue
        # An end hook that raises while the repair runs is logged and ignored.
        in_run = call.hook in START_HOOKS or (
            call.at < cut and not _failure_before(obs, call.at, obs.hook_calls[:index])
        )
        if not in_run or result is None:
            continue
        if result.status is not RunStatus.FAILED:
            out.append(
                Violation(
                    "hook-errors",
                    f"{call.hook} raised at t={call.at:g} during the run, yet the run ended"
                    f" {result.status.value} ({result.reason})",
                )
            )
        elif call.hook not in _failure_reasons(obs):
            out.append(
                Violation(
                    "hook-errors",
                    f"{call.hook} raised at t={call.at:g}; the run failed with"
                    f" {result.reason!r}, which does not name the hook",
                )
            )
        break


def _failure_reasons(obs: Observation) -> str:
    """The final reason, and the reason the run had before its repair could not be
    written (``detail["reason_before_repair"]``: a session error or timeout takes the
    reason over, so that a client never trusts the run as saved)."""
    result = obs.outcome
    reasons = [result.reason or ""] if result is not None else []
    for event in obs.events:
        if isinstance(event, RunUpdated) and event.status.is_terminal:
            reasons.append(str(event.detail.get("reason_before_repair", "")))
    return " | ".join(reasons)


def _failure_before(
    obs: Observation, at: float, hook_calls: Sequence[HookCall] | None = None
) -> bool:
    """Did something else fail the run at or before ``at``? (``hook_calls``: the hook
    calls to consider; by default all.)"""
    if "max_turns" in _failure_reasons(obs).split(" | "):
        return True
    for stream in obs.streams:
        if stream.error_at is not None and stream.error_at <= at:
            return True
        # A malformed event fails the run as it arrives (a ModelError), raising nothing.
        fault, fired = stream.fault, stream.fired_at
        if fault is not None and fault.kind in MALFORMED and fired is not None and fired <= at:
            return True
    # A session write that raised in the run fails it; the end hooks then run in the
    # repair, where their errors are logged and ignored.
    if any(c.fault and c.at <= at for c in obs.session_calls):
        return True
    calls = obs.hook_calls if hook_calls is None else hook_calls
    return any(c.outcome == "raised" and c.hook != "on_run_end" and c.at <= at for c in calls)


def _check_session(obs: Observation, out: Found) -> None:
    stored, result, fresh = obs.stored, obs.outcome, obs.fresh_run
    if stored is None:
        return
    gets = [c for c in obs.session_calls if c.method == "get_items"]
    adds = [c for c in obs.session_calls if c.method == "add_items"]
    if result is not None:
        persisted = stored == tuple(result.conversation)
        if not persisted and stored != tuple(result.conversation[: len(stored)]):
            out.append(
                Violation(
                    "session-stored",
                    f"the session holds {len(stored)} item(s) that are not a prefix of"
                    " result.conversation",
                )
            )
        for call in obs.hook_calls:
            if call.hook == "on_run_end" and call.stored is False and persisted:
                out.append(
                    Violation(
                        "session-stored",
                        "on_run_end was called before the conversation was written",
                    )
                )
        failed_writes = [c for c in adds if c.outcome != "ok"]
        load_failed = any(c.outcome == "raised" for c in gets)
        problem = None
        if load_failed:
            problem = "loading the session raised"
        elif not persisted:
            problem = "the session does not hold result.conversation"
        elif adds and adds[-1].outcome != "ok" and not adds[-1].stored:
            # (A write that stored its items and was interrupted after is not a loss:
            # the session holds result.conversation, as checked just above.)
            problem = f"the last add_items {adds[-1].outcome}"
        if problem is not None:
            first = failed_writes[0].at if failed_writes else (gets[0].at if gets else 0.0)
            if result.status is not RunStatus.FAILED:
                out.append(
                    Violation(
                        "session-error",
                        f"{problem}, yet the run ended {result.status.value}"
                        f" ({result.reason}): a client would trust it as saved",
                    )
                )
            elif (
                not _is_session_reason(result.reason)
                and not load_failed
                and not (_failure_before(obs, first))
            ):
                out.append(
                    Violation(
                        "session-error",
                        f"{problem}; the run failed with {result.reason!r}, not"
                        " 'session error: …' or 'cleanup timed out'",
                    )
                )
    if fresh is None:
        return
    if fresh.outcome == "busy":
        out.append(
            Violation("session-released", "the next run on the session raised SessionBusyError")
        )
        return
    if fresh.outcome != "completed":
        out.append(Violation("session-released", f"the next run on the session: {fresh.outcome}"))
    if fresh.request is not None:
        problems = conversation_problems(fresh.request)
        if problems:
            out.append(
                Violation(
                    "session-stored",
                    f"loading the session gave an invalid conversation: {problems[0]}",
                )
            )
        elif _repairable(fresh.stored_before) and not _subsequence(
            _sendable(fresh.stored_before), fresh.request
        ):
            out.append(Violation("session-stored", "loading the session lost stored items"))
        _check_rejected_unsent(fresh.stored_before, fresh.request, out)
    problems = conversation_problems(fresh.stored_after)
    if problems and (fresh.rewritable or not _repairable(fresh.stored_after)):
        # With replace_items the load repair must be written back; without, only calls
        # left open (which every load repairs) are acceptable in the stored rows.
        out.append(
            Violation(
                "session-stored",
                f"after the next run the session holds an invalid conversation: {problems[0]}"
                + (
                    " (was the repair of the loaded history written back?)"
                    if fresh.rewritable
                    else ""
                ),
            )
        )


def _repairable(items: Sequence[Item]) -> bool:
    """Only results are missing (a crash): loading must keep every item."""
    fatal = ("duplicate", "unknown call", "second result")
    return not any(any(f in p for f in fatal) for p in conversation_problems(items))


def _sendable(items: Sequence[Item]) -> list[Item]:
    """``items`` without those marked ``rejected_by`` (what a run sends of them)."""
    return [item for item in items if item.rejected_by is None]


def _unmarked(item: Item) -> Item:
    """``item`` without its guardrail mark (what its run.item event carried)."""
    return item if item.rejected_by is None else attrs.evolve(item, rejected_by=None)


def _sent_of(result: RunResult) -> tuple[Item, ...]:
    """What the run's requests are prefixes of: its history without the items rejected
    before it (never sent), then its new items as they were committed (the marks this
    run's end put on come after every request)."""
    history = result.conversation[: len(result.conversation) - len(result.new_items)]
    return (*_sendable(history), *map(_unmarked, result.new_items))


def _check_rejected_unsent(stored: Sequence[Item], request: Sequence[Item], out: Found) -> None:
    """The next run on a session is sent no item it holds marked ``rejected_by``: a
    request item equal to a rejected one (without its mark) is one only beyond the
    copies of it the session holds unmarked, and the next run's own input."""
    rejected = {_unmarked(item) for item in stored if item.rejected_by is not None}
    if not rejected:
        return
    allowed = collections.Counter([*_sendable(stored), UserMessage(FRESH_INPUT)])
    for item in request:
        if item in rejected and not allowed[item]:
            out.append(Violation("rejected-unsent", f"the next run was sent {item!r}"))
            return
        allowed[item] -= 1


def _subsequence(part: Sequence[Item], whole: Sequence[Item]) -> bool:
    remaining = iter(whole)
    return all(any(item == other for other in remaining) for item in part)


def _check_leaks(obs: Observation, out: Found) -> None:
    for name in obs.leaked_tasks:
        owner = " (named after the run)" if name.startswith(obs.run_id) else ""
        out.append(Violation("task-leak", f"task {name!r}{owner} is alive after the run ended"))
    for pid, cmdline in obs.leaked_processes:
        out.append(Violation("process-leak", f"process {pid} ({cmdline}) outlived the run"))
    if obs.leaked_threads:
        calls = [c.call_id for c in obs.tool_calls if c.kind == "thread" and c.state == "running"]
        fakes = f" (fake tool calls {calls})" if calls else ""
        out.append(
            Violation(
                "thread-leak",
                f"{', '.join(obs.leaked_threads)} still running after the run ended{fakes}:"
                " does a sync tool ignore ctx.cancelled?",
            )
        )
    faulty = {c.call_id for c in obs.tool_calls if c.fault is not None}
    for call_id, description in obs.ignored_cancels:
        if call_id not in faulty:
            out.append(
                Violation("thread-leak", f"{description}: does a sync tool ignore ctx.cancelled?")
            )
    for error in obs.op_errors:
        out.append(Violation("op-error", error))


def _check_ends(obs: Observation, out: Found) -> None:
    if obs.run_error is not None:
        out.append(Violation("run-ends", f"open_run raised {obs.run_error}"))
    what = {
        "wait": "run.wait() never returned",
        "updated": "`async for` over run.updated never ended",
        "events": "`async for` over run.events() never ended",
        "late_events": "run.events() started after the end did not replay the log and end",
    }
    for key, text in what.items():
        if not obs.ended.get(key, True) and (key != "late_events" or obs.ended.get("wait")):
            out.append(Violation("run-ends", text))


def check_events(
    result: RunResult | None, events: Sequence[RunEvent], *, output_type: object = None
) -> Report:
    """Check what any run's result and full event list can show on their own.

    Statuses, the one terminal update, seqs, the result's coherence, conversation
    validity, ``run.item`` events against ``new_items``, streamed text kept, and
    balanced tool events. Pass the agent's ``output_type`` to also check that a
    completed run's ``final_output`` validates against it. Use it on runs you drive
    yourself; :func:`check_run` checks much more. ``result`` None (a run that never
    ended) is itself a violation.
    """
    compiled = compile_output(output_type)
    return _check_events(result, events, compiled.spec if compiled is not None else None)


def _check_events(
    result: RunResult | None, events: Sequence[RunEvent], spec: OutputSpec | None
) -> Report:
    out: Found = []
    if not events:
        return Report((Violation("one-terminal", "the run has no events"),))
    _check_statuses(result, events, out)
    _check_approval_repeats(events, out)
    _check_seq(events, out)
    _check_streamed_text(events, out)
    if result is not None:
        _check_result(result, spec, out)
        _check_conversation(result, events, out)
        _check_tools(result, events, out)
    _check_clean_text(result, events, (), out)
    order = list(INVARIANTS)
    out.sort(key=lambda v: order.index(v.invariant))
    return Report(tuple(out))


def check_run(observation: Observation, *, max_cancel_latency: float | None = None) -> Report:
    """Check every lifecycle invariant (:data:`INVARIANTS`) of one observed example.

    ``max_cancel_latency`` bounds the virtual time from the first immediate (or outer)
    cancel to the terminal update (from the end of a shielded fault tool's shield, if
    one was running), and from a run's own end to its terminal update; by default the
    run's ``cleanup_timeout``, the one deadline of its whole cleanup.

    For a :func:`~trio_agents.testing.run_tree_schedule` observation it also checks
    every run below the root as a run of its own (its log, result, conversation,
    tools, injections, tool cancellation, hooks balanced, cancel latency), and the
    tree invariants (``tree-call-scope``, ``tree-bottom-up``, ``tree-conversations``,
    ``tree-subtree-cancel``); violations about a run below the root name it. Each
    level of the tree has its own cleanup deadline, so a run's latency bound is
    ``max_cancel_latency`` times one plus the number of levels below it.
    """
    obs = observation
    bound = obs.cleanup_timeout if max_cancel_latency is None else max_cancel_latency
    per_level = bound
    if obs.tree is not None and obs.tree.nodes:
        # Each level of the tree has its own cleanup deadline, from when its scope is
        # left: a parent's starts once its children's repairs are done.
        bound *= 1 + obs.tree.nodes[0].height
    # The output spec the run asked the model for (the same on every request).
    spec = obs.requests[-1].output if obs.requests else None
    out = list(_check_events(obs.outcome, obs.events, spec).violations)
    result = obs.outcome
    if result is not None and tuple(
        map(_unmarked, result.new_items[: len(obs.input_items)])
    ) != tuple(map(_unmarked, obs.input_items)):
        out.append(Violation("result", "result.new_items does not start with the run's input"))
    checks: list[Callable[[], None]] = [
        lambda: _check_clean_text(None, (), obs.requests, out),
        lambda: _check_ends(obs, out),
        lambda: _check_tool_cancellation(obs, out),
        lambda: _check_model(obs, out),
        lambda: _check_subscribers(obs, out),
        lambda: _check_cancels(obs, bound, out),
        lambda: _check_hooks(obs, out),
        lambda: _check_session(obs, out),
        lambda: _check_leaks(obs, out),
    ]
    if result is not None:
        checks.insert(2, lambda: _check_injections(obs, result, out))
    if obs.tree is not None:
        tree = obs.tree
        checks.append(lambda: _check_tree(tree, out))
        checks.append(lambda: _check_tree_nodes(obs, tree, per_level, out))
    for check in checks:
        check()
    order = list(INVARIANTS)
    out.sort(key=lambda v: order.index(v.invariant))
    return Report(tuple(out), obs.describe())


def _unencodable(text: object) -> bool:
    if not isinstance(text, str) or text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _holds_unencodable(value: object) -> bool:
    """Whether a JSON-like value holds a str (a key included) UTF-8 cannot encode."""
    if isinstance(value, dict):
        return any(_unencodable(k) or _holds_unencodable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_unencodable(v) for v in value)
    return _unencodable(value)


def _item_texts(item: Item) -> list[str]:
    return [value for value in item.to_json().values() if isinstance(value, str)]


def _check_clean_text(
    result: RunResult | None,
    events: Sequence[RunEvent],
    requests: Sequence[ModelRequest],
    out: Found,
) -> None:
    """No lone surrogate reaches the user, the session or the model: a request body
    holding one cannot be encoded, nor can any later request of the conversation."""
    found: list[str] = []
    for event in events:
        if isinstance(event, ResponseTextDelta) and _unencodable(event.text):
            found.append(f"response.text.delta seq {event.seq}")
        elif isinstance(event, RunItemEvent) and any(map(_unencodable, _item_texts(event.item))):
            found.append(f"run.item seq {event.seq}")
        elif isinstance(event, ToolStarted) and _unencodable(event.arguments):
            found.append(f"tool.started seq {event.seq}")
        elif isinstance(event, ToolFinished) and _unencodable(event.output):
            found.append(f"tool.finished seq {event.seq}")
        elif not isinstance(event, ResponseTextDelta) and _holds_unencodable(event.to_json()):
            # Any other field: a reason, a status's detail, a progress payload, an
            # agent name (what every face encodes as UTF-8 to send the event).
            found.append(f"{event.type} seq {event.seq}")
    if result is not None:
        for index, item in enumerate(result.conversation):
            if any(map(_unencodable, _item_texts(item))):
                found.append(f"result.conversation[{index}]")
        if _unencodable(result.final_output) or _unencodable(result.reason):
            found.append("the result's final_output or reason")
    for number, request in enumerate(requests, 1):
        if any(_unencodable(text) for item in request.items for text in _item_texts(item)):
            found.append(f"model request {number}")
    for where in found[:3]:
        out.append(Violation("clean-text", f"{where} holds text UTF-8 cannot encode"))


# ------------------------------------------------------------------ run trees (§17)


def check_tree(run: Run) -> Report:
    """Check a whole run tree from its root's handle, once the root has ended.

    Every run of the tree gets the checks of :func:`check_events` (its statuses, one
    terminal update, seqs, result, conversation, items, tools; ``output_type``
    from its agent), and the tree gets the tree invariants that its handles and
    events can show: ``tree-call-scope`` (no run outlives the call that started it),
    ``tree-bottom-up`` (a child's terminal update, then the parent's ``run.child``
    event, then the parent's result for that call; the root's terminal update last),
    ``tree-conversations`` and ``tree-subtree-cancel`` (a child whose own cancel ended
    it leaves its parent running). Use it on trees you drive yourself; a
    :func:`~trio_agents.testing.run_tree_schedule` observation, checked by
    :func:`check_run`, is checked against much more. Messages name the run (by id and
    agent) they are about.
    """
    tree = _tree_of(run)
    out: Found = []
    for node, handle in zip(tree.nodes, walk(run), strict=True):
        compiled = compile_output(handle[0].agent.output_type)
        spec = compiled.spec if compiled is not None else None
        for violation in _check_events(node.outcome, node.events, spec).violations:
            out.append(_about(node, violation))
    _check_tree(tree, out, cancels_known=False)
    order = list(INVARIANTS)
    out.sort(key=lambda v: order.index(v.invariant))
    return Report(tuple(out), "\n".join(tree.describe()))


def _tree_of(root: Run) -> TreeObservation:
    """What a tree's handles show (no times, no schedule)."""
    events = tree_events(root)
    nodes = [
        NodeRecord(
            run_id=node.id,
            agent=node.agent.name,
            parent_id=node.parent_id,
            call_id=node.call_id,
            depth=depth,
            height=height(node),
            outcome=node.result,
            events=tuple(e for e in events if e.run_id == node.id),
        )
        for node, depth in walk(root)
    ]
    return TreeObservation(tuple(nodes), tuple(events))


def _about(node: NodeRecord, violation: Violation) -> Violation:
    """A violation of one run of a tree: say which."""
    return Violation(violation.invariant, f"run {node.run_id} ({node.agent}): {violation.message}")


def _ancestors(node: NodeRecord, by_id: Mapping[str, NodeRecord]) -> list[NodeRecord]:
    found: list[NodeRecord] = []
    parent = by_id.get(node.parent_id) if node.parent_id is not None else None
    while parent is not None:
        found.append(parent)
        parent = by_id.get(parent.parent_id) if parent.parent_id is not None else None
    return found


def _subtree(node: NodeRecord, nodes: Sequence[NodeRecord]) -> list[NodeRecord]:
    """``node`` and every run below it."""
    ids = {node.run_id}
    found = [node]
    for other in nodes:  # pre-order: a parent comes before its children
        if other.parent_id in ids:
            ids.add(other.run_id)
            found.append(other)
    return found


def _check_tree(tree: TreeObservation, out: Found, *, cancels_known: bool = True) -> None:
    """The tree invariants of DESIGN §17 "Harness" (``cancels_known``: the tree's
    :attr:`NodeRecord.cancels` list every cancel applied, as the runner's do)."""
    if not tree.nodes:
        return
    position = {id(event): index for index, event in enumerate(tree.events)}
    by_id = {node.run_id: node for node in tree.nodes}
    root = tree.nodes[0]
    if not tree.complete:
        out.append(Violation("run-ends", "`async for` over run.events(tree=True) never ended"))
    for message in tree.outlived:
        out.append(Violation("tree-call-scope", message))
    for node in tree.nodes[1:]:
        parent = by_id.get(node.parent_id or "")
        if parent is None:  # pragma: no cover - walk() gives parents first
            continue
        _check_child(tree, node, parent, position, out)
        _check_child_cancel(node, parent, by_id, out, cancels_known)
    root_terminal = _terminal(root)
    last = tree.events[-1] if tree.events else None
    if (
        root_terminal is not None
        and tree.complete
        and last is not None
        and last is not root_terminal
    ):
        out.append(
            Violation(
                "tree-bottom-up",
                f"the root's terminal update is not the last event of the tree"
                f" ({last.type} of run {last.run_id} seq {last.seq} follows it)",
            )
        )
    for model in tree.models:
        if model.agent == root.agent:
            continue  # the root's model: checked as the root's own
        for number, request in enumerate(model.requests, 1):
            problems = conversation_problems(request.items)
            if problems:
                out.append(
                    Violation(
                        "model-input",
                        f"agent {model.agent}: model request {number} is invalid: {problems[0]}",
                    )
                )
                break
        if model.open_streams:
            out.append(
                Violation(
                    "model-streams-closed",
                    f"agent {model.agent}: {model.open_streams} stream(s) left open",
                )
            )


def _terminal(node: NodeRecord) -> RunUpdated | None:
    for event in reversed(node.events):
        if isinstance(event, RunUpdated) and event.status.is_terminal:
            return event
    return None


def _check_child(
    tree: TreeObservation,
    node: NodeRecord,
    parent: NodeRecord,
    position: Mapping[int, int],
    out: Found,
) -> None:
    """One child against the call of its parent that started it: the conversations,
    the order of the updates, and the child's tool calls against the call's scope."""
    call_id = node.call_id or ""
    what = f"run {node.run_id} ({node.agent}, in call {call_id!r} of run {parent.run_id})"
    _check_child_conversations(node, parent, call_id, what, out)
    result_at = _check_child_order(node, parent, call_id, position, what, out)
    if result_at is not None and tree.event_times:
        _check_child_calls(tree, node, result_at, what, out)


def _check_child_conversations(
    node: NodeRecord, parent: NodeRecord, call_id: str, what: str, out: Found
) -> None:
    """The child's conversation is valid; the parent's holds one result of the call."""
    if node.outcome is not None:
        problems = conversation_problems(node.outcome.conversation)
        if problems:
            out.append(
                Violation(
                    "tree-conversations", f"{what}: its conversation is invalid: {problems[0]}"
                )
            )
    if parent.outcome is not None:
        answers = [
            i
            for i in parent.outcome.conversation
            if isinstance(i, ToolResult) and i.call_id == call_id
        ]
        if len(answers) != 1:
            out.append(
                Violation(
                    "tree-conversations",
                    f"{what}: the parent's conversation holds {len(answers)} result(s) of the call",
                )
            )


def _check_child_order(
    node: NodeRecord,
    parent: NodeRecord,
    call_id: str,
    position: Mapping[int, int],
    what: str,
    out: Found,
) -> int | None:
    """Bottom-up: the parent's log says the child was queued and how it ended, after the
    child's terminal update, and records the call's result after it too.

    Returns where the parent's result of the call stands in the merged log (``None``:
    the child did not end, or the parent recorded no result).
    """
    terminal = _terminal(node)
    result_event = next(
        (
            e
            for e in parent.events
            if isinstance(e, RunItemEvent)
            and isinstance(e.item, ToolResult)
            and e.item.call_id == call_id
        ),
        None,
    )
    ended = [
        e
        for e in parent.events
        if isinstance(e, RunChild)
        and e.child_id == node.run_id
        and e.status is not RunStatus.QUEUED
    ]
    if not any(
        isinstance(e, RunChild) and e.child_id == node.run_id and e.status is RunStatus.QUEUED
        for e in parent.events
    ):
        out.append(
            Violation("tree-bottom-up", f"{what}: no run.child 'queued' in the parent's log")
        )
    if terminal is None:
        if parent.outcome is not None:
            out.append(Violation("tree-bottom-up", f"{what} has no terminal update"))
        return None
    if len(ended) != 1 or ended[0].status is not terminal.status:
        said = [e.status.value for e in ended]
        out.append(
            Violation(
                "tree-bottom-up",
                f"{what} ended {terminal.status.value}, the parent's run.child events say {said}",
            )
        )
    elif position.get(id(ended[0]), -1) < position.get(id(terminal), -1):
        out.append(
            Violation(
                "tree-bottom-up", f"{what}: run.child came before the child's terminal update"
            )
        )
    if result_event is None:
        return None
    result_at = position.get(id(result_event))
    terminal_at = position.get(id(terminal))
    if result_at is not None and terminal_at is not None and terminal_at > result_at:
        out.append(
            Violation(
                "tree-bottom-up",
                f"{what}: the parent recorded the call's result before the child's terminal update",
            )
        )
    return result_at


def _check_child_calls(
    tree: TreeObservation, node: NodeRecord, result_at: int, what: str, out: Found
) -> None:
    """No tool call of the child's subtree outlives the parent's call: all ended by the
    time the parent recorded the call's result."""
    result_time = tree.event_times[result_at]
    below = {n.run_id for n in _subtree(node, tree.nodes)}
    for call in tree.tool_calls:
        if call.run_id not in below:
            continue
        late = call.ended_at is not None and call.ended_at > result_time + EPSILON
        if call.state == "running" or late:
            when = "still runs" if call.state == "running" else f"ended at t={call.ended_at:g}"
            out.append(
                Violation(
                    "tree-call-scope",
                    f"{what}: tool {call.tool!r} (call {call.call_id!r} of run {call.run_id})"
                    f" {when}, after the parent's call got its result at t={result_time:g}",
                )
            )


def _check_child_cancel(
    node: NodeRecord,
    parent: NodeRecord,
    by_id: Mapping[str, NodeRecord],
    out: Found,
    cancels_known: bool,
) -> None:
    """Who may have cancelled a child, and what its own cancel does to its parent."""
    result = node.outcome
    if result is None or result.status is not RunStatus.CANCELLED:
        return
    what = f"run {node.run_id} ({node.agent})"
    own = [c for c in node.cancels if c.live and c.kind in ("immediate", "after_turn")]
    ancestors = {a.run_id for a in _ancestors(node, by_id)}
    terminal = _terminal(node)
    by = terminal.detail.get("by") if terminal is not None else None
    if result.reason == "parent cancelled":
        if by not in ancestors:
            out.append(
                Violation(
                    "cancel-reason",
                    f"{what} was cancelled 'parent cancelled' by {by!r}, not one of its ancestors",
                )
            )
        return
    if cancels_known and (not own or result.reason != own[0].reason):
        allowed = [own[0].reason] if own else []
        out.append(
            Violation(
                "cancel-reason",
                f"{what} was cancelled with reason {result.reason!r}; its cancels allow"
                f" {[*allowed, 'parent cancelled']}",
            )
        )
        return
    # Its own cancel ended it: the parent goes on, unless something cancelled it too.
    parent_result = parent.outcome
    if parent_result is None:
        return
    if (
        cancels_known
        and parent_result.status is RunStatus.CANCELLED
        and not any(c.live for c in parent.cancels)
    ):
        out.append(
            Violation(
                "tree-subtree-cancel",
                f"cancelling {what} alone ended its parent run {parent.run_id} cancelled too"
                f" ({parent_result.reason!r})",
            )
        )
    prefix = f"sub-agent {node.agent} "
    for item in parent_result.conversation:
        if (
            isinstance(item, ToolResult)
            and item.call_id == node.call_id
            and item.output.startswith(prefix)
            and item.status != "cancelled"
        ):
            out.append(
                Violation(
                    "tree-subtree-cancel",
                    f"{what} was cancelled ({result.reason!r}), yet its parent's call"
                    f" {item.call_id!r} ended {item.status!r}: {item.output!r}",
                )
            )


# The per-run checks a child gets (as the root gets them from check_run), with what
# cannot be told apart for a child left out: its cancel reason is checked above (a
# parent may cancel it for reasons of its own), and whether a hook error failed it
# (its model's errors are counted per agent, not per run).
_CHILD_SKIPS = frozenset({"cancel-reason", "cancel-before-start", "hook-errors"})


def _check_tree_nodes(obs: Observation, tree: TreeObservation, bound: float, out: Found) -> None:
    """Every run below the root, checked as a run of its own (``bound``: the latency
    bound per level of the tree, as for the root)."""
    for node in tree.nodes[1:]:
        below = {n.run_id for n in _subtree(node, tree.nodes)}
        view = attrs.evolve(
            obs,
            run_id=node.run_id,
            outcome=node.outcome,
            events=node.events,
            event_times=node.event_times,
            script=(),
            schedule=(),
            applied=(),
            requests=(),
            open_streams=0,
            cancels=node.cancels,
            injections=node.injections,
            subscribers=(),
            op_errors=(),
            leaked_tasks=(),
            leaked_processes=(),
            tool_calls=node.tool_calls,
            input_items=(),
            run_error=None,
            ended={},
            faults=Faults(),
            streams=(),
            hook_calls=node.hook_calls,
            session_calls=(),
            stored=None,
            fresh_run=None,
            leaked_threads=(),
            tree=attrs.evolve(
                tree, tool_calls=tuple(c for c in tree.tool_calls if c.run_id in below)
            ),
        )
        found: Found = list(_check_events(node.outcome, node.events, None).violations)
        node_bound = bound * (1 + node.height)
        if node.outcome is not None:
            _check_injections(view, node.outcome, found)
        _check_tool_cancellation(view, found, obs.applied)
        _check_hooks(view, found)
        if len(node.event_times) == len(node.events):
            _check_cancels(view, node_bound, found)
        out.extend(_about(node, v) for v in found if v.invariant not in _CHILD_SKIPS)


def _check_approval_repeats(events: Sequence[RunEvent], out: Found) -> None:
    """``awaiting_approval → awaiting_approval`` says the waiting calls changed (§17):
    never the same detail twice in a row."""
    updates = [e for e in events if isinstance(e, RunUpdated)]
    for before, after in itertools.pairwise(updates):
        if (
            before.status is RunStatus.AWAITING_APPROVAL
            and after.status is RunStatus.AWAITING_APPROVAL
            and before.detail == after.detail
        ):
            out.append(
                Violation(
                    "statuses",
                    f"awaiting_approval repeated unchanged (seq {before.seq} → {after.seq})",
                )
            )


def _delivered_item_seqs(events: Sequence[RunEvent]) -> set[int]:
    """The seqs of the ``run.item`` events of injected items: each ``inbox.delivered``
    follows the ``run.item`` events of its injection's items, in order."""
    sizes = {e.injection_id: len(e.items) for e in events if isinstance(e, InboxInjected)}
    items = [e.seq for e in events if isinstance(e, RunItemEvent)]
    found: set[int] = set()
    for event in events:
        if isinstance(event, InboxDelivered):
            before = [seq for seq in items if seq < event.seq]
            found.update(before[len(before) - sizes.get(event.injection_id, 0) :])
    return found
