"""A small client API (asyncio): start a run as a workflow, steer it, wait for it.

Enough for tests and scripts until the ``TemporalHost`` (a ``RunHost`` over every face)
is built. Items are given as ``Item`` objects or their JSON dicts.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError, RPCStatusCode

from .._items import Item, coerce_items
from ._trio_worker import DEFAULT_TASK_QUEUE
from ._types import (
    PARKED,
    UPDATE_APPROVE,
    UPDATE_CANCEL,
    UPDATE_INJECT,
    UPDATE_REJECT,
    UPDATE_WITHDRAW,
    WORKFLOW_NAME,
    OpAnswer,
    RunOutcome,
    RunRequest,
)

__all__ = [
    "approve_call",
    "cancel_run",
    "inject_run",
    "reject_call",
    "run_result",
    "start_run",
    "withdraw_run",
]


async def start_run(
    client: Client,
    agent: str,
    input: str | Sequence[Item | dict[str, Any]],
    *,
    run_id: str | None = None,
    session_id: str | None = None,
    principal: str = "temporal",
    task_queue: str = DEFAULT_TASK_QUEUE,
    heartbeat_timeout: float = 2.0,
    options: dict[str, Any] | None = None,
    park_after: float | None = None,
    approval_deadline: float | None = None,
) -> WorkflowHandle[Any, RunOutcome]:
    """Start a run of ``agent`` as a workflow (id = the run id); returns its handle.

    ``options`` are JSON-able ``open_run`` options (``max_turns``, ``cleanup_timeout``,
    ...). The input is validated here, so a malformed item is a ``TypeError`` /
    ``ValueError`` before anything is started. ``park_after`` and
    ``approval_deadline``: see :class:`RunRequest` (a run with a session waiting for
    approval frees its worker after ``park_after`` seconds; its waiting calls are
    rejected ``approval_deadline`` seconds after that, unless decided).
    """
    for name, value in (("park_after", park_after), ("approval_deadline", approval_deadline)):
        if value is not None and (isinstance(value, bool) or not value >= 0):
            raise ValueError(f"{name} must be a number of seconds >= 0 or None, not {value!r}")
    items = [item.to_json() for item in coerce_items(input)]
    request = RunRequest(
        run_id=run_id or f"r{uuid.uuid4().hex}",
        agent=agent,
        input=items,
        session_id=session_id,
        principal=principal,
        options=dict(options or {}),
        heartbeat_timeout=heartbeat_timeout,
        park_after=park_after,
        approval_deadline=approval_deadline,
    )
    return await client.start_workflow(
        WORKFLOW_NAME,
        request,
        id=request.run_id,
        task_queue=task_queue,
        result_type=RunOutcome,
    )


async def cancel_run(client: Client, run_id: str, reason: str | None = None) -> OpAnswer:
    """Cancel a run with ``reason``; the workflow then ends CANCELED.

    First a Temporal cancel carrying the reason (only a workflow Temporal was asked to
    cancel can end CANCELED, and an attempt that learns of it through its heartbeat
    reads the reason from the workflow), then the ``cancel`` update, which records the
    reason in the history and pushes it to the attempt at once, answering with the
    run's real answer. The other order would race: a run the push ends quickly would
    complete its workflow before Temporal's cancel arrived.
    """
    handle = client.get_workflow_handle(run_id)
    closed = await _closed_as(handle)
    if closed is not None:
        return closed
    await handle.cancel(reason=reason or "")
    try:
        answer: OpAnswer = await handle.execute_update(UPDATE_CANCEL, reason, result_type=OpAnswer)
    except (RPCError, WorkflowUpdateFailedError):
        # The workflow closed between the two: CANCELED if Temporal's cancel reached the
        # run first, else the run had ended on its own.
        return await _closed_as(handle) or OpAnswer(ok=True)
    return answer


async def _closed_as(handle: WorkflowHandle[Any, Any]) -> OpAnswer | None:
    """None while the run's workflow runs; else the answer an op on it gets (Temporal
    accepts a cancel of a closed workflow silently, so this asks first)."""
    try:
        status = (await handle.describe()).status
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        return OpAnswer(ok=False, code="not_found", message=f"no run {handle.id!r}")
    if status == WorkflowExecutionStatus.RUNNING:
        return None
    if status == WorkflowExecutionStatus.CANCELED:
        return OpAnswer(ok=True, message="the run was cancelled")
    return OpAnswer(ok=False, code="run_closed", message="the run has ended")


async def inject_run(
    client: Client,
    run_id: str,
    items: str | Sequence[Item | dict[str, Any]],
    *,
    when: str = "next_turn",
) -> OpAnswer:
    """Inject ``items`` into a run (recorded, then pushed); the run's answer."""
    payload = [item.to_json() for item in coerce_items(items)]
    handle = client.get_workflow_handle(run_id)
    answer: OpAnswer = await handle.execute_update(
        UPDATE_INJECT, args=[payload, when], result_type=OpAnswer
    )
    return answer


