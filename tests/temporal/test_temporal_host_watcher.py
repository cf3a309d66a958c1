"""A server over Temporal (``serve --temporal``) says nothing on stderr for a run that
completed: the TemporalHost's watcher of the run's workflow reads its result as a
``RunOutcome`` (it once read a ``dict`` and logged ``run ...: watching its workflow
failed`` with a traceback for every completed run; found by this test). The watcher logs
as soon as Temporal answers it, which this test cannot await through public API: it
waits for the workflow to close, then for the server to stop."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import httpx
import trio
from temporalio.client import Client

from tests.support.cli_support import cli_process, serving_url
from tests.support.temporal_support import Workers

HANG_GUARD = 120
TOKEN = "tok-watch"


async def _workflow_closed(target: str, run_id: str) -> None:
    """(asyncio) Wait until the run's workflow closed."""
    client = await Client.connect(target)
    await client.get_workflow_handle(run_id).result()


async def test_a_completed_run_leaves_no_traceback_on_the_server(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(1)
    argv = ["serve", "--temporal", group.target, "--task-queue", group.task_queue]
    argv += ["--db", str(group.db), "--app", "tests.support.temporal_app:AGENTS"]
    argv += ["--port", "0", "--token", TOKEN]
    with trio.fail_after(HANG_GUARD):
        async with cli_process(*argv) as served:
            await serving_url(served)
            line = next(text for text in served.stdout.lines if text.startswith("http: "))
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=line.split()[1], headers=headers) as http:
                answer = await http.post("/runs", json={"agent": "rules", "input": "hello"})
                run_id = answer.json()["run_id"]
                await trio.to_thread.run_sync(
                    lambda: asyncio.run(_workflow_closed(group.target, run_id))
                )
                got = await http.get(f"/runs/{run_id}")
                assert got.json()["run"]["status"] == "completed"
            served.process.send_signal(signal.SIGTERM)
            assert await served.process.wait() == 0
            await served.stdout.rest()
            assert "watching its workflow failed" not in served.stderr, served.stderr
