"""The TemporalHost (a RunHost over Temporal) against a real dev server and real worker
processes: runs started through the host run on the workers, their events and records
reach the host through the shared store, and steering goes through the workflow."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus

import trio_agents as ta
from tests.support.temporal_support import (
    Workers,
    assert_resumed_once,
    connect_until,
    free_port,
    opened_host,
    start_dev_server,
    stop,
    until_event,
)
from trio_agents.hosting import HostError, Origin, StartRequest
from trio_agents.sessions import SQLiteSession
from trio_agents.temporal import CANCELLED_BY_TEMPORAL

BOUND = 90.0  # hang guard per wait on a loaded machine
ALICE = Origin(principal="alice")


def _start(text: str, **kwargs: object) -> StartRequest:
    return StartRequest(agent="rules", input=(ta.UserMessage(text),), **kwargs)  # type: ignore[arg-type]


async def test_a_run_started_through_the_host_completes_on_a_worker(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(1)
    with trio.fail_after(BOUND):
        async with opened_host(group) as host:
            run_id = await host.start(Origin(principal="alice"), _start("hello"))
            info = await host.wait_terminal("alice", run_id)
            assert info.status == ta.RunStatus.COMPLETED
            async with host.events("alice", run_id) as events:
                seen = [event async for event in events]
            seqs = [event.seq for event in seen]
            assert seqs == list(range(1, len(seqs) + 1))
            texts = [
                event.event["item"].get("content")
                for event in seen
                if event.event["type"] == "run.item"
            ]
            assert "echo: hello" in texts
            assert seen[-1].event["status"] == "completed"
            listed = await host.list("alice")
            assert [run.run_id for run in listed] == [run_id]
            assert await host.list("bob") == []
            with pytest.raises(HostError) as hidden:
                await host.get("bob", run_id)
            assert hidden.value.code == "not_found"


async def _stored(db: Path, principal: str, session_id: str) -> list[dict[str, Any]]:
    async with SQLiteSession(db, json.dumps([principal, session_id])) as session:
        return [item.to_json() for item in await session.get_items()]


async def _workflow_status(target: str, run_id: str) -> WorkflowExecutionStatus | None:
    async def ask() -> WorkflowExecutionStatus | None:
        client = await Client.connect(target)
        return (await client.get_workflow_handle(run_id).describe()).status

    return await trio.to_thread.run_sync(asyncio.run, ask())


async def _workflow_cancel_requested(target: str, run_id: str) -> bool:
    async def ask() -> bool:
        client = await Client.connect(target)
        history = await client.get_workflow_handle(run_id).fetch_history()
        return any(
            event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED
            for event in history.events
        )

    return await trio.to_thread.run_sync(asyncio.run, ask())


async def test_a_cancel_through_the_host_ends_the_workflow_canceled_after_the_repair(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(1)
    with trio.fail_after(BOUND):
        async with opened_host(group) as host:
            run_id = await host.start(ALICE, _start("block", session_id="s1"))
            await until_event(host, run_id, "tool.started")
            await host.cancel("alice", run_id, "stop now")
            info = await host.wait_terminal("alice", run_id)
            assert (info.status, info.reason) == (ta.RunStatus.CANCELLED, "stop now")
            # Another process (Temporal) closes it after the record: polled.
            while await _workflow_status(group.target, run_id) == WorkflowExecutionStatus.RUNNING:  # noqa: ASYNC110
                await trio.sleep(0.05)
            assert await _workflow_status(group.target, run_id) == WorkflowExecutionStatus.CANCELED
    items = await _stored(group.db, "alice", "s1")
    assert [item["type"] for item in items[:3]] == [
        "message",
        "function_call",
        "function_call_output",
    ]
    assert items[2]["call_id"] == items[1]["call_id"]  # the open call was closed by the repair
    async with opened_host(group) as host:  # a new server over the same store
        with pytest.raises(HostError) as refused:
            await host.cancel("alice", run_id, "again")
        assert refused.value.code == "run_closed"
        assert (await host.get("alice", run_id)).reason == "stop now"


async def test_approve_inject_and_withdraw_reach_the_attempt_on_its_worker(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(1)
    with trio.fail_after(BOUND):
        async with opened_host(group) as host:
            guarded = await host.start(ALICE, _start("guarded"))
            while "call_guarded" not in (await host.get("alice", guarded)).pending_approvals:
                await until_event(host, guarded, "run.updated")
            with pytest.raises(HostError) as unknown:
                await host.approve("alice", guarded, "call_nope")
            assert unknown.value.code == "not_found"
            await host.approve("alice", guarded, "call_guarded")
            info = await host.wait_terminal("alice", guarded)
            assert info.status == ta.RunStatus.COMPLETED
            async with host.events("alice", guarded) as events:
                outputs = [
                    e.event["item"].get("content")
                    async for e in events
                    if e.event["type"] == "run.item"
                ]
            assert "done: guarded ran" in outputs

            blocked = await host.start(ALICE, _start("block"))
            await until_event(host, blocked, "tool.started")
            injection = await host.inject("alice", blocked, (ta.UserMessage("later"),))
            assert not injection.startswith("pending")
            await until_event(host, blocked, "inbox.injected")
            assert await host.withdraw("alice", blocked, injection) is True
            await host.cancel("alice", blocked, "done")
            assert (await host.wait_terminal("alice", blocked)).status == ta.RunStatus.CANCELLED


async def test_a_run_whose_worker_dies_resumes_on_another_and_its_seqs_continue(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(2)
    with trio.fail_after(BOUND):
        async with opened_host(group) as host:
            run_id = await host.start(ALICE, _start("block", session_id="s2"))
            await until_event(host, run_id, "tool.started")
            pid = int((group.marks / f"{run_id}.started").read_text())
            os.kill(pid, signal.SIGKILL)
            info = await host.wait_terminal("alice", run_id)
            async with host.events("alice", run_id) as events:
                seen = [event async for event in events]
    assert info.status == ta.RunStatus.COMPLETED, group.logs()
    assert_resumed_once(seen)


async def test_a_run_cancelled_before_any_worker_took_it_gets_its_terminal_record(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(0)  # no worker yet: the workflow waits for one
    with trio.fail_after(BOUND):
        async with opened_host(group) as host, trio.open_nursery() as nursery:
            run_id = await host.start(ALICE, _start("hello", session_id="s3"))
            cancelled = trio.Event()

            async def cancel() -> None:
                await host.cancel("alice", run_id, "never mind")
                cancelled.set()

            nursery.start_soon(cancel)
            # Temporal holds the cancel before any worker runs the workflow: the first
            # workflow task sees it, and no attempt ever runs the run.
            while await _workflow_cancel_requested(group.target, run_id) is False:  # noqa: ASYNC110
                await trio.sleep(0.02)
            group.start()
            await cancelled.wait()
            info = await host.wait_terminal("alice", run_id)
            assert (info.status, info.reason) == (ta.RunStatus.CANCELLED, "never mind")
            # Its session is free again.
            again = await host.start(ALICE, _start("hello", session_id="s3"))
            assert again != run_id


async def test_a_busy_session_refuses_or_interrupts(workers: Callable[[int], Workers]) -> None:
    group = workers(1)
    with trio.fail_after(BOUND):
        async with opened_host(group) as host:
            first = await host.start(ALICE, _start("block", session_id="s4"))
            await until_event(host, first, "tool.started")
            with pytest.raises(HostError) as busy:
                await host.start(ALICE, _start("hello", session_id="s4"))
            assert busy.value.code == "session_busy"
            second = await host.start(ALICE, _start("hello", session_id="s4", on_busy="interrupt"))
            ended = await host.wait_terminal("alice", first)
            assert (ended.status, ended.reason) == (
                ta.RunStatus.CANCELLED,
                "interrupted by a new run",
            )
            assert (await host.wait_terminal("alice", second)).status == ta.RunStatus.COMPLETED
            with pytest.raises(HostError) as idle:
                await host.cancel_session("alice", "s4")
            assert idle.value.code == "no_active_run"


async def test_refusals_are_host_errors_with_their_codes(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(0)  # nothing here needs a worker
    with trio.fail_after(BOUND):
        async with opened_host(group) as host:
            refusals: list[tuple[str, Callable[[], Awaitable[object]]]] = [
                (
                    "not_found",
                    lambda: host.start(
                        ALICE, StartRequest(agent="nope", input=(ta.UserMessage("x"),))
                    ),
                ),
                ("invalid_request", lambda: host.start(ALICE, _start("x", context={"a": 1}))),
                ("not_found", lambda: host.get("alice", "run_unknown")),
                ("not_found", lambda: host.cancel("alice", "run_unknown")),
                ("not_found", lambda: host.inject("alice", "run_unknown", (ta.UserMessage("x"),))),
                ("not_found", lambda: host.approve("alice", "run_unknown", "call")),
                ("no_active_run", lambda: host.cancel_session("alice", "nothing")),
            ]
            for code, op in refusals:
                with pytest.raises(HostError) as refused:
                    await op()
                assert refused.value.code == code
            run_id = await host.start(ALICE, _start("hello"))
            # Another principal's run is not_found on every op, exactly as an unknown id.
            for op2 in (
                lambda: host.get("bob", run_id),
                lambda: host.cancel("bob", run_id),
                lambda: host.reject("bob", run_id, "call"),
                lambda: host.withdraw("bob", run_id, "inj"),
            ):
                with pytest.raises(HostError) as hidden:
                    await op2()
                assert hidden.value.code == "not_found"
            with pytest.raises(HostError) as bad:
                async with host.events("alice", run_id, from_seq=-1):
                    pass
            assert bad.value.code == "invalid_request"


async def test_a_frozen_worker_is_fenced_once_another_took_its_run_over(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(2)
    with trio.fail_after(BOUND):
        async with opened_host(group) as host:
            run_id = await host.start(ALICE, _start("block", session_id="s5"))
            await until_event(host, run_id, "tool.started")
            pid = int((group.marks / f"{run_id}.started").read_text())
            frozen = group.by_pid(pid)
            os.kill(pid, signal.SIGSTOP)
            try:
                info = await host.wait_terminal("alice", run_id)
                async with host.events("alice", run_id) as events:
                    before = [event async for event in events]
                stored = await _stored(group.db, "alice", "s5")
            finally:
                os.kill(pid, signal.SIGCONT)
            # Thawed, the old attempt finds its heartbeats refused and its run taken over:
            # it tries to write its cancel and is refused (its worker says so).
            log = group.log_dir / f"worker-{group.processes.index(frozen)}.log"
            while "is fenced" not in log.read_text(errors="replace"):  # noqa: ASYNC110
                await trio.sleep(0.05)  # another process's log: polled
            after = await host.get("alice", run_id)
            async with host.events("alice", run_id) as events:
                again = [event async for event in events]
    assert info.status == ta.RunStatus.COMPLETED, group.logs()
    assert (after.status, after.seq) == (info.status, info.seq)
    assert [e.event for e in again] == [e.event for e in before]
    # Nor does its repair reach the session (a cancelled result for a call the run that
    # took over had already answered would break the conversation).
    assert await _stored(group.db, "alice", "s5") == stored


async def test_a_run_goes_on_across_a_restart_of_the_temporal_server(tmp_path: Path) -> None:
    port = free_port()
    state, log = tmp_path / "temporal.db", tmp_path / "server.log"
    server = start_dev_server(port, log, state)
    group = Workers(
        target=f"127.0.0.1:{port}",
        task_queue="q-restart",
        db=tmp_path / "sessions.sqlite3",
        marks=tmp_path / "marks",
        log_dir=tmp_path,
    )
    group.marks.mkdir()
    try:
        await trio.to_thread.run_sync(asyncio.run, connect_until(group.target, server, log))
        group.start()
        with trio.fail_after(BOUND * 2):
            async with opened_host(group) as host:
                run_id = await host.start(ALICE, _start("block", session_id="s6"))
                await until_event(host, run_id, "tool.started")
                stop(server)  # the server goes away mid-run...
                server = start_dev_server(port, log, state)  # ...and comes back with its state
                await trio.to_thread.run_sync(asyncio.run, connect_until(group.target, server, log))
                # The host's client and the worker reconnect: a cancel still reaches the
                # run, which ends cancelled with its reason, nothing a client saw lost.
                with trio.move_on_after(BOUND):
                    while True:
                        try:
                            await host.cancel("alice", run_id, "after the restart")
                            break
                        except HostError as exc:
                            if exc.code != "internal":  # Temporal not answering yet
                                raise
                        await trio.sleep(0.2)
                info = await host.wait_terminal("alice", run_id)
                async with host.events("alice", run_id) as events:
                    seen = [event async for event in events]
    finally:
        group.stop()
        stop(server)
    assert info.status == ta.RunStatus.CANCELLED, group.logs()
    # The reason is the host's, except when the cancel reached the attempt only through
    # its heartbeat while the workflow could not yet say why (seen about 1 run in 7 on a
    # loaded machine right after the restart; docs/temporal.md, "not built yet").
    assert info.reason in ("after the restart", CANCELLED_BY_TEMPORAL), group.logs()
    seqs = [event.seq for event in seen]
    assert seqs == list(range(1, len(seqs) + 1))


async def test_a_worker_that_stops_hands_its_run_over_with_one_terminal_update(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(2)
    with trio.fail_after(BOUND):
        async with opened_host(group) as host:
            run_id = await host.start(ALICE, _start("block", session_id="s7"))
            await until_event(host, run_id, "tool.started")
            pid = int((group.marks / f"{run_id}.started").read_text())
            os.kill(pid, signal.SIGTERM)  # a graceful stop: the run is handed over
            info = await host.wait_terminal("alice", run_id)
            async with host.events("alice", run_id) as events:
                seen = [event async for event in events]
    assert info.status == ta.RunStatus.COMPLETED, group.logs()
    terminal = [
        event.event["status"]
        for event in seen
        if event.event["type"] == "run.updated" and ta.RunStatus(event.event["status"]).is_terminal
    ]
    assert terminal == ["completed"]  # the stopped attempt's own end is not the run's
    assert [event.seq for event in seen] == list(range(1, len(seen) + 1))
