"""The run lifecycle: statuses, events, cancellation, repair (DESIGN.md §2-§5)."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.core_runs import (
    GateTool,
    ThreadTool,
    assert_ended,
    raising_tool,
    run_to_the_end,
)
from tests.support.helpers import collect, statuses
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import MemorySession
from trio_agents.testing import check_events


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def make_agent(model: ta.Model, tools: list[ta.Tool] | None = None, **kw: Any) -> ta.Agent:
    return ta.Agent(name="t", instructions="be useful", model=model, tools=tools or [], **kw)


# --------------------------------------------------------------------- completion


async def test_text_run_completes(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(["Hello there, friend."])
    result = await ta.run(make_agent(model), "hi")
    assert result.status == "completed"
    assert result.status is ta.RunStatus.COMPLETED
    assert result.reason is None
    assert result.final_output == "Hello there, friend."
    assert result.turns == 1
    assert result.new_items == (
        ta.UserMessage("hi"),
        ta.AssistantMessage("Hello there, friend."),
    )
    assert result.conversation == result.new_items
    assert result.unconsumed == ()
    assert result.raise_for_status() is result
    assert result.usage is not None
    assert result.usage.output_tokens > 0


async def test_tool_turn_then_answer(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(tool_calls=[("add", {"a": 2, "b": 3})]), "It is 5."])
    result, events = await run_to_the_end(make_agent(model, [add]), "2+3?")
    assert result.final_output == "It is 5."
    assert statuses(events) == ["queued", "running", "completed"]
    kinds = [type(item).__name__ for item in result.conversation]
    assert kinds == ["UserMessage", "ToolCall", "ToolResult", "AssistantMessage"]
    tool_result = result.conversation[2]
    assert isinstance(tool_result, ta.ToolResult)
    assert tool_result.output == "5"
    assert tool_result.status == "ok"
    # the model saw the tool result on its second call
    assert model.requests[1].items[-1] == tool_result
    assert [spec.name for spec in model.requests[0].tools] == ["add"]
    started = [e for e in events if isinstance(e, ta.ToolStarted)]
    finished = [e for e in events if isinstance(e, ta.ToolFinished)]
    assert len(started) == len(finished) == 1
    assert finished[0].status == "ok"


async def test_events_have_type_seq_run_id_and_json(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(text=["a", "b"], tool_calls=[("add", {"a": 1, "b": 1})]), "ok"])
    async with ta.open_run(make_agent(model, [add]), "x", run_id="run-1") as run:
        events = await collect(run)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    types = {e.type for e in events}
    assert {"run.updated", "response.text.delta", "run.item", "tool.started"} <= types
    assert "tool.finished" in types
    for event in events:
        data = event.to_json()
        assert data["type"] == event.type
        assert data["seq"] == event.seq
        assert data["run_id"] == "run-1"
    deltas = [e for e in events if isinstance(e, ta.ResponseTextDelta)]
    assert [d.text for d in deltas] == ["a", "b", "o", "k"] or "".join(
        d.text for d in deltas
    ) == "abok"


async def test_unknown_tool_and_bad_arguments_become_error_results(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # call id: the tool, its arguments, what its error result says
    bad_calls = {
        "c1": ("nope", "{}", "unknown tool 'nope'"),
        "c2": ("add", '{"a": "x", "b": 1}', "$.a"),
        "c3": ("add", "not json", ""),
    }
    calls = [ta.ToolCall(call_id, name, args) for call_id, (name, args, _) in bad_calls.items()]
    model = ScriptedModel([Turn(tool_calls=calls), "done"])
    result = await ta.run(make_agent(model, [add]), "go")
    assert result.status == "completed"
    outputs = {i.call_id: i for i in result.conversation if isinstance(i, ta.ToolResult)}
    for call_id, (_, _, says) in bad_calls.items():
        assert outputs[call_id].status == "error"
        assert says in outputs[call_id].output


async def test_tool_exception_becomes_error_result_or_fails_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    boom = raising_tool("boom", RuntimeError, "kaput")
    model = ScriptedModel([Turn(tool_calls=[("boom", {})]), "recovered"])
    result = await ta.run(make_agent(model, [boom]), "go")
    assert result.status == "completed"
    error = next(i for i in result.conversation if isinstance(i, ta.ToolResult))
    assert error.status == "error"
    assert "RuntimeError: kaput" in error.output

    model = ScriptedModel([Turn(tool_calls=[("boom", {})]), "unreached"])
    result = await ta.run(make_agent(model, [boom]), "go", on_tool_error="fail")
    assert result.status == "failed"
    assert result.reason is not None
    assert "kaput" in result.reason
    assert ta.conversation_problems(result.conversation) == []
    with pytest.raises(ta.RunFailedError) as info:
        result.raise_for_status()
    assert info.value.result is result


async def test_max_turns_fails_with_valid_conversation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([], default=Turn(tool_calls=[("add", {"a": 1, "b": 2})]))
    async with ta.open_run(make_agent(model, [add], max_turns=3), "loop") as run:
        events = await collect(run)
    result = run.result
    assert result is not None
    assert result.status == "failed"
    assert result.reason == "max_turns"
    assert result.turns == 3
    assert model.calls == 3
    check_events(result, events).raise_for_violations()


async def test_model_failure_keeps_partial_text(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(text=["one ", "two ", "three"], fail="backend down", fail_after=2)])
    async with ta.open_run(make_agent(model), "hi") as run:
        events = await collect(run)
    result = run.result
    assert result is not None
    assert result.status == "failed"
    assert result.reason is not None
    assert "backend down" in result.reason
    assert isinstance(result.error, ta.ModelError)
    assert result.new_items[-1] == ta.AssistantMessage("one two ", status="incomplete")
    check_events(result, events).raise_for_violations()


# ------------------------------------------------------------------- cancellation


async def test_cancel_before_first_model_call_makes_no_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(["never"])
    async with ta.open_run(make_agent(model), "hi") as run:
        run.cancel("changed my mind")
    result = run.result
    assert result is not None
    assert result.status == "cancelled"
    assert result.reason == "changed my mind"
    assert model.calls == 0
    assert result.new_items == (ta.UserMessage("hi"),)
    assert statuses(await collect(run)) == ["queued", "cancelled"]


async def test_cancel_mid_stream_keeps_partial_text_and_closes_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["alpha ", "beta ", "gamma ", "delta"], delay=1.0)])
    async with ta.open_run(make_agent(model), "hi") as run:
        async for event in run.events():
            if isinstance(event, ta.ResponseTextDelta) and event.text == "beta ":
                run.cancel("stop")
    result = run.result
    assert result is not None
    assert result.status == "cancelled"
    assert result.reason == "stop"
    assert result.new_items[-1] == ta.AssistantMessage("alpha beta ", status="incomplete")
    assert model.open_streams == 0
    check_events(result, await collect(run)).raise_for_violations()


async def test_cancel_drops_partial_tool_calls_of_an_unfinished_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(
        [Turn(text=["x", "y"], tool_calls=[("add", {"a": 1, "b": 2})], delay=1.0)]
    )
    async with ta.open_run(make_agent(model, [add]), "hi") as run:
        async for event in run.events():
            if isinstance(event, ta.ResponseTextDelta) and event.text == "y":
                run.cancel("stop")
    result = run.result
    assert result is not None
    assert not any(isinstance(i, ta.ToolCall | ta.ToolResult) for i in result.conversation)
    assert result.new_items[-1] == ta.AssistantMessage("xy", status="incomplete")


async def test_cancel_while_async_tool_runs(autojump_clock: trio.testing.MockClock) -> None:
    entered = trio.Event()
    cleaned_up = []

    @ta.function_tool
    async def slow() -> str:
        """Take an hour."""
        entered.set()
        try:
            await trio.sleep(3600)
        except trio.Cancelled:
            cleaned_up.append("cancelled")
            raise
        finally:
            cleaned_up.append("finally")
        return "unreachable"

    model = ScriptedModel([Turn(tool_calls=[("slow", {})])])
    async with ta.open_run(make_agent(model, [slow]), "go") as run:
        await entered.wait()
        start = trio.current_time()
        run.cancel("user pressed stop")
        result = await run.wait()
        assert trio.current_time() - start == 0, trio.current_time() - start  # not waited out
    assert cleaned_up == ["cancelled", "finally"]
    assert result.status == "cancelled"
    assert result.reason == "user pressed stop"
    tool_result = result.conversation[-1]
    assert isinstance(tool_result, ta.ToolResult)
    assert tool_result == ta.ToolResult(
        tool_result.call_id, "cancelled: user pressed stop", status="cancelled"
    )
    events = await collect(run)
    check_events(result, events).raise_for_violations()
    finished = [e for e in events if isinstance(e, ta.ToolFinished)]
    assert [f.status for f in finished] == ["cancelled"]


async def test_cancel_while_sync_tool_runs_sets_ctx_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    thread = ThreadTool()
    model = ScriptedModel([Turn(tool_calls=[("blocking", {})])])
    async with ta.open_run(make_agent(model, [thread.tool()]), "go") as run:
        await trio.to_thread.run_sync(thread.entered.wait)
        run.cancel("stop the thread")
        result = await run.wait()
    thread.release.set()
    await trio.to_thread.run_sync(thread.saw_cancel.wait, 30)
    assert thread.saw_cancel.is_set()
    assert result.status == "cancelled"
    outputs = [i.output for i in result.conversation if isinstance(i, ta.ToolResult)]
    assert outputs == ["cancelled: stop the thread"]


async def test_after_turn_finishes_the_turn_then_stops(
    autojump_clock: trio.testing.MockClock,
) -> None:
    step = GateTool("step", "step done")
    model = ScriptedModel([Turn(tool_calls=[("step", {})]), "never reached"])
    async with ta.open_run(make_agent(model, [step.tool]), "go") as run:
        await step.entered.wait()
        run.cancel("wrap up", mode="after_turn")
        await trio.testing.wait_all_tasks_blocked()
        assert run.status == "running"
        step.release.set()
    result = run.result
    assert result is not None
    assert result.status == "cancelled"
    assert result.reason == "wrap up"
    assert model.calls == 1
    assert result.conversation[-1] == ta.ToolResult(result.conversation[-2].call_id, "step done")  # type: ignore[union-attr]


async def test_after_turn_on_a_final_turn_completes(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(text=["the ", "answer"], delay=1.0)])
    async with ta.open_run(make_agent(model), "go") as run:
        async for event in run.events():
            if isinstance(event, ta.ResponseTextDelta):
                run.cancel("soft stop", mode="after_turn")
    result = run.result
    assert result is not None
    assert result.status == "completed"
    assert result.reason is None
    assert result.final_output == "the answer"


async def test_immediate_escalates_after_turn_and_first_reason_wins(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(tool_calls=[("forever", {})])])
    async with ta.open_run(make_agent(model, [forever]), "go") as run:
        await start_forever_run(run)
        run.cancel("first", mode="after_turn")
        run.cancel("second", mode="after_turn")
        await trio.testing.wait_all_tasks_blocked()
        assert run.status == "running"
        run.cancel("third")  # escalates; reason stays "first"
        run.cancel("fourth")
    result = run.result
    assert result is not None
    assert result.status == "cancelled"
    assert result.reason == "first"


async def test_cancel_is_idempotent_and_noop_after_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(["done"])
    async with ta.open_run(make_agent(model), "go") as run:
        pass
    assert run.result is not None
    run.cancel("too late")
    run.cancel("too late", mode="after_turn")
    assert run.result.status == "completed"
    assert statuses(await collect(run)) == ["queued", "running", "completed"]


@ta.function_tool
async def forever() -> str:
    """Never returns (and sets no timer, so the autojump clock cannot skip it)."""
    await trio.sleep_forever()
    raise AssertionError


async def start_forever_run(run: ta.Run) -> None:
    async for event in run.events():
        if isinstance(event, ta.ToolStarted):
            return


async def test_cancel_from_a_foreign_thread(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(tool_calls=[("forever", {})])])
    async with ta.open_run(make_agent(model, [forever]), "go") as run:
        await start_forever_run(run)
        await trio.to_thread.run_sync(run.cancel, "from a thread")
    assert_ended(run, "cancelled", "from a thread")


async def test_fifty_threads_cancelling_at_once_give_one_terminal_update(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(tool_calls=[("forever", {})])])
    barrier = threading.Barrier(50)

    def canceller(i: int) -> None:
        barrier.wait()
        run.cancel(f"thread {i}", mode="after_turn" if i % 2 else "immediate")

    async with ta.open_run(make_agent(model, [forever]), "go") as run:
        await start_forever_run(run)
        limiter = trio.CapacityLimiter(50)  # Trio's default (40) would deadlock the barrier
        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(partial(trio.to_thread.run_sync, canceller, i, limiter=limiter))
    events = await collect(run)
    terminal = [e for e in events if isinstance(e, ta.RunUpdated) and e.status.is_terminal]
    assert len(terminal) == 1
    assert run.result is not None
    assert run.result.status == "cancelled"
    assert run.result.reason is not None
    assert run.result.reason.startswith("thread ")
    assert terminal[0].reason == run.result.reason
    check_events(run.result, events).raise_for_violations()


async def test_outer_cancellation_is_recorded_and_propagates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["x"] * 100, delay=1.0)])
    agent = make_agent(model)
    handle: list[ta.Run] = []
    with trio.move_on_after(5) as scope:
        async with ta.open_run(agent, "go") as run:
            handle.append(run)
            await trio.sleep_forever()
    assert scope.cancelled_caught
    result = assert_ended(handle[0], "cancelled", "parent cancelled")
    assert result.new_items[-1].status == "incomplete"  # type: ignore[union-attr]


async def test_outer_cancellation_of_a_waiting_block_propagates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["x"] * 100, delay=1.0)])
    handle: list[ta.Run] = []
    with trio.move_on_after(5) as scope:
        async with ta.open_run(make_agent(model), "go") as run:
            handle.append(run)
        raise AssertionError("the cancellation must propagate out of the block")
    assert scope.cancelled_caught
    assert handle[0].result is not None
    assert handle[0].result.reason == "parent cancelled"


async def test_outer_cancel_never_swallowed_in_serve_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["x"] * 100, delay=1.0)])
    with trio.move_on_after(3) as scope:
        async with trio.open_nursery() as nursery:
            run = await nursery.start(ta.serve_run, make_agent(model), "go")
    assert scope.cancelled_caught
    assert_ended(run, "cancelled", "parent cancelled")


async def test_exception_in_block_cancels_run_and_propagates_unwrapped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["x"] * 100, delay=1.0)])
    handle: list[ta.Run] = []

    async def body() -> None:
        async with ta.open_run(make_agent(model), "go") as run:
            handle.append(run)
            await trio.sleep(2.5)
            raise KeyError("oops")

    with pytest.raises(KeyError, match="oops"):
        await body()
    result = handle[0].result
    assert result is not None
    assert result.status == "cancelled"
    assert result.reason == "caller exited"


async def test_serve_run_returns_result(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(["fine"])
    async with trio.open_nursery() as nursery:
        run = await nursery.start(ta.serve_run, make_agent(model), "go")
        assert isinstance(run, ta.Run)
    assert run.result is not None
    assert run.result.final_output == "fine"


async def test_agent_is_reusable_after_a_cancelled_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["x"] * 10, delay=1.0), "second run answer"])
    agent = make_agent(model)
    async with ta.open_run(agent, "first") as run:
        await trio.sleep(2.5)
        run.cancel("stop")
    assert run.result is not None
    assert run.result.status == "cancelled"
    result = await ta.run(agent, "second")
    assert result.final_output == "second run answer"
    assert result.conversation == (
        ta.UserMessage("second"),
        ta.AssistantMessage("second run answer"),
    )


async def test_concurrent_runs_share_one_agent(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([], default=Turn(text="same", delay=1.0))
    agent = make_agent(model)
    results: list[ta.RunResult] = []

    async def one(i: int) -> None:
        results.append(await ta.run(agent, f"q{i}"))

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(one, i)
    assert [r.status for r in results] == ["completed"] * 20
    assert len({r.run_id for r in results}) == 20


# ---------------------------------------------------------------- subscribers


async def test_updated_stream_first_current_then_changes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 1})], delay=1.0), "2"])
    seen: list[str] = []
    async with ta.open_run(make_agent(model, [add]), "go") as run:
        async for update in run.updated:
            seen.append(update.status.value)
    assert seen[0] in ("queued", "running")
    assert seen[-1] == "completed"


async def test_late_updated_subscriber_gets_terminal_status(
    autojump_clock: trio.testing.MockClock,
) -> None:
    result = None
    async with ta.open_run(make_agent(ScriptedModel(["done"])), "go") as run:
        pass
    result = run.result
    updates = [u async for u in run.updated]
    assert [u.status for u in updates] == [ta.RunStatus.COMPLETED]
    assert result is not None
    # and a late events() reader replays everything from seq 1
    events = await collect(run)
    assert events[0].seq == 1
    assert events[-1] == updates[0]


async def test_two_updated_subscribers_are_independent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["a", "b"], delay=1.0)])
    a: list[str] = []
    b: list[str] = []

    async def sub(run: ta.Run, out: list[str]) -> None:
        async for u in run.updated:
            out.append(u.status.value)

    async with ta.open_run(make_agent(model), "go") as run, trio.open_nursery() as n:
        n.start_soon(sub, run, a)
        n.start_soon(sub, run, b)
    # Each starts at the status current when it first reads (which one the scheduler
    # runs first is not ours to fix), then sees every change: a suffix of the whole.
    every = statuses(await collect(run))
    assert every == ["queued", "running", "completed"]
    for seen in (a, b):
        assert seen
        assert seen == every[-len(seen) :]


async def test_subscriber_that_never_reads_does_not_block_the_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["x"] * 500)])
    async with ta.open_run(make_agent(model), "go", event_retention=64) as run:
        never_read = run.events()
        stalled = aiter(run.updated)
        del stalled
    assert run.result is not None
    assert run.result.status == "completed"
    first = await anext(never_read)
    assert isinstance(first, ta.EventsDropped)
    assert first.first_missing_seq == 1
    assert first.count > 400
    assert first.seq == first.first_missing_seq + first.count - 1
    rest = [e async for e in never_read]
    assert rest[0].seq == first.seq + 1
    assert rest[-1].type == "run.updated"


async def test_events_from_seq_replays_inclusively(autojump_clock: trio.testing.MockClock) -> None:
    async with ta.open_run(make_agent(ScriptedModel(["a b c"])), "go") as run:
        pass
    everything = await collect(run)
    assert [e.seq for e in await collect(run, 3)] == [e.seq for e in everything[2:]]
    assert await collect(run, everything[-1].seq + 10) == []
    with pytest.raises(ValueError, match="from_seq"):
        run.events(-1)


async def test_breaking_out_of_a_subscription_is_safe(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["x"] * 20, delay=1.0)])
    async with ta.open_run(make_agent(model), "go") as run:
        async for _ in run.events():
            break
        async for _ in run.updated:
            break
    assert run.result is not None
    assert run.result.status == "completed"


class _StepCounter(trio.abc.Instrument):
    """Counts the task steps of one task."""

    def __init__(self, task: trio.lowlevel.Task) -> None:
        self.task = task
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1


async def test_batches_take_every_ready_event_in_one_step(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 200 events already in the log: batches() hands them over in a few lists, one
    # task step each; the per-event iteration takes a step per event.
    model = ScriptedModel([Turn(text=["x"] * 200)])
    async with ta.open_run(make_agent(model), "go") as run:
        pass
    every = [e.seq async for e in run.events()]
    assert every == list(range(1, len(every) + 1))

    counter = _StepCounter(trio.lowlevel.current_task())
    trio.lowlevel.add_instrument(counter)
    try:
        lists = [batch async for batch in run.events().batches(max_events=64)]
        batch_steps = counter.steps
        counter.steps = 0
        one_by_one = [e async for e in run.events()]
        event_steps = counter.steps
    finally:
        trio.lowlevel.remove_instrument(counter)
    assert [e.seq for batch in lists for e in batch] == every
    assert [len(batch) for batch in lists] == [64, 64, 64, len(every) - 192]
    assert batch_steps <= len(lists) + 1
    assert event_steps >= len(one_by_one)


async def test_batches_follow_a_live_run_and_share_the_cursor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["a", "b", "c"], delay=1.0)])
    async with ta.open_run(make_agent(model), "go") as run:
        cursor = run.events()
        first = await anext(cursor)
        seen = [first]
        async for batch in cursor.batches():
            assert batch  # never empty
            seen.extend(batch)
            if any(isinstance(e, ta.ResponseTextDelta) for e in batch):
                break
        seen.extend([e async for e in cursor])  # the cursor goes on after the lists
    assert [e.seq for e in seen] == [e.seq for e in await collect(run)]
    assert seen[-1].type == "run.updated"
    assert [e.text for e in seen if isinstance(e, ta.ResponseTextDelta)] == ["a", "b", "c"]


async def test_batches_mark_what_fell_out_of_retention_and_check_max_events(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["x"] * 100)])
    async with ta.open_run(make_agent(model), "go", event_retention=16) as run:
        late = run.events(1)
    lists = [batch async for batch in late.batches()]
    first = lists[0][0]
    assert isinstance(first, ta.EventsDropped)
    assert first.first_missing_seq == 1
    assert [e.seq for e in lists[0][1:]] == list(range(first.seq + 1, run._log.next_seq))
    assert len(lists) == 1
    with pytest.raises(ValueError, match="max_events"):
        run.events().batches(0)
    with pytest.raises(TypeError, match="max_events"):
        run.events().batches(True)


async def test_a_cancelled_batch_read_loses_nothing(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(text=["x"] * 10)])
    async with ta.open_run(make_agent(model), "go") as run:
        pass
    cursor = run.events()
    batches = cursor.batches(max_events=4)
    with trio.CancelScope() as scope:
        scope.cancel()
        await anext(batches)  # raises Cancelled before taking anything
    assert scope.cancelled_caught
    assert [e.seq for e in await anext(batches)] == [1, 2, 3, 4]


# ----------------------------------------------------------------------- hooks


class RecordingHooks(ta.RunHooks):
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def on_run_start(self, run: ta.Run) -> None:
        self.calls.append("run_start")

    async def on_run_end(self, run: ta.Run, result: ta.RunResult) -> None:
        self.calls.append(f"run_end:{result.status.value}")

    async def on_model_start(self, run: ta.Run, turn: int, request: ta.ModelRequest) -> None:
        self.calls.append(f"model_start:{turn}")
        await trio.sleep(0.1)

    async def on_model_end(self, run: ta.Run, turn: int, outcome: str) -> None:
        self.calls.append(f"model_end:{turn}:{outcome}")

    async def on_tool_start(self, run: ta.Run, call: ta.ToolCall) -> None:
        self.calls.append(f"tool_start:{call.call_id}")
        await trio.sleep(0.1)

    async def on_tool_end(self, run: ta.Run, call: ta.ToolCall, result: ta.ToolResult) -> None:
        self.calls.append(f"tool_end:{call.call_id}:{result.status}")

    def balanced(self) -> bool:
        def count(prefix: str) -> int:
            return sum(c.startswith(prefix) for c in self.calls)

        return all(
            count(f"{kind}_start") == count(f"{kind}_end") for kind in ("run", "model", "tool")
        )


async def test_hooks_balanced_on_completion(autojump_clock: trio.testing.MockClock) -> None:
    hooks = RecordingHooks()
    model = ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])
    await ta.run(make_agent(model, [add]), "go", hooks=hooks)
    assert hooks.calls == [
        "run_start",
        "model_start:1",
        "model_end:1:completed",
        "tool_start:call_1_0",
        "tool_end:call_1_0:ok",
        "model_start:2",
        "model_end:2:completed",
        "run_end:completed",
    ]


@pytest.mark.parametrize("cancel_at", [0.05, 0.15, 1.05, 1.15, 2.5, 100.0])
async def test_hooks_balanced_on_cancel_at_any_point(
    cancel_at: float, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = RecordingHooks()

    @ta.function_tool
    async def slow() -> str:
        """Slow."""
        await trio.sleep(1)
        return "ok"

    model = ScriptedModel([Turn(text=["a"], tool_calls=[("slow", {})], delay=0.5), "b"])
    async with ta.open_run(make_agent(model, [slow]), "go", hooks=hooks) as run:
        await trio.sleep(cancel_at)
        run.cancel("stop")
    assert hooks.balanced(), hooks.calls
    assert run.result is not None
    assert hooks.calls[-1] == f"run_end:{run.result.status.value}"


async def test_failing_hook_fails_the_run_but_stays_balanced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Bad(RecordingHooks):
        async def on_tool_start(self, run: ta.Run, call: ta.ToolCall) -> None:
            self.calls.append(f"tool_start:{call.call_id}")
            raise RuntimeError("hook bug")

    hooks = Bad()
    model = ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])
    result = await ta.run(make_agent(model, [add]), "go", hooks=hooks)
    assert result.status == "failed"
    assert result.reason is not None
    assert "hook bug" in result.reason
    assert hooks.balanced(), hooks.calls
    assert ta.conversation_problems(result.conversation) == []


# -------------------------------------------------------------------- sessions


async def test_session_receives_items_and_next_run_sees_history(
    autojump_clock: trio.testing.MockClock,
) -> None:
    session = MemorySession("s1")
    model = ScriptedModel([Turn(text=["partial "] * 5, delay=1.0), "second answer"])
    agent = make_agent(model)
    async with ta.open_run(agent, "first", session=session) as run:
        await trio.sleep(2.5)
        run.cancel("stop")
    stored = await session.get_items()
    assert run.result is not None
    assert stored == list(run.result.conversation)
    assert stored[-1].status == "incomplete"  # type: ignore[union-attr]
    result = await ta.run(agent, "second", session=session)
    assert model.requests[-1].items[: len(stored)] == tuple(stored)
    assert result.conversation[: len(stored)] == tuple(stored)
    assert result.new_items == (ta.UserMessage("second"), ta.AssistantMessage("second answer"))


# ------------------------------------------------------------------ bad input


async def test_bad_input_and_options_raise_before_anything_starts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = make_agent(ScriptedModel(["x"]))
    with pytest.raises(TypeError, match="unknown run option"):
        await ta.run(agent, "x", bogus=1)
    with pytest.raises(TypeError):
        await ta.run(agent, 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="item 1"):
        await ta.run(agent, [{"role": "user", "content": "ok"}, {"role": "system", "content": "x"}])
    with pytest.raises(ValueError, match="cleanup_timeout"):
        await ta.run(agent, "x", cleanup_timeout=0)
    async with ta.open_run(agent, "x") as run:
        with pytest.raises(ValueError, match="mode"):
            run.cancel("x", mode="later")  # type: ignore[arg-type]


async def test_statistics_snapshot(autojump_clock: trio.testing.MockClock) -> None:
    async with ta.open_run(make_agent(ScriptedModel(["x"])), "go") as run:
        stats = run.statistics()
        assert stats.status in ("queued", "running")
    assert run.statistics().status == "completed"
    assert run.statistics().open_tool_calls == 0
    assert repr(run).startswith(f"<Run {run.id} completed")
