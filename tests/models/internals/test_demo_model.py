"""DemoModel: the labelled offline default model (DESIGN.md §8)."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from typing import Any, Literal, TypedDict

import attrs
import pytest
import trio
import trio.testing

import trio_agents as ta
from trio_agents._validator import validate
from trio_agents.models import (
    DemoModel,
    Finish,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCallDone,
    ToolSpec,
    Usage,
)

# pytest-trio only runs a test on a clock that the test takes as an argument, so every
# async test here asks for ``autojump_clock``.

LABEL = "[demo model]"


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number.
        b: the second number.
    """
    return a + b


@ta.function_tool
async def weather(city: str) -> str:
    """Look up today's weather in a city.

    Args:
        city: the city name.
    """
    return f"{city}: sunny"


@ta.function_tool
async def search_archive(query: str) -> str:
    """Search the archive for documents.

    Args:
        query: what to look for.
    """
    return f"found {query}"


TOOLS = (add, weather, search_archive)


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Window(TypedDict):
    days: int
    label: str


@attrs.frozen
class Place:
    name: str
    lat: float
    tags: list[str]


@ta.function_tool
async def forecast(
    place: Place,
    window: Window,
    unit: Unit,
    detail: Literal["short", "long"],
    hourly: bool,
    ratio: float,
    sources: list[str],
    note: str | None,
    limit: int = 3,
) -> str:
    """Forecast the weather somewhere."""
    return "ok"


def request(
    *items: ta.Item, tools: Sequence[ta.Tool | ToolSpec] = (), instructions: str = "help"
) -> ModelRequest:
    specs = tuple(t if isinstance(t, ToolSpec) else t.spec() for t in tools)
    return ModelRequest(instructions=instructions, items=items, tools=specs)


async def consume(model: DemoModel, req: ModelRequest) -> list[ModelEvent]:
    async with model.stream(req) as stream:
        return [event async for event in stream]


def text_of(events: Sequence[ModelEvent]) -> str:
    return "".join(e.text for e in events if isinstance(e, TextDelta))


def calls_of(events: Sequence[ModelEvent]) -> list[ta.ToolCall]:
    return [e.call for e in events if isinstance(e, ToolCallDone)]


async def ask(message: str, tools: Sequence[ta.Tool | ToolSpec] = TOOLS) -> ta.ToolCall:
    events = await consume(DemoModel(delay=0), request(ta.UserMessage(message), tools=tools))
    (call,) = calls_of(events)
    return call


def check_labelled(text: str) -> None:
    assert text.startswith(LABEL + " "), text
    assert text.count(LABEL) == 1, text


# --------------------------------------------------------------------- the label


async def test_plain_answer_is_labelled_and_echoes_the_request(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events = await consume(DemoModel(), request(ta.UserMessage("Tell me about otters")))
    text = text_of(events)
    check_labelled(text)
    assert "Tell me about otters" in text
    assert "not an LLM" in text or "No LLM" in text
    assert calls_of(events) == []
    assert isinstance(events[-2], Usage)
    assert events[-2].output_tokens > 0
    assert events[-1] == Finish("stop")


@pytest.mark.parametrize(
    "items",
    [
        (),
        (ta.UserMessage(""),),
        (ta.UserMessage("say [demo model] twice"),),
        (ta.AssistantMessage("unprompted"),),
        (ta.UserMessage("hi"), ta.AssistantMessage("half an ans", status="incomplete")),
    ],
    ids=["empty", "empty-message", "label-in-input", "no-user", "interrupted"],
)
async def test_every_answer_carries_the_label_once(
    autojump_clock: trio.testing.MockClock, items: tuple[ta.Item, ...]
) -> None:
    for tools in ((), TOOLS):
        events = await consume(DemoModel(), request(*items, tools=tools))
        check_labelled(text_of(events))
        assert isinstance(events[-1], Finish)


async def test_seeded_wordings_are_labelled_too(autojump_clock: trio.testing.MockClock) -> None:
    histories: list[tuple[ta.Item, ...]] = [
        (ta.UserMessage("hello"),),
        (
            ta.UserMessage("2+3?"),
            ta.ToolCall("c1", "add", '{"a": 2, "b": 3}'),
            ta.ToolResult("c1", "5"),
        ),
    ]
    for seed in range(10):
        for items in histories:
            for tools in ((), TOOLS):
                check_labelled(
                    text_of(await consume(DemoModel(seed=seed), request(*items, tools=tools)))
                )


# ------------------------------------------------------------------- tool choice


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("What is 21 + 21?", "add"),
        ("add 2 and 3", "add"),
        ("what's the sum of 4 and 5", "add"),
        ("And what is the weather in Paris?", "weather"),
        ("Will it rain in Oslo?", "weather"),
        ("Search the archive for structured concurrency", "search_archive"),
        ("find documents about trio", "search_archive"),
        ("hello there", "add"),  # nothing matches: the first tool
    ],
)
async def test_picks_the_best_matching_tool(
    autojump_clock: trio.testing.MockClock, message: str, expected: str
) -> None:
    call = await ask(message)
    assert call.name == expected


