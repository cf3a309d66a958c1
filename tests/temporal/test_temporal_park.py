"""Parking on Temporal (DESIGN §20): a run awaiting approval frees its worker after
``park_after`` — its attempt returns a ``parked`` outcome, the call left open in the
session — the workflow waits durably for the decision (or its approval deadline, a
Temporal timer), then the next attempt resumes the run, waits for the same call again
and gets the decision from its catch-up. Real dev server, real worker processes."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle

import trio_agents as ta
from tests.support.temporal_app import AGENTS
from tests.support.temporal_support import Workers
from trio_agents.hosting import Origin, StartRequest
from trio_agents.sessions import SQLiteSession
from trio_agents.temporal import (
    CANCELLED_BY_TEMPORAL,
    OpAnswer,
    RunOutcome,
    RunStore,
    TemporalHost,
    approve_call,
    inject_run,
    reject_call,
    run_result,
    start_run,
)

BOUND = 90.0  # hang guard per wait: a loaded 2-core box is slow, never this slow
CALL = "call_guarded"  # the rules agent's call that needs approval


def _stored_rows(db: Path, session_id: str) -> list[dict[str, Any]]:
    """The session's rows as stored (``get_stored_items``: not repaired, nothing written —
    ``get_items`` would close a parked call as a crash's)."""

    async def read() -> list[dict[str, Any]]:
        async with SQLiteSession(db, json.dumps(["temporal", session_id])) as session:
            return [item.to_json() for item in await session.get_stored_items()]

    return trio.run(read)


async def _start_parked(
    group: Workers, session_id: str, **options: Any
) -> tuple[Client, WorkflowHandle[Any, RunOutcome]]:
    """Start the rules agent on "guarded" with ``park_after=0.2`` and wait until its
    workflow says it is parked (the attempt returned)."""
    client = await Client.connect(group.target)
    handle = await start_run(
        client,
        "rules",
        "guarded",
        session_id=session_id,
        task_queue=group.task_queue,
        park_after=0.2,
        **options,
    )
    deadline = time.monotonic() + BOUND
    while (await handle.query("status"))["parked"] != [CALL]:
        if time.monotonic() > deadline:
            raise AssertionError(f"the run never parked\n{group.logs()}")
        await asyncio.sleep(0.05)
    return client, handle


async def _parked_attempts(client: Client, handle: WorkflowHandle[Any, Any]) -> list[RunOutcome]:
    """The parked outcomes the workflow's history holds (each attempt that parked)."""
    outcomes = []
    async for event in handle.fetch_history_events():
        if event.HasField("activity_task_completed_event_attributes"):
            payloads = event.activity_task_completed_event_attributes.result.payloads
            (value,) = await client.data_converter.decode(payloads, [RunOutcome])
            if value.status == "parked":
                outcomes.append(value)
    return outcomes


