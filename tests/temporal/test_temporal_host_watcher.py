"""A bug found while serving the TemporalHost (``serve --temporal``), left to the
TemporalHost's owner: its watcher of a run's workflow reads the workflow's result with
no ``result_type`` (``_temporal_host._closed_as``: ``client.get_workflow_handle(run_id)``
then ``handle.result()``), so a run that COMPLETED gives a ``dict``, and
``outcome.status`` raises ``AttributeError``: every completed run logs
``run ...: watching its workflow failed`` with a traceback on the server's stderr, and a
completed workflow whose terminal record no attempt wrote would never get one.

The fix: ``get_workflow_handle(run_id, result_type=RunOutcome)``. Then this test passes
(remove the xfail). It is not strict: the watcher logs as soon as Temporal answers it,
which this test cannot await through public API, so on a loaded machine it could pass
before the log line is written."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import httpx
import pytest
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


@pytest.mark.xfail(reason="TemporalHost's watcher reads a dict as a RunOutcome", strict=False)
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
