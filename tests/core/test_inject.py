"""Injection and steering (DESIGN.md §6): the inbox, when= modes, withdraw, accounting."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.core_runs import assert_ended
from tests.support.helpers import collect
from trio_agents.models import ScriptedModel, Turn
from trio_agents.testing import check_events


@ta.function_tool
async def gate(seconds: float) -> str:
    """Sleep, then answer."""
    await trio.sleep(seconds)
    return "gate open"


def agent(model: ta.Model, **kw: object) -> ta.Agent:
    return ta.Agent(name="inj", model=model, tools=[gate], **kw)  # type: ignore[arg-type]


async def wait_for(run: ta.Run, predicate: type[ta.RunEvent], text: str | None = None) -> None:
    async for event in run.events():
        if isinstance(event, predicate) and (text is None or getattr(event, "text", None) == text):
            return


def gated(seconds: float, *then: str) -> ScriptedModel:
    """A model whose first turn calls ``gate`` for ``seconds``, then answers ``then``."""
    return ScriptedModel([Turn(tool_calls=[("gate", {"seconds": seconds})]), *then])


@asynccontextmanager
async def in_the_gate(model: ta.Model, input: str = "q") -> AsyncIterator[ta.Run]:
    """A run of :func:`agent` on ``input``, entered once its first tool has started;
    leaving waits for the run to end."""
    async with ta.open_run(agent(model), input) as run:
        await wait_for(run, ta.ToolStarted)
        yield run


async def test_next_turn_lands_after_the_tool_results_before_the_next_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = gated(5, "answer")
    async with in_the_gate(model, "start") as run:
        injection = run.inject("steer: be brief")
    result = assert_ended(run, "completed", None)
    second_call = model.requests[1].items
    kinds = [type(i).__name__ for i in second_call]
    assert kinds == ["UserMessage", "ToolCall", "ToolResult", "UserMessage"]
    assert second_call[-1] == ta.UserMessage("steer: be brief")
    events = await collect(run)
    injected = [e for e in events if isinstance(e, ta.InboxInjected)]
    delivered = [e for e in events if isinstance(e, ta.InboxDelivered)]
    assert [e.injection_id for e in injected] == [injection]
    assert [(e.injection_id, e.turn) for e in delivered] == [(injection, 2)]
    assert injected[0].seq < delivered[0].seq
    check_events(result, events).raise_for_violations()


async def test_injection_that_arrives_with_the_final_answer_runs_another_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["first ", "answer"], delay=1.0), "second answer"])
    async with ta.open_run(agent(model), "q") as run:
        await wait_for(run, ta.ResponseTextDelta, "first ")
        run.inject({"role": "user", "content": "one more thing"})
    result = run.result
    assert result is not None
    assert result.final_output == "second answer"
    assert model.calls == 2
    assert model.requests[1].items[-1] == ta.UserMessage("one more thing")
    assert model.requests[1].items[-2] == ta.AssistantMessage("first answer")


async def test_now_interrupts_the_stream_and_keeps_partial_text(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["a ", "b ", "c ", "d"], delay=1.0), "redirected"])
    async with ta.open_run(agent(model), "q") as run:
        await wait_for(run, ta.ResponseTextDelta, "b ")
        start = trio.current_time()
        run.inject("stop that, do this", when="now")
        await wait_for(run, ta.InboxDelivered)
        assert trio.current_time() == start  # the rest of the stream was not waited out
    result = run.result
    assert result is not None
    assert result.status == "completed"
    assert result.final_output == "redirected"
    assert model.requests[1].items[-2:] == (
        ta.AssistantMessage("a b ", status="incomplete"),
        ta.UserMessage("stop that, do this"),
    )
    assert model.open_streams == 0


async def test_now_during_tools_does_not_interrupt_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = gated(3, "done")
    async with in_the_gate(model) as run:
        run.inject("urgent", when="now")
    result = assert_ended(run, "completed", None)
    outputs = [i for i in result.conversation if isinstance(i, ta.ToolResult)]
    assert outputs[0].output == "gate open"
    assert model.requests[1].items[-1] == ta.UserMessage("urgent")


async def test_when_idle_waits_for_the_final_answer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(tool_calls=[("gate", {"seconds": 2})]), "answer one", "answer two"])
    async with ta.open_run(agent(model), "q") as run:
        run.inject("follow-up", when="when_idle")
    result = run.result
    assert result is not None
    assert model.calls == 3
    assert ta.UserMessage("follow-up") not in model.requests[1].items
    assert model.requests[2].items[-2:] == (
        ta.AssistantMessage("answer one"),
        ta.UserMessage("follow-up"),
    )
    assert result.final_output == "answer two"


async def test_steering_goes_before_follow_ups(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(text="a1", delay=1.0), "a2", "a3"])
    async with ta.open_run(agent(model), "q") as run:
        run.inject("later", when="when_idle")
        run.inject("steer")
    # both were queued before the first model call: steering joins the first turn
    assert model.requests[0].items == (ta.UserMessage("q"), ta.UserMessage("steer"))
    assert model.requests[1].items[-2:] == (ta.AssistantMessage("a1"), ta.UserMessage("later"))
    assert run.result is not None
    assert run.result.final_output == "a2"


async def test_withdraw_before_and_after_delivery(autojump_clock: trio.testing.MockClock) -> None:
    async with in_the_gate(gated(2, "done")) as run:
        kept = run.inject("kept")
        dropped = run.inject("dropped")
        assert run.withdraw(dropped) is True
        assert run.withdraw(dropped) is False
        await wait_for(run, ta.InboxDelivered)
        assert run.withdraw(kept) is False
        assert run.withdraw("inj_unknown") is False
    result = assert_ended(run, "completed", None)
    assert ta.UserMessage("dropped") not in result.conversation
    assert ta.UserMessage("kept") in result.conversation
    assert result.unconsumed == ()


async def test_unconsumed_on_cancel_and_max_turns(autojump_clock: trio.testing.MockClock) -> None:
    async with in_the_gate(gated(100)) as run:
        run.inject(["x", "y"], when="when_idle")
        run.inject("z")
        run.cancel("stop")
    result = assert_ended(run, "cancelled", "stop")
    assert result.unconsumed == (ta.UserMessage("x"), ta.UserMessage("y"), ta.UserMessage("z"))
    events = await collect(run)
    assert len([e for e in events if isinstance(e, ta.InboxInjected)]) == 2
    assert not [e for e in events if isinstance(e, ta.InboxDelivered)]
    check_events(result, events).raise_for_violations()

    model = ScriptedModel([], default=Turn(tool_calls=[("gate", {"seconds": 1})]))
    async with ta.open_run(agent(model, max_turns=2), "q") as run:
        await wait_for(run, ta.ToolStarted)
        run.inject("too late", when="when_idle")
    assert run.result is not None
    assert run.result.reason == "max_turns"
    assert run.result.unconsumed == (ta.UserMessage("too late"),)


async def test_after_turn_cancel_leaves_pending_injections_unconsumed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with in_the_gate(gated(2, "never")) as run:
        run.cancel("wrap up", mode="after_turn")
        run.inject("pending")
    result = assert_ended(run, "cancelled", "wrap up")
    assert result.unconsumed == (ta.UserMessage("pending"),)


async def test_inject_errors_queue_nothing(autojump_clock: trio.testing.MockClock) -> None:
    async with ta.open_run(agent(gated(2, "done")), "q", inbox_capacity=3) as run:
        with pytest.raises(ValueError, match="item 1"):
            run.inject(["fine", {"role": "robot", "content": "x"}])
        with pytest.raises(TypeError):
            run.inject(42)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="when"):
            run.inject("x", when="later")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="at least one"):
            run.inject([])
        with pytest.raises(ValueError, match="pairs"):
            run.inject([{"type": "function_call", "call_id": "z", "name": "gate"}])
        run.inject(["a", "b"])
        with pytest.raises(ta.InboxFullError) as info:
            run.inject(["c", "d"])
        assert info.value.capacity == 3
        run.inject("c")
    assert run.result is not None
    delivered = [i for i in run.result.new_items if isinstance(i, ta.UserMessage)]
    assert [m.content for m in delivered] == ["q", "a", "b", "c"]
    with pytest.raises(ta.RunClosedError) as closed:
        run.inject("after the end")
    assert closed.value.status == "completed"


async def test_injected_call_result_pairs_are_accepted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text="x", delay=1.0), "y"])
    async with ta.open_run(agent(model), "q") as run:
        run.inject(
            [
                {"type": "function_call", "call_id": "ext1", "name": "gate", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "ext1", "output": "external"},
            ]
        )
    assert run.result is not None
    assert ta.conversation_problems(run.result.conversation) == []
    assert ta.ToolResult("ext1", "external") in run.result.conversation


async def test_inject_from_a_thread(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(tool_calls=[("forever_gate", {})]), "done"])
    release = trio.Event()

    @ta.function_tool
    async def forever_gate() -> str:
        """Wait for the test."""
        await release.wait()
        return "ok"

    ids: list[str] = []

    def from_thread(run: ta.Run) -> None:
        ids.append(run.inject("from a thread"))

    async with ta.open_run(ta.Agent(name="t", model=model, tools=[forever_gate]), "q") as run:
        await wait_for(run, ta.ToolStarted)
        await trio.to_thread.run_sync(from_thread, run)
        await wait_for(run, ta.InboxInjected)
        release.set()
    assert run.result is not None
    assert model.requests[1].items[-1] == ta.UserMessage("from a thread")


async def test_inject_racing_cancel_from_threads(autojump_clock: trio.testing.MockClock) -> None:
    """Whatever the interleaving, every accepted injection is consumed or unconsumed."""
    accepted: list[str] = []
    lock = threading.Lock()

    def injector(run: ta.Run, i: int) -> None:
        try:
            run.inject(f"m{i}")
        except ta.RunClosedError:
            return
        with lock:
            accepted.append(f"m{i}")

    async with in_the_gate(gated(1000)) as run, trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(trio.to_thread.run_sync, injector, run, i)
        nursery.start_soon(trio.to_thread.run_sync, partial(run.cancel, "race"))
    result = run.result
    assert result is not None
    consumed = [i.content for i in result.new_items if isinstance(i, ta.UserMessage)][1:]
    unconsumed = [i.content for i in result.unconsumed if isinstance(i, ta.UserMessage)]
    assert sorted(consumed + unconsumed) == sorted(accepted)
    assert not set(consumed) & set(unconsumed)
