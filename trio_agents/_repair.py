"""The repair: what every run does after its scope is left, whatever left it.

It runs shielded, under **one deadline** (``cleanup_timeout`` from the moment the run's
scope was left) that bounds every step, the session write and the hooks included. The
steps, each guarded on its own so one that raises or blocks never skips the others
(a blocked step only uses up the shared deadline):

1. ``record_input``     — a run stopped before it began still records its input.
2. ``keep_partial_text`` — streamed text is kept as an incomplete assistant message.
3. ``close_open_calls`` — every call without a result gets a ``cancelled`` one (and
   its ``tool.finished``); thread tools see ``ctx.cancelled``. Not for a *parked* run
   (``park_after``, verdict ``awaiting_approval``): its calls, all waiting for
   approval, stay open in its session for the run resumed later — unless the session
   write below fails, which makes it a failed run, closed like any.
4. ``mark_rejected``    — what guardrails have not passed (input or answer: tripped on,
   or never finished with) is marked ``rejected_by``, never to reach a model.
5. ``return_leftovers`` — injections no turn consumed are announced and returned.
6. ``write_session``    — the repaired conversation is persisted (marks on items
   already written rewrite it, atomically).
7. ``end_hooks``        — open tool/model spans end (concurrently), then ``on_run_end``.

If step 6 fails (the session raised, or the deadline passed first), the terminal status
is ``failed`` with reason ``"session error: …"`` or ``"cleanup timed out"``: a client
must never read ``cancelled`` as "persisted" when it was not. ``result.conversation``
is valid either way.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from ._error_text import summarize
from ._events import RunStatus
from ._exceptions import GuardrailTripped
from ._inbox import Injection
from ._items import ToolResult
from ._model import Usage
from ._result import RunResult
from ._session_load import load_session
from ._state import RunState
from ._text_cleaning import clean_text
from ._toolcalls import finish_call
from ._tools import mark_cancelled
from ._turns import announce

__all__ = ["Verdict", "repair"]

logger = logging.getLogger("trio_agents")

# The share of the remaining deadline the tool/model end hooks may use, so that a
# blocking one still leaves on_run_end a chance.
_SPAN_SHARE = 0.75


@attrs.define
class Verdict:
    """How the run ends; the repair may turn it into a failure."""

    status: RunStatus
    reason: str | None
    error: BaseException | None = None
    final_output: Any = None  # str, or the parsed value with an output_type
    detail: dict[str, Any] = attrs.field(factory=dict)
    # A KeyboardInterrupt (or the like) met during the repair: raised once it is done.
    interrupt: BaseException | None = None


async def repair(
    state: RunState, verdict: Verdict, leftovers: list[Injection], deadline: float
) -> RunResult:
    """Run the repair steps under ``deadline``; return the result to publish."""
    if not state.input_committed:
        await _step("record_input", verdict, _record_input(state), deadline)
    # A step with nothing to do is not entered (no closure, no guard): in a cancelled
    # tree most nodes have no partial text, no leftovers and nothing held, and each
    # step's closure and guard cost every node of it (benchmark B8).
    if state.partial_text:
        _sync_step("keep_partial_text", verdict, state.keep_partial_text)
    else:
        state.partial_text = None
    parked = verdict.status is RunStatus.AWAITING_APPROVAL
    if not parked and (state.open_calls or state.hooks is not None):
        _sync_step("close_open_calls", verdict, lambda: _close_open_calls(state, verdict))
    if state.holds:
        _sync_step("mark_rejected", verdict, lambda: state.mark_held(_tripped(verdict)))
    if leftovers:
        _sync_step(
            "return_leftovers",
            verdict,
            lambda: announce(state, [i for i in leftovers if not i.announced]),
        )
    if state.session is not None:
        await _step("write_session", verdict, state.persist(), deadline)
    if parked and verdict.status is not RunStatus.AWAITING_APPROVAL:
        # The park could not be written: a failed run, whose open calls are closed
        # and written (again under the deadline) like any other's.
        _sync_step("close_open_calls", verdict, lambda: _close_open_calls(state, verdict))
        if state.session is not None:
            await _step("write_session", verdict, state.persist(), deadline)
    result = build_result(state, verdict, leftovers)
    if state.hooks is not None and not await _end_hooks(state, result, deadline, verdict):
        # Only hooks were cut short: the repair itself was written, the status stands.
        verdict.detail["cleanup_timed_out"] = True
    return result


def build_result(state: RunState, verdict: Verdict, leftovers: list[Injection]) -> RunResult:
    """The result of a run that ends with ``verdict``, from its state."""
    unconsumed = [*state.undelivered, *leftovers]
    # The one place a reason enters the run's record (GET /runs, A2A GetTask, ...):
    # cleaned here too, not only where each known kind of user text enters it — a
    # failure made of a guardrail's own name (GuardrailFault), say, holds it as given.
    reason = verdict.reason if verdict.reason is None else clean_text(verdict.reason)
    return RunResult(
        run_id=state.run_id,
        status=verdict.status,
        reason=reason,
        final_output=verdict.final_output if verdict.status is RunStatus.COMPLETED else None,
        new_items=tuple(state.new_items),
        conversation=tuple(state.conversation),
        usage=state.usage,
        turns=state.turn,
        unconsumed=tuple(item for injection in unconsumed for item in injection.items),
        error=verdict.error,
        finish_reason=state.finish_reason,
        tree_usage=_tree_usage(state.usage, state.usage_below),
    )


def _tree_usage(own: Usage | None, below: Usage | None) -> Usage | None:
    if own is None or below is None:
        return own if below is None else below
    return own + below


def _fail(verdict: Verdict, reason: str, error: BaseException | None) -> None:
    if verdict.reason is not None and verdict.reason != reason:
        verdict.detail.setdefault("reason_before_repair", verdict.reason)
    verdict.status, verdict.reason = RunStatus.FAILED, reason
    if error is not None:
        verdict.error = error


async def _step(name: str, verdict: Verdict, step: Awaitable[None], deadline: float) -> None:
    """Await one session step under the deadline. A step that raises or times out is
    logged and fails the verdict (the session may not hold the repair); it never stops
    the steps after it."""
    with trio.CancelScope(shield=True, deadline=deadline) as scope:
        try:
            await step
        except BaseException as exc:
            if _deadline_passed(exc):
                raise  # caught by the scope just above
            logger.exception("repair step %s failed", name)
            inner = getattr(exc, "error", exc)
            _fail(verdict, f"session error: {summarize(inner)}", inner)
            _keep_interrupt(verdict, exc)
    if scope.cancelled_caught:
        logger.error("repair step %s did not finish within cleanup_timeout", name)
        _fail(verdict, "cleanup timed out", None)


def _deadline_passed(exc: BaseException) -> bool:
    """Whether ``exc`` is the Cancelled of the repair's own (expired) deadline, rather
    than a stray one a session or hook raised by itself."""
    return isinstance(exc, trio.Cancelled) and trio.current_effective_deadline() == -math.inf


def _keep_interrupt(verdict: Verdict, exc: BaseException) -> None:
    """Remember a KeyboardInterrupt-like exception to raise once the repair is done
    (a stray ``trio.Cancelled`` is only a fault of the part that raised it)."""
    if not isinstance(exc, Exception | trio.Cancelled) and verdict.interrupt is None:
        verdict.interrupt = exc


def _sync_step(name: str, verdict: Verdict, step: Callable[[], None]) -> None:
    try:
        step()
    except Exception as exc:
        logger.exception("repair step %s failed", name)
        verdict.detail[f"{name}_error"] = summarize(exc)


async def _record_input(state: RunState) -> None:
    if state.input_committed:
        return
    if state.session is None:  # never held it (cancelled while queued): nothing to load
        state.input_committed = True
        items, state.input = state.input, ()
        for item in items:
            state.take_input(item)  # never checked by a guardrail: held like any input
        return
    await load_session(state)


def _tripped(verdict: Verdict) -> str | None:
    """The guardrail that tripped, if that is what ended the run."""
    error = verdict.error
    return error.name if isinstance(error, GuardrailTripped) else None


def _close_open_calls(state: RunState, verdict: Verdict) -> None:
    output = f"cancelled: {verdict.reason}"
    for open_call in list(state.open_calls.values()):
        # None once marked: when its call raised (_toolcalls._invoke), or never
        # started. A call whose tool is still running (a thread) is marked here.
        if open_call.ctx is not None:
            mark_cancelled(open_call.ctx)
        result = ToolResult(open_call.call.call_id, output, status="cancelled")
        finish_call(state, open_call.call, result)
    hooks = state.hooks
    if hooks is not None and "model" in state.spans:
        outcome = "failed" if verdict.status is RunStatus.FAILED else "cancelled"
        handle, turn = state.handle, state.turn
        state.spans.rebind("model", lambda: hooks.on_model_end(handle, turn, outcome))


async def _end_hooks(state: RunState, result: RunResult, deadline: float, verdict: Verdict) -> bool:
    """Step 6: end the open spans concurrently, then ``on_run_end``; all bounded.

    Returns False if a hook was cut short by the deadline."""
    hooks = state.hooks
    if hooks is None:
        return True
    in_time = True
    ends = state.spans.pop_all()
    if ends:
        remaining = max(0.0, deadline - trio.current_time())
        bound = trio.current_time() + _SPAN_SHARE * remaining
        with trio.CancelScope(shield=True, deadline=bound) as scope:
            async with trio.open_nursery() as nursery:
                for end in ends:
                    nursery.start_soon(_guarded, "end hook", end, verdict)
        in_time = not scope.cancelled_caught
    if state.run_span_open:
        state.run_span_open = False
        with trio.CancelScope(shield=True, deadline=deadline) as scope:
            await _guarded("on_run_end", lambda: hooks.on_run_end(state.handle, result), verdict)
        in_time = in_time and not scope.cancelled_caught
    return in_time


async def _guarded(name: str, hook: Callable[[], Awaitable[None]], verdict: Verdict) -> None:
    try:
        await hook()
    except BaseException as exc:
        if _deadline_passed(exc):
            raise  # caught by the deadline's own scope
        logger.exception("%s failed during the repair", name)
        verdict.detail.setdefault("hook_errors", []).append(f"{name}: {summarize(exc)}")
        _keep_interrupt(verdict, exc)