async def withdraw_run(client: Client, run_id: str, injection_id: str) -> OpAnswer:
    """Take back an injection not yet delivered (``answer.withdrawn`` says whether)."""
    answer: OpAnswer = await client.get_workflow_handle(run_id).execute_update(
        UPDATE_WITHDRAW, injection_id, result_type=OpAnswer
    )
    return answer


async def approve_call(
    client: Client, run_id: str, call_id: str, *, content: Mapping[str, Any] | None = None
) -> OpAnswer:
    """Let the run's call waiting for approval run (``not_found``: no such call waits).

    ``content``: the answer to a question a running call asks
    (``ToolContext.request_approval(schema=...)``; ``call_id`` is then the question's
    id), a JSON object matching its schema: the run answers ``invalid_request`` (nothing
    decided) when it does not match, or when the call asked for none. A ``content``
    that is not a JSON object raises ``TypeError`` here, before anything is recorded.
    """
    args: list[Any] = [call_id]
    if content is not None:
        if not isinstance(content, Mapping):
            raise TypeError(f"content must be a mapping or None, not {type(content).__name__}")
        try:
            args.append(json.loads(json.dumps(dict(content), allow_nan=False)))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"content must be JSON-serialisable: {exc}") from None
    # Without content, one argument: what a worker from before ``content`` takes too.
    answer: OpAnswer = await client.get_workflow_handle(run_id).execute_update(
        UPDATE_APPROVE, args=args, result_type=OpAnswer
    )
    return answer


async def reject_call(
    client: Client, run_id: str, call_id: str, *, message: str | None = None
) -> OpAnswer:
    """Refuse the run's call waiting for approval; the model reads ``message``."""
    answer: OpAnswer = await client.get_workflow_handle(run_id).execute_update(
        UPDATE_REJECT, args=[call_id, message], result_type=OpAnswer
    )
    return answer


async def run_result(client: Client, run_id: str) -> RunOutcome:
    """Wait for the run's workflow to close; the run's terminal outcome, whatever the
    workflow's Temporal status (COMPLETED, FAILED for a failed run, CANCELED)."""
    handle = client.get_workflow_handle(run_id, result_type=RunOutcome)
    try:
        outcome: RunOutcome = await handle.result()
        return outcome
    except WorkflowFailureError as exc:
        cause = exc.cause
        if isinstance(cause, ApplicationError) and cause.type == "RunFailed" and cause.details:
            return _outcome(cause.details[0])
        if isinstance(cause, CancelledError):
            return await _recorded_outcome(client, handle)
        raise


def _outcome(value: Any) -> RunOutcome:
    if isinstance(value, RunOutcome):
        return value
    fields = {field.name for field in dataclasses.fields(RunOutcome)}
    return RunOutcome(**{key: val for key, val in dict(value).items() if key in fields})


async def _recorded_outcome(client: Client, handle: WorkflowHandle[Any, Any]) -> RunOutcome:
    """A CANCELED workflow's outcome: the last attempt's completion in the history (not
    a parked attempt's: a parked run's next attempt ended it)."""
    ended: RunOutcome | None = None
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_completed_event_attributes"):
            payloads = event.activity_task_completed_event_attributes.result.payloads
            values = await client.data_converter.decode(payloads, [RunOutcome])
            outcome = _outcome(values[0])
            if outcome.status != PARKED:
                ended = outcome
        if event.HasField("workflow_execution_canceled_event_attributes"):
            break
    if ended is not None:
        return ended
    # Cancelled before any attempt ran: the workflow's memo holds the outcome's status.
    memo = await (await handle.describe()).memo()
    if memo.get("status") == "cancelled":
        return RunOutcome(handle.id, "cancelled", memo.get("reason"), None, attempt=0)
    raise LookupError(f"run {handle.id}: the workflow was cancelled before any attempt ended")
