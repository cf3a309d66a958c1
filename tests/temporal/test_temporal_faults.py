"""Faults of issue #38 over the TemporalHost, against a real dev server and real worker
processes: a tree whose grandchild awaits approval while the worker running it dies
(and the same with ``park_after``), a SIGKILL while the model streams, and an A2A
``CancelTask`` racing the run's completion."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from temporalio.client import Client

import trio_agents as ta
from tests.support.a2a_support import rpc, text_message
from tests.support.http_support import TOKENS, bearer
from tests.support.temporal_app import AGENTS
from tests.support.temporal_support import Workers, opened_host
from trio_agents.faces import HttpFaces
from trio_agents.hosting import Limits, Origin, StartRequest, open_server
from trio_agents.sessions import SQLiteSession
from trio_agents.temporal import RunStore, TemporalHost

BOUND = 90.0  # hang guard per wait on a loaded machine
ALICE = Origin(principal="alice")
GUARDED = "call_guarded"  # the leaf's call that needs approval
HEARTBEAT = 1.0  # the host's heartbeat timeout: a killed worker's attempt is retried soon


async def _attempt_pid(target: str, run_id: str) -> int:
    """The pid of the worker process running the run's attempt (Temporal's default
    worker identity is ``pid@host``)."""

    async def ask() -> str:
        client = await Client.connect(target)
        described = await client.get_workflow_handle(run_id).describe()
        (pending,) = described.raw_description.pending_activities
        return str(pending.last_worker_identity)

    identity = await trio.to_thread.run_sync(asyncio.run, ask())
    return int(identity.split("@", 1)[0])


async def _waiting_after(host: TemporalHost, run_id: str, seq: int) -> Mapping[str, Any]:
    """The root's first ``awaiting_approval`` update after ``seq`` that names a call of
    a descendant (its ``detail``), followed through the host's store."""
    async with host.events("alice", run_id, from_seq=seq + 1, status_only=True) as events:
        async for hosted in events:
            event = hosted.event
            if hosted.run_id == run_id and event["status"] == "awaiting_approval":
                detail: Mapping[str, Any] = event["detail"]
                if detail.get("waiting"):
                    return detail
    raise AssertionError(f"run {run_id} ended without waiting for approval")


async def _tree_events(host: TemporalHost, run_id: str) -> list[dict[str, Any]]:
    async with host.events("alice", run_id, tree=True) as events:
        return [dict(hosted.event) async for hosted in events]


