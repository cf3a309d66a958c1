"""Session ids a database cannot store are refused when the session is made
(``ValueError``), never by a raw ``UnicodeEncodeError`` at every later call; hostile but
storable ids round-trip on a real SQLite file and the test-started PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

import trio_agents as ta
from trio_agents.models import ScriptedModel
from trio_agents.sessions import MemorySession, PostgresSession, SQLiteSession

UNSTORABLE = ["r\udce9sum\udce9", "\ud83d", "a\x00b", "\x00"]
STORABLE = ["😀 emoji", "'; DROP TABLE items; --", "\\u0000", "%s %(x)s ?", "a" * 2000, " "]


@pytest.mark.parametrize("session_id", UNSTORABLE)
def test_an_unstorable_session_id_is_refused_up_front(tmp_path: Path, session_id: str) -> None:
    with pytest.raises(ValueError, match="session_id"):
        SQLiteSession(tmp_path / "s.db", session_id)
    with pytest.raises(ValueError, match="session_id"):
        PostgresSession("postgresql://127.0.0.1:1/nowhere", session_id)


@pytest.mark.parametrize("session_id", STORABLE)
async def test_a_storable_session_id_round_trips_in_sqlite(tmp_path: Path, session_id: str) -> None:
    async with SQLiteSession(tmp_path / "s.db", session_id) as session:
        await session.add_items([ta.UserMessage("hi")])
    async with SQLiteSession(tmp_path / "s.db", session_id) as again:
        assert await again.get_items() == [ta.UserMessage("hi")]
    async with SQLiteSession(tmp_path / "s.db", session_id + "x") as other:
        assert await other.get_items() == []


async def test_storable_session_ids_round_trip_in_postgres(pg_dsn: str) -> None:
    for session_id in STORABLE:
        async with PostgresSession(pg_dsn, session_id) as session:
            await session.add_items([ta.UserMessage(session_id[:10])])
    for session_id in STORABLE:
        async with PostgresSession(pg_dsn, session_id) as again:
            assert await again.get_items() == [ta.UserMessage(session_id[:10])]


async def test_a_memory_session_keeps_any_str_id() -> None:
    # Nothing is encoded: any str is fine in memory.
    for session_id in [*UNSTORABLE, *STORABLE]:
        session = MemorySession(session_id)
        result = await ta.run(
            ta.Agent(name="t", instructions="", model=ScriptedModel(["ok"])),
            "hi",
            session=session,
        )
        assert result.status == "completed"
