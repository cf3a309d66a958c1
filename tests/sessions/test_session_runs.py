"""Runs on sessions: one active run per session (``on_busy``), reuse after cancel,
history and persistence, on real SQLite files and in memory."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.helpers import collect
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import MemorySession, Session, SQLiteSession
from trio_agents.testing import check_events


@ta.function_tool
async def slow(seconds: float) -> str:
    """Sleep, then answer."""
    await trio.sleep(seconds)
    return "slow done"


@ta.function_tool(needs_approval=True)
async def guarded(x: int) -> int:
    """Needs a human's approval."""
    return x * 2


def agent(model: ta.Model) -> ta.Agent:
    return ta.Agent(name="s", model=model, tools=[slow, guarded])


async def reached(run: ta.Run, predicate: type[ta.RunEvent]) -> None:
    async for event in run.events():
        if isinstance(event, predicate):
            return


async def status_reached(run: ta.Run, status: ta.RunStatus) -> None:
    async for update in run.updated:
        if update.status == status:
            return


@asynccontextmanager
async def held_by_a_slow_run(session: Session) -> AsyncIterator[ta.Run]:
    """``session`` held by a run on "one" whose tool takes 5 s, served in a nursery the
    block runs inside (so leaving it waits for that run)."""
    model = ScriptedModel([Turn(tool_calls=[("slow", {"seconds": 5})]), "first done"])
    async with trio.open_nursery() as nursery:
        yield await nursery.start(partial(ta.serve_run, session=session), agent(model), "one")


def enqueued(model: ta.Model, text: str, session: Session) -> Any:
    """``open_run`` of ``text`` on ``session``, waiting in its queue while it is busy."""
    return ta.open_run(agent(model), text, session=session, on_busy="enqueue")


@asynccontextmanager
async def queued_behind_a_slow_run(
    session: Session, model: ta.Model
) -> AsyncIterator[tuple[ta.Run, ta.Run]]:
    """A run of "two" on ``model``, waiting in the queue of ``session`` behind a run
    holding it: the holder and the queued run. Leaving waits for both to end."""
    async with held_by_a_slow_run(session) as first, enqueued(model, "two", session) as second:
        await trio.testing.wait_all_tasks_blocked()
        yield first, second


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sessions.db"


# -------------------------------------------------------------------- on_busy


async def test_reject_is_the_default_and_raises_before_anything_starts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = MemorySession("s1")
    first_model = ScriptedModel([Turn(tool_calls=[("slow", {"seconds": 10})]), "first done"])
    second_model = ScriptedModel(["never"])
    async with ta.open_run(agent(first_model), "one", session=session) as first:
        await reached(first, ta.ToolStarted)
        with pytest.raises(ta.SessionBusyError) as info:
            async with ta.open_run(agent(second_model), "two", session=session):
                pass  # pragma: no cover - never entered
        assert info.value.session_id == "s1"
        assert info.value.run_id == first.id
        with pytest.raises(ta.SessionBusyError):
            await ta.run(agent(second_model), "two", session=session, on_busy="reject")
    assert second_model.calls == 0
    assert first.result is not None
    assert first.result.status == "completed"
    # Free again: the next run works and sees the whole history.
    third = await ta.run(agent(ScriptedModel(["third"])), "three", session=session)
    assert third.status == "completed"
    assert [i for i in third.conversation if isinstance(i, ta.UserMessage)] == [
        ta.UserMessage("one"),
        ta.UserMessage("three"),
    ]


async def test_serve_run_rejects_a_busy_session_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = MemorySession("s1")
    model = ScriptedModel([Turn(tool_calls=[("slow", {"seconds": 10})]), "done"])
    async with trio.open_nursery() as nursery:
        serve = partial(ta.serve_run, session=session)
        first = await nursery.start(serve, agent(model), "one")
        with pytest.raises(ta.SessionBusyError):
            await nursery.start(serve, agent(ScriptedModel(["x"])), "two")
        first.cancel("enough")
    assert first.result is not None
    assert first.result.reason == "enough"


