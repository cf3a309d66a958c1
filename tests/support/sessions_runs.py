"""What the tests of runs on stored sessions share beside tests/support/core_runs.py:
two tools whose results finish apart, and the items a PostgreSQL session has stored."""

from __future__ import annotations

import trio
import trio.lowlevel

import trio_agents as ta
from tests.support.sessions_sql import postgres_sql


def fast_and_slow(release: trio.Event) -> list[ta.Tool]:
    """``fast`` answers "fast done" at once, ``slow`` answers "slow done" once
    ``release`` is set: a turn's results finishing apart."""

    @ta.function_tool
    async def fast() -> str:
        """Answers at once."""
        return "fast done"

    @ta.function_tool
    async def slow() -> str:
        """Answers when the test says so."""
        await release.wait()
        return "slow done"

    return [fast, slow]


def items_of(dsn: str, session_id: str) -> list[ta.Item]:
    """The items stored for ``session_id`` in the PostgreSQL database ``dsn``, as stored."""
    return [item for _, item in postgres_sql(dsn).stored(session_id)]