def test_a_parked_run_frees_its_worker_and_an_approval_after_the_park_finishes_it(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(1)

    async def main() -> tuple[list[RunOutcome], OpAnswer, RunOutcome, list[dict[str, Any]]]:
        client, handle = await _start_parked(group, "s-park")
        parked = await _parked_attempts(client, handle)
        # The session holds the call, open: no cancel repair was written.
        open_rows = _stored_rows(group.db, "s-park")
        approved = await approve_call(client, handle.id, CALL)
        outcome = await asyncio.wait_for(run_result(client, handle.id), BOUND)
        return parked, approved, outcome, open_rows

    parked, approved, outcome, open_rows = asyncio.run(main())
    # The attempt returned (its activity completed: no worker holds the run) parked.
    assert [(p.status, p.reason, p.pending, p.attempt) for p in parked] == [
        ("parked", "parked", [CALL], 1)
    ]
    assert open_rows[-1] == {
        "type": "function_call",
        "call_id": CALL,
        "name": "guarded",
        "arguments": "{}",
    }
    # The approve while parked: recorded, applied by the next attempt.
    assert (approved.ok, approved.pending) == (True, True)
    assert (outcome.status, outcome.final_output, outcome.attempt) == (
        "completed",
        "done: guarded ran",
        2,
    ), group.logs()
    # The next attempt continued the seqs after the parked one's last event.
    assert outcome.first_seq == parked[0].last_seq + 1
    rows = _stored_rows(group.db, "s-park")
    results = [row for row in rows if row["type"] == "function_call_output"]
    assert [(r["call_id"], r["output"]) for r in results] == [(CALL, "guarded ran")]


def test_a_rejection_after_the_park_reaches_the_model(workers: Callable[[int], Workers]) -> None:
    group = workers(1)

    async def main() -> tuple[OpAnswer, RunOutcome]:
        client, handle = await _start_parked(group, "s-rej")
        rejected = await reject_call(client, handle.id, CALL, message="not today")
        return rejected, await asyncio.wait_for(run_result(client, handle.id), BOUND)

    rejected, outcome = asyncio.run(main())
    assert (rejected.ok, rejected.pending) == (True, True)
    assert (outcome.status, outcome.final_output) == ("completed", "done: rejected: not today")
    rows = _stored_rows(group.db, "s-rej")
    assert rows[-2]["status"] == "error"
    assert rows[-2]["output"] == "rejected: not today"


def test_the_approval_deadline_rejects_a_parked_call(workers: Callable[[int], Workers]) -> None:
    group = workers(1)

    async def main() -> RunOutcome:
        client, handle = await _start_parked(group, "s-late", approval_deadline=0.5)
        return await asyncio.wait_for(run_result(client, handle.id), BOUND)

    outcome = asyncio.run(main())
    assert (outcome.status, outcome.final_output) == (
        "completed",
        "done: rejected: no decision within 0.5 s",
    ), group.logs()
    assert outcome.attempt == 2


def test_a_cancel_from_temporal_while_parked_repairs_and_ends_canceled(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(1)

    async def main() -> tuple[RunOutcome, WorkflowExecutionStatus | None]:
        client, handle = await _start_parked(group, "s-cancel")
        await handle.cancel()
        outcome = await asyncio.wait_for(run_result(client, handle.id), BOUND)
        return outcome, (await handle.describe()).status

    outcome, status = asyncio.run(main())
    assert status == WorkflowExecutionStatus.CANCELED
    assert (outcome.status, outcome.reason) == ("cancelled", CANCELLED_BY_TEMPORAL), group.logs()
    rows = _stored_rows(group.db, "s-cancel")
    assert rows[-1]["call_id"] == CALL
    assert rows[-1]["output"] == f"cancelled: {CANCELLED_BY_TEMPORAL}"


def test_an_approval_recorded_while_no_attempt_runs_is_applied_on_resume(
    workers: Callable[[int], Workers],
) -> None:
    # No park: the worker running the attempt dies while the call awaits approval; the
    # approval is recorded while no attempt runs, and the next attempt (on a new worker)
    # gets it from its catch-up before its run reaches the approval wait again — applied
    # when the wait begins (its Resume), never answered not_found and lost.
    group = workers(1)

    async def main() -> tuple[OpAnswer, RunOutcome]:
        client = await Client.connect(group.target)
        handle = await start_run(
            client,
            "rules",
            "guarded",
            session_id="s-lost",
            task_queue=group.task_queue,
            heartbeat_timeout=1.0,
        )
        deadline = time.monotonic() + BOUND
        while not [r for r in _stored_rows(group.db, "s-lost") if r.get("call_id") == CALL]:
            if time.monotonic() > deadline:
                raise AssertionError(f"the call never came\n{group.logs()}")
            await asyncio.sleep(0.05)
        group.processes[0].send_signal(signal.SIGKILL)
        group.processes[0].wait(BOUND)
        # The update waits for a worker to run the workflow's task, and the next
        # attempt starts on the same new worker: whichever the workflow takes first,
        # the approval reaches that attempt before its run asks for the call again
        # (caught up into its Resume, or pushed and held until the run asks).
        approving = asyncio.ensure_future(approve_call(client, handle.id, CALL))
        group.start()  # the next attempt runs here
        approved = await asyncio.wait_for(approving, BOUND)
        return approved, await asyncio.wait_for(run_result(client, handle.id), BOUND)

    approved, outcome = asyncio.run(main())
    assert approved.ok, approved  # applied live, or recorded for the catch-up
    assert (outcome.status, outcome.final_output) == ("completed", "done: guarded ran"), (
        group.logs()
    )
    assert outcome.attempt == 2


async def test_a_parked_run_over_the_temporal_host_shows_its_call_and_takes_the_approval(
    workers: Callable[[int], Workers],
) -> None:
    # Every face sees a parked run through the host's store: awaiting approval, its
    # call pending; the approve from the host finishes it on the next attempt, the
    # events one stream with no gap (seqs go on after the park).
    group = workers(1)
    host = TemporalHost(
        group.target,
        AGENTS,
        store=RunStore.beside(group.db),
        task_queue=group.task_queue,
        poll_interval=0.01,
        run_options={"park_after": 0.2},
    )
    request = StartRequest(agent="rules", input=(ta.UserMessage("guarded"),), session_id="s-h")
    with trio.fail_after(BOUND):
        async with trio.open_nursery() as nursery:
            stop = await host.open(nursery)
            try:
                run_id = await host.start(Origin(principal="alice"), request)
                async with host.events("alice", run_id) as events:
                    async for hosted in events:
                        detail = hosted.event.get("detail") or {}
                        if hosted.event["type"] == "run.updated" and detail.get("parked"):
                            break
                parked = await host.get("alice", run_id)
                await host.approve("alice", run_id, CALL)
                info = await host.wait_terminal("alice", run_id)
                async with host.events("alice", run_id) as events:
                    seen = [hosted.event async for hosted in events]
            finally:
                stop()
    assert parked.status == ta.RunStatus.AWAITING_APPROVAL
    assert parked.pending_approvals == (CALL,)
    assert info.status == ta.RunStatus.COMPLETED, group.logs()
    assert [event["seq"] for event in seen] == list(range(1, len(seen) + 1))
    resumed = [e["detail"] for e in seen if (e.get("detail") or {}).get("resumed")]
    assert resumed == [{"resumed": True, "attempt": 2}]
    assert "done: guarded ran" in [
        e["item"].get("content") for e in seen if e["type"] == "run.item"
    ]


def test_an_injection_while_parked_is_delivered_once_across_parks(
    workers: Callable[[int], Workers],
) -> None:
    # Injected while parked: recorded, delivered by the next attempt (after the approved
    # call's result); that attempt parks again on the call the injection asked for, and
    # the attempt after it must not deliver the injection a second time.
    group = workers(1)

    async def main() -> tuple[OpAnswer, RunOutcome]:
        client, handle = await _start_parked(group, "s-inj")
        injected = await inject_run(client, handle.id, "guarded again")
        await approve_call(client, handle.id, CALL)
        deadline = time.monotonic() + BOUND
        while (await handle.query("status"))["parked"] != [f"{CALL}_1"]:
            if time.monotonic() > deadline:
                raise AssertionError(f"the run never parked again\n{group.logs()}")
            await asyncio.sleep(0.05)
        await approve_call(client, handle.id, f"{CALL}_1")
        return injected, await asyncio.wait_for(run_result(client, handle.id), BOUND)

    injected, outcome = asyncio.run(main())
    assert (injected.ok, injected.pending) == (True, True)
    assert (outcome.status, outcome.final_output, outcome.attempt) == (
        "completed",
        "done: guarded ran",
        3,
    ), group.logs()
    rows = _stored_rows(group.db, "s-inj")
    users = [row["content"] for row in rows if row.get("role") == "user"]
    assert users == ["guarded", "guarded again"]
