"""The policy checker: what guardrails and usage limits promise (DESIGN §18), checked
on a :class:`~trio_agents.testing.PolicyObservation` on top of every lifecycle
invariant (:func:`~trio_agents.testing.check_run`).

The invariants are in :data:`~trio_agents.testing.INVARIANTS` (the ``gate-*``,
``guardrail-*`` and ``limit-*`` rows). The gate's promise — "no released delta was
later withheld, no withheld delta was published" — is three of them: what a guarded
turn publishes is a prefix of what the model streamed (``gate-prefix``), every piece of
it was passed by every streaming guardrail (``gate-passed``: the text that tripped is
never published), and the turn keeps exactly what it published (``gate-kept``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from .. import (
    WRAP_UP_MESSAGE,
    AssistantMessage,
    GuardrailTripped,
    InboxDelivered,
    ResponseTextDelta,
    RunItemEvent,
    RunResult,
    RunStatus,
    RunUpdated,
    ToolStarted,
    UsageLimitExceeded,
    UsageLimits,
    UserMessage,
)
from ..models import Turn, Usage
from ._checker import check_run
from ._invariants import EPSILON, INVARIANTS, Report, Violation
from ._observation import InjectionRecord, Observation
from ._policy_faults import GuardrailCall
from ._policy_runner import PolicyObservation

__all__ = ["check_policies"]

_FAULTS = frozenset({"tripped", "raised", "garbage", "stray_cancel"})
"""Guardrail outcomes that must stop the run (a trip, or a guardrail fault)."""


def _terminal_time(pobs: PolicyObservation) -> float | None:
    obs = pobs.observation
    for event, at in zip(obs.events, obs.event_times, strict=True):
        if isinstance(event, RunUpdated) and event.status.is_terminal:
            return at
    return None


def _streamed(pobs: PolicyObservation, model_call: int) -> str:
    """The text model call ``model_call`` (from 1) streamed, as the script has it."""
    script = pobs.observation.script
    if model_call <= len(script):
        turn = script[model_call - 1]
    else:
        default = pobs.default_turn
        if default is None:
            return ""
        turn = default if isinstance(default, Turn) else Turn(default)
    return "".join(turn.text)


def _check_gate(pobs: PolicyObservation, out: list[Violation]) -> None:
    """No released delta was later withheld, no withheld delta was published."""
    if not any(plan.kind == "stream" for plan in pobs.policies.guardrails):
        return
    stream_names = [p.name for p in pobs.policies.guardrails if p.kind == "stream"]
    published: dict[int, list[str]] = {}
    kept: dict[int, list[str]] = {}
    injected = [item for inj in pobs.observation.injections for item in inj.items]
    for event in pobs.observation.events:
        if isinstance(event, ResponseTextDelta) and isinstance(event.text, str):
            published.setdefault(event.turn, []).append(event.text)
        elif (
            isinstance(event, RunItemEvent)
            and isinstance(event.item, AssistantMessage)
            and event.item not in injected  # the user's, not the model's
        ):
            kept.setdefault(event.turn, []).append(event.item.content)
    for turn, pieces in sorted(published.items()):
        text = "".join(pieces)
        streamed = _streamed(pobs, turn)
        if not streamed.startswith(text):
            out.append(
                Violation(
                    "gate-prefix",
                    f"turn {turn} published {text!r}, not a prefix of the streamed {streamed!r}",
                )
            )
        # How far each streaming guardrail passed this turn's text.
        passed = {
            name: max(
                (
                    len(call.value)
                    for call in pobs.guardrail_calls
                    if call.name == name and call.model_call == turn and call.outcome == "passed"
                ),
                default=0,
            )
            for name in stream_names
        }
        end = 0
        for piece in pieces:
            end += len(piece)
            short = [name for name, length in passed.items() if length < end]
            if short:
                out.append(
                    Violation(
                        "gate-passed",
                        f"turn {turn} published {text[:end]!r}, but {', '.join(short)} never"
                        f" passed that much (passed: {passed})",
                    )
                )
                break
    for turn, contents in sorted(kept.items()):
        text = "".join(published.get(turn, []))
        wrong = [c for c in contents if c and c != text]
        if wrong:
            out.append(
                Violation(
                    "gate-kept",
                    f"turn {turn} published {text!r} but kept {wrong[0]!r}",
                )
            )


def _stoppers(pobs: PolicyObservation) -> list[GuardrailCall]:
    """Guardrail calls that tripped or failed (not after swallowing a cancel)."""
    return [c for c in pobs.guardrail_calls if c.outcome in _FAULTS and not c.swallowed]


def _check_guardrails(pobs: PolicyObservation, out: list[Violation]) -> None:
    """A trip or a guardrail's fault fails the run, the reason names it, and nothing
    starts after it; a run never completes with an input guardrail pending."""
    obs = pobs.observation
    result = obs.outcome
    stoppers = _stoppers(pobs)
    if result is None:
        return
    terminal = _terminal_time(pobs)
    if result.status is RunStatus.COMPLETED and stoppers:
        first = stoppers[0]
        out.append(
            Violation(
                "guardrail-trip",
                f"the run completed although guardrail {first.name} {first.outcome}"
                f" at t={first.ended_at:g}",
            )
        )
    _check_guardrail_reason(pobs, result, stoppers, out)
    if stoppers and result.status is RunStatus.FAILED and not obs.cancels:
        _check_stopped_by_guardrail(pobs, result, stoppers, terminal, out)
    if result.status is RunStatus.COMPLETED:
        _check_input_pending(pobs, terminal, out)
    if stoppers:
        _check_nothing_after(pobs, stoppers, out)


def _check_guardrail_reason(
    pobs: PolicyObservation,
    result: RunResult,
    stoppers: Sequence[GuardrailCall],
    out: list[Violation],
) -> None:
    """A ``guardrail ...`` failure reason names a trip (with its info, and a
    ``GuardrailTripped`` error) or a fault that happened."""
    reason = result.reason or ""
    if result.status is not RunStatus.FAILED or not reason.startswith("guardrail "):
        return
    named = reason[len("guardrail ") :]
    fault = re.match(r"(\S+) raised ", named)
    if fault is None and ": " in named:
        name, info = named.split(": ", 1)
        plan = next((p for p in pobs.policies.guardrails if p.name == name), None)
        tripped = any(c.name == name and c.outcome == "tripped" for c in stoppers)
        if plan is None or not tripped or info != plan.info:
            out.append(
                Violation("guardrail-trip", f"reason {reason!r} names no trip that happened")
            )
        error = result.error
        if not (isinstance(error, GuardrailTripped) and error.name == name):
            out.append(
                Violation(
                    "guardrail-trip",
                    f"reason {reason!r}, but result.error is {error!r}, not a"
                    f" GuardrailTripped of {name}",
                )
            )
    else:
        name = fault.group(1) if fault is not None else named
        if not any(c.name == name and c.outcome != "tripped" for c in stoppers):
            out.append(Violation("guardrail-fault", f"reason {reason!r} names no guardrail fault"))


def _check_stopped_by_guardrail(
    pobs: PolicyObservation,
    result: RunResult,
    stoppers: Sequence[GuardrailCall],
    terminal: float | None,
    out: list[Violation],
) -> None:
    """Nothing else was asked to stop the failed run: a trip or fault is what ended it,
    and its reason says so."""
    reason = result.reason or ""
    first = min(stoppers, key=lambda c: c.ended_at or 0.0)
    earlier = first.ended_at is not None and terminal is not None and terminal < first.ended_at
    if not reason.startswith("guardrail ") and not earlier and _only_guardrails_stop(pobs):
        out.append(
            Violation(
                "guardrail-trip",
                f"guardrail {first.name} {first.outcome} at t={first.ended_at:g},"
                f" but the run failed with {reason!r}",
            )
        )


def _check_input_pending(
    pobs: PolicyObservation, terminal: float | None, out: list[Violation]
) -> None:
    """A completed run saw every input guardrail pass before its end."""
    for call in pobs.guardrail_calls:
        if call.kind != "input":
            continue
        if call.outcome != "passed" or (
            terminal is not None and (call.ended_at or 0.0) > terminal + EPSILON
        ):
            out.append(
                Violation(
                    "guardrail-input-pending",
                    f"the run completed at t={terminal}, but input guardrail {call.name}"
                    f" #{call.number} was {call.outcome or 'still running'}",
                )
            )


def _check_nothing_after(
    pobs: PolicyObservation, stoppers: Sequence[GuardrailCall], out: list[Violation]
) -> None:
    """Once a guardrail stopped the run, no model call opens and no tool starts."""
    obs = pobs.observation
    at = min(c.ended_at or 0.0 for c in stoppers)
    opened = [s.number for s in obs.streams if (s.opened_at or -1.0) > at + EPSILON]
    started = [
        event.call_id
        for event, when in zip(obs.events, obs.event_times, strict=True)
        if isinstance(event, ToolStarted) and when > at + EPSILON
    ]
    if opened or started:
        out.append(
            Violation(
                "guardrail-stops",
                f"a guardrail stopped the run at t={at:g}, but then model call(s) {opened}"
                f" opened and tool call(s) {started} started",
            )
        )


def _only_guardrails_stop(pobs: PolicyObservation) -> bool:
    """Whether nothing but a guardrail could fail the example's run: no limits, no
    model, hook or session faults, no model failure in the script."""
    obs = pobs.observation
    return (
        pobs.policies.limits is None
        and not obs.faults
        and all(turn.fail is None for turn in obs.script)
    )


def _check_limits(pobs: PolicyObservation, out: list[Violation]) -> None:
    """The run's usage limits held: counts, the reason of a run they failed, tokens and
    the deadline of a completed run, the deadline's bound, the wrap-up."""
    limits = pobs.policies.limits
    obs = pobs.observation
    result = obs.outcome
    if limits is None or result is None:
        return
    requests = len(obs.requests)
    started = sum(isinstance(e, ToolStarted) for e in obs.events)
    ran = len(obs.tool_calls)
    if limits.requests is not None and requests > limits.requests:
        out.append(
            Violation(
                "limit-requests",
                f"{requests} model requests were sent, past the limit of {limits.requests}",
            )
        )
    if limits.tool_calls is not None and max(started, ran) > limits.tool_calls:
        out.append(
            Violation(
                "limit-tool-calls",
                f"{started} tool calls started ({ran} ran), past the limit of {limits.tool_calls}",
            )
        )
    _check_limit_reason(limits, result, requests, out)
    terminal = _terminal_time(pobs)
    if result.status is RunStatus.COMPLETED:
        _check_completed_within(limits, result, terminal, out)
    if limits.deadline is not None and terminal is not None:
        bound = limits.deadline + obs.cleanup_timeout + EPSILON
        if terminal > bound and not obs.cancels:
            out.append(
                Violation(
                    "limit-deadline",
                    f"deadline {limits.deadline:g} s, cleanup_timeout {obs.cleanup_timeout:g} s,"
                    f" but the terminal update came at t={terminal:g}",
                )
            )
    _check_wrap_up(pobs, out)


