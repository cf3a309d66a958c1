"""The cluster part's fixtures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.pg_support import PostgresServer, PostgresUnavailable, find_bin_dir


@pytest.fixture
def crashable_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, with synchronous commits, that the test
    stops, crashes and restarts (the suite's shared server keeps its clients' pools)."""
    server = PostgresServer(find_bin_dir(), synchronous_commit=True)
    try:
        server.start()
    except PostgresUnavailable as exc:
        server.stop()
        pytest.skip(str(exc))
    try:
        yield server
    finally:
        server.stop()  # idempotent: a test may have stopped it already
