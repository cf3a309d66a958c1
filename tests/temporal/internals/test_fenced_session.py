"""A worker attempt's session (``temporal/_fenced_session.py``, private): each write
checks the attempt's claim in the shared store first, so a fenced attempt writes
nothing to the session (DESIGN §20). Real SQLite sessions; both stores."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.pg_support import postgres_url
from trio_agents import RunStatus, ToolCall, ToolResult, UserMessage
from trio_agents.hosting import RunInfo
from trio_agents.sessions import SessionStorageError, SQLiteSession
from trio_agents.temporal import PostgresRunStore, RunStore, SharedRunStore
from trio_agents.temporal._fenced_session import FencedSession


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> SharedRunStore:
    if request.param == "sqlite":
        return RunStore(tmp_path / "runs.sqlite3")
    return PostgresRunStore(postgres_url(request.getfixturevalue("pg_dsn")))


def _info(run_id: str) -> RunInfo:
    return RunInfo(
        run_id=run_id, agent="a", session_id="s", status=RunStatus.QUEUED, reason=None, seq=0
    )


async def test_a_fenced_attempts_session_writes_nothing(
    store: SharedRunStore, tmp_path: Path
) -> None:
    """The session an attempt writes checks its claim before each write: once a later
    attempt claimed the run, the old one's writes (its cancel repair, a child's) are
    refused and nothing reaches the session."""
    db = tmp_path / "sessions.sqlite3"
    async with (
        store,
        SQLiteSession(db, "s") as plain,
        SQLiteSession(db, "s") as inner,
    ):
        await store.claim_attempt("r1", "p", "s", 1, _info("r1"))
        old = FencedSession(inner, lambda: store.owns("r1", 1))
        call = ToolCall("c1", "t", "{}")
        await old.add_items([UserMessage("hi"), call])
        assert await store.owns("r1", 1)
        # Optional parts are the inner session's, present or not.
        assert getattr(old, "lock_key", None) is not None
        assert getattr(old, "no_such_part", None) is None

        await store.claim_attempt("r1", "p", "s", 2, _info("r1"))
        assert not await store.owns("r1", 1)
        assert await store.owns("r1", 2)
        before = await plain.get_items()
        with pytest.raises(SessionStorageError, match="fenced"):
            await old.add_items([ToolResult("c1", "cancelled: gone", status="cancelled")])
        with pytest.raises(SessionStorageError, match="fenced"):
            await old.replace_items([])
        with pytest.raises(SessionStorageError, match="fenced"):
            await old.clear()
        child = old.with_id("s/c1")
        with pytest.raises(SessionStorageError, match="fenced"):
            await child.add_items([UserMessage("child")])
        assert await plain.get_items() == before
        assert await old.get_items() == before  # reads are the inner session's
        async with SQLiteSession(db, "s/c1") as stored_child:
            assert await stored_child.get_items() == []
