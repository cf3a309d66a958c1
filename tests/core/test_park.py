"""Parking a run at its approval wait (the ``park_after`` run option, DESIGN §20): the
run stops without a cancel repair, its calls left open in its session, and a run
resumed from that session (``resume=``) waits for the same decisions — approved or
rejected there, or already decided in the ``Resume``. Real SQLite session files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import trio_agents as ta
from tests.support.helpers import collect
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import SQLiteSession
from trio_agents.tracing import OpenTelemetryHooks


def approval_agent(
    model: ScriptedModel, ran: list[str], gate: trio.Event | None = None
) -> ta.Agent:
    """``delete`` needs approval; ``lookup`` does not and, given ``gate``, waits for it."""

    @ta.function_tool(needs_approval=True)
    async def delete(ctx: ta.ToolContext) -> str:
        """Delete it."""
        ran.append(ctx.call_id)
        return "deleted"

    @ta.function_tool
    async def lookup(ctx: ta.ToolContext) -> str:
        """Look it up."""
        if gate is not None:
            await gate.wait()
        ran.append(ctx.call_id)
        return "looked up"

    return ta.Agent(name="a", instructions="", model=model, tools=[delete, lookup])


def one_call(call_id: str = "c1", name: str = "delete") -> Turn:
    return Turn(tool_calls=[ta.ToolCall(call_id, name, "{}")])


async def parked_run(
    session: SQLiteSession, model: ScriptedModel, ran: list[str]
) -> tuple[ta.RunResult, list[ta.RunEvent]]:
    """Run until it parks (``park_after=30``, virtual time): its result and events."""
    async with ta.open_run(
        approval_agent(model, ran), "delete it", session=session, park_after=30
    ) as run:
        events = await collect(run)
    assert run.result is not None
    return run.result, events


async def until_awaiting(run: ta.Run) -> ta.RunUpdated:
    """Follow the run's updates until it awaits approval (the session's SQLite work runs
    in threads, which ``wait_all_tasks_blocked`` does not wait for)."""
    async for update in run.updated:
        if update.status == "awaiting_approval":
            return update
    raise AssertionError(f"the run ended {run.result}")


def results(items: list[ta.Item] | tuple[ta.Item, ...]) -> dict[str, ta.ToolResult]:
    return {i.call_id: i for i in items if isinstance(i, ta.ToolResult)}


async def test_a_parked_run_leaves_its_call_open_and_a_resumed_run_approves_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ran: list[str] = []
    model = ScriptedModel([one_call(), "done"])
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        parked, events = await parked_run(session, model, ran)
        assert parked.parked
        assert (parked.status, parked.reason) == ("awaiting_approval", "parked")
        assert not parked.status.is_terminal
        assert ran == []
        # No cancel repair: the call is open in the result and, as stored, in the session.
        assert results(parked.conversation) == {}
        stored = await session.get_stored_items()
        assert stored[-1] == ta.ToolCall("c1", "delete", "{}")
        assert results(stored) == {}
        # Its last update says it still awaits approval, parked (not terminal, no reason).
        last = events[-1]
        assert isinstance(last, ta.RunUpdated)
        assert (last.status, last.reason) == ("awaiting_approval", None)
        assert last.detail == {"pending": ["c1"], "parked": True}

        resume = ta.Resume(attempt=2, next_seq=last.seq + 1)
        async with ta.open_run(
            approval_agent(model, ran), [], session=session, resume=resume
        ) as run:
            # The same decision is asked for again.
            assert (await until_awaiting(run)).detail == {"pending": ["c1"]}
            run.approve("c1")
            resumed = await collect(run, from_seq=last.seq + 1)
        assert run.result is not None
        assert run.result.status == "completed", run.result.reason
        assert ran == ["c1"]
        # Seqs go on after the parked run's; the resumed run says it resumed.
        assert resumed[0].seq == last.seq + 1
        running = [e for e in resumed if isinstance(e, ta.RunUpdated) and e.status == "running"]
        assert running[0].detail == {"resumed": True, "attempt": 2}
        stored = await session.get_stored_items()
        assert results(stored)["c1"].output == "deleted"
        assert ta.conversation_problems(stored) == []
        # The model saw the call answered: valid input only once the decision was in.
        assert all(ta.conversation_problems(r.items) == [] for r in model.requests)


async def test_a_resumed_run_rejecting_a_parked_call_closes_it_properly(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ran: list[str] = []
    model = ScriptedModel([one_call(), "ok, not deleted"])
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        parked, events = await parked_run(session, model, ran)
        assert parked.parked
        resume = ta.Resume(attempt=2, next_seq=events[-1].seq + 1)
        async with ta.open_run(
            approval_agent(model, ran), [], session=session, resume=resume
        ) as run:
            await until_awaiting(run)
            assert run.statistics().pending_approvals == ("c1",)
            run.reject("c1", message="not today")
        assert run.result is not None
        assert run.result.status == "completed"
        assert ran == []
        stored = await session.get_stored_items()
        assert (results(stored)["c1"].status, results(stored)["c1"].output) == (
            "error",
            "rejected: not today",
        )
        assert ta.conversation_problems(stored) == []
        assert ta.conversation_problems(model.requests[-1].items) == []


async def test_a_decision_recorded_in_the_resume_is_applied_when_the_wait_begins(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ran: list[str] = []
    model = ScriptedModel([one_call(), "done"])
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        _, events = await parked_run(session, model, ran)
        resume = ta.Resume(attempt=2, next_seq=events[-1].seq + 1, approved={"c1"})
        async with ta.open_run(
            approval_agent(model, ran), [], session=session, resume=resume
        ) as run:
            seen = await collect(run)
    assert run.result is not None
    assert run.result.status == "completed"
    assert ran == ["c1"]
    assert "awaiting_approval" not in [e.status for e in seen if isinstance(e, ta.RunUpdated)]


async def test_a_plain_run_on_a_parked_session_closes_the_open_call(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Not resumed: the parked call is answered by the load's repair, like a crash's.
    ran: list[str] = []
    model = ScriptedModel([one_call(), "hello"])
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        await parked_run(session, model, ran)
        result = await ta.run(approval_agent(model, ran), "something else", session=session)
        assert result.status == "completed"
        assert results(result.conversation)["c1"].status == "cancelled"
        assert ta.conversation_problems(await session.get_stored_items()) == []


async def test_an_approve_just_before_the_park_is_due_wins(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ran: list[str] = []
    model = ScriptedModel([one_call(), "done"])
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        async with ta.open_run(
            approval_agent(model, ran), "go", session=session, park_after=30
        ) as run:
            await until_awaiting(run)
            await trio.sleep(29.999)
            run.approve("c1")
        assert run.result is not None
        assert (run.result.status, ran) == ("completed", ["c1"])


async def test_a_decision_after_the_park_is_refused_with_status_parked(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ran: list[str] = []
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        async with ta.open_run(
            approval_agent(ScriptedModel([one_call()]), ran), "go", session=session, park_after=0
        ) as run:
            pass
        assert run.result is not None
        assert run.result.parked
        # Still listed as waiting (what a host shows, with the approve buttons).
        assert run.status == "awaiting_approval"
        assert run.statistics().pending_approvals == ("c1",)
        # Refused, never silently dropped: the caller gives it to the resumed run.
        with pytest.raises(ta.RunClosedError) as caught:
            run.approve("c1")
        assert caught.value.status == "parked"
        with pytest.raises(ta.RunClosedError, match="parked"):
            run.reject("c1", message="no")
        with pytest.raises(ta.RunClosedError):
            run.inject([{"role": "user", "content": "late"}])
        assert ran == []


async def test_an_approve_racing_the_park_is_applied_or_refused_never_lost(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ran: list[str] = []
    model = ScriptedModel([one_call(), "done"])
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        async with ta.open_run(
            approval_agent(model, ran), "go", session=session, park_after=30
        ) as run:
            await until_awaiting(run)
            await trio.sleep(30)  # the park is due now: it happens at this tick
            try:
                run.approve("c1")
            except ta.RunClosedError as exc:
                refused: str | None = exc.status
            else:
                refused = None
        assert run.result is not None
        if refused is None:
            # The approve came first: it ran here.
            assert (run.result.status, ran) == ("completed", ["c1"])
        else:
            # The park came first: the approve was refused, for the resumed run.
            assert refused == "parked"
            assert run.result.parked
            assert ran == []


async def test_a_run_does_not_park_while_a_call_of_its_turn_executes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ran: list[str] = []
    gate = trio.Event()
    model = ScriptedModel(
        [
            Turn(tool_calls=[ta.ToolCall("w", "delete", "{}"), ta.ToolCall("x", "lookup", "{}")]),
            "done",
        ]
    )
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        async with ta.open_run(
            approval_agent(model, ran, gate), "go", session=session, park_after=5
        ) as run:
            await until_awaiting(run)
            await trio.sleep(60)  # long past park_after: "x" still executes
            assert run.status == "awaiting_approval"
            gate.set()  # "x" ends; "w" alone waits: the run parks now
            events = await collect(run)
        assert run.result is not None
        assert run.result.parked
        assert ran == ["x"]
        last = events[-1]
        assert isinstance(last, ta.RunUpdated)
        assert last.detail == {"pending": ["w"], "parked": True}
        stored = await session.get_stored_items()
        assert results(stored)["x"].output == "looked up"  # persisted, kept
        assert "w" not in results(stored)

        resume = ta.Resume(attempt=2, next_seq=events[-1].seq + 1, rejected={"w": "no"})
        result = await ta.run(approval_agent(model, ran), [], session=session, resume=resume)
        assert result.status == "completed"
        assert results(result.conversation)["w"].output == "rejected: no"
        assert ran == ["x"]  # neither call ran twice


async def test_a_cancel_during_the_approval_wait_still_cancels_a_parkable_run(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    ran: list[str] = []
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        async with ta.open_run(
            approval_agent(ScriptedModel([one_call()]), ran), "go", session=session, park_after=30
        ) as run:
            await until_awaiting(run)
            run.cancel("stop")
        assert run.result is not None
        assert (run.result.status, run.result.reason) == ("cancelled", "stop")
        assert results(await session.get_stored_items())["c1"].status == "cancelled"


@pytest.mark.parametrize(
    ("value", "error"),
    [(-1, ValueError), (float("nan"), ValueError), ("5", TypeError), (True, TypeError)],
)
async def test_bad_park_after_values_are_refused(
    tmp_path: Path, value: Any, error: type[Exception]
) -> None:
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        with pytest.raises(error, match="park_after"):
            await ta.run(
                approval_agent(ScriptedModel(["hi"]), []), "go", session=session, park_after=value
            )


async def test_park_after_needs_a_session_and_a_root_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="park_after needs a session"):
        await ta.run(approval_agent(ScriptedModel(["hi"]), []), "go", park_after=1)

    child = approval_agent(ScriptedModel(["child"]), [])

    @ta.function_tool
    async def delegate(ctx: ta.ToolContext) -> str:
        """Ask the child."""
        result = await ctx.run(child, "go", session="inherit", park_after=1)
        return str(result.final_output)

    parent = ta.Agent(
        name="p",
        instructions="",
        model=ScriptedModel([Turn(tool_calls=[("delegate", {})]), "done"]),
        tools=[delegate],
    )
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        result = await ta.run(parent, "go", session=session)
    tool_result = results(result.conversation)["call_1_0"]
    assert "park_after needs a session and a root run" in tool_result.output


async def test_a_parked_run_s_span_ends_without_an_error(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    hooks = OpenTelemetryHooks(tracer_provider=provider)
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        result = await ta.run(
            approval_agent(ScriptedModel([one_call()]), []),
            "go",
            session=session,
            park_after=1,
            hooks=hooks,
        )
    assert result.parked
    (run_span,) = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    assert run_span.status.status_code is not StatusCode.ERROR
    assert run_span.attributes is not None
    assert run_span.attributes["trio_agents.run.status"] == "awaiting_approval"
