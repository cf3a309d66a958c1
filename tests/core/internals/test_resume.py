"""Resuming a run from its session (the ``resume`` and ``before_tool`` run options, the
core of a cluster takeover, DESIGN §12): which open calls run again, which are answered
``interrupted``, seqs continuing, and the start barrier before each tool."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import hypothesis
import pytest
import trio
import trio.testing
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.core_runs import by_call, resume_agent
from tests.support.helpers import collect
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import MemorySession, SQLiteSession


async def session_holding(*items: ta.Item) -> MemorySession:
    """A memory session, ``s``, whose stored history is ``items``."""
    session = MemorySession("s")
    await session.add_items(items)
    return session


async def crashed_session() -> MemorySession:
    """What a node killed mid-turn leaves: a turn's calls, one answered."""
    return await session_holding(
        ta.UserMessage("do it"),
        ta.ToolCall("c1", "lookup", "{}"),
        ta.ToolCall("c2", "charge", "{}"),
        ta.ToolCall("c3", "charge", "{}"),
        ta.ToolCall("c4", "delete", "{}"),
        ta.ToolResult("c3", "charged"),
    )


async def test_a_resumed_run_reruns_idempotent_calls_and_interrupts_started_ones() -> None:
    session = await crashed_session()
    ran: list[str] = []
    model = ScriptedModel(["all done"])
    resume = ta.Resume(attempt=2, next_seq=41, started={"c1", "c2", "c3"}, reason="node a died")
    async with ta.open_run(resume_agent(model, ran), [], session=session, resume=resume) as run:
        events_task: list[ta.RunEvent] = []
        async with trio.open_nursery() as nursery:

            async def read() -> None:
                events_task.extend(await collect(run))

            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert run.status is ta.RunStatus.AWAITING_APPROVAL
            run.approve("c4")
    result = run.result
    assert result is not None
    assert result.status == "completed", result.reason
    # c1 (idempotent) ran again, c2 (started, not idempotent) did not, c4 never started.
    assert sorted(ran) == ["c1", "c4"]
    results = by_call(result.conversation)
    assert results["c1"].output == "looked up"
    assert (results["c2"].status, results["c2"].output) == ("error", "interrupted: node a died")
    assert results["c3"].output == "charged"  # the stored result is kept
    assert results["c4"].output == "deleted"
    assert ta.conversation_problems(await session.get_items()) == []
    assert ta.conversation_problems(model.requests[0].items) == []
    # Seqs continue the earlier attempts' (40 events), contiguous, one terminal update.
    assert [e.seq for e in events_task] == list(range(41, 41 + len(events_task)))
    terminal = [e for e in events_task if isinstance(e, ta.RunUpdated) and e.status.is_terminal]
    assert terminal == [events_task[-1]]
    first_running = next(
        e for e in events_task if isinstance(e, ta.RunUpdated) and e.status == "running"
    )
    assert first_running.detail == {"resumed": True, "attempt": 2}
    # The interrupted call's tool.started came from the earlier attempt: it gets its
    # tool.finished here; the re-run calls get both.
    finished = {e.call_id: e.status for e in events_task if isinstance(e, ta.ToolFinished)}
    assert finished == {"c1": "ok", "c2": "error", "c4": "ok"}


async def test_a_call_that_never_started_runs_once_on_resume() -> None:
    session = await crashed_session()
    ran: list[str] = []
    resume = ta.Resume(attempt=3, next_seq=7)  # nothing had started
    async with ta.open_run(
        resume_agent(ScriptedModel(["ok"]), ran), [], session=session, resume=resume
    ) as run:
        await trio.testing.wait_all_tasks_blocked()
        run.approve("c4")
    assert run.result is not None
    assert run.result.status == "completed"
    assert sorted(ran) == ["c1", "c2", "c4"]


async def test_cancelling_a_resumed_run_awaiting_approval_leaves_a_valid_session() -> None:
    session = await crashed_session()
    ran: list[str] = []
    resume = ta.Resume(attempt=2, next_seq=5, started={"c1", "c2"})
    async with ta.open_run(
        resume_agent(ScriptedModel(["ok"]), ran), [], session=session, resume=resume
    ) as run:
        await trio.testing.wait_all_tasks_blocked()
        assert run.status is ta.RunStatus.AWAITING_APPROVAL
        run.cancel("stop")
    assert run.result is not None
    assert run.result.status == "cancelled"
    assert by_call(run.result.conversation)["c4"].output == "cancelled: stop"
    stored = await session.get_items()
    assert ta.conversation_problems(stored) == []
    assert "c4" not in ran


