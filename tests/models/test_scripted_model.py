"""ScriptedModel: the deterministic test model (DESIGN.md §8, §11)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
import trio
import trio.testing

import trio_agents as ta
from trio_agents.models import (
    Finish,
    ModelEvent,
    ModelRequest,
    ScriptedModel,
    TextDelta,
    ToolCallDone,
    Turn,
    Usage,
)

# pytest-trio only runs a test on a clock that the test takes as an argument, so every
# async test here asks for ``autojump_clock`` (``usefixtures`` would not be enough).


def request(*items: ta.Item, instructions: str = "be useful") -> ModelRequest:
    return ModelRequest(instructions=instructions, items=items or (ta.UserMessage("hi"),))


async def consume(model: ScriptedModel, req: ModelRequest | None = None) -> list[ModelEvent]:
    async with model.stream(req or request()) as stream:
        return [event async for event in stream]


async def drain(model: ScriptedModel, into: list[ModelEvent]) -> None:
    """Read one stream to the end, keeping what arrived before any error."""
    async with model.stream(request()) as stream:
        async for event in stream:
            into.append(event)


def texts(events: Sequence[ModelEvent]) -> list[str]:
    return [e.text for e in events if isinstance(e, TextDelta)]


def calls(events: Sequence[ModelEvent]) -> list[ta.ToolCall]:
    return [e.call for e in events if isinstance(e, ToolCallDone)]


# -------------------------------------------------------------------------- text


@pytest.mark.parametrize(
    "text",
    [
        "Hello there, friend.",
        "a b c",
        "  leading and trailing  ",
        "line one\n\nline two\tend",
        "single",
        "   ",
        "",
        "ünïcödé wörds \u2013 and \u201cquotes\u201d",
    ],
)
def test_text_chunks_round_trip(text: str) -> None:
    turn = Turn(text)
    assert "".join(turn.text) == text
    assert all(turn.text)
    if text.split():
        assert len(turn.text) == len(text.split())


def test_text_is_split_into_words_keeping_whitespace() -> None:
    assert Turn("Hello there, friend.").text == ("Hello ", "there, ", "friend.")
    assert Turn(["a", "b", ""]).text == ("a", "b", "")


async def test_stream_yields_text_then_usage_then_finish(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(["Hello there, friend."])
    events = await consume(model)
    assert texts(events) == ["Hello ", "there, ", "friend."]
    assert isinstance(events[-2], Usage)
    assert events[-2].input_tokens > 0
    assert events[-2].output_tokens == 5  # 20 characters, about 4 per token
    assert events[-1] == Finish("stop")


async def test_explicit_chunks_are_streamed_as_given(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["one ", "", "two"])])
    assert texts(await consume(model)) == ["one ", "", "two"]


async def test_usage_is_deterministic_and_overridable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    req = request(ta.UserMessage("x" * 40))
    first = await consume(ScriptedModel(["abcdefgh"]), req)
    second = await consume(ScriptedModel(["abcdefgh"]), req)
    assert first == second
    usage = next(e for e in first if isinstance(e, Usage))
    assert usage.output_tokens == 2
    given = Usage(input_tokens=7, output_tokens=9)
    events = await consume(ScriptedModel([Turn("x", usage=given, finish="length")]), req)
    assert events[-2:] == [given, Finish("length")]


# -------------------------------------------------------------------- tool calls


async def test_tool_calls_follow_text_with_deterministic_ids(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(
        [
            Turn(
                text="Let me add.",
                tool_calls=[
                    ("add", {"a": 2, "b": 3}),
                    ("raw", '{"x": [1, 2]}'),
                    ta.ToolCall("mine", "add", '{"a": 0, "b": 0}'),
                    ("bad", "not json"),
                ],
            ),
            Turn(tool_calls=[("add", {})]),
        ]
    )
    events = await consume(model)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["TextDelta"] * 3 + ["ToolCallDone"] * 4 + ["Usage", "Finish"]
    assert calls(events) == [
        ta.ToolCall("call_1_0", "add", '{"a": 2, "b": 3}'),
        ta.ToolCall("call_1_1", "raw", '{"x": [1, 2]}'),
        ta.ToolCall("mine", "add", '{"a": 0, "b": 0}'),
        ta.ToolCall("call_1_3", "bad", "not json"),
    ]
    assert json.loads(calls(events)[0].arguments) == {"a": 2, "b": 3}
    assert events[-1] == Finish("tool_calls")
    second = await consume(model)
    assert calls(second) == [ta.ToolCall("call_2_0", "add", "{}")]


async def test_a_repeated_default_turn_gets_fresh_call_ids(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([], default=Turn(tool_calls=[("add", {"a": 1})]))
    ids = [calls(await consume(model))[0].call_id for _ in range(3)]
    assert ids == ["call_1_0", "call_2_0", "call_3_0"]


async def test_generated_ids_never_repeat_an_id_of_the_history(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # a fresh model on an old session: its call_1_0 is already in the conversation
    history = (
        ta.UserMessage("hi"),
        ta.ToolCall("call_1_0", "add", "{}"),
        ta.ToolResult("call_1_0", "0"),
        ta.UserMessage("again"),
    )
    model = ScriptedModel([Turn(tool_calls=[("add", {}), ("add", {})])])
    got = calls(await consume(model, request(*history)))
    assert [c.call_id for c in got] == ["call_1_0_2", "call_1_1"]


def test_turn_validation() -> None:
    with pytest.raises(TypeError, match="tool_calls"):
        Turn(tool_calls="add")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"tool_calls\[0\]"):
        Turn(tool_calls=[("add",)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="name"):
        Turn(tool_calls=[("", {})])
    with pytest.raises(ValueError, match="JSON"):
        Turn(tool_calls=[("add", {"a": object()})])
    with pytest.raises(TypeError, match=r"text\[1\]"):
        Turn(text=["a", 1])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="delay"):
        Turn("x", delay=-1)
    with pytest.raises(ValueError, match="delay"):
        Turn("x", delay=float("inf"))
    with pytest.raises(ValueError, match=r"needs Turn\.fail"):
        Turn("x", fail_after=1)
    with pytest.raises(ValueError, match="fail_after"):
        Turn("x", fail="boom", fail_after=-1)
    with pytest.raises(TypeError, match="fail"):
        Turn("x", fail=42)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="turns must be a sequence"):
        ScriptedModel("hello")
    with pytest.raises(TypeError, match="Turn or a str"):
        ScriptedModel([42])  # type: ignore[list-item]


def test_turns_are_frozen_values() -> None:
    turn = Turn("a b", tool_calls=[("add", {"a": 1})])
    assert turn == Turn(["a ", "b"], tool_calls=[("add", '{"a": 1}')])
    assert hash(turn) == hash(Turn("a b", tool_calls=[("add", {"a": 1})]))
    with pytest.raises(AttributeError):
        turn.delay = 1.0  # type: ignore[misc]


# ------------------------------------------------------------------------ delays


async def test_delay_runs_in_virtual_time_before_each_chunk_and_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(
        [Turn(text=["a", "b", "c"], tool_calls=[("t", {}), ("t", {})], delay=1.5)]
    )
    start = trio.current_time()
    seen: list[tuple[float, str]] = []
    async with model.stream(request()) as stream:
        async for event in stream:
            seen.append((trio.current_time() - start, type(event).__name__))
    assert seen == [
        (1.5, "TextDelta"),
        (3.0, "TextDelta"),
        (4.5, "TextDelta"),
        (6.0, "ToolCallDone"),
        (7.5, "ToolCallDone"),
        (7.5, "Usage"),
        (7.5, "Finish"),
    ]


async def test_every_step_is_a_checkpoint_even_without_delay(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["x"] * 5)])
    with trio.CancelScope() as scope:
        async with model.stream(request()) as stream:
            scope.cancel()
            await stream.__anext__()
            pytest.fail("the first read should have been cancelled")  # pragma: no cover
    assert scope.cancelled_caught
    assert model.open_streams == 0


# ---------------------------------------------------------------------- failures


async def test_fail_before_the_first_chunk_by_default(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["a", "b"], fail="backend down", delay=1.0)])
    start = trio.current_time()
    got: list[ModelEvent] = []
    with pytest.raises(ta.ModelError, match="backend down"):
        await drain(model, got)
    assert got == []
    assert trio.current_time() == start
    assert model.open_streams == 0
    assert model.closed_streams == 1


async def test_fail_after_n_chunks(autojump_clock: trio.testing.MockClock) -> None:
    boom = ConnectionResetError("peer reset")
    model = ScriptedModel(
        [Turn(text=["one ", "two ", "three"], fail=boom, fail_after=2, delay=1.0)]
    )
    start = trio.current_time()
    got: list[ModelEvent] = []
    with pytest.raises(ConnectionResetError) as info:
        await drain(model, got)
    assert info.value is boom
    assert texts(got) == ["one ", "two "]
    assert trio.current_time() - start == 2.0
    assert model.open_streams == 0


async def test_fail_after_all_text_comes_before_the_tool_calls(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(
        [Turn(text=["a", "b"], tool_calls=[("t", {})], fail="late", fail_after=5)]
    )
    got: list[ModelEvent] = []
    with pytest.raises(ta.ModelError, match="late"):
        await drain(model, got)
    assert got == [TextDelta("a"), TextDelta("b")]


async def test_a_failed_stream_stays_failed(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(fail="once")])
    async with model.stream(request()) as stream:
        with pytest.raises(ta.ModelError):
            await stream.__anext__()
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()


# ------------------------------------------------------------ script and default


async def test_exhausted_script_raises_model_error(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(["only"])
    assert texts(await consume(model)) == ["only"]
    with pytest.raises(ta.ModelError, match="ScriptedModel script exhausted after 1 turns"):
        await consume(model)
    assert model.calls == 2
    assert model.open_streams == 0
    assert model.closed_streams == 1  # the failed one was never entered


async def test_empty_script_without_default_fails_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with pytest.raises(ta.ModelError, match="after 0 turns"):
        await consume(ScriptedModel([]))


async def test_default_is_used_once_the_script_runs_out(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(["first", Turn("second")], default="again")
    answers = ["".join(texts(await consume(model))) for _ in range(4)]
    assert answers == ["first", "second", "again", "again"]
    assert model.default == Turn("again")
    assert model.turns == (Turn("first"), Turn("second"))


async def test_requests_are_recorded_in_order(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(["a", "b"])
    first = request(ta.UserMessage("one"))
    second = ModelRequest(
        instructions="x",
        items=(ta.UserMessage("two"),),
        tools=(ta.ToolSpec("add", "Add.", {"type": "object"}),),
        settings={"temperature": 0},
    )
    await consume(model, first)
    stream = model.stream(second)
    # recorded when stream() is called, before the stream is entered
    assert model.requests == [first, second]
    assert model.calls == 2
    async with stream as events:
        assert [e async for e in events][-1] == Finish("stop")
    model.requests.clear()  # a copy: the record is not changed
    assert model.calls == 2


# ------------------------------------------------------------ stream accounting


async def test_open_and_closed_streams(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(["a b", "c"])
    assert (model.open_streams, model.closed_streams) == (0, 0)
    async with model.stream(request()) as first:
        assert model.open_streams == 1
        async with model.stream(request()) as second:
            assert model.open_streams == 2
            assert texts([e async for e in second]) == ["c"]
        assert (model.open_streams, model.closed_streams) == (1, 1)
        assert texts([e async for e in first]) == ["a ", "b"]
    assert (model.open_streams, model.closed_streams) == (0, 2)


async def test_consumer_cancelled_mid_stream_closes_the_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["x "] * 100, delay=1.0)])
    received: list[ModelEvent] = []

    async def consumer() -> None:
        async with model.stream(request()) as stream:
            async for event in stream:
                received.append(event)

    start = trio.current_time()
    with trio.move_on_after(3.5):
        await consumer()
    assert trio.current_time() - start == 3.5
    assert len(received) == 3
    assert model.open_streams == 0
    assert model.closed_streams == 1


async def test_consumer_task_cancelled_from_a_nursery(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text=["x "] * 100, delay=1.0)])
    first_chunk = trio.Event()

    async def consumer() -> None:
        async with model.stream(request()) as stream:
            async for _ in stream:
                first_chunk.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer)
        await first_chunk.wait()
        assert model.open_streams == 1
        nursery.cancel_scope.cancel()
    assert model.open_streams == 0
    assert model.closed_streams == 1


async def test_breaking_out_early_closes_the_stream(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(["a b c d"])
    async with model.stream(request()) as stream:
        async for _ in stream:
            break
    assert (model.open_streams, model.closed_streams) == (0, 1)
    with pytest.raises(RuntimeError, match="after its `async with` block"):
        await stream.__anext__()


async def test_a_stream_can_be_entered_only_once(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(["a"])
    cm = model.stream(request())
    async with cm:
        pass
    with pytest.raises(RuntimeError, match="only be entered once"):
        async with cm:
            pass  # pragma: no cover


async def test_shared_model_gives_each_concurrent_call_the_next_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn("one", delay=1.0), Turn("two", delay=1.0)], default="rest")
    results: dict[int, str] = {}

    async def caller(i: int) -> None:
        results[i] = "".join(texts(await consume(model, request(ta.UserMessage(str(i))))))

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(caller, i)
    assert sorted(results.values()) == ["one", "rest", "rest", "two"]
    assert model.calls == 4
    assert (model.open_streams, model.closed_streams) == (0, 4)


def test_scripted_model_is_a_model() -> None:
    assert isinstance(ScriptedModel([]), ta.Model)


def test_runs_without_pytest_trio_on_a_mock_clock() -> None:
    model = ScriptedModel([Turn("a b", delay=10.0)])

    async def main() -> tuple[float, list[ModelEvent]]:
        events = await consume(model)
        return trio.current_time(), events

    now, events = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert now == 20.0
    assert texts(events) == ["a ", "b"]
