"""The checks of one observed run (an :class:`~trio_agents.testing.Observation`):
tool cancellation, injections, the model, subscribers, cancels and cleanup latency,
hooks, leaks, and that everything ends. :func:`~trio_agents.testing.check_run`
applies them to a run, and to every run of a tree."""

from __future__ import annotations

from collections.abc import Sequence

from .. import (
    AssistantMessage,
    InboxDelivered,
    InboxInjected,
    Item,
    RunChild,
    RunEvent,
    RunItemEvent,
    RunResult,
    RunStatus,
    RunUpdated,
    ToolFinished,
    ToolStarted,
    conversation_problems,
)
from .._text_cleaning import clean_text
from ._event_checks import sendable, unmarked
from ._faults import MALFORMED, START_HOOKS, SWALLOWING, HookCall
from ._invariants import EPSILON, Found, Violation
from ._observation import Observation

__all__ = [
    "check_cancels",
    "check_ends",
    "check_hooks",
    "check_injections",
    "check_leaks",
    "check_model",
    "check_subscribers",
    "check_tool_cancellation",
    "failure_before",
]


def check_tool_cancellation(
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


def check_injections(obs: Observation, result: RunResult, out: Found) -> None:
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
    new_items = [unmarked(item) for item in result.new_items]
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


def check_model(obs: Observation, out: Found) -> None:
    """What the run sent its model, what it made of the model's faults, and that no
    stream is left open."""
    _check_requests(obs, out)
    _check_stream_faults(obs, out)
    if obs.open_streams:
        out.append(Violation("model-streams-closed", f"{obs.open_streams} stream(s) left open"))


def _check_requests(obs: Observation, out: Found) -> None:
    """Every request is valid model input and a prefix of what the run sent in the end."""
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


def _check_stream_faults(obs: Observation, out: Found) -> None:
    """The first model fault that fired decides the run: a broken stream fails it (a
    malformed one with a ModelError reason); a stream that swallowed its cancellation
    never has its cut-off text kept as a complete answer."""
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


def _sent_of(result: RunResult) -> tuple[Item, ...]:
    """What the run's requests are prefixes of: its history without the items rejected
    before it (never sent), then its new items as they were committed (the marks this
    run's end put on come after every request)."""
    history = result.conversation[: len(result.conversation) - len(result.new_items)]
    return (*sendable(history), *map(unmarked, result.new_items))


def check_subscribers(obs: Observation, out: Found) -> None:
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


def check_cancels(obs: Observation, max_latency: float, out: Found) -> None:
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


def check_hooks(obs: Observation, out: Found) -> None:
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
            call.at < cut and not failure_before(obs, call.at, obs.hook_calls[:index])
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


def failure_before(
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


def check_leaks(obs: Observation, out: Found) -> None:
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


def check_ends(obs: Observation, out: Found) -> None:
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
