"""Runs as Temporal workflows on real worker processes (``python -m trio_agents worker``)
against a real dev server: completion, cancel from the ``temporal`` CLI and through the
workflow update, a lost worker's attempt retried elsewhere, a failed run not retried.

The client side is asyncio (``temporalio``), so these tests are sync functions that run
their client steps with ``asyncio.run``. Every wait is bounded (a hang guard); none
measures time.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError

from tests.support.temporal_support import Workers, temporal_cli
from trio_agents.sessions import SQLiteSession
from trio_agents.temporal import (
    CANCELLED_BY_TEMPORAL,
    OpAnswer,
    RunOutcome,
    approve_call,
    cancel_run,
    inject_run,
    run_result,
    start_run,
)

BOUND = 90.0  # hang guard per wait: a loaded 2-core box is slow, never this slow


def _stored(db: Path, session_id: str, principal: str = "temporal") -> list[dict[str, Any]]:
    """The items the session holds (as JSON), read back through a new ``SQLiteSession``
    on the file every worker shares, as the next run on the session would see them."""

    async def read() -> list[dict[str, Any]]:
        async with SQLiteSession(db, json.dumps([principal, session_id])) as session:
            return [item.to_json() for item in await session.get_items()]

    return trio.run(read)


def _start_blocked(group: Workers, run_id: str, **options: Any) -> str:
    """Start the "rules" agent on "block" (its tool blocks until cancelled) as workflow
    ``run_id`` and wait until the tool has started; what the tool marked (its worker's
    pid)."""

    async def start() -> None:
        client = await Client.connect(group.target)
        await start_run(
            client, "rules", "block", run_id=run_id, task_queue=group.task_queue, **options
        )

    asyncio.run(start())
    return group.wait_for(group.marks / f"{run_id}.started", "the tool's start")


async def _outcome(client: Client, run_id: str) -> RunOutcome:
    return await asyncio.wait_for(run_result(client, run_id), BOUND)


async def _status(client: Client, run_id: str) -> WorkflowExecutionStatus | None:
    return (await client.get_workflow_handle(run_id).describe()).status


def test_run_completes_on_a_worker(workers: Callable[[int], Workers]) -> None:
    group = workers(1)

    async def main() -> tuple[RunOutcome, WorkflowExecutionStatus | None]:
        client = await Client.connect(group.target)
        handle = await start_run(
            client, "rules", "hello", session_id="s1", task_queue=group.task_queue
        )
        outcome = await _outcome(client, handle.id)
        late = await cancel_run(client, handle.id, "too late")
        assert (late.ok, late.code) == (False, "run_closed")
        # The history holds the request, the attempt's announcement and its result:
        # no event of the run (no text delta, no status update) is ever written there.
        history = [event async for event in handle.fetch_history_events()]
        assert not [event for event in history if b"response.text.delta" in str(event).encode()]
        assert [event for event in history if b"echo: hello" in event.SerializeToString()]
        return outcome, await _status(client, handle.id)

    outcome, status = asyncio.run(main())
    assert (outcome.status, outcome.reason, outcome.attempt) == ("completed", None, 1)
    assert outcome.final_output == "echo: hello"
    assert status == WorkflowExecutionStatus.COMPLETED
    stored = _stored(group.db, "s1")
    assert [item.get("content") for item in stored] == ["hello", "echo: hello"]


def _cli_cancel(target: str, run_id: str) -> None:
    subprocess.run(
        [temporal_cli(), "workflow", "cancel", "--address", target, "-w", run_id],
        check=True,
        capture_output=True,
        timeout=BOUND,
    )


def test_cancel_from_the_temporal_cli_ends_canceled_after_the_repair(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(1)
    run_id = f"r{uuid.uuid4().hex}"

    _start_blocked(group, run_id, session_id="s-cli", heartbeat_timeout=1.0)
    _cli_cancel(group.target, run_id)

    async def finish() -> tuple[RunOutcome, WorkflowExecutionStatus | None]:
        client = await Client.connect(group.target)
        outcome = await _outcome(client, run_id)
        return outcome, await _status(client, run_id)

    outcome, status = asyncio.run(finish())
    assert status == WorkflowExecutionStatus.CANCELED
    assert (outcome.status, outcome.reason) == ("cancelled", CANCELLED_BY_TEMPORAL)
    # The workflow closed CANCELED only after the attempt returned: by then the session
    # holds the repaired conversation (the blocked call closed as cancelled).
    stored = _stored(group.db, "s-cli")
    assert [item["type"] for item in stored[1:]] == ["function_call", "function_call_output"]
    assert stored[-1]["status"] == "cancelled"
    assert stored[-1]["output"] == f"cancelled: {CANCELLED_BY_TEMPORAL}"


def test_cancel_through_the_update_keeps_its_reason(workers: Callable[[int], Workers]) -> None:
    group = workers(1)
    run_id = f"r{uuid.uuid4().hex}"

    _start_blocked(group, run_id, session_id="s-upd")

    async def cancel() -> tuple[Any, RunOutcome, WorkflowExecutionStatus | None]:
        client = await Client.connect(group.target)
        answer = await cancel_run(client, run_id, "user pressed stop")
        outcome = await _outcome(client, run_id)
        return answer, outcome, await _status(client, run_id)

    answer, outcome, status = asyncio.run(cancel())
    assert answer.ok
    assert status == WorkflowExecutionStatus.CANCELED
    assert (outcome.status, outcome.reason) == ("cancelled", "user pressed stop")
    stored = _stored(group.db, "s-upd")
    assert stored[-1]["output"] == "cancelled: user pressed stop"


def test_a_lost_worker_s_attempt_is_retried_on_another(workers: Callable[[int], Workers]) -> None:
    group = workers(2)
    run_id = f"r{uuid.uuid4().hex}"

    pid = int(_start_blocked(group, run_id, session_id="s-kill", heartbeat_timeout=1.0))
    group.by_pid(pid).send_signal(signal.SIGKILL)
    outcome = asyncio.run(_finish(group.target, run_id))
    assert (outcome.status, outcome.attempt) == ("completed", 2), group.logs()
    # The second attempt resumed from the session: the call the lost attempt had started
    # (recorded in the workflow's history before the tool ran) is not run again (the
    # tool is not idempotent): it gets an "interrupted" error result for the model.
    stored = _stored(group.db, "s-kill")
    assert [item.get("content") for item in stored if item.get("role") == "user"] == ["block"]
    results = [item for item in stored if item["type"] == "function_call_output"]
    assert len(results) == 1
    assert results[0]["status"] == "error"
    assert results[0]["output"].startswith("interrupted:")
    assert outcome.final_output == f"done: {results[0]['output']}"
    assert outcome.first_seq > 1  # seqs continue after what the lost attempt recorded


async def _finish(target: str, run_id: str) -> RunOutcome:
    client = await Client.connect(target)
    return await _outcome(client, run_id)


def test_a_run_that_fails_on_its_own_is_not_retried(workers: Callable[[int], Workers]) -> None:
    group = workers(1)

    async def main() -> tuple[RunOutcome, WorkflowExecutionStatus | None, int]:
        client = await Client.connect(group.target)
        handle = await start_run(client, "rules", "fail", task_queue=group.task_queue)
        outcome = await _outcome(client, handle.id)
        attempts = [
            event.activity_task_started_event_attributes.attempt
            async for event in handle.fetch_history_events()
            if event.HasField("activity_task_started_event_attributes")
        ]
        return outcome, await _status(client, handle.id), max(attempts)

    outcome, status, attempts = asyncio.run(main())
    assert (outcome.status, outcome.attempt, attempts) == ("failed", 1, 1)
    assert outcome.reason is not None
    assert "the rule model fails" in outcome.reason
    assert status == WorkflowExecutionStatus.FAILED


def test_steering_ops_are_pushed_to_the_running_attempt(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(1)
    run_id = f"r{uuid.uuid4().hex}"

    _start_blocked(group, run_id)

    async def steer() -> tuple[OpAnswer, OpAnswer, RunOutcome, WorkflowExecutionStatus | None]:
        client = await Client.connect(group.target)
        injected = await inject_run(client, run_id, "also this")
        # The cancel update alone (no Temporal cancel): recorded, pushed, and its reason
        # is the run's; the workflow completes with the cancelled outcome.
        handle = client.get_workflow_handle(run_id)
        cancelled = await handle.execute_update("cancel", "stop now", result_type=OpAnswer)
        outcome = await _outcome(client, run_id)
        return injected, cancelled, outcome, await _status(client, run_id)

    injected, cancelled, outcome, status = asyncio.run(steer())
    # The attempt's real answers: an injection id from run.inject, then the cancel.
    assert injected.ok
    assert injected.injection_id
    assert (cancelled.ok, cancelled.pending) == (True, False)
    assert (outcome.status, outcome.reason) == ("cancelled", "stop now")
    assert status == WorkflowExecutionStatus.COMPLETED


def test_a_worker_that_stops_hands_its_run_over(workers: Callable[[int], Workers]) -> None:
    group = workers(2)
    run_id = f"r{uuid.uuid4().hex}"

    pid = int(_start_blocked(group, run_id, session_id="s-term"))
    group.by_pid(pid).send_signal(signal.SIGTERM)
    outcome = asyncio.run(_finish(group.target, run_id))
    # Not cancelled: the stopping worker repaired and persisted the run ("worker
    # shutdown" closes the running call), and the next attempt, on the other worker,
    # went on from the session.
    assert (outcome.status, outcome.attempt) == ("completed", 2), group.logs()
    assert outcome.final_output == "done: cancelled: worker shutdown"
    assert group.by_pid(pid).wait(BOUND) == 0


def test_a_run_without_a_session_is_not_run_twice_after_a_loss(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(2)
    run_id = f"r{uuid.uuid4().hex}"

    pid = int(_start_blocked(group, run_id, heartbeat_timeout=1.0))
    group.by_pid(pid).send_signal(signal.SIGKILL)
    outcome = asyncio.run(_finish(group.target, run_id))
    # Nothing was persisted and the tool had started: the next attempt ends the run
    # failed rather than start it again from its input (the tool would run twice).
    assert (outcome.status, outcome.attempt) == ("failed", 2), group.logs()
    assert outcome.reason is not None
    assert outcome.reason.startswith("interrupted: the worker running the run was lost")


def test_an_unknown_agent_fails_the_workflow_at_once(workers: Callable[[int], Workers]) -> None:
    group = workers(1)

    async def main() -> tuple[str, WorkflowExecutionStatus | None]:
        client = await Client.connect(group.target)
        handle = await start_run(client, "nobody", "hi", task_queue=group.task_queue)
        try:
            await asyncio.wait_for(handle.result(), BOUND)
        except WorkflowFailureError as exc:
            # WorkflowFailureError <- ActivityError <- ApplicationError (the attempt's)
            chain, error = [], exc.__cause__
            while error is not None:
                chain.append(str(error))
                error = error.__cause__
            return " | ".join(chain), await _status(client, handle.id)
        raise AssertionError("the workflow did not fail")

    message, status = asyncio.run(main())
    assert "no agent named 'nobody'" in message
    assert status == WorkflowExecutionStatus.FAILED


def test_an_approval_is_pushed_to_the_attempt(workers: Callable[[int], Workers]) -> None:
    group = workers(1)

    async def main() -> tuple[list[OpAnswer], RunOutcome]:
        client = await Client.connect(group.target)
        handle = await start_run(client, "rules", "guarded", task_queue=group.task_queue)
        answers = [await approve_call(client, handle.id, "call_nobody")]
        # Approve once the call waits for its approval: until then the run answers
        # not_found (as for any call that does not wait), so ask again, bounded.
        deadline = time.monotonic() + BOUND
        while True:
            answer = await approve_call(client, handle.id, "call_guarded")
            if answer.ok or time.monotonic() > deadline:
                break
            assert answer.code == "not_found", answer
            await asyncio.sleep(0.05)
        answers.append(answer)
        return answers, await _outcome(client, handle.id)

    (unknown, approved), outcome = asyncio.run(main())
    assert (unknown.ok, unknown.code) == (False, "not_found")
    assert approved.ok
    assert (outcome.status, outcome.final_output) == ("completed", "done: guarded ran")