def _check_logs(seen: Sequence[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Per run of the tree: its seqs are 1..n (nothing lost, nothing reused) and it has
    exactly one terminal update, its last event. The events by run."""
    by_run: dict[str, list[Mapping[str, Any]]] = {}
    for event in seen:
        by_run.setdefault(event["run_id"], []).append(event)
    for run, events in by_run.items():
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1)), run
        terminal = [
            e
            for e in events
            if e["type"] == "run.updated" and ta.RunStatus(e["status"]).is_terminal
        ]
        assert terminal == [events[-1]], (run, terminal)
    return by_run


def _session(session_id: str, *calls: str) -> str:
    """The stored id of alice's session (of its child in ``calls``, one per level)."""
    return "/".join([json.dumps(["alice", session_id]), *calls])


async def _stored(db: Path, stored_id: str) -> list[dict[str, Any]]:
    """The session's rows as stored (not repaired: ``get_stored_items``)."""
    async with SQLiteSession(db, stored_id) as session:
        return [item.to_json() for item in await session.get_stored_items()]


@pytest.mark.parametrize("park_after", [None, 0.01], ids=["live", "park_after"])
async def test_a_tree_whose_grandchild_awaits_approval_survives_the_death_of_its_worker(
    workers: Callable[[int], Workers], park_after: float | None
) -> None:
    # With park_after, the tree behaves as docs/temporal.md says ("Parking a tree"):
    # only a root's own approval wait parks, so a tree whose grandchild waits keeps its
    # worker (no attempt returns parked: the one attempt after the kill finishes it).
    group = workers(2)
    request = StartRequest(agent="tree", input=(ta.UserMessage("tree"),), session_id="s-tree")
    options: dict[str, Any] = (
        {} if park_after is None else {"run_options": {"park_after": park_after}}
    )
    with trio.fail_after(BOUND * 2):
        async with opened_host(group, heartbeat_timeout=HEARTBEAT, **options) as host:
            run_id = await host.start(ALICE, request)
            first = await _waiting_after(host, run_id, 0)
            ((leaf, call),) = [(w["run_id"], w["call_id"]) for w in first["waiting"]]
            assert call == GUARDED
            before = await host.get("alice", run_id)
            pid = await _attempt_pid(group.target, run_id)
            os.kill(pid, signal.SIGKILL)
            group.by_pid(pid).wait(BOUND)
            # The next attempt (the other worker) resumes the tree: the grandchild asks
            # for the same call again, under its own id, and the root says so again.
            again = await _waiting_after(host, run_id, before.seq)
            assert again["waiting"] == first["waiting"], group.logs()
            await host.approve("alice", leaf, GUARDED)
            info = await host.wait_terminal("alice", run_id)
            seen = await _tree_events(host, run_id)
    assert (info.status, info.reason) == (ta.RunStatus.COMPLETED, None), group.logs()
    by_run = _check_logs(seen)
    assert len(by_run) == 3  # the root, its child and the grandchild: the same three runs
    resumed = [
        (e["run_id"], e["detail"])
        for e in seen
        if e["type"] == "run.updated" and (e.get("detail") or {}).get("resumed")
    ]
    assert resumed
    assert {detail["attempt"] for _, detail in resumed} == {2}
    assert not [e for e in seen if (e.get("detail") or {}).get("parked")]
    # The guarded tool ran once, after the approval, on the second worker.
    started = [e for e in seen if e["type"] == "tool.started" and e["call_id"] == GUARDED]
    assert len(started) == 1
    assert started[0]["run_id"] == leaf
    leaf_rows = await _stored(group.db, _session("s-tree", "call_middle", "call_leaf"))
    outputs = [
        (r["call_id"], r["output"]) for r in leaf_rows if r["type"] == "function_call_output"
    ]
    assert outputs == [(GUARDED, "guarded ran")]
    root_rows = await _stored(group.db, _session("s-tree"))
    assert root_rows[-1]["content"] == "done: done: done: guarded ran"


async def test_a_worker_killed_while_the_model_streams_resumes_the_turn_from_the_session(
    workers: Callable[[int], Workers],
) -> None:
    # SIGKILL mid-stream (no tool running): the streamed partial text of the lost attempt
    # was never an item (nothing persisted it), so the resumed attempt asks the model
    # again from the session and the conversation holds only the new answer; the
    # partial deltas stay in the run's log, where clients saw them, and the seqs go on.
    group = workers(2)
    request = StartRequest(
        agent="rules", input=(ta.UserMessage("stream s1"),), session_id="s-stream"
    )
    mark = group.marks / "s1.streaming"
    with trio.fail_after(BOUND):
        async with opened_host(group, heartbeat_timeout=HEARTBEAT) as host:
            run_id = await host.start(ALICE, request)
            async with host.events("alice", run_id) as events:
                async for hosted in events:
                    if hosted.event["type"] == "response.text.delta":
                        break
            while not mark.exists():  # noqa: ASYNC110 (another process's file: polled)
                await trio.sleep(0.02)
            pid = int(mark.read_text())
            os.kill(pid, signal.SIGKILL)
            info = await host.wait_terminal("alice", run_id)
            seen = await _tree_events(host, run_id)
    assert (info.status, info.reason) == (ta.RunStatus.COMPLETED, None), group.logs()
    _check_logs(seen)
    deltas = [e["text"] for e in seen if e["type"] == "response.text.delta"]
    assert deltas == ["partial s1 ", "streamed s1"]  # the lost attempt's, then the new one's
    resumed = [e["seq"] for e in seen if (e.get("detail") or {}).get("resumed")]
    first_delta = next(e["seq"] for e in seen if e["type"] == "response.text.delta")
    assert len(resumed) == 1
    assert resumed[0] > first_delta  # seqs went on after what the lost attempt wrote
    items = [e["item"] for e in seen if e["type"] == "run.item"]
    # The input once (the resumed attempt does not re-emit it), then the new answer only.
    assert [item.get("content") for item in items] == ["stream s1", "streamed s1"]
    rows = await _stored(group.db, _session("s-stream"))
    assert [(row.get("role"), row.get("content")) for row in rows] == [
        ("user", "stream s1"),
        ("assistant", "streamed s1"),
    ]


V1 = {"A2A-Version": "1.0", **bearer("tok-alice")}
TASK_NOT_CANCELABLE = -32002


async def _until(host: TemporalHost, run_id: str, stage: str) -> None:
    """Follow the run in the store until ``stage``: ``"sent"`` (at once),
    ``"streaming"`` (the model's first delta is written), ``"answered"`` (its answer is
    an item: the run is about to complete, its terminal update written or not)."""
    if stage == "sent":
        return
    async with host.events("alice", run_id) as events:
        async for hosted in events:
            event = hosted.event
            if stage == "streaming" and event["type"] == "response.text.delta":
                return
            if event["type"] == "run.item" and event["item"].get("role") == "assistant":
                return


# Five runs: the cancel sent at once and while the model streams (cancelled), and
# right after the answer (racing the terminal update: either side).
@pytest.mark.parametrize(
    ("stage", "repeat"),
    [("sent", 1), ("streaming", 1), ("streaming", 2), ("answered", 1), ("answered", 2)],
)
async def test_an_a2a_cancel_racing_the_completion_answers_once_and_never_hangs(
    workers: Callable[[int], Workers], stage: str, repeat: int
) -> None:
    # CancelTask sent while the run completes on its worker: the answer is the task,
    # cancelled after its repair, or TaskNotCancelableError once it had completed, or
    # (docs/faces.md, A2A: "the state it reached if it finished first") the completed
    # task; never a hang, and the run has exactly one terminal update either way, the
    # one the answer reports.
    group = workers(1)
    host = TemporalHost(
        group.target,
        AGENTS,
        store=RunStore.beside(group.db),
        task_queue=group.task_queue,
        limits=Limits(ping_interval=None),
        poll_interval=0.01,
    )
    with trio.fail_after(BOUND):
        async with open_server(host, [HttpFaces(auth=TOKENS)]) as (http_port,):
            base = f"http://127.0.0.1:{http_port}"
            sent = await rpc(
                base,
                "SendMessage",
                {
                    "message": text_message("slow"),
                    "configuration": {"returnImmediately": True},
                    "metadata": {"agent": "rules"},
                },
                headers=V1,
            )
            assert sent.status_code == 200, sent.text
            task_id = sent.json()["result"]["task"]["id"]
            await _until(host, task_id, stage)
            cancelled = await rpc(base, "CancelTask", {"id": task_id}, headers=V1)
            assert cancelled.status_code == 200, cancelled.text
            info = await host.wait_terminal("alice", task_id)
            seen = await _tree_events(host, task_id)
    _check_logs(seen)  # one terminal update, the last event
    body = cancelled.json()
    if "error" in body:
        assert body["error"]["code"] == TASK_NOT_CANCELABLE, body
        assert info.status == ta.RunStatus.COMPLETED
    else:
        state = body["result"]["status"]["state"]
        expected = {
            ta.RunStatus.CANCELLED: "TASK_STATE_CANCELED",
            ta.RunStatus.COMPLETED: "TASK_STATE_COMPLETED",
        }
        assert state == expected[info.status], (body, info)
    if info.status == ta.RunStatus.CANCELLED:
        assert info.reason == "cancelled over A2A"
    else:
        assert info.status == ta.RunStatus.COMPLETED, info


async def test_a_grandchilds_approval_recorded_while_no_worker_runs_the_tree_is_applied(
    workers: Callable[[int], Workers],
) -> None:
    # The worker running the tree dies while the grandchild awaits approval, and the
    # approve (by the grandchild's id) is recorded while no worker runs the tree: the
    # next attempt applies it once its resumed tree has the grandchild asking again
    # (from its catch-up, or pushed: whichever reaches it first), never answered
    # not_found nor lost.
    group = workers(1)
    request = StartRequest(agent="tree", input=(ta.UserMessage("tree"),), session_id="s-dead")
    with trio.fail_after(BOUND * 2):
        async with opened_host(group, heartbeat_timeout=HEARTBEAT) as host:
            run_id = await host.start(ALICE, request)
            waiting = await _waiting_after(host, run_id, 0)
            ((leaf, call),) = [(w["run_id"], w["call_id"]) for w in waiting["waiting"]]
            (worker,) = group.processes
            worker.send_signal(signal.SIGKILL)
            worker.wait(BOUND)
            async with trio.open_nursery() as nursery:
                # The update waits for a worker to run the workflow's task: whichever
                # comes first, the next attempt gets it caught up or pushed.
                nursery.start_soon(host.approve, "alice", leaf, call)
                group.start()
            info = await host.wait_terminal("alice", run_id)
            seen = await _tree_events(host, run_id)
    assert (info.status, info.reason) == (ta.RunStatus.COMPLETED, None), group.logs()
    by_run = _check_logs(seen)
    assert len(by_run) == 3
    started = [e for e in seen if e["type"] == "tool.started" and e["call_id"] == GUARDED]
    assert [e["run_id"] for e in started] == [leaf]
    root_rows = await _stored(group.db, _session("s-dead"))
    assert root_rows[-1]["content"] == "done: done: done: guarded ran"
