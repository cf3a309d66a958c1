"""The TemporalHost (a RunHost over Temporal) against a real dev server and real worker
processes: runs started through the host run on the workers, their events and records
reach the host through the shared store, and steering goes through the workflow."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

import trio_agents as ta
from tests.support.temporal_app import AGENTS
from tests.support.temporal_support import Workers
from trio_agents.hosting import HostError, Origin, StartRequest
from trio_agents.temporal import TemporalHost

BOUND = 90.0  # hang guard per wait on a loaded machine


@asynccontextmanager
async def opened(group: Workers) -> AsyncIterator[TemporalHost]:
    host = TemporalHost(
        group.target, AGENTS, store=group.db, task_queue=group.task_queue, poll_interval=0.01
    )
    async with trio.open_nursery() as nursery:
        stop = await host.open(nursery)
        try:
            yield host
        finally:
            stop()


def _start(text: str, **kwargs: object) -> StartRequest:
    return StartRequest(agent="rules", input=(ta.UserMessage(text),), **kwargs)  # type: ignore[arg-type]


async def test_a_run_started_through_the_host_completes_on_a_worker(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(1)
    with trio.fail_after(BOUND):
        async with opened(group) as host:
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
            try:
                await host.get("bob", run_id)
            except HostError as exc:
                assert exc.code == "not_found"
            else:
                raise AssertionError("another principal's run was visible")