async def test_resume_on_a_session_with_nothing_open_just_continues(tmp_path: Any) -> None:
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        await session.add_items([ta.UserMessage("hi"), ta.AssistantMessage("hello")])
        resume = ta.Resume(attempt=2, next_seq=3)
        result = await ta.run(
            resume_agent(ScriptedModel(["again"]), []), [], session=session, resume=resume
        )
        assert result.status == "completed", result.reason
        assert [type(i).__name__ for i in await session.get_items()] == [
            "UserMessage",
            "AssistantMessage",
            "AssistantMessage",
        ]


async def test_a_resumed_run_starts_its_budget_from_what_was_spent() -> None:
    # Two requests spent by earlier attempts, three allowed: one more request is sent;
    # the next would be the fourth.
    session = await session_holding(ta.UserMessage("go"))
    model = ScriptedModel([Turn(tool_calls=[("lookup", {})])], default="again")
    result = await ta.run(
        resume_agent(model, []),
        [],
        session=session,
        resume=ta.Resume(attempt=2, next_seq=1, spent={"requests": 2, "tool_calls": 0}),
        limits=ta.UsageLimits(requests=3),
    )
    assert (result.status, result.reason) == ("failed", "usage limit: requests 4/3")
    assert len(model.requests) == 1


async def test_a_resumed_run_starts_its_cost_budget_from_what_was_spent() -> None:
    # 40 millionths of a USD spent before (in billionths, Resume.spent holds ints); the
    # one request now costs 2 more: past a budget of 40.
    session = await session_holding(ta.UserMessage("go"))
    usage = ta.Usage(1, 1, cost=Decimal("0.000002"))
    model = ScriptedModel([Turn("done", usage=usage)])
    result = await ta.run(
        resume_agent(model, []),
        [],
        session=session,
        resume=ta.Resume(attempt=2, next_seq=1, spent={"cost_nano_usd": 40_000}),
        limits=ta.UsageLimits(cost=Decimal("0.00004")),
    )
    assert (result.status, result.reason) == ("failed", "usage limit: cost 0.000042/0.00004")


async def test_a_resumed_runs_usage_counts_the_earlier_attempts_calls() -> None:
    # Before: a resumed run's usage started from nothing, so its result and cost left
    # out every call an earlier attempt made.
    session = await session_holding(ta.UserMessage("go"))
    earlier = ta.Usage(100, 7, "m", cache_read_tokens=40, cost=Decimal("0.000123"))
    now = ta.Usage(30, 2, "m", cache_read_tokens=0, cost=Decimal("0.0000071"))
    model = ScriptedModel([Turn("done", usage=now)])
    result = await ta.run(
        resume_agent(model, []),
        [],
        session=session,
        resume=ta.Resume(attempt=2, next_seq=1, usage=earlier),
    )
    assert result.status == "completed"
    assert result.usage == result.tree_usage == earlier + now
    assert result.usage is not None
    assert result.usage.cost == Decimal("0.0001301")


