"""Fault safety of the run core (DESIGN.md §4, §5, §6, §8, §9): one regression test per
defect of issue 13. Each misbehaving part here is the kind a user's own code could be."""

from __future__ import annotations

import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.core_runs import (
    EventsModel,
    fast_and_slow,
    inject_now_during_model_start,
    make_agent,
    raising_tool,
    run_to_the_end,
    slow,
)
from tests.support.helpers import collect
from trio_agents.models import Finish, ScriptedModel, TextDelta, ToolCallDone, Turn, Usage
from trio_agents.sessions import MemorySession, SQLiteSession
from trio_agents.testing import check_events


def call(call_id: str, name: str = "slow", arguments: str = "{}") -> ta.ToolCall:
    return ta.ToolCall(call_id, name, arguments)


async def raise_a_stray_cancelled() -> None:
    """Raise the ``trio.Cancelled`` of a scope of our own, outside that scope: a stray
    one, which nothing around the caller cancelled."""
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as exc:
            stray = exc
    raise stray


async def session_with_answered_call(call_id: str) -> MemorySession:
    """A session whose stored history already holds call ``call_id`` and its result."""
    session = MemorySession()
    await session.add_items([ta.UserMessage("a"), call(call_id), ta.ToolResult(call_id, "x")])
    return session


async def assert_session_free(session: Any) -> None:
    """A next run on the session starts (the first one released it) and sees valid rows."""
    result = await ta.run(make_agent(ScriptedModel(["ok"])), "again", session=session)
    assert result.status == "completed", result.reason
    assert ta.conversation_problems(await session.get_items()) == []


# ------------------------------------------------------------------ malformed models


@pytest.mark.parametrize(
    "bad",
    [TextDelta(b"bytes"), TextDelta(None), object(), Usage(-1, 2), Finish(3), ToolCallDone("x")],  # type: ignore[arg-type]
    ids=["bytes-text", "none-text", "unknown-event", "negative-usage", "int-finish", "not-a-call"],
)
async def test_a_malformed_model_event_fails_the_run_and_keeps_the_text(
    autojump_clock: trio.testing.MockClock, bad: object
) -> None:
    session = MemorySession()
    model = EventsModel([TextDelta("seen "), TextDelta("text"), bad])
    result, _ = await run_to_the_end(make_agent(model), "hi", session=session)
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason.startswith("ModelError: model yielded")
    assert isinstance(result.error, ta.ModelError)
    assert result.conversation[-1] == ta.AssistantMessage("seen text", status="incomplete")
    assert list(await session.get_items()) == list(result.conversation)
    await assert_session_free(session)


async def test_duplicate_call_ids_fail_with_model_error_and_keep_streamed_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = EventsModel(
        [TextDelta("let me check"), ToolCallDone(call("c1")), ToolCallDone(call("c1"))]
    )
    result = await ta.run(make_agent(model), "hi")
    assert result.status == "failed"
    assert result.reason == "ModelError: model returned a duplicate tool call id 'c1'"
    assert result.conversation[-1] == ta.AssistantMessage("let me check", status="incomplete")
    assert ta.conversation_problems(result.conversation) == []


async def test_a_call_id_reused_across_turns_fails_before_any_tool_runs_twice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ran: list[str] = []

    @ta.function_tool
    async def slow() -> str:
        """Record the call."""
        ran.append("slow")
        return "done"

    model = EventsModel([ToolCallDone(call("same"))], [ToolCallDone(call("same"))])
    result = await ta.run(make_agent(model, [slow]), "hi")
    assert result.status == "failed"
    assert isinstance(result.error, ta.ModelError)
    assert ran == ["slow"]
    assert ta.conversation_problems(result.conversation) == []


# ----------------------------------------------------------------- finish and usage


async def test_an_answer_cut_by_length_is_incomplete_and_says_why(
    autojump_clock: trio.testing.MockClock,
) -> None:
    result = await ta.run(make_agent(ScriptedModel([Turn("cut he", finish="length")])), "hi")
    assert result.status == "completed"
    assert result.finish_reason == "length"
    assert result.final_output == "cut he"
    assert result.conversation[-1] == ta.AssistantMessage("cut he", status="incomplete")


async def test_usage_is_none_when_no_model_call_reported_any(
    autojump_clock: trio.testing.MockClock,
) -> None:
    result = await ta.run(make_agent(EventsModel([TextDelta("hi"), Finish("stop")])), "hi")
    assert result.status == "completed"
    assert result.usage is None
    assert result.finish_reason == "stop"
    result = await ta.run(make_agent(EventsModel([TextDelta("hi"), Usage(0, 0)])), "hi")
    assert result.usage == Usage(0, 0)


