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
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus

from tests.temporal.conftest import Workers, temporal_cli
from trio_agents.temporal import (
    CANCELLED_BY_TEMPORAL,
    RunOutcome,
    cancel_run,
    run_result,
    start_run,
)

BOUND = 90.0  # hang guard per wait: a loaded 2-core box is slow, never this slow


def _stored(db: Path, session_id: str, principal: str = "temporal") -> list[dict[str, Any]]:
    """The items the session holds, read straight from the shared SQLite file."""
    key = json.dumps([principal, session_id])
    with sqlite3.connect(db) as conn:
        tables = [row[0] for row in conn.execute("select name from sqlite_master")]
        table = next(name for name in tables if "item" in name)
        columns = [row[1] for row in conn.execute(f"pragma table_info({table})")]
        data_column = next(name for name in columns if name in ("item", "data", "json", "body"))
        rows = conn.execute(
            f"select {data_column} from {table} where session_id = ? order by rowid", (key,)
        ).fetchall()
    return [json.loads(row[0]) for row in rows]


def _wait_for(path: Path, what: str, group: Workers) -> str:
    deadline = time.monotonic() + BOUND
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} never happened\n{group.logs()}")
        time.sleep(0.02)
    return path.read_text()


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
        return outcome, await _status(client, handle.id)

    outcome, status = asyncio.run(main())
    assert (outcome.status, outcome.reason, outcome.attempt) == ("completed", None, 1)
    assert outcome.final_output == "echo: hello"
    assert status == WorkflowExecutionStatus.COMPLETED
    stored = _stored(group.db, "s1")
    assert [item.get("content") for item in stored] == ["hello", "echo: hello"]
