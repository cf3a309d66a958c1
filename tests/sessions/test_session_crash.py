"""Crash safety for real: a process running an agent on a SQLite or PostgreSQL session
is killed with SIGKILL in the middle of a tool call; the session it leaves behind loads
repaired and the next run on it completes with a valid conversation."""

from __future__ import annotations

import textwrap
from pathlib import Path

import trio

import trio_agents as ta
from tests.support.crash import sigkill_once_printed
from tests.support.sessions_sql import items_of
from trio_agents.models import ScriptedModel
from trio_agents.sessions import PostgresSession, SQLiteSession

CHILD = textwrap.dedent(  # SESSION_CLASS: the session class under test
    """
    import sys
    import trio
    import trio_agents as ta
    from trio_agents.models import ScriptedModel, Turn
    from trio_agents.sessions import SESSION_CLASS

    @ta.function_tool
    async def lookup(city: str) -> str:
        "Look a city up (the first call answers, the second hangs)."
        if city == "Oslo":
            return "Oslo: 4 C"
        print("tool started", flush=True)
        await trio.sleep_forever()
        return "unreachable"

    async def main(where: str) -> None:
        model = ScriptedModel([
            Turn(text="Checking Oslo.", tool_calls=[("lookup", {"city": "Oslo"})]),
            Turn(text="Now Paris.", tool_calls=[("lookup", {"city": "Paris"})]),
            "unreached",
        ])
        agent = ta.Agent(name="crashy", model=model, tools=[lookup])
        async with SESSION_CLASS(where, "s1") as session:
            await ta.run(agent, "weather in Oslo and Paris?", session=session)

    trio.run(main, sys.argv[1])
    """
)

# What the child finalised before it was killed mid-call, and the repair of that call.
FINALISED: list[ta.Item] = [
    ta.UserMessage("weather in Oslo and Paris?"),
    ta.AssistantMessage("Checking Oslo."),
    ta.ToolCall("call_1_0", "lookup", '{"city": "Oslo"}'),
    ta.ToolResult("call_1_0", "Oslo: 4 C"),
    ta.AssistantMessage("Now Paris."),
    ta.ToolCall("call_2_0", "lookup", '{"city": "Paris"}'),
]
REPAIR = ta.ToolResult("call_2_0", "cancelled: interrupted", status="cancelled")


async def test_sigkill_mid_tool_loses_nothing_finalised(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    with trio.fail_after(30):
        await sigkill_once_printed(
            CHILD.replace("SESSION_CLASS", "SQLiteSession"), str(db), b"tool started"
        )

        async with SQLiteSession(db, "s1") as session:
            loaded = await session.get_items()
            # Everything finalised before the kill, then the repair of the open call.
            assert loaded == [*FINALISED, REPAIR]
            model = ScriptedModel(["Sorry, the Paris lookup was interrupted."])
            result = await ta.run(ta.Agent(name="after", model=model), "and now?", session=session)
        assert result.status == "completed"
        (request,) = model.requests
        assert request.items == (*loaded, ta.UserMessage("and now?"))
        assert ta.conversation_problems(request.items) == []

        async with SQLiteSession(db, "s1") as reopened:
            stored = await reopened.get_items()
        assert stored == list(result.conversation)
        assert ta.conversation_problems(stored) == []


async def test_sigkill_mid_tool_leaves_a_session_the_next_run_loads_valid(pg_dsn: str) -> None:
    with trio.fail_after(60):
        await sigkill_once_printed(
            CHILD.replace("SESSION_CLASS", "PostgresSession"), pg_dsn, b"tool started"
        )

        # Everything finalised before the kill is stored; the open call has no result.
        before: list[ta.Item] = items_of(pg_dsn, "s1")
        assert before == FINALISED
        async with PostgresSession(pg_dsn, "s1") as session:
            model = ScriptedModel(["Sorry, the Paris lookup was interrupted."])
            result = await ta.run(ta.Agent(name="after", model=model), "and now?", session=session)
        assert result.status == "completed"
        (request,) = model.requests
        assert request.items == (*before, REPAIR, ta.UserMessage("and now?"))
        assert ta.conversation_problems(request.items) == []
        # The load's repair was written back, and the new run appended after it.
        assert items_of(pg_dsn, "s1") == list(result.conversation)
        assert ta.conversation_problems(result.conversation) == []
