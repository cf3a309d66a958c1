"""What the stream loop costs, counted (issue 43): task steps per streamed delta, which
no machine load moves, and the promises the cheaper paths keep (every delta published
in order, a gate that never publishes what it rejects, cleaned text)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.core_runs import assert_ended, assert_failed_with
from tests.support.core_trees import tool_turn
from trio_agents.models import ScriptedModel, Turn
from trio_agents.testing import check_events


class _Steps(trio.abc.Instrument):
    """Counts task steps: each is one wake-up of one task (a checkpoint's worth of the
    scheduler's work), whatever the machine's load."""

    def __init__(self) -> None:
        self.count = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


async def _steps(make: Callable[[int], Awaitable[None]], deltas: int) -> int:
    steps = _Steps()
    trio.lowlevel.add_instrument(steps)
    try:
        await make(deltas)
    finally:
        trio.lowlevel.remove_instrument(steps)
    return steps.count


async def _per_delta(make: Callable[[int], Awaitable[None]]) -> float:
    """Task steps per delta: the difference of a long and a short stream, so the run's
    own start and end cancel out."""
    short, long = await _steps(make, 20), await _steps(make, 220)
    return (long - short) / 200


def _stream_run(
    guardrails: Sequence[ta.OutputGuardrail] = (), *, reader: str = "each"
) -> Callable[[int], Awaitable[None]]:
    async def make(deltas: int) -> None:
        agent = ta.Agent(
            name="w1",
            model=ScriptedModel([Turn(text=["x"] * deltas)]),
            output_guardrails=list(guardrails),
        )
        async with ta.open_run(agent, "go") as run:
            if reader == "each":
                async for _ in run.events():
                    pass
            elif reader == "batches":
                async for _ in run.events().batches():
                    pass
        assert run.result is not None
        assert run.result.final_output == "x" * deltas

    return make


@ta.output_guardrail(stream=True)
def _passes(run: ta.Run, text: str) -> bool:
    return False


@ta.output_guardrail(stream=True)
async def _passes_async(run: ta.Run, text: str) -> bool:
    return False


async def test_a_run_adds_no_task_step_per_delta_to_its_models() -> None:
    # ScriptedModel yields once per delta: the run streams in exactly those steps.
    assert await _per_delta(_stream_run(reader="none")) < 1.05


@pytest.mark.parametrize("reader", ["each", "batches"])
async def test_a_reader_that_keeps_up_costs_one_task_step_per_delta(reader: str) -> None:
    # The model's step and the reader's: never a park and a wake-up per delta too.
    assert await _per_delta(_stream_run(reader=reader)) < 2.1


@pytest.mark.parametrize("reader", ["none", "each"])
async def test_a_sync_streaming_guardrail_adds_no_task_step_per_delta(reader: str) -> None:
    plain = await _per_delta(_stream_run(reader=reader))
    gated = await _per_delta(_stream_run([_passes], reader=reader))
    # Checked in the stream loop as each delta arrives: no checker task to wake (the
    # checker task cost about 0.65 task steps per delta).
    assert gated - plain < 0.05, (plain, gated)


async def test_an_async_streaming_guardrail_still_checks_beside_the_stream() -> None:
    plain = await _per_delta(_stream_run(reader="none"))
    gated = await _per_delta(_stream_run([_passes_async], reader="none"))
    assert gated - plain > 0.3, (plain, gated)  # its checker task's rounds


async def test_plain_streaming_guardrails_open_no_side_nursery() -> None:
    # Checked inline, they need no task beside the turn loop: the run's task holds no
    # nursery for side tasks while it streams (a nursery per run, and one more frame
    # to resume at each of the stream's steps).
    held: list[int] = []

    @ta.output_guardrail(stream=True)
    def watch(run: ta.Run, text: str) -> bool:
        held.append(len(trio.lowlevel.current_task().child_nurseries))
        return False

    await _stream_run([watch], reader="none")(3)
    assert held == [0, 0, 0]


async def test_a_guardrail_listed_twice_is_called_once_per_place() -> None:
    # Its second place hands back an awaitable: settle() finishes it and checks the
    # places after that one, never the first place again (a guardrail whose verdict
    # depends on its calls would judge a delta twice).
    calls: list[str] = []

    @ta.output_guardrail(stream=True, name="twice")
    def twice(run: ta.Run, text: str) -> Any:
        calls.append(text)
        if len(calls) == 2:

            async def remote() -> bool:
                return False

            return remote()
        return len(calls) > 2  # a third call on the one delta trips

    agent = ta.Agent(name="a", model=ScriptedModel([Turn(["a"])]), output_guardrails=[twice] * 2)
    result = await ta.run(agent, "x")
    assert (result.status, calls) == ("completed", ["a", "a"]), (result.reason, calls)


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_handoff_targets_streaming_guardrail_gates_its_stream(kind: str) -> None:
    # The first agent has no guardrail: the run still sets up what the agent it hands
    # off to needs (a checker task for an async one), and the gate holds its stream.
    def rejects(run: ta.Run, text: str) -> bool:
        return "secret" in text

    async def rejects_async(run: ta.Run, text: str) -> bool:
        await trio.lowlevel.checkpoint()
        return "secret" in text

    guard = ta.output_guardrail(stream=True, name="no_secret")(
        rejects if kind == "sync" else rejects_async
    )
    target = ta.Agent(
        name="b", model=ScriptedModel([Turn(["ok ", "sec", "ret"])]), output_guardrails=[guard]
    )
    source = ta.Agent(
        name="a", model=ScriptedModel([tool_turn(("transfer_to_b", {}))]), handoffs=[target]
    )
    async with ta.open_run(source, "x") as run:
        seen = [e async for e in run.events()]
    result = run.result
    assert result is not None
    assert result.reason == "guardrail no_secret: None", result.reason
    published = [e.text for e in seen if isinstance(e, ta.ResponseTextDelta)]
    assert "secret" not in "".join(published)
    if kind == "sync":
        assert published == ["ok ", "sec"]  # each delta checked as it arrives
    assert check_events(result, seen).ok


async def test_a_sync_streaming_guardrail_sees_every_prefix_and_gates_each_delta() -> None:
    calls: list[str] = []
    published: list[str] = []

    @ta.output_guardrail(stream=True)
    def watch(run: ta.Run, text: str) -> bool:
        calls.append(text)
        # Nothing of this delta is published before the check that holds it passed.
        assert "".join(published) == text[: len("".join(published))]
        assert len("".join(published)) < len(text)
        return False

    words = ["one ", "two ", "three ", "\ud83d", "\ude00 four"]
    agent = ta.Agent(name="a", model=ScriptedModel([Turn(words)]), output_guardrails=[watch])
    async with ta.open_run(agent, "x") as run:
        async for event in run.events():
            if isinstance(event, ta.ResponseTextDelta):
                published.append(event.text)
    result = assert_ended(run, "completed", None)
    # the split surrogate pair is joined before any guardrail sees it
    whole = "one two three \U0001f600 four"
    assert calls == ["one ", "one two ", "one two three ", whole]
    assert "".join(published) == whole == result.final_output


@pytest.mark.parametrize("returns", ["bool", "result", "awaitable"])
async def test_a_sync_streaming_guardrail_trip_never_publishes_the_delta(returns: str) -> None:
    async def later(verdict: bool) -> bool:
        await trio.lowlevel.checkpoint()
        return verdict

    @ta.output_guardrail(stream=True)
    def no_digits(run: ta.Run, text: str) -> Any:
        tripped = any(c.isdigit() for c in text)
        if returns == "result":
            return ta.GuardrailResult(tripped, info="digits")
        if returns == "awaitable":
            return later(tripped)  # a plain function may hand back an awaitable
        return tripped

    model = ScriptedModel([Turn(["Call ", "me ", "at ", "555 ", "now", " please"])])
    session = ta.sessions.MemorySession("digits")
    agent = ta.Agent(name="a", model=model, output_guardrails=[no_digits])
    async with ta.open_run(agent, "number?", session=session) as run:
        seen = [e async for e in run.events()]
    info = "digits" if returns == "result" else "None"
    result, error = assert_failed_with(run, f"guardrail no_digits: {info}", ta.GuardrailTripped)
    assert error.name == "no_digits"
    published = "".join(e.text for e in seen if isinstance(e, ta.ResponseTextDelta))
    assert published == "Call me at "
    kept = [i for i in result.new_items if isinstance(i, ta.AssistantMessage)]
    assert [(k.content, k.status) for k in kept] == [("Call me at ", "incomplete")]
    assert "555" not in str(await session.get_items())
    assert model.open_streams == 0  # the stream was cut at the trip
    assert check_events(result, seen).ok


async def _stray_cancelled() -> trio.Cancelled:
    """A ``Cancelled`` of a scope already left: raised later, nothing asked for it."""
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as exc:
            return exc  # deliberately not re-raised: the guardrail raises it later
    raise AssertionError("unreachable: the scope was cancelled")  # pragma: no cover


@pytest.mark.parametrize("kind", ["raise", "garbage", "stray-cancel"])
async def test_a_sync_streaming_guardrail_that_fails_fails_the_run(kind: str) -> None:
    stray = await _stray_cancelled()

    @ta.output_guardrail(stream=True, name="broken")
    def broken(run: ta.Run, text: str) -> Any:
        if "b" not in text:
            return False
        if kind == "raise":
            raise RuntimeError("guard down")
        if kind == "garbage":
            return "yes"
        raise stray  # a Cancelled that nothing asked for

    model = ScriptedModel([Turn(["a", "b", "c"])])
    agent = ta.Agent(name="a", model=model, output_guardrails=[broken])
    async with ta.open_run(agent, "x") as run:
        seen = [e async for e in run.events()]
    result = run.result
    assert result is not None
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason.startswith("guardrail broken raised"), result.reason
    assert [e.text for e in seen if isinstance(e, ta.ResponseTextDelta)] == ["a"]
    assert check_events(result, seen).ok


async def test_sync_and_async_streaming_guardrails_together_check_in_rounds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen_by: dict[str, list[str]] = {"sync": [], "async": []}

    @ta.output_guardrail(stream=True, name="sync")
    def quick(run: ta.Run, text: str) -> bool:
        seen_by["sync"].append(text)
        return "STOP" in text

    @ta.output_guardrail(stream=True, name="async")
    async def slow(run: ta.Run, text: str) -> bool:
        seen_by["async"].append(text)
        await trio.sleep(0.05)
        return False

    words = [f"w{n} " for n in range(20)]
    agent = ta.Agent(
        name="a",
        model=ScriptedModel([Turn([*words, "STOP"], delay=0.01)]),
        output_guardrails=[quick, slow],
    )
    async with ta.open_run(agent, "x") as run:
        seen = [e async for e in run.events()]
    assert_ended(run, "failed", "guardrail sync: None")
    # One async guardrail puts the whole gate beside the stream: both see the same
    # rounds, fewer than the deltas.
    assert seen_by["sync"][:-1] == seen_by["async"]
    assert seen_by["sync"][-1] == "".join(words) + "STOP"
    assert len(seen_by["sync"]) < len(words)
    published = "".join(e.text for e in seen if isinstance(e, ta.ResponseTextDelta))
    assert "STOP" not in published
