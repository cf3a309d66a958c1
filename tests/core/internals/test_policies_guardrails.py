"""Run policies (DESIGN §18): guardrails — input checks beside the model call, output
checks of the answer, and streaming output checks that gate what is published."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.core_runs import assert_ended, assert_failed_with
from tests.support.core_trees import root_calling, run_events, tool_turn
from trio_agents.models import ScriptedModel, Turn
from trio_agents.testing import check_events
from trio_agents.testing._fakes import stray_cancelled


def _texts(events: Sequence[ta.RunEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, ta.ResponseTextDelta))


async def test_input_guardrail_runs_beside_the_model_and_a_trip_cuts_the_stream(
    autojump_clock: Any,
) -> None:
    started = trio.Event()

    @ta.input_guardrail
    async def no_secrets(run: ta.Run, items: Sequence[ta.Item]) -> ta.GuardrailResult:
        started.set()
        await trio.sleep(2)  # slow: the model streams meanwhile
        text = " ".join(i.content for i in items if isinstance(i, ta.UserMessage))
        return ta.GuardrailResult("password" in text, info="asked for a password")

    model = ScriptedModel([Turn(["chunk "] * 100, delay=0.1)])
    agent = ta.Agent(name="a", model=model, input_guardrails=[no_secrets])
    async with ta.open_run(agent, "tell me the password") as run:
        pass
    reason = "guardrail no_secrets: asked for a password"
    result, error = assert_failed_with(run, reason, ta.GuardrailTripped)
    assert error.name == "no_secrets"
    events = await run_events(run)
    # the model was streaming (in parallel) and was cut at the trip, after about 2 s
    streamed = _texts(events)
    assert 0 < len(streamed) < len("chunk " * 100)
    assert model.open_streams == 0
    assert check_events(result, events).ok


async def test_a_passing_input_guardrail_costs_no_model_time(autojump_clock: Any) -> None:
    @ta.input_guardrail
    async def slow_ok(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        await trio.sleep(0.2)
        return False

    model = ScriptedModel([Turn("quick answer")])
    agent = ta.Agent(name="a", model=model, input_guardrails=[slow_ok])
    start = trio.current_time()
    result = await ta.run(agent, "hi")
    assert result.status == "completed"
    # the run waited for the guardrail before completing, not before calling the model
    assert trio.current_time() - start == pytest.approx(0.2)


async def test_a_trip_cancels_tools_started_since(autojump_clock: Any) -> None:
    cancelled: list[str] = []

    @ta.function_tool
    async def long_tool() -> str:
        """Takes long."""
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            cancelled.append("long_tool")
            raise
        return "done"

    @ta.input_guardrail
    async def slow_no(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        await trio.sleep(5)
        return True

    agent = ta.Agent(
        name="a",
        model=ScriptedModel([tool_turn(("long_tool", {}))]),
        tools=[long_tool],
        input_guardrails=[slow_no],
    )
    result = await ta.run(agent, "go")
    assert result.status == "failed"
    assert result.reason == "guardrail slow_no: None"
    assert cancelled == ["long_tool"]
    results = [i for i in result.conversation if isinstance(i, ta.ToolResult)]
    assert [r.status for r in results] == ["cancelled"]


async def test_blocking_input_guardrail_runs_before_the_model_call() -> None:
    @ta.input_guardrail(name="gate", blocking=True)
    def refuse(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        return True

    model = ScriptedModel(["never"])
    result = await ta.run(ta.Agent(name="a", model=model, input_guardrails=[refuse]), "x")
    assert result.status == "failed"
    assert result.reason == "guardrail gate: None"
    assert model.calls == 0


async def test_injected_input_is_checked_in_its_turn(autojump_clock: Any) -> None:
    seen: list[list[str]] = []

    @ta.input_guardrail
    async def record(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        seen.append([i.content for i in items if isinstance(i, ta.UserMessage)])
        return any("bad" in text for text in seen[-1])

    model = ScriptedModel([Turn("first", delay=1)], default="again")
    agent = ta.Agent(name="a", model=model, input_guardrails=[record])
    async with ta.open_run(agent, "hello") as run:
        await trio.sleep(0.5)  # the first turn is streaming
        run.inject("something bad")
    assert run.result is not None
    assert run.result.status == "failed"
    assert seen == [["hello"], ["something bad"]]


async def test_output_guardrail_checks_the_final_answer() -> None:
    @ta.output_guardrail
    async def polite(run: ta.Run, answer: str) -> ta.GuardrailResult:
        return ta.GuardrailResult("stupid" in answer, info={"word": "stupid"})

    ok = await ta.run(
        ta.Agent(name="a", model=ScriptedModel(["fine"]), output_guardrails=[polite]), "x"
    )
    assert ok.status == "completed"
    bad = await ta.run(
        ta.Agent(name="a", model=ScriptedModel(["that is stupid"]), output_guardrails=[polite]), "x"
    )
    assert bad.status == "failed"
    assert bad.reason == "guardrail polite: {'word': 'stupid'}"


async def test_streaming_guardrail_never_publishes_what_it_rejects(autojump_clock: Any) -> None:
    @ta.output_guardrail(stream=True)
    async def no_pii(run: ta.Run, text: str) -> ta.GuardrailResult:
        await trio.sleep(0.05)  # a check takes time: deltas queue behind it
        return ta.GuardrailResult("555-0199" in text, info="phone number")

    words = ["Call ", "me ", "at ", "555-0199 ", "any ", "time"]
    session = ta.sessions.MemorySession("pii")
    agent = ta.Agent(
        name="a", model=ScriptedModel([Turn(words, delay=0.01)]), output_guardrails=[no_pii]
    )
    async with ta.open_run(agent, "number?", session=session) as run:
        seen = [e async for e in run.events()]
    result = assert_ended(run, "failed", "guardrail no_pii: phone number")
    published = _texts(seen)
    assert "555" not in published
    assert published == "Call me at "[: len(published)]
    # only released text is kept, as an incomplete message, in the result and session
    kept = [i for i in result.new_items if isinstance(i, ta.AssistantMessage)]
    assert [k.content for k in kept] == ([published] if published else [])
    assert all(k.status == "incomplete" for k in kept)
    assert "555" not in str(await session.get_items())
    assert check_events(result, seen).ok


async def test_streaming_guardrail_that_passes_publishes_everything(autojump_clock: Any) -> None:
    calls: list[str] = []

    @ta.output_guardrail(stream=True)
    async def watch(run: ta.Run, text: str) -> bool:
        calls.append(text)
        await trio.sleep(0.05)
        return False

    words = [f"w{n} " for n in range(50)]
    agent = ta.Agent(
        name="a", model=ScriptedModel([Turn(words, delay=0.001)]), output_guardrails=[watch]
    )
    async with ta.open_run(agent, "x") as run:
        seen = [e async for e in run.events()]
    assert run.result is not None
    assert run.result.status == "completed"
    assert _texts(seen) == "".join(words)
    assert run.result.final_output == "".join(words)
    # checked in rounds, each on the whole text so far; far fewer rounds than deltas
    assert calls[-1] == "".join(words)
    assert len(calls) < len(words)


@pytest.mark.parametrize("kind", ["raise", "garbage", "stray-cancel"])
async def test_a_guardrail_that_fails_fails_the_run_never_a_pass(kind: str) -> None:
    @ta.input_guardrail(name="broken")
    async def broken(run: ta.Run, items: Sequence[ta.Item]) -> Any:
        if kind == "raise":
            raise RuntimeError("guard down")
        if kind == "garbage":
            return "yes"
        raise await stray_cancelled()

    model = ScriptedModel([Turn("answer")])
    result = await ta.run(ta.Agent(name="a", model=model, input_guardrails=[broken]), "x")
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason.startswith("guardrail broken raised"), result.reason


async def test_a_hanging_guardrail_holds_the_run_until_it_is_cancelled(autojump_clock: Any) -> None:
    @ta.input_guardrail
    async def hang(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        await trio.sleep_forever()

    agent = ta.Agent(name="a", model=ScriptedModel(["answer"]), input_guardrails=[hang])
    async with ta.open_run(agent, "x") as run:
        await trio.sleep(60)
        assert run.status == "running"  # never completes with an unchecked input
        run.cancel("enough")
    assert run.result is not None
    assert run.result.status == "cancelled"


async def test_a_guardrail_in_a_child_fails_the_child_only() -> None:
    @ta.input_guardrail
    async def refuse(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        return True

    child = ta.Agent(name="kid", model=ScriptedModel(["x"]), input_guardrails=[refuse])
    root = root_calling(child, then="coped", input="q")
    result = await ta.run(root, "go")
    assert result.status == "completed"
    (tool_result,) = [i for i in result.conversation if isinstance(i, ta.ToolResult)]
    assert tool_result.output == "sub-agent kid failed: guardrail refuse: None"


async def test_guardrail_validation() -> None:
    with pytest.raises(TypeError, match="list of guardrails"):
        ta.Agent(name="a", input_guardrails=ta.input_guardrail(lambda r, i: False))
    with pytest.raises(TypeError, match="make guardrails with"):
        ta.Agent(name="a", output_guardrails=[lambda r, t: False])


# ----------------------------------------------------------------------- races


@pytest.mark.parametrize("trip_at", [0.999, 1.0, 1.001])
async def test_a_trip_racing_the_final_answer_never_completes_the_run(
    autojump_clock: Any, trip_at: float
) -> None:
    @ta.input_guardrail
    async def late(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        await trio.sleep(trip_at)
        return True

    model = ScriptedModel([Turn(["the ", "answer"], delay=0.5)])  # done at t=1.0
    agent = ta.Agent(name="a", model=model, input_guardrails=[late])
    async with ta.open_run(agent, "x") as run:
        pass
    # an unchecked input never gives a completed run
    result = assert_ended(run, "failed", "guardrail late: None")
    assert check_events(result, await run_events(run)).ok


@pytest.mark.parametrize("trip_at", [0.999, 1.0, 1.001])
async def test_a_trip_racing_a_tool_finishing(autojump_clock: Any, trip_at: float) -> None:
    @ta.function_tool
    async def one_second() -> str:
        """Takes a second."""
        await trio.sleep(1)
        return "done"

    @ta.input_guardrail
    async def late(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        await trio.sleep(trip_at)
        return True

    agent = ta.Agent(
        name="a",
        model=ScriptedModel([tool_turn(("one_second", {})), "after"]),
        tools=[one_second],
        input_guardrails=[late],
    )
    async with ta.open_run(agent, "x") as run:
        pass
    result = run.result
    assert result is not None
    assert result.status == "failed"
    assert ta.conversation_problems(result.conversation) == []
    assert check_events(result, await run_events(run)).ok


@pytest.mark.parametrize("cancel_at", [0.999, 1.0, 1.001])
async def test_a_trip_racing_a_cancel(autojump_clock: Any, cancel_at: float) -> None:
    @ta.input_guardrail
    async def trip(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        await trio.sleep(1)
        return True

    agent = ta.Agent(
        name="a", model=ScriptedModel([Turn(["x"] * 100, delay=0.1)]), input_guardrails=[trip]
    )
    async with ta.open_run(agent, "x") as run:
        await trio.sleep(cancel_at)
        run.cancel("user")
    result = run.result
    assert result is not None
    # whichever came first ends the run; exactly one terminal update, a valid history
    expected = {0.999: "cancelled", 1.001: "failed"}.get(cancel_at)
    assert result.status in ("cancelled", "failed")
    if expected is not None:
        assert result.status == expected
    assert check_events(result, await run_events(run)).ok


async def test_a_guardrail_swallowing_the_runs_cancel_is_no_pass(autojump_clock: Any) -> None:
    @ta.input_guardrail
    async def swallow(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            return False  # swallowed: "passes"
        return False

    agent = ta.Agent(name="a", model=ScriptedModel(["answer"]), input_guardrails=[swallow])
    async with ta.open_run(agent, "x") as run:
        await trio.sleep(1)
        run.cancel("stop")
    assert run.result is not None
    assert run.result.status == "cancelled"
    assert run.result.reason == "stop"


async def test_each_streaming_check_sees_exactly_the_text_so_far(autojump_clock: Any) -> None:
    # Rounds of one delta (the stream is slower than the check) and of several (a slow
    # check lets deltas queue), mixed: every call sees a longer prefix of the stream,
    # the last the whole text; a bare True trips with no info.
    calls: list[str] = []

    @ta.output_guardrail(stream=True)
    async def watch(run: ta.Run, text: str) -> bool:
        calls.append(text)
        await trio.sleep(0.05 if len(calls) % 3 == 0 else 0)
        return "STOP" in text

    words = [f"w{n} " for n in range(20)]
    agent = ta.Agent(
        name="a", model=ScriptedModel([Turn(words, delay=0.01)]), output_guardrails=[watch]
    )
    async with ta.open_run(agent, "x") as run:
        seen = [e async for e in run.events()]
    whole = "".join(words)
    assert _texts(seen) == whole
    assert calls[-1] == whole
    assert all(whole.startswith(text) for text in calls)
    assert all(len(a) < len(b) for a, b in itertools.pairwise(calls))
    assert any(len(b) - len(a) > len(words[0]) for a, b in itertools.pairwise(calls))
    assert len(calls) < len(words)

    calls.clear()
    agent = ta.Agent(
        name="a",
        model=ScriptedModel([Turn(["go ", "on ", "STOP ", "now"], delay=0.01)]),
        output_guardrails=[watch],
    )
    async with ta.open_run(agent, "x") as run:
        seen = [e async for e in run.events()]
    assert run.result is not None
    assert run.result.reason == "guardrail watch: None"
    assert isinstance(run.result.error, ta.GuardrailTripped)
    assert run.result.error.info is None
    assert "STOP" not in _texts(seen)
