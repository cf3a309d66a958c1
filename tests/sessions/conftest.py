"""The sessions part's fixture: a fresh, empty store of every backend."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.session_backends import (
    BACKENDS,
    Store,
    memory_store,
    postgres_store,
    sqlite_store,
)


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """Memory, a real SQLite file, and a database of its own on the suite's PostgreSQL
    (only that case starts the server)."""
    if request.param == "memory":
        store = memory_store()
    elif request.param == "sqlite":
        store = sqlite_store(tmp_path / "sessions.db")
    else:
        store = postgres_store(request.getfixturevalue("pg_dsn"))
    try:
        yield store
    finally:
        await store.aclose()
