"""``Resume`` on the shipped stored sessions (a real SQLite file, the test-started
PostgreSQL): the calls a dead process left open reach the resumed run unrepaired, so an
idempotent call runs again, a call that never started is asked for approval, and a
started one gets ``error "interrupted: <reason>"``, never ``cancelled``. Also what a
resumed load does when the session misbehaves, and a real ``SIGKILL`` mid-tool."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.core_runs import by_call, resume_agent
from tests.support.crash import sigkill_once_printed
from trio_agents.models import ScriptedModel
from trio_agents.sessions import PostgresSession, SQLiteSession
from trio_agents.testing._fakes import stray_cancelled

CRASHED: list[ta.Item] = [
    ta.UserMessage("do it"),
    ta.ToolCall("c1", "lookup", "{}"),  # idempotent
    ta.ToolCall("c2", "charge", "{}"),  # started: interrupted
    ta.ToolCall("c3", "charge", "{}"),
    ta.ToolCall("c4", "delete", "{}"),  # needs approval, never started
    ta.ToolResult("c3", "charged"),
]


@pytest.fixture(params=["sqlite", "postgres"])
async def stored(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    """A stored session of each shipped kind, holding what a crashed attempt left."""
    session: SQLiteSession | PostgresSession
    if request.param == "sqlite":
        session = SQLiteSession(tmp_path / "s.db", "s")
    else:
        session = PostgresSession(request.getfixturevalue("pg_dsn"), "s")
    async with session:
        await session.add_items(CRASHED)
        yield session


async def awaiting_approval(run: ta.Run) -> bool:
    """Wait (the session works in threads) until ``run`` awaits an approval; ``False``
    if it ends first."""
    with trio.fail_after(30):
        async for update in run.updated:
            if update.status is ta.RunStatus.AWAITING_APPROVAL:
                return True
    return False


async def reopen(session: SQLiteSession | PostgresSession) -> list[ta.Item]:
    """The rows as a fresh object (another process) reads them, unrepaired."""
    other = (
        SQLiteSession(session.path, "s")
        if isinstance(session, SQLiteSession)
        else PostgresSession(session._dsn, "s")
    )
    async with other:
        return await other.get_stored_items()


async def resumed(session: Any, reply: str, ran: list[str], resume: ta.Resume) -> ta.RunResult:
    """A whole run resuming ``session`` with ``resume``, its model answering ``reply``."""
    return await ta.run(
        resume_agent(ScriptedModel([reply]), ran), [], session=session, resume=resume
    )


async def test_a_stored_session_resumes_its_open_calls(stored: Any) -> None:
    ran: list[str] = []
    model = ScriptedModel(["all done"])
    resume = ta.Resume(attempt=2, next_seq=9, started={"c1", "c2"}, reason="node a died")
    async with ta.open_run(resume_agent(model, ran), [], session=stored, resume=resume) as run:
        # c4 never started: the resumed run asks for its approval.
        assert await awaiting_approval(run)
        assert run.statistics().pending_approvals == ("c4",)
        run.approve("c4")
    assert run.result is not None
    assert run.result.status == "completed", run.result.reason
    assert sorted(ran) == ["c1", "c4"]  # c1 idempotent: again; c2 started: not again
    results = by_call(run.result.conversation)
    assert results["c1"].output == "looked up"
    assert (results["c2"].status, results["c2"].output) == ("error", "interrupted: node a died")
    assert results["c3"].output == "charged"
    assert results["c4"].output == "deleted"
    assert ta.conversation_problems(model.requests[0].items) == []
    # The written rows: the crashed attempt's, then the resumed run's, in order.
    rows = await reopen(stored)
    assert rows == list(run.result.conversation)
    assert rows[: len(CRASHED)] == CRASHED
    assert ta.conversation_problems(rows) == []


async def test_a_resumed_stored_session_never_writes_the_load_repair(stored: Any) -> None:
    resume = ta.Resume(attempt=2, next_seq=9, started={"c1", "c2"})
    ran: list[str] = []
    async with ta.open_run(
        resume_agent(ScriptedModel(["ok"]), ran), [], session=stored, resume=resume
    ) as run:
        assert await awaiting_approval(run)
        # Loaded and waiting for c4's approval: nothing closed the open calls.
        assert (await reopen(stored))[: len(CRASHED)] == CRASHED
        run.cancel("stop")
    assert run.result is not None
    assert run.result.status == "cancelled"
    rows = await reopen(stored)
    assert rows == list(run.result.conversation)
    assert ta.conversation_problems(rows) == []
    results = by_call(rows)
    assert results["c4"].output == "cancelled: stop"
    assert "cancelled: interrupted" not in [r.output for r in results.values()]


CHILD = textwrap.dedent(
    """
    import sys
    import trio
    import trio_agents as ta
    from trio_agents.models import ScriptedModel, Turn
    from trio_agents.sessions import SQLiteSession

    @ta.function_tool(idempotent=True)
    async def lookup() -> str:
        "Read something (safe to repeat); hangs here."
        print("started lookup", flush=True)
        await trio.sleep_forever()
        return "unreachable"

    @ta.function_tool
    async def charge() -> str:
        "Charge a card (never twice); hangs here."
        print("started charge", flush=True)
        await trio.sleep_forever()
        return "unreachable"

    async def main(path: str) -> None:
        model = ScriptedModel([Turn(tool_calls=[("lookup", {}), ("charge", {})]), "unreached"])
        agent = ta.Agent(name="crashy", model=model, tools=[lookup, charge])
        async with SQLiteSession(path, "s") as session:
            await ta.run(agent, "do both", session=session)

    trio.run(main, sys.argv[1])
    """
)


async def kill_mid_tools(db: Path) -> None:
    """Run CHILD on ``db`` and SIGKILL it once both its tools are running."""
    with trio.fail_after(30):
        await sigkill_once_printed(CHILD, str(db), b"started lookup", b"started charge")


async def test_resume_after_a_real_sigkill_mid_tool(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    await kill_mid_tools(db)
    ran: list[str] = []
    model = ScriptedModel(["resumed"])
    async with SQLiteSession(db, "s") as session:
        left = await session.get_stored_items()
        calls = [item.call_id for item in left if isinstance(item, ta.ToolCall)]
        assert left == [
            ta.UserMessage("do both"),
            ta.ToolCall(calls[0], "lookup", "{}"),
            ta.ToolCall(calls[1], "charge", "{}"),
        ]
        # Both had started (a cluster records that before running a tool).
        resume = ta.Resume(attempt=2, next_seq=20, started=set(calls), reason="killed")
        result = await ta.run(resume_agent(model, ran), [], session=session, resume=resume)
    assert result.status == "completed", result.reason
    assert ran == [calls[0]]  # the idempotent lookup ran again; the charge did not
    results = by_call(result.conversation)
    assert (results[calls[0]].status, results[calls[0]].output) == ("ok", "looked up")
    assert (results[calls[1]].status, results[calls[1]].output) == ("error", "interrupted: killed")
    async with SQLiteSession(db, "s") as reopened:
        rows = await reopened.get_stored_items()
    assert rows == list(result.conversation)
    assert rows[:3] == left
    assert ta.conversation_problems(rows) == []


# ------------------------------------------------------------------ adversarial sessions


@attrs.define(eq=False)
class LoadFault:
    """A stored session whose resumed load (``get_stored_items``) misbehaves."""

    inner: SQLiteSession
    kind: str
    loads: int = 0

    @property
    def session_id(self) -> str:
        return self.inner.session_id

    async def get_stored_items(self) -> Any:
        self.loads += 1
        if self.kind == "raise":
            raise OSError("disk gone")
        if self.kind == "stray_cancel":
            raise await stray_cancelled()
        if self.kind == "block":
            await trio.sleep_forever()
        if self.kind == "garbage":
            return [*CRASHED, "not an item"]
        return await self.inner.get_stored_items()

    async def get_items(self) -> list[ta.Item]:
        return await self.inner.get_items()

    async def add_items(self, items: Sequence[ta.Item]) -> None:
        await self.inner.add_items(items)

    async def replace_items(self, items: Sequence[ta.Item]) -> None:
        await self.inner.replace_items(items)

    async def clear(self) -> None:
        await self.inner.clear()


@pytest.mark.parametrize("kind", ["raise", "stray_cancel", "garbage"])
async def test_a_resumed_load_that_fails_fails_the_run_and_writes_nothing(
    tmp_path: Path, kind: str
) -> None:
    async with SQLiteSession(tmp_path / "s.db", "s") as inner:
        await inner.add_items(CRASHED)
        session = LoadFault(inner, kind)
        ran: list[str] = []
        resume = ta.Resume(attempt=2, next_seq=9, started={"c1"})
        with trio.fail_after(30):
            result = await ta.run(
                resume_agent(ScriptedModel(["x"]), ran), [], session=session, resume=resume
            )
        assert result.status == "failed"
        assert result.reason is not None
        assert result.reason.startswith("session error: ")
        assert ran == []
        # The open calls are still there for the next attempt to resume.
        assert await inner.get_stored_items() == CRASHED


async def test_a_resumed_load_that_blocks_can_be_cancelled(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with SQLiteSession(tmp_path / "s.db", "s") as inner:
        await inner.add_items(CRASHED)
        session = LoadFault(inner, "block")
        resume = ta.Resume(attempt=2, next_seq=9)
        ran: list[str] = []
        async with ta.open_run(
            resume_agent(ScriptedModel(["x"]), ran), [], session=session, resume=resume
        ) as run:
            await trio.testing.wait_all_tasks_blocked()
            assert session.loads == 1
            run.cancel("stop")
        assert run.result is not None
        # The repair's load blocks too: the session holds nothing of this run, so the
        # run says so (DESIGN §5: never a plain `cancelled` that was not persisted).
        assert (run.result.status, run.result.reason) == ("failed", "cleanup timed out")
        assert ran == []
        # Never loaded, so never written: still resumable.
        assert await inner.get_stored_items() == CRASHED


async def test_resume_fields_naming_no_open_call_are_ignored(stored: Any) -> None:
    ran: list[str] = []
    resume = ta.Resume(
        attempt=7,
        next_seq=10**12,
        started={"ghost", "c3"},  # c3 is answered; ghost does not exist
        approved={"ghost2", "c1"},  # c1 needs no approval
        rejected={"ghost3": None, "c2": "no"},  # nor does c2
        reason="\x00\udce9 hostile \n reason",
    )
    async with ta.open_run(
        resume_agent(ScriptedModel(["ok"]), ran), [], session=stored, resume=resume
    ) as run:
        assert await awaiting_approval(run)
        assert run.statistics().pending_approvals == ("c4",)
        run.reject("c4")
    assert run.result is not None
    assert run.result.status == "completed", run.result.reason
    assert sorted(ran) == ["c1", "c2"]  # neither had started
    results = by_call(run.result.conversation)
    assert results["c3"].output == "charged"
    assert results["c4"].status == "error"
    assert ta.conversation_problems(await reopen(stored)) == []


async def test_resuming_twice_runs_nothing_twice(stored: Any) -> None:
    ran: list[str] = []
    resume = ta.Resume(attempt=2, next_seq=9, started={"c1", "c2", "c4"}, reason="gone")
    first = await resumed(stored, "one", ran, resume)
    assert first.status == "completed", first.reason
    assert ran == ["c1"]  # c4 had started and is not idempotent: interrupted
    assert by_call(first.conversation)["c4"].output == "interrupted: gone"
    # The same Resume again (a second takeover of an attempt that in fact finished):
    # nothing is open any more, so nothing runs; the conversation just continues.
    second = await resumed(stored, "two", ran, resume)
    assert second.status == "completed", second.reason
    assert ran == ["c1"]
    rows = await reopen(stored)
    assert rows == list(second.conversation)
    assert rows[: len(first.conversation)] == list(first.conversation)
    assert ta.conversation_problems(rows) == []


async def test_a_resumed_load_writes_back_a_mid_conversation_repair(stored: Any) -> None:
    # An orphan result in an earlier group is dropped by the load repair; that is no
    # append, so the stored session's replace_items writes it back, atomically, and
    # the open tail stays open.
    await stored.clear()
    await stored.add_items(
        [ta.UserMessage("a"), ta.ToolResult("orphan", "x"), ta.AssistantMessage("b"), *CRASHED]
    )
    resume = ta.Resume(attempt=2, next_seq=9, started={"c1", "c2", "c4"})
    ran: list[str] = []
    result = await resumed(stored, "ok", ran, resume)
    assert result.status == "completed", result.reason
    assert ran == ["c1"]
    rows = await reopen(stored)
    assert rows == list(result.conversation)
    assert rows[:5] == [ta.UserMessage("a"), ta.AssistantMessage("b"), *CRASHED[:3]]
    assert ta.conversation_problems(rows) == []


async def test_a_resumed_call_of_an_unknown_tool_gets_an_error_result(stored: Any) -> None:
    # The agent changed between attempts: an open call names a tool it no longer has.
    await stored.add_items([ta.ToolCall("c5", "gone", "{}")])
    ran: list[str] = []
    resume = ta.Resume(attempt=2, next_seq=9, started={"c1", "c2", "c4"})
    result = await resumed(stored, "ok", ran, resume)
    assert result.status == "completed", result.reason
    assert ran == ["c1"]
    gone = by_call(result.conversation)["c5"]
    assert gone.status == "error"
    assert "unknown tool 'gone'" in gone.output
    assert ta.conversation_problems(await reopen(stored)) == []


async def test_resuming_on_a_closed_stored_session_fails_the_run(tmp_path: Path) -> None:
    session = SQLiteSession(tmp_path / "s.db", "s")
    async with session:
        await session.add_items(CRASHED)
    resume = ta.Resume(attempt=2, next_seq=9)
    result = await ta.run(
        resume_agent(ScriptedModel(["x"]), []), [], session=session, resume=resume
    )
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason.startswith("session error: ")
    async with SQLiteSession(tmp_path / "s.db", "s") as again:
        assert await again.get_stored_items() == CRASHED