def _check_limit_reason(
    limits: UsageLimits, result: RunResult, requests: int, out: list[Violation]
) -> None:
    """A run failed by a limit carries a ``UsageLimitExceeded`` matching its reason and
    the limit it was given (used past it), and sent no request past a requests limit."""
    reason = result.reason or ""
    error = result.error
    if result.status is not RunStatus.FAILED or not (
        reason.startswith("usage limit:") or isinstance(error, UsageLimitExceeded)
    ):
        return
    if not isinstance(error, UsageLimitExceeded) or str(error) != reason:
        out.append(Violation("limit-reason", f"reason {reason!r} with result.error {error!r}"))
        return
    limit = getattr(limits, error.name, None)
    # A deadline is "used" up to its end; a count is used past its limit.
    past = error.used >= error.limit if error.name == "deadline" else error.used > error.limit
    if limit is None or error.limit != limit or not past:
        out.append(
            Violation(
                "limit-reason",
                f"{reason!r}: limit {error.name} is {limit!r}, used {error.used!r}",
            )
        )
    if error.name == "requests" and requests != limits.requests:
        out.append(
            Violation(
                "limit-requests",
                f"{reason!r}, but {requests} requests were sent (the limit is {limits.requests})",
            )
        )


def _check_completed_within(
    limits: UsageLimits, result: RunResult, terminal: float | None, out: list[Violation]
) -> None:
    """A completed run stayed within its token limits and its deadline."""
    usage = result.usage or Usage()
    over = [
        f"{name} {used}/{limit}"
        for name, used, limit in (
            ("output_tokens", usage.output_tokens, limits.output_tokens),
            ("total_tokens", usage.total_tokens, limits.total_tokens),
        )
        if limit is not None and used > limit
    ]
    deadline = limits.deadline
    if deadline is not None and terminal is not None and terminal > deadline + EPSILON:
        over.append(f"deadline: completed at t={terminal:g} > {limits.deadline:g}")
    if over:
        out.append(Violation("limit-completed", f"the run completed past {', '.join(over)}"))