async def test_sqlite_sessions_on_one_file_and_id_are_one_session(db: Path) -> None:
    model = ScriptedModel([Turn(tool_calls=[("slow", {"seconds": 3600})]), "done"])
    with trio.fail_after(10):
        async with (
            SQLiteSession(db, "a") as a1,
            SQLiteSession(db, "a") as a2,
            SQLiteSession(db, "b") as b,
            ta.open_run(agent(model), "one", session=a1) as run,
        ):
            await reached(run, ta.ToolStarted)
            with pytest.raises(ta.SessionBusyError):
                await ta.run(agent(ScriptedModel(["x"])), "two", session=a2)
            other = await ta.run(agent(ScriptedModel(["b here"])), "hi", session=b)
            assert other.status == "completed"
            run.cancel("stop")


# SQLite works in real threads, which a MockClock with autojump treats as idle time (it
# would jump past the cleanup bound): tests on SQLite files run on the real clock, bounded.


async def test_interrupt_cancels_the_active_run_and_starts_after_its_repair(db: Path) -> None:
    first_model = ScriptedModel([Turn(tool_calls=[("slow", {"seconds": 3600})]), "unreached"])
    second_model = ScriptedModel(["second answer"])
    with trio.fail_after(10):
        await interrupt_on_sqlite(db, first_model, second_model)


async def interrupt_on_sqlite(
    db: Path, first_model: ScriptedModel, second_model: ScriptedModel
) -> None:
    async with SQLiteSession(db, "s") as session:
        async with ta.open_run(agent(first_model), "one", session=session) as first:
            await reached(first, ta.ToolStarted)
            second = await ta.run(agent(second_model), "two", session=session, on_busy="interrupt")
        assert first.result is not None
        assert first.result.status == "cancelled"
        assert first.result.reason == "superseded"
        assert second.status == "completed"
        # The second run's model saw the first run's repair: a valid conversation.
        (request,) = second_model.requests
        assert ta.conversation_problems(request.items) == []
        assert ta.ToolResult("call_1_0", "cancelled: superseded", status="cancelled") in (
            request.items
        )
        stored = await session.get_items()
        assert stored == list(second.conversation)
        assert ta.conversation_problems(stored) == []


async def test_interrupt_while_awaiting_approval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = MemorySession("s")
    first_model = ScriptedModel([Turn(tool_calls=[("guarded", {"x": 2})]), "unreached"])
    async with ta.open_run(agent(first_model), "one", session=session) as first:
        await status_reached(first, ta.RunStatus.AWAITING_APPROVAL)
        second = await ta.run(
            agent(ScriptedModel(["fresh start"])), "two", session=session, on_busy="interrupt"
        )
    assert first.result is not None
    assert (first.result.status, first.result.reason) == ("cancelled", "superseded")
    assert first.result.conversation[-1] == ta.ToolResult(
        "call_1_0", "cancelled: superseded", status="cancelled"
    )
    assert second.status == "completed"
    assert second.final_output == "fresh start"
    assert ta.conversation_problems(second.conversation) == []
    check_events(first.result, await collect(first)).raise_for_violations()