async def test_tool_turn_says_which_tool_then_calls_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    events = await consume(DemoModel(), request(ta.UserMessage("What is 21 + 21?"), tools=TOOLS))
    assert text_of(events) == "[demo model] Let me use the `add` tool."
    kinds = [type(e).__name__ for e in events]
    assert kinds[-3:] == ["ToolCallDone", "Usage", "Finish"]
    assert set(kinds[:-3]) == {"TextDelta"}
    assert events[-1] == Finish("tool_calls")
    (call,) = calls_of(events)
    assert json.loads(call.arguments) == {"a": 21, "b": 21}
    assert add.parse_arguments(call.arguments) == {"a": 21, "b": 21}


# ------------------------------------------------------------ schema-valid args


async def test_arguments_come_from_the_message(autojump_clock: trio.testing.MockClock) -> None:
    assert json.loads((await ask("What is 21 + 21?")).arguments) == {"a": 21, "b": 21}
    assert json.loads((await ask("add -4 and 2.0 please")).arguments) == {"a": -4, "b": 2}
    assert json.loads((await ask("add them")).arguments) == {"a": 0, "b": 0}
    assert json.loads((await ask("weather in Paris?")).arguments) == {"city": "Paris"}
    query = json.loads((await ask("Search the archive for structured concurrency")).arguments)
    assert query == {"query": "structured concurrency"}


@pytest.mark.parametrize(
    "message",
    ["", "forecast please", "forecast for Lyon, 3 days, 12.5 percent", "1 2 3 4 5 6 7 8"],
)
async def test_arguments_satisfy_a_rich_generated_schema(
    autojump_clock: trio.testing.MockClock, message: str
) -> None:
    call = await ask(message, tools=[forecast])
    arguments = json.loads(call.arguments)
    assert validate(forecast.spec().parameters, arguments) == []
    converted = forecast.parse_arguments(call.arguments)
    assert converted["unit"] == "celsius"  # the first enum value
    assert converted["detail"] == "short"
    assert converted["hourly"] is False
    assert converted["sources"] == []
    assert "limit" not in converted  # optional parameters are left out
    assert set(converted["place"]) == {"name", "lat", "tags"}
    kwargs = forecast.convert_arguments(converted)
    assert kwargs["unit"] is Unit.CELSIUS
    assert isinstance(kwargs["place"], Place)


async def test_arguments_respect_bounds_refs_and_unions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    parameters: dict[str, Any] = {
        "type": "object",
        "$defs": {
            "Point": {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
                "required": ["x", "y"],
            }
        },
        "properties": {
            "small": {"type": "integer", "minimum": 10, "maximum": 20},
            "positive": {"type": "number", "exclusiveMinimum": 0},
            "capped": {"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 9},
            "code": {"type": "string", "minLength": 40, "maxLength": 50},
            "tiny": {"type": "string", "maxLength": 3},
            "point": {"$ref": "#/$defs/Point"},
            "maybe": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
            "nullable": {"type": ["null", "integer"]},
            "fixed": {"const": "v1"},
            "pair": {"type": "array", "items": {"type": "string"}, "minItems": 2},
            "untyped": {},
            "optional": {"type": "string"},
        },
        "required": [
            "small",
            "positive",
            "capped",
            "code",
            "tiny",
            "point",
            "maybe",
            "nullable",
            "fixed",
            "pair",
            "untyped",
        ],
    }
    spec = ToolSpec("shape", "Make a shape.", parameters)
    args = json.loads(
        (await ask("make 3 shapes about circles, 99 of them", tools=[spec])).arguments
    )
    assert set(args) == set(parameters["required"])
    assert args["small"] == 10  # 3 is below the minimum
    assert args["positive"] == 99
    assert args["capped"] == 6  # no number left: 0, raised above the exclusive minimum
    assert 40 <= len(args["code"]) <= 50
    assert len(args["tiny"]) <= 3
    assert set(args["point"]) == {"x", "y"}
    assert all(isinstance(v, int) for v in args["point"].values())
    assert args["maybe"] is False
    assert isinstance(args["nullable"], int)
    assert args["fixed"] == "v1"
    assert len(args["pair"]) == 2
    assert all(isinstance(v, str) for v in args["pair"])


async def test_a_self_referencing_schema_terminates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    parameters = {
        "type": "object",
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"next": {"$ref": "#/$defs/Node"}},
                "required": ["next"],
            }
        },
        "properties": {"head": {"$ref": "#/$defs/Node"}},
        "required": ["head"],
    }
    call = await ask("go", tools=[ToolSpec("walk", "Walk a list.", parameters)])
    assert "head" in json.loads(call.arguments)


# -------------------------------------------------------------- after the tools


