"""A cancelled run ends ``cancelled`` whatever its parts do with the cancellation
(DESIGN §5): a model stream whose iterator turns ``trio.Cancelled`` into the end of the
stream, or whose ``__aexit__`` swallows it; a tool or a hook that swallows it. And a
``when="now"`` injection interrupts the stream even when the model swallows the
interruption, or when it was accepted while ``on_model_start`` ran (DESIGN §6)."""

from __future__ import annotations

import contextlib
from types import TracebackType
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.core_runs import inject_now_during_model_start
from trio_agents.models import ScriptedModel, TextDelta, Turn
from trio_agents.sessions import MemorySession


class SwallowingModel:
    """Streams ``"cut "`` then waits for more; a Cancelled while waiting is swallowed:
    by the iterator (it ends the stream, ``how="iterator"``) or by the stream's
    ``__aexit__`` (``how="aexit"``). Later calls answer ``"again"`` at once."""

    def __init__(self, how: str) -> None:
        self.how = how
        self.calls = 0
        self.waiting = trio.Event()
        self.requests: list[ta.ModelRequest] = []

    def stream(self, request: ta.ModelRequest) -> Any:
        self.calls += 1
        self.requests.append(request)
        return _Stream(self, first=self.calls == 1)


class _Stream:
    def __init__(self, model: SwallowingModel, *, first: bool) -> None:
        self.model = model
        self.first = first
        self.sent = False
        self.done = False

    async def __aenter__(self) -> _Stream:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self.model.how == "aexit" and isinstance(exc, trio.Cancelled)

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> TextDelta:
        if self.done:
            raise StopAsyncIteration
        if not self.first:
            self.done = True
            await trio.lowlevel.checkpoint()
            return TextDelta("again")
        if not self.sent:
            self.sent = True
            await trio.lowlevel.checkpoint()
            return TextDelta("cut ")
        self.model.waiting.set()
        if self.model.how == "iterator":
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                self.done = True
                raise StopAsyncIteration from None
        await trio.sleep_forever()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("with_session", [True, False])
@pytest.mark.parametrize("how", ["iterator", "aexit"])
async def test_a_model_that_swallows_cancel_still_ends_cancelled(
    how: str, with_session: bool, autojump_clock: trio.testing.MockClock
) -> None:
    # Without a session nothing after the stream checkpointed: the run used to end
    # `completed` with the cut-off text as final_output (with one, it ended cancelled
    # but kept that text as a complete answer).
    model = SwallowingModel(how)
    session = MemorySession("s") if with_session else None
    agent = ta.Agent(name="t", instructions="", model=model)
    async with ta.open_run(agent, "go", session=session) as run:
        await model.waiting.wait()
        run.cancel("stop")
    result = cancelled_by_stop(run)
    assert result.final_output is None
    assert result.new_items[-1] == ta.AssistantMessage("cut ", status="incomplete")
    assert model.calls == 1
    if session is not None:
        assert await session.get_items() == list(result.conversation)


@pytest.mark.parametrize("how", ["iterator", "aexit"])
async def test_an_injection_interrupts_a_model_that_swallows_the_interruption(
    how: str, autojump_clock: trio.testing.MockClock
) -> None:
    model = SwallowingModel(how)
    agent = ta.Agent(name="t", instructions="", model=model)
    async with ta.open_run(agent, "go") as run:
        await model.waiting.wait()
        run.inject("more", when="now")
    result = run.result
    assert result is not None
    assert (result.status, result.final_output) == ("completed", "again")
    # The interrupted text is kept as incomplete, then the injection, then the answer.
    assert result.new_items == (
        ta.UserMessage("go"),
        ta.AssistantMessage("cut ", status="incomplete"),
        ta.UserMessage("more"),
        ta.AssistantMessage("again"),
    )
    assert model.calls == 2


@ta.function_tool
async def stubborn() -> str:
    """Swallows its cancellation and returns as if nothing happened."""
    with contextlib.suppress(trio.Cancelled):  # the bug, on purpose
        await trio.sleep_forever()
    return "done anyway"


async def test_a_tool_that_swallows_cancel_does_not_complete_the_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(tool_calls=[("stubborn", {})]), "finished"])
    agent = ta.Agent(name="t", instructions="", model=model, tools=[stubborn])
    async with ta.open_run(agent, "go") as run:
        await trio.testing.wait_all_tasks_blocked()
        run.cancel("stop")
    cancelled_by_stop(run)
    # The model is never asked again. (The tool's own result says what it returned:
    # swallowing is the tool's bug, which the harness reports as "tool-cancellation".)
    assert model.calls == 1