async def test_enqueue_waits_queued_then_runs_on_the_whole_history(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = MemorySession("s")
    second_model = ScriptedModel(["second done"])
    async with queued_behind_a_slow_run(session, second_model) as (first, second):
        assert second.status == "queued"
        assert second_model.calls == 0
    assert first.result is not None
    assert first.result.status == "completed"
    assert second.result is not None
    assert second.result.status == "completed"
    (request,) = second_model.requests
    assert request.items[: len(first.result.conversation)] == first.result.conversation
    assert await session.get_items() == list(second.result.conversation)


async def test_enqueue_is_first_come_first_served(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = MemorySession("s")
    order: list[str] = []

    async def queued(name: str) -> None:
        result = await ta.run(
            agent(ScriptedModel([name])), name, session=session, on_busy="enqueue"
        )
        order.append(result.final_output or "")

    async with held_by_a_slow_run(session), trio.open_nursery() as nursery:
        for name in ("a", "b", "c"):
            nursery.start_soon(queued, name)
            await trio.testing.wait_all_tasks_blocked()
    assert order == ["a", "b", "c"]
    texts = [i.content for i in await session.get_items() if isinstance(i, ta.UserMessage)]
    assert texts == ["one", "a", "b", "c"]


async def test_a_run_cancelled_while_queued_leaves_the_session_untouched(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = MemorySession("s")
    waiting_model = ScriptedModel(["never"])
    async with held_by_a_slow_run(session) as first:
        async with enqueued(waiting_model, "two", session) as waiting:
            await trio.testing.wait_all_tasks_blocked()
            waiting.cancel("gave up")
        # The place in the queue is given up: a later run gets the session after the first.
        later = await ta.run(
            agent(ScriptedModel(["later"])), "three", session=session, on_busy="enqueue"
        )
    assert waiting.result is not None
    assert (waiting.result.status, waiting.result.reason) == ("cancelled", "gave up")
    assert waiting.result.conversation == (ta.UserMessage("two"),)
    assert waiting_model.calls == 0
    assert first.result is not None
    assert first.result.status == "completed"
    assert later.status == "completed"
    texts = [i.content for i in await session.get_items() if isinstance(i, ta.UserMessage)]
    assert texts == ["one", "three"]


async def test_outer_cancel_while_queued_gives_the_place_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = MemorySession("s")
    async with held_by_a_slow_run(session):
        with trio.move_on_after(1):
            await ta.run(agent(ScriptedModel(["x"])), "two", session=session, on_busy="enqueue")
        later = await ta.run(
            agent(ScriptedModel(["later"])), "three", session=session, on_busy="enqueue"
        )
    assert later.status == "completed"


def test_enqueue_across_trio_runs_in_threads(tmp_path: Path) -> None:
    """A run in one thread's ``trio.run`` hands the session to a waiter in another.

    Driven by events, not by timing: the holder keeps the session until the waiter is
    in its queue, whatever the machine's load."""
    db = tmp_path / "threads.db"
    holding = threading.Event()
    queued = threading.Event()
    results: dict[str, ta.RunResult] = {}
    errors: list[BaseException] = []

    @ta.function_tool
    def hold() -> str:
        """Hold the session until the other thread's run waits for it."""
        if not queued.wait(10):
            raise RuntimeError("the waiter never queued")
        return "held long enough"

    async def holder() -> None:
        model = ScriptedModel([Turn(tool_calls=[("hold", {})]), "held"])
        async with (
            SQLiteSession(db, "s") as session,
            ta.open_run(
                ta.Agent(name="h", model=model, tools=[hold]), "one", session=session
            ) as run,
        ):
            await reached(run, ta.ToolStarted)
            holding.set()
        assert run.result is not None
        results["holder"] = run.result

    async def waiter() -> None:
        async with (
            SQLiteSession(db, "s") as session,
            ta.open_run(
                agent(ScriptedModel(["waited"])), "two", session=session, on_busy="enqueue"
            ) as run,
        ):
            assert run.status == "queued"  # in the session's queue, behind the holder
            queued.set()
        assert run.result is not None
        results["waiter"] = run.result

    def in_thread(fn: object) -> None:
        try:
            trio.run(fn)  # type: ignore[arg-type]
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    first = threading.Thread(target=in_thread, args=(holder,))
    first.start()
    assert holding.wait(10)
    second = threading.Thread(target=in_thread, args=(waiter,))
    second.start()
    first.join(10)
    second.join(10)
    assert errors == []
    assert results["holder"].final_output == "held"
    assert results["waiter"].final_output == "waited"
    # the waiter started only once the holder's conversation was stored
    texts = [i.content for i in results["waiter"].conversation if isinstance(i, ta.UserMessage)]
    assert texts == ["one", "two"]


async def test_on_busy_is_validated() -> None:
    with pytest.raises(ValueError, match="on_busy"):
        await ta.run(agent(ScriptedModel(["x"])), "x", on_busy="wait")


# -------------------------------------------------------- reuse after cancel


@pytest.mark.parametrize("where", ["mid-stream", "mid-tool", "awaiting-approval", "queued"])
async def test_a_cancelled_run_is_followed_by_one_that_completes(db: Path, where: str) -> None:
    with trio.fail_after(10):
        await cancel_then_reuse(db, where)


async def cancel_then_reuse(db: Path, where: str) -> None:
    first_turn = {
        "mid-stream": Turn(text=["partial ", "answer ", "never ", "finished"], delay=0.5),
        "mid-tool": Turn(text="calling", tool_calls=[("slow", {"seconds": 3600})]),
        "awaiting-approval": Turn(tool_calls=[("guarded", {"x": 1}), ("slow", {"seconds": 0})]),
        "queued": Turn(text="unreached"),
    }[where]
    first_model = ScriptedModel([first_turn, "unreached"])
    next_model = ScriptedModel(["all good"])
    async with SQLiteSession(db, "s") as session:
        async with ta.open_run(agent(first_model), "first", session=session) as run:
            if where == "mid-stream":
                await reached(run, ta.ResponseTextDelta)
            elif where == "mid-tool":
                await reached(run, ta.ToolStarted)
            elif where == "awaiting-approval":
                await status_reached(run, ta.RunStatus.AWAITING_APPROVAL)
            run.cancel("stop")
        assert run.result is not None
        assert run.result.status == "cancelled"
        stored = await session.get_items()
        assert stored == list(run.result.conversation)
        assert ta.conversation_problems(stored) == []
        if where == "mid-stream":
            assert stored[-1] == ta.AssistantMessage("partial ", status="incomplete")
        result = await ta.run(agent(next_model), "second", session=session)
    assert result.status == "completed"
    (request,) = next_model.requests
    assert ta.conversation_problems(request.items) == []
    assert request.items == (*stored, ta.UserMessage("second"))


async def test_a_generic_session_with_a_dangling_call_is_repaired_on_load(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = MemorySession("crashed")
    await session.add_items([ta.UserMessage("q"), ta.ToolCall("c1", "slow", '{"seconds": 1}')])
    model = ScriptedModel(["fine"])
    result = await ta.run(agent(model), "again", session=session)
    assert result.status == "completed"
    (request,) = model.requests
    assert request.items[2] == ta.ToolResult("c1", "cancelled: interrupted", status="cancelled")
    assert ta.conversation_problems(request.items) == []


class ChangedUnderTheRun:
    """A session whose second write stores its items, then someone else appends one
    and the write raises: its rows no longer say what the write stored."""

    def __init__(self) -> None:
        self.inner = MemorySession("changed")
        self.session_id = "changed"
        self.adds = 0

    async def get_items(self) -> list[ta.Item]:
        return await self.inner.get_items()

    async def add_items(self, items: Sequence[ta.Item]) -> None:
        await self.inner.add_items(items)
        self.adds += 1
        if self.adds == 2:
            await self.inner.add_items([ta.UserMessage("from elsewhere")])
            raise OSError("connection lost after the commit")

    async def clear(self) -> None:
        await self.inner.clear()


async def test_a_write_that_raised_is_never_guessed_at(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # After a write that raised, the run reads the rows to find what it stored; rows
    # that are neither what it knew of nor that followed by what it has to write cannot
    # tell it: it writes nothing more (never a duplicate) and fails with a session error.
    session = ChangedUnderTheRun()
    model = ScriptedModel([Turn(tool_calls=[("slow", {"seconds": 1})]), "done"])
    result = await ta.run(agent(model), "hi", session=session)
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason.startswith("session error: RuntimeError: cannot tell what an")
    # The write of the call raised: the run failed, the repair answered the call.
    user, call, answer = result.conversation
    assert isinstance(call, ta.ToolCall)
    assert answer == ta.ToolResult(
        call.call_id,
        "cancelled: session error: OSError: connection lost after the commit",
        status="cancelled",
    )
    assert ta.conversation_problems(list(result.conversation)) == []
    # Written once each, then nothing: the rows stay as the other writer left them.
    assert await session.get_items() == [user, call, ta.UserMessage("from elsewhere")]
