"""The SQL backends' internals tests: each file names its store (``sql``: a SQLite file,
a PostgreSQL database, or both in turn); ``session`` is session "main" on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.sessions_sql import SqlStore


@pytest.fixture
async def session(sql: SqlStore) -> AsyncIterator[Any]:
    async with sql.session("main") as s:
        yield s