class SwallowingHooks(ta.RunHooks):
    """Every hook waits (until cancelled) and swallows the cancellation."""

    def __init__(self, hook: str) -> None:
        self.hook = hook
        self.waiting = trio.Event()

    async def _wait(self, name: str) -> None:
        if name != self.hook:
            return
        self.waiting.set()
        with contextlib.suppress(trio.Cancelled):  # the bug, on purpose
            await trio.sleep_forever()

    async def on_model_start(self, run: ta.Run, turn: int, request: ta.ModelRequest) -> None:
        await self._wait("on_model_start")

    async def on_model_end(self, run: ta.Run, turn: int, outcome: str) -> None:
        if outcome == "completed":
            await self._wait("on_model_end")

    async def on_tool_start(self, run: ta.Run, call: ta.ToolCall) -> None:
        await self._wait("on_tool_start")

    async def on_tool_end(self, run: ta.Run, call: ta.ToolCall, result: ta.ToolResult) -> None:
        if result.status == "ok":
            await self._wait("on_tool_end")


@ta.function_tool
async def quick() -> str:
    """Answers at once."""
    return "quick"


@pytest.mark.parametrize("hook", ["on_model_start", "on_model_end", "on_tool_start", "on_tool_end"])
async def test_a_hook_that_swallows_cancel_does_not_complete_the_run(
    hook: str, autojump_clock: trio.testing.MockClock
) -> None:
    hooks = SwallowingHooks(hook)
    model = ScriptedModel([Turn(tool_calls=[("quick", {})]), "finished"])
    agent = ta.Agent(name="t", instructions="", model=model, tools=[quick])
    async with ta.open_run(agent, "go", hooks=hooks) as run:
        await hooks.waiting.wait()
        run.cancel("stop")
    result = cancelled_by_stop(run)
    assert result.final_output is None


class InjectingModelStart(ta.RunHooks):
    """``on_model_start`` of the first call injects ``when="now"`` itself, then returns
    without another checkpoint (a hook reacting to the request, say)."""

    async def on_model_start(self, run: ta.Run, turn: int, request: ta.ModelRequest) -> None:
        if turn == 1:
            run.inject("actually, this", when="now")


async def test_inject_now_from_on_model_start_interrupts_the_call_that_follows(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(["the first answer", "the only answer"])
    result = await ta.run(
        ta.Agent(name="t", instructions="", model=model), "go", hooks=InjectingModelStart()
    )
    assert (result.status, result.final_output) == ("completed", "the first answer")
    # The interrupted call never reached the model's stream: the one streamed call
    # saw the injection.
    assert [r.items for r in model.requests] == [
        (ta.UserMessage("go"), ta.UserMessage("actually, this"))
    ]


async def test_inject_now_during_a_shielded_on_model_start_interrupts_that_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # on_model_start of the first call does shielded work (a span exporter's flush, say)
    # during which another task injects when="now".
    model = ScriptedModel(["the first answer", "the only answer"])
    agent = ta.Agent(name="t", instructions="", model=model)
    result = await inject_now_during_model_start(agent, shield=True)
    assert (result.status, result.final_output) == ("completed", "the first answer")
    assert [r.items for r in model.requests] == [
        (ta.UserMessage("go"), ta.UserMessage("actually, this"))
    ]


class NoCheckpointModel:
    """A model whose stream never checkpoints (events it already holds): nothing in it
    can notice a cancelled scope. Answers ``answer <n>`` per call."""

    def __init__(self) -> None:
        self.requests: list[ta.ModelRequest] = []

    def stream(self, request: ta.ModelRequest) -> Any:
        self.requests.append(request)
        return _Ready([TextDelta(f"answer {len(self.requests)}")])


class _Ready:
    def __init__(self, events: list[TextDelta]) -> None:
        self.events = events

    async def __aenter__(self) -> _Ready:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        return None

    def __aiter__(self) -> _Ready:
        return self

    async def __anext__(self) -> TextDelta:
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)


async def test_inject_now_from_on_model_start_never_streams_a_checkpoint_free_model(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = NoCheckpointModel()
    result = await ta.run(
        ta.Agent(name="t", instructions="", model=model), "go", hooks=InjectingModelStart()
    )
    assert (result.status, result.final_output) == ("completed", "answer 1")
    assert [r.items for r in model.requests] == [
        (ta.UserMessage("go"), ta.UserMessage("actually, this"))
    ]
    assert result.new_items == (
        ta.UserMessage("go"),
        ta.UserMessage("actually, this"),
        ta.AssistantMessage("answer 1"),
    )


def cancelled_by_stop(run: ta.Run) -> ta.RunResult:
    """The run's result, which must be: cancelled, for the reason "stop"."""
    result = run.result
    assert result is not None
    assert (result.status, result.reason) == ("cancelled", "stop")
    return result
