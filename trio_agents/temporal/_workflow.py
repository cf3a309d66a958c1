"""The run's workflow: its history holds the start request, the steering ops and the
terminal result; the run itself is an activity attempt on a worker.

Deterministic plain code: it imports neither trio nor the run core (Temporal's workflow
sandbox refuses a module that imports trio; the workers run this workflow unsandboxed,
for speed, but a replayer may sandbox it): only :mod:`._types`' plain data, and the
activities by name.

Statuses: a run that completes ends the workflow COMPLETED with its
:class:`RunOutcome`; one that fails on its own ends it FAILED (an ``ApplicationError``
of type ``"RunFailed"`` carrying the outcome); a cancel from Temporal (CLI, UI, a
client's ``cancel()``) waits for the attempt's repaired result, records it, then ends
the workflow CANCELED. A cancel through the ``cancel`` update alone ends the run
``cancelled`` and the workflow COMPLETED with that outcome (Temporal cannot mark a
workflow CANCELED that nobody asked Temporal to cancel); :func:`cancel_run` sends the
update *and* a Temporal cancel, so the workflow ends CANCELED with the reason kept.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from ._types import (
        ACTIVITY_ATTEMPT,
        ACTIVITY_PUSH,
        CANCELLED_BY_TEMPORAL,
        PARKED,
        SIGNAL_CANCEL_REASON,
        UPDATE_APPROVE,
        UPDATE_ATTEMPT_STARTED,
        UPDATE_CALL_STARTED,
        UPDATE_CANCEL,
        UPDATE_INJECT,
        UPDATE_REJECT,
        UPDATE_STEER,
        UPDATE_WITHDRAW,
        WORKFLOW_NAME,
        AttemptStarted,
        CallStarted,
        Catchup,
        OpAnswer,
        RunOutcome,
        RunRequest,
        SteeringOp,
    )

__all__ = ["RunWorkflow"]

# How long an update waits for an attempt to announce itself before it answers with
# the op recorded but not yet delivered: the attempt then catches up from the history.
_ANNOUNCE_WAIT = timedelta(seconds=10)
# An attempt may run for as long as the run does; a lost one is found by its heartbeat.
_START_TO_CLOSE = timedelta(days=7)
_PUSH_TIMEOUT = timedelta(seconds=10)
# Versioning (docs/temporal.md, "Upgrading workers"): a change to the commands the
# workflow issues goes behind ``workflow.patched(ID)``, so that runs opened by older
# workers replay on newer ones (tests/temporal/test_temporal_replay.py replays the
# histories each release recorded). Never reuse or rename an ID.
#
# A push the attempt did not take waits for the next attempt, the park or the end (a
# timer), then pushes again there; before it, the push answered "pending" at once.
_PATCH_PUSH_WAITS = "push-waits-for-the-next-attempt"


def _parked_answer() -> OpAnswer:
    return OpAnswer(
        ok=True, pending=True, message="recorded; the run is parked: the next attempt applies it"
    )


@workflow.defn(name=WORKFLOW_NAME)
class RunWorkflow:
    """One run: schedules its attempt, records steering ops and the terminal result."""

    def __init__(self) -> None:
        self._ops: list[SteeringOp] = []
        self._answers: dict[int, OpAnswer] = {}
        self._pushing: set[int] = set()
        self._address: str | None = None
        self._attempt = 0
        self._started_calls: list[str] = []
        self._last_seq = 0
        self._outcome: RunOutcome | None = None
        # While the run is parked: the calls it left awaiting approval.
        self._parked: list[str] | None = None
        self._base = 0  # attempts of the earlier (parked) activities
        self._caught_up: list[int] = []  # the ops the latest attempt's catch-up held
        self._asked_reason: str | None = None

    @workflow.run
    async def run(self, request: RunRequest) -> RunOutcome:
        while True:
            outcome = await self._attempt_run(request)
            if outcome.status != PARKED:
                break
            # The attempt parked at an approval wait: no worker holds the run now.
            await self._wait_for_decision(request, outcome)
        self._outcome = outcome
        workflow.upsert_memo({"status": outcome.status, "reason": outcome.reason})
        if outcome.status == "cancelled" and workflow.cancellation_reason() is not None:
            # Temporal was asked to cancel the workflow: the attempt's repaired result is
            # recorded above (its completion event, the memo), now the workflow says so.
            raise asyncio.CancelledError(outcome.reason)
        if outcome.status == "failed":
            raise ApplicationError(
                outcome.reason or "run failed", outcome, type="RunFailed", non_retryable=True
            )
        return outcome

    async def _attempt_run(self, request: RunRequest) -> RunOutcome:
        """One activity of the run (retried by Temporal when an attempt is lost): its
        outcome, terminal or ``parked``."""
        handle = workflow.start_activity(
            ACTIVITY_ATTEMPT,
            request,
            result_type=RunOutcome,
            start_to_close_timeout=_START_TO_CLOSE,
            heartbeat_timeout=timedelta(seconds=request.heartbeat_timeout),
            # Only a lost attempt (its heartbeat timed out) is retried: the attempt
            # returns a run that failed or was cancelled as a result, and reports its own
            # errors (unknown agent, unreadable session) as non-retryable.
            retry_policy=RetryPolicy(
                initial_interval=timedelta(seconds=request.retry_interval),
                backoff_coefficient=1.0,
            ),
            # A cancel waits for the attempt to return its repaired result: an activity
            # that raised on cancel would leave the canceled event without it.
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        try:
            outcome: RunOutcome = await handle
        except ActivityError as exc:
            if not (
                isinstance(exc.cause, CancelledError) and workflow.cancellation_reason() is not None
            ):
                raise
            # Cancelled before any attempt ran the run (none had started, or it was still
            # announcing itself): nothing to repair, the session is untouched.
            outcome = RunOutcome(
                run_id=request.run_id,
                status="cancelled",
                reason=self._cancel_reason() or CANCELLED_BY_TEMPORAL,
                final_output=None,
                attempt=0,
            )
        return outcome

    async def _wait_for_decision(self, request: RunRequest, parked: RunOutcome) -> None:
        """A parked run: wait durably (no attempt, no worker) until a decision on one of
        its calls or a cancel is recorded — or its approval deadline passes (a Temporal
        timer: each call still waiting is rejected) — then the next attempt resumes the
        run and applies them from its catch-up."""
        self._parked = list(parked.pending)
        for index in self._caught_up:
            # The attempt parked, so it ended cleanly with an empty inbox: every inject
            # its catch-up held was delivered. Answered now, or the next attempt's
            # catch-up would deliver it again (decisions are kept: one on a call still
            # waiting is for the next attempt, and one already applied is harmless).
            if self._ops[index].op in ("inject", "withdraw") and index not in self._answers:
                self._answers[index] = OpAnswer(ok=True, message="applied from a catch-up")
        self._address = None  # nothing to push to: ops answer pending, for the next one
        self._last_seq = max(self._last_seq, parked.last_seq)
        self._base = self._attempt  # the next activity's attempts count on from here
        waiting = set(parked.pending)

        def decided() -> bool:
            # Every op no attempt applied counts, those recorded before the park too (an
            # approve pushed to the attempt as it parked answered "pending").
            return any(
                op.op == "cancel" or (op.op in ("approve", "reject") and op.target in waiting)
                for op in self._ops
                if op.index not in self._answers and op.node is None
            )

        deadline = request.approval_deadline
        try:
            await workflow.wait_condition(
                decided, timeout=None if deadline is None else timedelta(seconds=deadline)
            )
        except TimeoutError:
            assert deadline is not None
            message = f"no decision within {deadline:g} s"
            for call_id in parked.pending:
                self._record(SteeringOp(op="reject", target=call_id, reason=message))
        except asyncio.CancelledError:
            # Temporal cancels the parked run: the next attempt applies the cancel before
            # any model call, and its repair closes the waiting calls (then CANCELED).
            reason = self._cancel_reason() or CANCELLED_BY_TEMPORAL
            self._record(SteeringOp(op="cancel", reason=reason))
        self._parked = None

    def _is_parked(self) -> bool:
        # A method, not the attribute: it changes while an update handler awaits.
        return self._parked is not None

    def _record(self, op: SteeringOp) -> None:
        """Record ``op`` in the workflow's list (its index set): applied by an attempt."""
        op.index = len(self._ops)
        self._ops.append(op)

    @workflow.update(name=UPDATE_CANCEL)
    async def cancel(self, reason: str | None) -> OpAnswer:
        """Cancel the run with ``reason``: recorded, then pushed to the attempt."""
        return await self._steer(SteeringOp(op="cancel", reason=reason))

    @workflow.update(name=UPDATE_INJECT)
    async def inject(self, items: list[dict[str, Any]], when: str) -> OpAnswer:
        """Inject ``items`` into the run: recorded, then pushed to the attempt."""
        return await self._steer(SteeringOp(op="inject", items=items, when=when))

    @workflow.update(name=UPDATE_WITHDRAW)
    async def withdraw(self, injection_id: str) -> OpAnswer:
        """Take back an injection not yet delivered: recorded, then pushed."""
        return await self._steer(SteeringOp(op="withdraw", target=injection_id))

    @workflow.update(name=UPDATE_APPROVE)
    async def approve(self, call_id: str, content: dict[str, Any] | None = None) -> OpAnswer:
        """Let a call waiting for approval run, or answer a question a running call
        asks (``content``: its answer, a JSON object matching the question's schema):
        recorded, then pushed. ``content`` is an optional second argument, so an
        approve recorded before it existed (one argument) replays the same."""
        return await self._steer(SteeringOp(op="approve", target=call_id, content=content))

    @workflow.update(name=UPDATE_REJECT)
    async def reject(self, call_id: str, message: str | None) -> OpAnswer:
        """Refuse a call waiting for approval: recorded, then pushed."""
        return await self._steer(SteeringOp(op="reject", target=call_id, reason=message))

    @workflow.signal(name=SIGNAL_CANCEL_REASON)
    def cancel_reason(self, reason: str) -> None:
        """The reason of the Temporal cancel that follows (a host sends it first: a
        Temporal cancel does not carry its reason to the workflow)."""
        self._asked_reason = reason

    @workflow.update(name=UPDATE_STEER)
    async def steer(self, op: SteeringOp) -> OpAnswer:
        """Any steering op, for any run of the tree (``op.node``): what a
        :class:`~trio_agents.temporal.TemporalHost` sends. Recorded, then pushed."""
        return await self._steer(op)

    async def _steer(self, op: SteeringOp) -> OpAnswer:
        # Recording comes first: the update's acceptance is in the history from here on,
        # so an attempt started later applies the op from its catch-up.
        self._record(op)
        if self._outcome is not None:
            return OpAnswer(ok=False, code="run_closed", message="the run has ended")
        if self._parked is not None:
            # No attempt holds the run: the next one applies the op (a decision on a
            # parked call, or a cancel, starts it: _wait_for_decision).
            return _parked_answer()
        # While this handler pushes the op, a starting attempt's catch-up leaves it out:
        # applied once, by the push, whose answer is the attempt's own.
        self._pushing.add(op.index)
        try:
            answer = await self._push(op)
        finally:
            self._pushing.discard(op.index)
        if not answer.ok and self._is_parked():
            # Refused by an attempt that was parking as the push reached it (or had
            # gone): not applied, so the next attempt applies it.
            return _parked_answer()
        if not answer.pending:
            # Applied (or refused) by an attempt: a later attempt does not apply it again.
            self._answers[op.index] = answer
        return answer

    async def _push(self, op: SteeringOp) -> OpAnswer:
        """Push ``op`` to the attempt that announced itself last (waiting for one)."""
        while True:
            try:
                await workflow.wait_condition(
                    lambda: self._address is not None or self._outcome is not None,
                    timeout=_ANNOUNCE_WAIT,
                )
            except TimeoutError:
                return OpAnswer(ok=True, pending=True, message="recorded; no attempt running")
            if self._is_parked():
                return _parked_answer()
            address = self._address
            if self._outcome is not None or address is None:
                # Ended: the last attempt's address stays set, but nothing runs there.
                return OpAnswer(ok=False, code="run_closed", message="the run has ended")
            answer: OpAnswer = await workflow.execute_local_activity(
                ACTIVITY_PUSH,
                args=[address, workflow.info().workflow_id, op],
                result_type=OpAnswer,
                start_to_close_timeout=_PUSH_TIMEOUT,
                # The push answers even when the attempt's worker is gone (pending): a
                # retry would only push to the same dead address again.
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
            if not answer.pending:
                return answer
            if not workflow.patched(_PATCH_PUSH_WAITS):
                # A run started by a worker before this wait (its history holds none):
                # as that worker's code did, answer the push's "pending", unless another
                # attempt announced itself meanwhile (the next attempt's catch-up then
                # applies the op).
                if self._address != address and self._outcome is None:
                    continue
                return answer
            # The attempt at that address did not take the op: its worker is gone, or
            # it has just ended or parked (its result is on its way here). Wait for the
            # next attempt, the park or the run's end, then answer from there (the
            # op stays out of a new attempt's catch-up meanwhile: it is being pushed).
            try:
                await workflow.wait_condition(self._moved_from(address), timeout=_ANNOUNCE_WAIT)
            except TimeoutError:
                return answer

    def _moved_from(self, address: str) -> Callable[[], bool]:
        """Whether the run is no longer at ``address``: another attempt announced
        itself, the run parked, or it ended."""
        return lambda: self._address != address or self._outcome is not None or self._is_parked()

    @workflow.update(name=UPDATE_ATTEMPT_STARTED)
    def attempt_started(self, started: AttemptStarted) -> Catchup:
        """An attempt announces where it takes pushed ops; it gets the ops recorded so
        far and what earlier attempts recorded (calls started, the last seq)."""
        self._address = started.address
        # The run's count: a parked run's next attempt is a new activity (whose own
        # count starts at 1 again).
        self._attempt = self._base + started.attempt
        # Ops an earlier attempt already answered were applied there; an op with no
        # answer may never have reached any attempt.
        pending = [
            op
            for op in self._ops
            if op.index not in self._answers and op.index not in self._pushing
        ]
        self._caught_up = [op.index for op in pending]
        return Catchup(
            ops=pending,
            started_calls=list(self._started_calls),
            next_seq=self._last_seq + 1,
            attempt=self._attempt,
        )

    @workflow.update(name=UPDATE_CALL_STARTED)
    def call_started(self, call: CallStarted) -> None:
        """The attempt's ``before_tool`` barrier: the call is recorded before it runs."""
        self._started_calls.append(call.call_id)
        self._last_seq = max(self._last_seq, call.seq)

    @workflow.query(name="status")
    def status(self) -> dict[str, Any]:
        """Where the run stands: its outcome once ended, the attempt, the ops recorded."""
        outcome = self._outcome
        return {
            "status": outcome.status if outcome else "running",
            "reason": outcome.reason if outcome else None,
            "attempt": self._attempt,
            "ops": len(self._ops),
            # Parked at an approval wait (no worker holds it): the calls awaiting it.
            "parked": list(self._parked) if self._parked is not None else None,
            # A cancel from Temporal carries its reason here only: an attempt reads it
            # when the cancel reaches it through its heartbeat ("" or None: no reason).
            "cancel_reason": self._cancel_reason(),
        }

    def _cancel_reason(self) -> str | None:
        """The reason of Temporal's cancel; else that of the latest ``cancel`` op recorded
        for the root (a Temporal cancel's own reason may not reach the workflow: the
        ``temporal`` CLI sends none, and a client's is not always delivered)."""
        reason = workflow.cancellation_reason()
        if reason:
            return reason
        if self._asked_reason:
            return self._asked_reason
        for op in reversed(self._ops):
            if op.op == "cancel" and op.node is None and op.reason:
                return op.reason
        return reason