async def test_final_answer_reports_the_tool_results(
    autojump_clock: trio.testing.MockClock,
) -> None:
    items = (
        ta.UserMessage("2+3, and the weather in Rome?"),
        ta.AssistantMessage("[demo model] Let me use the `add` tool."),
        ta.ToolCall("c1", "add", '{"a": 2, "b": 3}'),
        ta.ToolCall("c2", "weather", '{"city": "Rome"}'),
        ta.ToolCall("c3", "search_archive", '{"query": "x"}'),
        ta.ToolResult("c1", "5"),
        ta.ToolResult("c2", "boom", status="error"),
        ta.ToolResult("c3", "cancelled: stop", status="cancelled"),
    )
    events = await consume(DemoModel(), request(*items, tools=TOOLS))
    text = text_of(events)
    check_labelled(text)
    assert text.startswith("[demo model] The `add` tool returned 5")
    assert "the `weather` tool failed: boom" in text
    assert "the `search_archive` tool was cancelled" in text
    assert calls_of(events) == []
    assert events[-1] == Finish("stop")


async def test_a_new_user_message_after_results_starts_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    items = (
        ta.UserMessage("2+3?"),
        ta.ToolCall("demo_call_1", "add", '{"a": 2, "b": 3}'),
        ta.ToolResult("demo_call_1", "5"),
        ta.AssistantMessage("[demo model] The `add` tool returned 5."),
        ta.UserMessage("weather in Paris?"),
    )
    events = await consume(DemoModel(), request(*items, tools=TOOLS))
    (call,) = calls_of(events)
    assert call.name == "weather"
    assert call.call_id == "demo_call_2"  # never an id the conversation already has


async def test_an_interrupted_answer_in_history_is_tolerated(
    autojump_clock: trio.testing.MockClock,
) -> None:
    items = (
        ta.UserMessage("What is 1 + 2?"),
        ta.AssistantMessage("[demo model] Let me", status="incomplete"),
    )
    events = await consume(DemoModel(), request(*items, tools=TOOLS))
    check_labelled(text_of(events))
    (call,) = calls_of(events)
    assert json.loads(call.arguments) == {"a": 1, "b": 2}


# ------------------------------------------------------------------- streaming


async def test_streams_word_by_word_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = DemoModel(delay=0.5)
    start = trio.current_time()
    stamps: list[tuple[float, ModelEvent]] = []
    async with model.stream(request(ta.UserMessage("hello"))) as stream:
        async for event in stream:
            stamps.append((trio.current_time() - start, event))
    deltas = [(t, e) for t, e in stamps if isinstance(e, TextDelta)]
    assert len(deltas) > 5
    assert [t for t, _ in deltas] == [0.5 * (i + 1) for i in range(len(deltas))]
    assert all(e.text.strip() for _, e in deltas)
    assert stamps[-1][0] == deltas[-1][0]  # no delay after the text


async def test_cancelling_the_reader_mid_stream_is_clean(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = DemoModel(delay=1.0)
    got: list[ModelEvent] = []
    with trio.move_on_after(2.5) as scope:
        async with model.stream(request(ta.UserMessage("hello there"))) as stream:
            async for event in stream:
                got.append(event)
    assert scope.cancelled_caught
    assert len(got) == 2


# ----------------------------------------------------------------- determinism


async def test_deterministic_for_a_request_and_seed(autojump_clock: trio.testing.MockClock) -> None:
    req = request(ta.UserMessage("What is 4 + 5?"), tools=TOOLS)
    assert await consume(DemoModel(), req) == await consume(DemoModel(), req)
    for seed in (0, 1, 7):
        assert await consume(DemoModel(seed=seed), req) == await consume(DemoModel(seed=seed), req)
    wordings = {text_of(await consume(DemoModel(seed=seed), req)) for seed in range(20)}
    assert len(wordings) > 1  # the seed varies the wording ...
    calls = {tuple(calls_of(await consume(DemoModel(seed=seed), req))) for seed in range(20)}
    assert len(calls) == 1  # ... but never what the model does


def test_validation_and_protocol() -> None:
    assert isinstance(DemoModel(), ta.Model)
    assert DemoModel().delay == 0.02
    with pytest.raises(ValueError, match="delay"):
        DemoModel(delay=-0.1)
    with pytest.raises(TypeError, match="seed"):
        DemoModel(seed="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        DemoModel(0.1)  # type: ignore[call-arg]


# ------------------------------------------------------------------ end to end


async def test_a_run_on_the_demo_model_uses_the_tool_and_answers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    agent = ta.Agent(name="demo", instructions="help", model=DemoModel(), tools=list(TOOLS))
    result = await ta.run(agent, "What is 21 + 21?")
    assert result.status == "completed"
    assert result.final_output is not None
    check_labelled(result.final_output)
    assert "The `add` tool returned 42." in result.final_output
    assert result.turns == 2
    assert ta.conversation_problems(result.conversation) == []


async def test_the_default_agent_model_is_the_labelled_demo(
    autojump_clock: trio.testing.MockClock,
) -> None:
    result = await ta.run(ta.Agent(name="plain"), "hello")
    assert result.status == "completed"
    assert result.final_output is not None
    check_labelled(result.final_output)
