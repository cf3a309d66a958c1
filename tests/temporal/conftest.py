"""Fixtures of the Temporal tests (the dev server, ``temporal_server``, is the root
conftest's: the host conformance suite uses it too): real worker processes (``python -m trio_agents worker``) on a task queue
of each test's own, so workers never take each other's runs. Every wait is bounded;
nothing sleeps to wait. The tests here are marked ``temporal`` (``-m temporal``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.temporal_support import Workers


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.temporal)


@pytest.fixture
def workers(temporal_server: str, tmp_path: Path) -> Iterator[Callable[..., Workers]]:
    """``workers(n)``: ``n`` worker processes on a task queue of this test's own, their
    storage a SQLite file of the test's (``workers(n, storage=URL)``: a PostgreSQL
    database)."""
    started: list[Workers] = []

    def start(count: int, storage: str | None = None) -> Workers:
        marks = tmp_path / "marks"
        marks.mkdir(exist_ok=True)
        group = Workers(
            target=temporal_server,
            task_queue=f"q-{uuid.uuid4().hex[:12]}",
            db=tmp_path / "sessions.sqlite3",
            storage=storage,
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
