"""The checks of a run's session: what it stores, that a failed write fails the run,
that it is released, and that the next run on it loads it whole (and is sent nothing
a guardrail rejected)."""

from __future__ import annotations

import collections
from collections.abc import Sequence

from .. import Item, RunResult, RunStatus, UserMessage, conversation_problems
from ._event_checks import sendable, unmarked
from ._invariants import Found, Violation
from ._observation import FRESH_INPUT, FreshRun, Observation
from ._run_checks import failure_before

__all__ = ["check_session"]


SESSION_REASONS = ("session error:", "cleanup timed out")


def _is_session_reason(reason: str | None) -> bool:
    return reason is not None and (
        reason.startswith(SESSION_REASONS[0]) or reason == SESSION_REASONS[1]
    )


def check_session(obs: Observation, out: Found) -> None:
    """What the session holds after the run, what its failures did to the run, and the
    next run on it."""
    stored, result = obs.stored, obs.outcome
    if stored is None:
        return
    if result is not None:
        persisted = _check_stored(obs, stored, result, out)
        _check_session_error(obs, result, persisted, out)
    if obs.fresh_run is not None:
        _check_next_run(obs.fresh_run, out)


def _check_stored(
    obs: Observation, stored: tuple[Item, ...], result: RunResult, out: Found
) -> bool:
    """The session holds a prefix of the conversation, all of it before ``on_run_end``;
    returns whether it holds all of it."""
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
    return persisted


def _check_session_error(obs: Observation, result: RunResult, persisted: bool, out: Found) -> None:
    """A run whose conversation could not be loaded or stored says so: it failed, with
    a session reason (unless something else failed it first)."""
    gets = [c for c in obs.session_calls if c.method == "get_items"]
    adds = [c for c in obs.session_calls if c.method == "add_items"]
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
    if problem is None:
        return
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
        and not (failure_before(obs, first))
    ):
        out.append(
            Violation(
                "session-error",
                f"{problem}; the run failed with {result.reason!r}, not"
                " 'session error: …' or 'cleanup timed out'",
            )
        )


def _check_next_run(fresh: FreshRun, out: Found) -> None:
    """The next run on the session starts and completes, loads what the session holds
    (repaired, without what a guardrail rejected), and leaves it valid."""
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
            sendable(fresh.stored_before), fresh.request
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


def _check_rejected_unsent(stored: Sequence[Item], request: Sequence[Item], out: Found) -> None:
    """The next run on a session is sent no item it holds marked ``rejected_by``: a
    request item equal to a rejected one (without its mark) is one only beyond the
    copies of it the session holds unmarked, and the next run's own input."""
    rejected = {unmarked(item) for item in stored if item.rejected_by is not None}
    if not rejected:
        return
    allowed = collections.Counter([*sendable(stored), UserMessage(FRESH_INPUT)])
    for item in request:
        if item in rejected and not allowed[item]:
            out.append(Violation("rejected-unsent", f"the next run was sent {item!r}"))
            return
        allowed[item] -= 1


def _subsequence(part: Sequence[Item], whole: Sequence[Item]) -> bool:
    remaining = iter(whole)
    return all(any(item == other for other in remaining) for item in part)