# ------------------------------------------------------------------------ the repair


class BlockingEndHooks(ta.RunHooks):
    def __init__(self) -> None:
        self.ends: list[str] = []

    async def on_tool_end(self, run: ta.Run, call: ta.ToolCall, result: ta.ToolResult) -> None:
        self.ends.append(call.call_id)
        if result.status == "cancelled":
            await trio.sleep_forever()


async def test_a_blocking_end_hook_skips_no_repair_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hooks = BlockingEndHooks()
    session = MemorySession()
    model = ScriptedModel([Turn(tool_calls=[call("a"), call("b")])])
    async with ta.open_run(
        make_agent(model, [slow]), "go", session=session, hooks=hooks, cleanup_timeout=2
    ) as run:
        started = 0
        async for event in run.events():
            started += isinstance(event, ta.ToolStarted)
            if started == 2:
                await trio.testing.wait_all_tasks_blocked()
                cancelled_at = trio.current_time()
                run.cancel("stop")
                break
        events = await collect(run)
    result = run.result
    assert result is not None
    check_events(result, events).raise_for_violations()
    # Both calls answered and written before any hook ran: the status is the truth.
    assert (result.status, result.reason) == ("cancelled", "stop")
    assert result.reason == "stop"
    stored = await session.get_items()
    assert [i.call_id for i in stored if isinstance(i, ta.ToolResult)] == ["a", "b"]
    assert sorted(hooks.ends) == ["a", "b"]  # ended concurrently: one block stalls nobody
    assert trio.current_time() - cancelled_at <= 2  # one deadline for the whole cleanup
    terminal = events[-1]
    assert isinstance(terminal, ta.RunUpdated)
    assert terminal.detail.get("cleanup_timed_out") is True


class BlockingRunEnd(ta.RunHooks):
    async def on_run_end(self, run: ta.Run, result: ta.RunResult) -> None:
        await trio.sleep_forever()


async def test_on_run_end_gets_no_second_window(autojump_clock: trio.testing.MockClock) -> None:
    model = EventsModel([TextDelta("x")], block=True)
    async with ta.open_run(
        make_agent(model), "go", hooks=BlockingRunEnd(), cleanup_timeout=1.5
    ) as run:
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        run.cancel("stop")
    assert trio.current_time() - start <= 1.5
    assert run.result is not None
    assert run.result.status == "cancelled"  # persisted (no session): only a hook was late


class WrappedSession:
    """A MemorySession behind a layer a test can make misbehave."""

    def __init__(self) -> None:
        self.inner = MemorySession()
        self.session_id = "wrapped"
        self.lock_key = self

    async def get_items(self) -> list[ta.Item]:
        return await self.inner.get_items()

    async def add_items(self, items: Sequence[ta.Item]) -> None:
        await self.inner.add_items(items)

    async def clear(self) -> None:
        await self.inner.clear()


class FailingSession(WrappedSession):
    def __init__(self, *, fail_get: bool = False, fail_add_after: int | None = None) -> None:
        super().__init__()
        self.fail_get = fail_get
        self.fail_add_after = fail_add_after
        self.adds = 0

    async def get_items(self) -> list[ta.Item]:
        if self.fail_get:
            raise OSError("disk on fire")
        return await super().get_items()

    async def add_items(self, items: Sequence[ta.Item]) -> None:
        self.adds += 1
        if self.fail_add_after is not None and self.adds > self.fail_add_after:
            raise OSError("disk full")
        await super().add_items(items)


class TrippedSession(WrappedSession):
    """Writes normally until the test sets ``tripped``; from then on every write first
    awaits ``trip`` (which hangs or raises)."""

    def __init__(self, trip: Callable[[], Awaitable[None]]) -> None:
        super().__init__()
        self.trip = trip
        self.tripped = False

    async def add_items(self, items: Sequence[ta.Item]) -> None:
        if self.tripped:
            await self.trip()
        await super().add_items(items)


