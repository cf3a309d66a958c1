"""Session ids a database cannot store are refused when the session is made
(``ValueError``), never by a raw ``UnicodeEncodeError`` at every later call; memory keeps
any str. (Hostile but storable ids round-trip on every backend: test_session_conformance.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

import trio_agents as ta
from tests.support.session_backends import STORABLE
from trio_agents.models import ScriptedModel
from trio_agents.sessions import MemorySession, PostgresSession, SQLiteSession

UNSTORABLE = ["r\udce9sum\udce9", "\ud83d", "a\x00b", "\x00"]


@pytest.mark.parametrize("session_id", UNSTORABLE)
def test_an_unstorable_session_id_is_refused_up_front(tmp_path: Path, session_id: str) -> None:
    with pytest.raises(ValueError, match="session_id"):
        SQLiteSession(tmp_path / "s.db", session_id)
    with pytest.raises(ValueError, match="session_id"):
        PostgresSession("postgresql://127.0.0.1:1/nowhere", session_id)


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