def _check_wrap_up(pobs: PolicyObservation, out: list[Violation]) -> None:
    limits = pobs.policies.limits
    if limits is None or limits.deadline is None:
        return
    obs = pobs.observation
    wrap = None if limits.wrap_up is None else limits.deadline - limits.wrap_up
    for event, at in zip(obs.events, obs.event_times, strict=True):
        if not (
            isinstance(event, RunItemEvent)
            and isinstance(event.item, UserMessage)
            and event.item.content == WRAP_UP_MESSAGE
        ):
            continue
        if wrap is None or at < wrap - EPSILON:
            out.append(
                Violation(
                    "limit-wrap-up",
                    f"the wrap-up message arrived at t={at:g}, before deadline - wrap_up"
                    f" ({wrap!r})",
                )
            )


def _with_wrap_up(pobs: PolicyObservation) -> Observation:
    """The observation as if the harness had made the run's own wrap-up injection, so
    the lifecycle checker accounts for it like any other."""
    obs = pobs.observation
    limits = pobs.policies.limits
    if limits is None or limits.wrap_up is None or limits.deadline is None:
        return obs
    known = {inj.id for inj in obs.injections}
    delivered = [
        e.injection_id
        for e in obs.events
        if isinstance(e, InboxDelivered) and e.injection_id not in known
    ]
    message = UserMessage(WRAP_UP_MESSAGE)
    if not delivered and obs.outcome is not None and message in obs.outcome.unconsumed:
        delivered = ["(the wrap-up, never delivered)"]
    if not delivered:
        return obs
    at = limits.deadline - limits.wrap_up
    records = [InjectionRecord(id, "now", (message,), at) for id in delivered[:1]]
    injections = sorted((*obs.injections, *records), key=lambda inj: inj.at)
    return attrs.evolve(obs, injections=tuple(injections))