async def test_a_repair_that_cannot_be_written_fails_the_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = FailingSession(fail_add_after=1)  # the input is written, nothing after
    model = EventsModel([TextDelta("partial")], block=True)
    async with ta.open_run(make_agent(model), "go", session=session) as run:
        await trio.testing.wait_all_tasks_blocked()
        run.cancel("stop")
    result = run.result
    assert result is not None
    assert result.status == "failed"
    assert result.reason == "session error: OSError: disk full"
    assert ta.conversation_problems(result.conversation) == []
    session.fail_add_after = None
    await assert_session_free(session)


async def test_a_repair_that_times_out_fails_the_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = TrippedSession(trio.sleep_forever)
    model = EventsModel([TextDelta("partial")], block=True)
    async with ta.open_run(make_agent(model), "go", session=session, cleanup_timeout=1) as run:
        await trio.testing.wait_all_tasks_blocked()
        session.tripped = True
        start = trio.current_time()
        run.cancel("stop")
    assert trio.current_time() - start == pytest.approx(1)
    result = run.result
    assert result is not None
    assert (result.status, result.reason) == ("failed", "cleanup timed out")
    assert result.conversation[-1] == ta.AssistantMessage("partial", status="incomplete")
    session.tripped = False
    await assert_session_free(session)


async def test_a_session_that_cannot_be_read_keeps_the_input_in_new_items(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(["never"])
    result = await ta.run(make_agent(model), "hello", session=FailingSession(fail_get=True))
    assert result.status == "failed"
    assert result.reason == "session error: OSError: disk on fire"
    assert result.new_items == (ta.UserMessage("hello"),)
    assert model.calls == 0


async def test_sqlite_write_blocked_by_another_connection_is_bounded(tmp_path: Path) -> None:
    """A real lock held by another connection: the repair gives up within its deadline
    (SQLite's busy timeout, an hour here, is capped by what is left of it) and says so."""
    import sqlite3

    path = tmp_path / "s.db"
    session = SQLiteSession(path, "s", busy_timeout=3600)
    model = EventsModel([TextDelta("partial")], block=True)
    async with ta.open_run(make_agent(model), "go", session=session, cleanup_timeout=0.3) as run:
        with trio.fail_after(30):  # a hang guard
            async for event in run.events():
                if isinstance(event, ta.ResponseTextDelta):
                    break
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        try:
            run.cancel("stop")
            with trio.fail_after(30):  # a hang guard, not a timing claim
                result = await run.wait()
        finally:
            other.rollback()
            other.close()
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason == "cleanup timed out" or result.reason.startswith("session error:")
    await session.aclose()


# --------------------------------------------------------------------- misbehaving tools


async def test_a_stray_cancelled_from_a_tool_is_an_error_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    @ta.function_tool
    async def slow() -> str:
        """Re-raise a Cancelled from a scope of its own, like a shared service nursery."""
        await raise_a_stray_cancelled()
        return "never reached"

    model = ScriptedModel([Turn(tool_calls=[call("a")]), "final"])
    result, _ = await run_to_the_end(make_agent(model, [slow]), "go")
    assert result.status == "completed"
    assert result.final_output == "final"
    assert result.conversation[-1] == ta.AssistantMessage("final")
    (tool_result,) = [i for i in result.conversation if isinstance(i, ta.ToolResult)]
    assert tool_result.status == "error"
    assert "trio.Cancelled" in tool_result.output


async def test_each_tool_result_is_persisted_as_its_tool_finishes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    release = trio.Event()
    session = MemorySession()
    model = ScriptedModel([Turn(tool_calls=[call("s", "slow"), call("f", "fast")]), "done"])
    agent = make_agent(model, fast_and_slow(release))
    async with ta.open_run(agent, "go", session=session) as run:
        await trio.testing.wait_all_tasks_blocked()
        stored = await session.get_items()
        assert ta.ToolResult("f", "fast done") in stored  # before its sibling finished
        assert not any(isinstance(i, ta.ToolResult) and i.call_id == "s" for i in stored)
        release.set()
    assert run.result is not None
    assert run.result.status == "completed"


async def test_keyboard_interrupt_in_a_tool_is_named_and_propagates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    interrupting = raising_tool("slow", KeyboardInterrupt)
    handle: list[ta.Run] = []
    with pytest.raises(BaseExceptionGroup) as info:
        async with trio.open_nursery() as nursery:
            handle.append(
                await nursery.start(
                    ta.serve_run,
                    make_agent(ScriptedModel([Turn(tool_calls=[call("a")])]), [interrupting]),
                    "x",
                )
            )
    assert info.group_contains(KeyboardInterrupt)
    result = handle[0].result
    assert result is not None
    assert (result.status, result.reason) == ("cancelled", "KeyboardInterrupt")
    assert ta.conversation_problems(result.conversation) == []


async def test_two_failing_tools_give_one_readable_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a = raising_tool("a", ValueError, "first")
    b = raising_tool("b", LookupError, "second")
    model = ScriptedModel([Turn(tool_calls=[call("1", "a"), call("2", "b")])])
    result = await ta.run(make_agent(model, [a, b]), "go", on_tool_error="fail")
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason.startswith("tool error: tool ")
    assert "ValueError: first" in result.reason
    assert "LookupError: second" in result.reason
    assert "\n" not in result.reason
    assert "sub-exception" not in result.reason
    assert ta.conversation_problems(result.conversation) == []


class FailingHook(ta.RunHooks):
    async def on_model_start(self, run: ta.Run, turn: int, request: ta.ModelRequest) -> None:
        raise ValueError("hook bug\nsecond line")


async def test_a_failing_hook_is_named_in_one_line(autojump_clock: trio.testing.MockClock) -> None:
    result = await ta.run(make_agent(ScriptedModel(["x"])), "go", hooks=FailingHook())
    assert (result.status, result.reason) == (
        "failed",
        "hook error: on_model_start raised ValueError: hook bug second line",
    )


@pytest.mark.parametrize(
    ("value", "error"), [(0, ValueError), ("3", TypeError), (2.5, TypeError), (True, TypeError)]
)
async def test_max_turns_option_is_validated(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_turns"):
        await ta.run(make_agent(ScriptedModel(["x"])), "go", max_turns=value)


# ------------------------------------------------------------------ invalid conversations


@pytest.mark.parametrize(
    "items",
    [
        [ta.ToolResult("c9", "out"), call("c9")],  # result before its call
        [call("c9"), ta.UserMessage("between"), ta.ToolResult("c9", "out")],
        [call("c9")],  # a call with no result
        [ta.ToolResult("c9", "out")],  # a result with no call
        [call("c9"), ta.ToolResult("c9", "a"), call("c9"), ta.ToolResult("c9", "b")],
    ],
    ids=["result-first", "message-between", "open-call", "orphan", "dup-in-batch"],
)
async def test_injected_items_that_break_the_conversation_are_refused(
    autojump_clock: trio.testing.MockClock, items: list[ta.Item]
) -> None:
    model = EventsModel([TextDelta("x")], block=True)
    async with ta.open_run(make_agent(model), "go") as run:
        with pytest.raises(ValueError, match="invalid"):
            run.inject(items)
        assert run.statistics().inbox_items == 0
        run.cancel("done")


async def test_an_injected_pair_may_not_reuse_a_call_id(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(tool_calls=[call("c1")])])
    async with ta.open_run(make_agent(model, [slow]), "go") as run:
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(ValueError, match="c1"):
            run.inject([call("c1", "slow"), ta.ToolResult("c1", "fake")])
        pair = [call("c2", "slow"), ta.ToolResult("c2", "fine")]
        run.inject(pair)
        with pytest.raises(ValueError, match="c2"):  # queued ids count too
            run.inject([call("c2", "slow"), ta.ToolResult("c2", "again")])
        run.cancel("done")


async def test_open_run_input_with_an_open_call_is_refused() -> None:
    model = ScriptedModel(["x"])
    with pytest.raises(ValueError, match="no result"):
        async with ta.open_run(make_agent(model), [ta.UserMessage("hi"), call("c1")]):
            pass
    assert model.calls == 0


async def test_input_reusing_a_stored_call_id_fails_before_any_model_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = await session_with_answered_call("c1")
    model = ScriptedModel(["x"])
    result = await ta.run(
        make_agent(model), [call("c1"), ta.ToolResult("c1", "again")], session=session
    )
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason.startswith("invalid conversation: the input does not fit")
    assert model.calls == 0
    assert len(await session.get_items()) == 3  # nothing invalid was stored


async def test_a_repair_that_only_appends_is_written_back_to_any_session(
    autojump_clock: trio.testing.MockClock,
) -> None:
    plain = NoReplaceSession()  # add_items is enough for the usual crash
    await plain.inner.add_items([ta.UserMessage("a"), call("c1")])
    assert (await ta.run(make_agent(ScriptedModel(["ok"])), "b", session=plain)).ok
    assert ta.conversation_problems(await plain.get_items()) == []


async def test_loading_a_broken_session_writes_the_repair_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = MemorySession()
    await session.add_items([ta.UserMessage("a"), call("c1")])  # a crash left this
    result = await ta.run(make_agent(ScriptedModel(["ok"])), "b", session=session)
    assert result.status == "completed"
    stored = await session.get_items()
    assert stored[:3] == [
        ta.UserMessage("a"),
        call("c1"),
        ta.ToolResult("c1", "cancelled: interrupted", status="cancelled"),
    ]
    assert ta.conversation_problems(stored) == []


# ------------------------------------------------------------------------------ races


def test_cancel_right_after_serve_run_starts_comes_before_any_model_call() -> None:
    for seed in range(200):
        model = ScriptedModel(["x"])

        async def main(model: ScriptedModel = model) -> None:
            async with trio.open_nursery() as nursery:
                run = await nursery.start(ta.serve_run, make_agent(model), "hi")
                run.cancel("at once")
            assert run.result is not None
            assert run.result.status == "cancelled"

        random.seed(seed)
        trio.run(main)
        assert model.calls == 0, f"seed {seed}: a model call was made"


async def test_inject_now_during_model_start_interrupts_that_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(["the only answer"])
    result = await inject_now_during_model_start(make_agent(model), shield=False)
    assert result.final_output == "the only answer"
    # The interrupted call never reached the model; the one call made saw the injection.
    assert model.calls == 1
    assert model.requests[0].items == (ta.UserMessage("go"), ta.UserMessage("actually, this"))


def test_an_inject_racing_the_final_answer_is_delivered_or_refused() -> None:
    outcomes = {"delivered": 0, "refused": 0}
    for seed in range(150):
        model = ScriptedModel([Turn("done", delay=0)], default=Turn("more"))
        accepted: list[str] = []
        refused: list[BaseException] = []

        def injector(
            run: ta.Run,
            go: threading.Event,
            accepted: list[str] = accepted,
            refused: list[BaseException] = refused,
        ) -> None:
            go.wait()
            try:
                accepted.append(run.inject("late"))
            except ta.RunClosedError as exc:
                refused.append(exc)

        async def main(model: ScriptedModel = model) -> ta.RunResult:
            go = threading.Event()
            async with ta.open_run(make_agent(model), "hi") as run:
                thread = threading.Thread(target=injector, args=(run, go))
                thread.start()
                go.set()
            await trio.to_thread.run_sync(thread.join)
            assert run.result is not None
            return run.result

        random.seed(seed)
        result = trio.run(main)
        assert result.status == "completed"
        assert result.unconsumed == (), f"seed {seed}: accepted but never consumed"
        assert len(accepted) + len(refused) == 1
        if accepted:
            assert ta.UserMessage("late") in result.conversation
            outcomes["delivered"] += 1
        else:
            outcomes["refused"] += 1
    assert outcomes["delivered"] + outcomes["refused"] == 150


# --------------------------------------------- found by the adversarial review of the core


class NoReplaceSession(WrappedSession):
    """A session without ``replace_items``: a load repair cannot be written atomically."""


class ReplaceFailsSession(WrappedSession):
    async def replace_items(self, items: Sequence[ta.Item]) -> None:
        raise OSError("replace failed")


# A dangling call *before* a message: the repair inserts, so it needs replace_items.
BROKEN: list[ta.Item] = [ta.UserMessage("q"), call("c1"), ta.AssistantMessage("a")]


async def test_a_load_repair_is_written_back_atomically_or_not_at_all(
    autojump_clock: trio.testing.MockClock,
) -> None:
    memory = MemorySession()
    await memory.add_items(BROKEN)
    assert (await ta.run(make_agent(ScriptedModel(["ok"])), "new", session=memory)).ok
    stored = await memory.get_items()
    assert stored[:4] == [
        ta.UserMessage("q"),
        call("c1"),
        ta.ToolResult("c1", "cancelled: interrupted", "cancelled"),
        ta.AssistantMessage("a"),
    ]
    # No atomic replace: the history is never put at risk; it is repaired at each load.
    plain = NoReplaceSession()
    await plain.inner.add_items(BROKEN)
    assert (await ta.run(make_agent(ScriptedModel(["ok"])), "new", session=plain)).ok
    assert (await plain.get_items())[:3] == BROKEN
    # A replace that fails: the run fails, the history is untouched.
    failing = ReplaceFailsSession()
    await failing.inner.add_items(BROKEN)
    result = await ta.run(make_agent(ScriptedModel(["ok"])), "new", session=failing)
    assert (result.status, result.reason) == ("failed", "session error: OSError: replace failed")
    assert await failing.get_items() == BROKEN


async def test_an_injected_pair_clashing_with_the_stored_history_is_never_delivered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = await session_with_answered_call("c1")
    model = ScriptedModel(["never"])
    async with ta.open_run(make_agent(model), "b", session=session) as run:
        run.inject([call("c1"), ta.ToolResult("c1", "again")])  # before the history loaded
    result = run.result
    assert result is not None
    assert (result.status, result.reason) == (
        "failed",
        "invalid conversation: injected call id 'c1' is already in the conversation",
    )
    assert result.unconsumed == (call("c1"), ta.ToolResult("c1", "again"))
    assert ta.conversation_problems(result.conversation) == []
    assert ta.conversation_problems(await session.get_items()) == []
    assert model.calls == 0


class ToolStartFailsWhenCancelled(ta.RunHooks):
    async def on_tool_start(self, run: ta.Run, call: ta.ToolCall) -> None:
        if call.call_id == "a":
            try:
                await trio.sleep_forever()
            finally:
                raise ValueError("hook cleanup failed")


async def test_an_outer_cancel_meeting_a_hook_error_still_propagates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(tool_calls=[call("a"), call("b")])])
    reached = False
    with trio.move_on_after(1) as outer:
        async with ta.open_run(
            make_agent(model, [slow]), "go", hooks=ToolStartFailsWhenCancelled()
        ) as run:
            pass
        reached = True
    assert outer.cancelled_caught
    assert not reached
    assert run.result is not None
    assert (run.result.status, run.result.reason) == (
        "failed",
        "hook error: on_tool_start raised ValueError: hook cleanup failed",
    )