async def test_a_resumed_runs_deadline_counts_from_its_original_start(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = await session_holding(ta.UserMessage("go"))
    model = ScriptedModel([], default="never asked")
    result = await ta.run(
        resume_agent(model, []),
        [],
        session=session,
        resume=ta.Resume(attempt=2, next_seq=1, elapsed=60.0),
        limits=ta.UsageLimits(deadline=30.0),
    )
    assert (result.status, result.reason) == ("failed", "timeout")
    assert model.requests == []


async def test_resume_needs_a_session_and_no_input() -> None:
    resume = ta.Resume(attempt=2, next_seq=1)
    with pytest.raises(ValueError, match="resume"):
        await ta.run(resume_agent(ScriptedModel(["x"]), []), [], resume=resume)
    with pytest.raises(ValueError, match="resume"):
        await ta.run(
            resume_agent(ScriptedModel(["x"]), []), "hi", session=MemorySession("s"), resume=resume
        )


def test_resume_is_a_hashable_value_with_its_decisions() -> None:
    one = ta.Resume(attempt=2, next_seq=1, approved={"a"}, rejected={"b": "no"})
    same = ta.Resume(attempt=2, next_seq=1, approved=["a"], rejected={"b": "no"})
    assert one == same
    assert hash(one) == hash(same)
    assert one != ta.Resume(attempt=2, next_seq=1, approved={"a"}, rejected={"b": None})
    with pytest.raises(TypeError):
        one.rejected["c"] = None  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"attempt": 1, "next_seq": 1}, ValueError),
        ({"attempt": 2, "next_seq": 0}, ValueError),
        ({"attempt": True, "next_seq": 1}, TypeError),
        ({"attempt": 2, "next_seq": 1, "started": "c1"}, TypeError),
        ({"attempt": 2, "next_seq": 1, "reason": None}, TypeError),
        ({"attempt": 2, "next_seq": 1, "approved": "c1"}, TypeError),
        ({"attempt": 2, "next_seq": 1, "approved": {1}}, TypeError),
        ({"attempt": 2, "next_seq": 1, "rejected": ["c1"]}, TypeError),
        ({"attempt": 2, "next_seq": 1, "rejected": {"c1": 3}}, TypeError),
        ({"attempt": 2, "next_seq": 1, "approved": {"c1"}, "rejected": {"c1": None}}, ValueError),
        ({"attempt": 2, "next_seq": 1, "spent": [("requests", 1)]}, TypeError),
        ({"attempt": 2, "next_seq": 1, "spent": {"requests": 1.5}}, TypeError),
        ({"attempt": 2, "next_seq": 1, "spent": {"requests": -1}}, ValueError),
        ({"attempt": 2, "next_seq": 1, "elapsed": "1"}, TypeError),
        ({"attempt": 2, "next_seq": 1, "elapsed": -1.0}, ValueError),
        ({"attempt": 2, "next_seq": 1, "elapsed": float("nan")}, ValueError),
        ({"attempt": 2, "next_seq": 1, "children": {"p/c": ("run_1", 3)}}, TypeError),
        ({"attempt": 2, "next_seq": 1, "children": {("p", "c"): ("", 3)}}, TypeError),
        ({"attempt": 2, "next_seq": 1, "children": {("p", "c"): ("run_1", 0)}}, ValueError),
        ({"attempt": 2, "next_seq": 1, "usage": {"input_tokens": 1}}, TypeError),
    ],
)
def test_resume_validates_its_fields(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        ta.Resume(**kwargs)


@pytest.mark.parametrize("approved", [True, False])
async def test_a_decision_an_earlier_attempt_recorded_answers_the_call_asked_again(
    approved: bool,
) -> None:
    # The earlier attempt had the approval (or rejection) of c4 but never ran it: the
    # resumed run answers c4 with it, never shows awaiting_approval, and a second
    # decision for c4 is refused like one for any answered call.
    session = await crashed_session()
    ran: list[str] = []
    decided: dict[str, Any] = (
        {"approved": {"c4"}} if approved else {"rejected": {"c4": "not that file"}}
    )
    resume = ta.Resume(attempt=2, next_seq=5, started={"c2"}, **decided)
    model = ScriptedModel(["ok"])
    async with ta.open_run(resume_agent(model, ran), [], session=session, resume=resume) as run:
        statuses = [u.status.value async for u in run.updated]
        with pytest.raises(ta.RunClosedError):
            run.approve("c4")
    assert run.result is not None
    assert run.result.status == "completed", run.result.reason
    assert "awaiting_approval" not in statuses
    result = by_call(run.result.conversation)["c4"]
    if approved:
        assert (result.status, result.output) == ("ok", "deleted")
        assert sorted(ran) == ["c1", "c4"]  # c2 had started: interrupted, not run
    else:
        assert (result.status, result.output) == ("error", "rejected: not that file")
        assert sorted(ran) == ["c1"]
    assert ta.conversation_problems(await session.get_items()) == []


async def test_a_recorded_decision_leaves_the_other_calls_awaiting_approval() -> None:
    session = await session_holding(
        ta.UserMessage("do it"),
        ta.ToolCall("c1", "delete", "{}"),
        ta.ToolCall("c2", "delete", "{}"),
    )
    ran: list[str] = []
    resume = ta.Resume(attempt=2, next_seq=4, approved={"c1"})
    async with ta.open_run(
        resume_agent(ScriptedModel(["ok"]), ran), [], session=session, resume=resume
    ) as run:
        await trio.testing.wait_all_tasks_blocked()
        assert run.status is ta.RunStatus.AWAITING_APPROVAL
        assert run.statistics().pending_approvals == ("c2",)
        with pytest.raises(ta.UnknownCallError):
            run.approve("c1")
        run.approve("c2")
    assert run.result is not None
    assert run.result.status == "completed", run.result.reason
    assert sorted(ran) == ["c1", "c2"]


async def test_before_tool_is_awaited_before_each_tool_runs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order: list[str] = []

    @ta.function_tool
    async def work(ctx: ta.ToolContext) -> str:
        """Work."""
        order.append(f"run {ctx.call_id}")
        return "ok"

    async def before_tool(call: ta.ToolCall) -> None:
        order.append(f"record {call.call_id}")
        await trio.sleep(1)  # a database round trip
        order.append(f"recorded {call.call_id}")

    model = ScriptedModel([Turn(tool_calls=[("work", {})]), "done"])
    a = ta.Agent(name="t", instructions="", model=model, tools=[work])
    result = await ta.run(a, "go", before_tool=before_tool)
    assert result.status == "completed"
    call_id = by_call(result.conversation).popitem()[0]
    assert order == [f"record {call_id}", f"recorded {call_id}", f"run {call_id}"]


async def test_a_failing_before_tool_means_the_tool_never_runs() -> None:
    ran: list[str] = []

    async def before_tool(call: ta.ToolCall) -> None:
        raise ConnectionError("database down")

    model = ScriptedModel([Turn(tool_calls=[("charge", {})]), "sorry"])
    result = await ta.run(resume_agent(model, ran), "go", before_tool=before_tool)
    assert result.status == "completed"
    assert ran == []
    output = next(iter(by_call(result.conversation).values()))
    assert output.status == "error"
    assert output.output == "not started: ConnectionError: database down"
    finished = [e for e in result.new_items if isinstance(e, ta.ToolResult)]
    assert len(finished) == 1


def test_function_tool_idempotent_must_be_a_bool() -> None:
    async def f() -> str:
        """F."""
        return ""

    assert ta.function_tool(f, idempotent=True).idempotent is True
    assert ta.function_tool(f).idempotent is False
    with pytest.raises(TypeError):
        ta.function_tool(f, idempotent="yes")  # type: ignore[call-overload]


def test_an_event_log_starting_later_keeps_its_seqs() -> None:
    from trio_agents._log import EventLog

    log = EventLog("r", retention=4, start_seq=100)
    assert (log.first_seq, log.next_seq) == (100, 100)
    for seq in range(100, 110):
        log.append(
            ta.RunUpdated(
                run_id="r", seq=seq, status=ta.RunStatus.RUNNING, reason=None, turn=0, at=0.0
            )
        )
    assert [e.seq for e in log.retained()] == [106, 107, 108, 109]


# ------------------------------------------------------------------ property

TOOL_KINDS = ("lookup", "charge", "delete")  # idempotent, plain, needs approval


@hypothesis.settings(max_examples=150, deadline=None, derandomize=True, database=None)
@hypothesis.given(
    tail=st.lists(st.sampled_from(TOOL_KINDS), min_size=0, max_size=5),
    answered=st.sets(st.integers(0, 4)),
    started=st.sets(st.integers(0, 4)),
    approve=st.booleans(),
    next_seq=st.integers(1, 10_000),
)
def test_resume_never_runs_a_started_call_twice(
    tail: list[str], answered: set[int], started: set[int], approve: bool, next_seq: int
) -> None:
    """Whatever a crash left at the end of the session, a resumed run: runs each
    unanswered call at most once, never a started non-idempotent one; answers every call;
    keeps the stored results; leaves a valid session; continues the seqs."""
    calls = [ta.ToolCall(f"c{i}", name, "{}") for i, name in enumerate(tail)]
    stored_results = [
        ta.ToolResult(c.call_id, "stored") for i, c in enumerate(calls) if i in answered
    ]
    started_ids = {f"c{i}" for i in started}
    ran: list[str] = []

    async def main() -> ta.RunResult:
        session = await session_holding(ta.UserMessage("go"), *calls, *stored_results)
        resume = ta.Resume(attempt=2, next_seq=next_seq, started=started_ids)
        model = ScriptedModel(["done"])
        async with ta.open_run(resume_agent(model, ran), [], session=session, resume=resume) as run:

            async def decide() -> None:
                async for update in run.updated:
                    if update.status is ta.RunStatus.AWAITING_APPROVAL:
                        for call_id in update.detail["pending"]:
                            if approve:
                                run.approve(call_id)
                            else:
                                run.reject(call_id)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(decide)
        assert run.result is not None
        stored = await session.get_items()
        assert ta.conversation_problems(stored) == []
        assert stored[: 1 + len(calls) + len(stored_results)] == [
            ta.UserMessage("go"),
            *calls,
            *stored_results,
        ]
        seqs = [e.seq async for e in run.events()]
        assert seqs == list(range(next_seq, next_seq + len(seqs)))
        return run.result

    result = trio.run(main)
    assert result.status == "completed", result.reason
    open_ids = [c.call_id for i, c in enumerate(calls) if i not in answered]
    results = by_call(result.conversation)
    assert set(results) == {c.call_id for c in calls}
    assert len(ran) == len(set(ran))
    for call in calls:
        if call.call_id not in open_ids:
            assert results[call.call_id].output == "stored"
            assert call.call_id not in ran
        elif call.call_id in started_ids and call.name != "lookup":
            assert results[call.call_id].output.startswith("interrupted: ")
            assert call.call_id not in ran
        elif call.name == "delete" and not approve:
            assert call.call_id not in ran
        else:
            assert call.call_id in ran
