"""Runs on PostgresSessions, with the real run core and a real PostgreSQL server: each
tool result persisted as its tool finishes, the repair persisted before the terminal
update, a repair blocked by a lock held elsewhere stays bounded, ``on_busy`` across
objects, and a process killed with SIGKILL mid-tool leaves a session the next run loads
valid.

PostgreSQL is called from real threads, which a MockClock with autojump would take for
idle time: these tests run on the real clock, each under a hang guard."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.core_runs import EventsModel, fast_and_slow, make_agent
from tests.support.sessions_sql import PG_SESSIONS, items_of, pg_connection
from trio_agents.models import ScriptedModel, TextDelta, Turn
from trio_agents.sessions import PostgresSession

HANG_GUARD = 60  # seconds; never a timing claim


class Watched:
    """A PostgresSession that tells the test each batch it has written (the database is
    real; this only reports when ``add_items`` returned)."""

    def __init__(self, inner: PostgresSession) -> None:
        self.inner = inner
        self.session_id = inner.session_id
        self.lock_key = inner.lock_key
        self.written_send, self.written = trio.open_memory_channel[list[ta.Item]](100)

    async def get_items(self) -> list[ta.Item]:
        return await self.inner.get_items()

    async def add_items(self, items: Sequence[ta.Item]) -> None:
        await self.inner.add_items(items)
        self.written_send.send_nowait(list(items))

    async def clear(self) -> None:
        await self.inner.clear()


async def test_each_tool_result_is_persisted_when_its_tool_finishes(pg_dsn: str) -> None:
    release = trio.Event()
    model = ScriptedModel([Turn(tool_calls=[("slow", {}), ("fast", {})]), "all done"])
    agent = ta.Agent(name="p", model=model, tools=fast_and_slow(release))
    with trio.fail_after(HANG_GUARD):
        async with PostgresSession(pg_dsn, "s") as inner:
            session = Watched(inner)
            async with ta.open_run(agent, "go", session=session) as run:
                fast_result = ta.ToolResult("call_1_1", "fast done")
                async for batch in session.written:
                    if fast_result in batch:
                        break
                assert not release.is_set()  # the slow tool, and so its turn, still runs
                rows = items_of(pg_dsn, "s")
                assert rows[-1] == fast_result
                assert not any(
                    isinstance(item, ta.ToolResult) and item.call_id == "call_1_0" for item in rows
                )
                release.set()
    assert run.result is not None
    assert run.result.status == "completed"
    assert items_of(pg_dsn, "s") == list(run.result.conversation)


async def test_cancel_persists_the_repair_before_the_terminal_update(pg_dsn: str) -> None:
    @ta.function_tool
    async def forever() -> str:
        """Never answers."""
        await trio.sleep_forever()

    model = ScriptedModel([Turn(text="working", tool_calls=[("forever", {})]), "unreached"])
    agent = ta.Agent(name="p", model=model, tools=[forever])
    seen_at_terminal: list[ta.Item] = []
    with trio.fail_after(HANG_GUARD):
        async with (
            PostgresSession(pg_dsn, "s") as session,
            ta.open_run(agent, "go", session=session) as run,
        ):
            async for event in run.events():
                if isinstance(event, ta.ToolStarted):
                    break
            run.cancel("stop")
            async for update in run.updated:
                if update.status.is_terminal:
                    # Read at once, before anything else runs: the repair must be there.
                    seen_at_terminal = items_of(pg_dsn, "s")
                    break
    result = run.result
    assert result is not None
    assert (result.status, result.reason) == ("cancelled", "stop")
    assert seen_at_terminal == list(result.conversation)
    assert seen_at_terminal[-1] == ta.ToolResult("call_1_0", "cancelled: stop", status="cancelled")
    assert ta.conversation_problems(seen_at_terminal) == []


async def test_a_repair_blocked_by_a_lock_held_elsewhere_is_bounded(pg_dsn: str) -> None:
    """A real row lock held by another connection: the repair gives up within its
    deadline (the session's hour-long timeouts are capped by what is left of
    ``cleanup_timeout``) and says so; the run ends ``failed``, not ``cancelled``."""
    session = PostgresSession(pg_dsn, "s", lock_timeout=3600, statement_timeout=3600)
    model = EventsModel([TextDelta("partial")], block=True)
    try:
        async with ta.open_run(
            make_agent(model), "go", session=session, cleanup_timeout=0.3
        ) as run:
            with trio.fail_after(HANG_GUARD):
                async for event in run.events():
                    if isinstance(event, ta.ResponseTextDelta):
                        break
            with pg_connection(pg_dsn) as other:
                other.autocommit = False
                locked = other.execute(
                    f"SELECT 1 FROM {PG_SESSIONS} WHERE session_id = 's' FOR UPDATE"
                ).fetchall()
                assert locked == [(1,)]  # the input was persisted: the row exists
                run.cancel("stop")
                with trio.fail_after(HANG_GUARD):
                    result = await run.wait()
                other.rollback()
        assert result.status == "failed"
        assert result.reason is not None
        assert result.reason == "cleanup timed out" or result.reason.startswith("session error:")
        assert result.conversation[-1] == ta.AssistantMessage("partial", status="incomplete")
        # Nothing of the repair was written; the session is usable again.
        assert items_of(pg_dsn, "s") == [ta.UserMessage("go")]
        with trio.fail_after(HANG_GUARD):
            after = await ta.run(make_agent(ScriptedModel(["ok"])), "again", session=session)
        assert after.status == "completed"
    finally:
        await session.aclose()


async def test_two_objects_on_one_database_and_id_are_one_session(pg_dsn: str) -> None:
    @ta.function_tool
    async def forever() -> str:
        """Never answers."""
        await trio.sleep_forever()

    params = psycopg.conninfo.conninfo_to_dict(pg_dsn)
    uri = f"postgresql://postgres@127.0.0.1:{params['port']}/{params['dbname']}"
    model = ScriptedModel([Turn(tool_calls=[("forever", {})]), "done"])
    with trio.fail_after(HANG_GUARD):
        async with (
            PostgresSession(pg_dsn, "a") as a1,
            PostgresSession(uri, "a", max_connections=2) as a2,  # spelled otherwise
            PostgresSession(pg_dsn, "b") as b,
            ta.open_run(ta.Agent(name="p", model=model, tools=[forever]), "one", session=a1) as run,
        ):
            async for event in run.events():
                if isinstance(event, ta.ToolStarted):
                    break
            with pytest.raises(ta.SessionBusyError):
                await ta.run(make_agent(ScriptedModel(["x"])), "two", session=a2)
            other = await ta.run(make_agent(ScriptedModel(["b here"])), "hi", session=b)
            assert other.status == "completed"
            second = await ta.run(
                make_agent(ScriptedModel(["took over"])), "three", session=a2, on_busy="interrupt"
            )
    assert run.result is not None
    assert (run.result.status, run.result.reason) == ("cancelled", "superseded")
    assert second.status == "completed"
    assert items_of(pg_dsn, "a") == list(second.conversation)
    assert ta.conversation_problems(second.conversation) == []