def _excuse_slow_guardrails(
    pobs: PolicyObservation, found: list[Violation], bound: float | None
) -> list[Violation]:
    """A run ends by itself only once its guardrails answered (a slow output or input
    guardrail legitimately holds the final answer back): ``cleanup-latency`` counts
    from the last guardrail answer, not from the model's final answer."""
    ends = [c.ended_at for c in pobs.guardrail_calls if c.ended_at is not None]
    terminal = _terminal_time(pobs)
    if not ends or terminal is None:
        return found
    limit = pobs.observation.cleanup_timeout if bound is None else bound
    if terminal - max(ends) > limit + EPSILON:
        return found
    return [v for v in found if v.invariant != "cleanup-latency"]


def check_policies(
    observation: PolicyObservation, *, max_cancel_latency: float | None = None
) -> Report:
    """Check every lifecycle invariant (:func:`~trio_agents.testing.check_run`) and
    every policy invariant of one example run with
    :func:`~trio_agents.testing.run_policy_schedule`."""
    lifecycle = _with_wrap_up(observation)
    out = list(check_run(lifecycle, max_cancel_latency=max_cancel_latency).violations)
    out = _excuse_slow_guardrails(observation, out, max_cancel_latency)
    _check_gate(observation, out)
    _check_guardrails(observation, out)
    _check_limits(observation, out)
    order = list(INVARIANTS)
    out.sort(key=lambda v: order.index(v.invariant))
    return Report(tuple(out), observation.describe())