class StrayCancelledModel:
    @asynccontextmanager
    async def stream(self, request: ta.ModelRequest) -> AsyncIterator[AsyncIterator[Any]]:
        await raise_a_stray_cancelled()
        yield _empty()


async def _empty() -> AsyncIterator[Any]:  # never reached: the stream fails first
    return
    yield


class StrayCancelledHook(ta.RunHooks):
    async def on_model_start(self, run: ta.Run, turn: int, request: ta.ModelRequest) -> None:
        await StrayCancelledModel().stream(request).__aenter__()


async def test_a_stray_cancelled_from_a_model_or_hook_is_a_named_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    result = await ta.run(make_agent(StrayCancelledModel()), "go")
    assert (result.status, result.reason) == (
        "failed",
        "a model, hook or session raised trio.Cancelled although nothing cancelled it",
    )
    result = await ta.run(make_agent(ScriptedModel(["x"])), "go", hooks=StrayCancelledHook())
    assert (result.status, result.reason) == (
        "failed",
        "hook error: on_model_start raised a stray trio.Cancelled",
    )


async def interrupt() -> None:
    raise KeyboardInterrupt


class CountingHooks(ta.RunHooks):
    def __init__(self) -> None:
        self.open = 0

    async def on_run_start(self, run: ta.Run) -> None:
        self.open += 1

    async def on_run_end(self, run: ta.Run, result: ta.RunResult) -> None:
        self.open -= 1

    async def on_model_start(self, run: ta.Run, turn: int, request: ta.ModelRequest) -> None:
        self.open += 1

    async def on_model_end(self, run: ta.Run, turn: int, outcome: str) -> None:
        self.open -= 1


async def test_a_keyboard_interrupt_in_the_repair_write_skips_no_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = TrippedSession(interrupt)
    hooks = CountingHooks()
    model = EventsModel([TextDelta("partial")], block=True)

    async def cancel_with_a_bad_session(handle: list[ta.Run]) -> None:
        agent = make_agent(model)
        async with trio.open_nursery() as nursery:
            run = await nursery.start(
                partial(ta.serve_run, session=session, hooks=hooks), agent, "go"
            )
            handle.append(run)
            await trio.testing.wait_all_tasks_blocked()
            session.tripped = True
            run.cancel("stop")

    handle: list[ta.Run] = []
    with pytest.raises(BaseExceptionGroup) as info:
        await cancel_with_a_bad_session(handle)
    assert info.group_contains(KeyboardInterrupt)
    (run,) = handle
    assert hooks.open == 0  # every start got its end
    assert run.result is not None
    assert (run.result.status, run.result.reason) == (
        "failed",
        "session error: KeyboardInterrupt",
    )
