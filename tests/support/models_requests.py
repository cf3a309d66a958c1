"""What the tests of one provider's own wire share with the others': each model on a
loopback server, the ``add`` tool (as a tool, and as the spec a request carries), the
conversation of two additions every request-body test starts from, two tool calls
streamed in pieces, an event cut inside a character, and the one request a model sent,
or the error its stream ended in."""

from __future__ import annotations

import json
from typing import Any, Final

import pytest
import trio

import trio_agents as ta
from tests.support.model_streams import REQUEST, collect
from tests.support.sse_server import Raw, RecordedRequest, Reply, SSEServer
from trio_agents import models


def chat_model(server: SSEServer, **options: Any) -> models.OpenAIChatModel:
    return models.OpenAIChatModel("gpt-test", base_url=f"{server.base_url}/v1", **options)


def responses_model(server: SSEServer, **options: Any) -> models.OpenAIResponsesModel:
    return models.OpenAIResponsesModel("gpt-test", base_url=f"{server.base_url}/v1", **options)


def anthropic_model(server: SSEServer, **options: Any) -> models.AnthropicModel:
    return models.AnthropicModel("claude-test", base_url=server.base_url, **options)


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


ADD_SPEC: Final = ta.ToolSpec(
    "add", "Add two integers.", {"type": "object", "properties": {"a": {"type": "integer"}}}
)

# Two calls in one turn, one with arguments that are not JSON, and their results.
ADDING: Final[tuple[ta.Item, ...]] = (
    ta.UserMessage("what is 2+3 and 4+4?"),
    ta.AssistantMessage("Let me add."),
    ta.ToolCall("c1", "add", '{"a": 2, "b": 3}'),
    ta.ToolCall("c2", "add", "not json"),
    ta.ToolResult("c1", "5"),
    ta.ToolResult("c2", "bad arguments", status="error"),
)

# An answer cut short, and the user asking for the rest.
GO_ON: Final[tuple[ta.Item, ...]] = (
    ta.AssistantMessage("The answers are 5 a", status="incomplete"),
    ta.UserMessage("go on"),
)


def openai_settings(max_tokens_key: str) -> dict[str, Any]:
    """The start of an OpenAI body for a model made with temperature 0.1 and a token limit
    of 99, sent a request with temperature 0.5 and top_p 0.9: the request's win."""
    return {"model": "gpt-test", "temperature": 0.5, max_tokens_key: 99, "top_p": 0.9}


# Two calls' arguments, with quotes and characters beyond ASCII, cut into the pieces a
# server streams (cut inside strings).
_WEATHER = json.dumps({"city": 'Zürich "centre"', "days": 3}, ensure_ascii=False)
_SEARCH = json.dumps({"q": "日本語 ✓"}, ensure_ascii=False)
WEATHER_PIECES: Final = [_WEATHER[:3], _WEATHER[3:9], _WEATHER[9:15], _WEATHER[15:]]
SEARCH_PIECES: Final = [_SEARCH[:5], _SEARCH[5:8], _SEARCH[8:]]
# What a model gives for a text and then those two calls.
TWO_CALLS: Final[list[models.ModelEvent]] = [
    models.TextDelta("Let me check."),
    models.ToolCallDone(ta.ToolCall("call_a", "weather", _WEATHER)),
    models.ToolCallDone(ta.ToolCall("call_b", "search", _SEARCH)),
    ta.Usage(50, 20),
    models.Finish("tool_calls"),
]


async def sent_request(
    server: SSEServer, model: Any, *items: ta.Item, settings: dict[str, Any]
) -> RecordedRequest:
    """Streams a request of ``items`` (instructions "You are terse.", the add tool, and
    ``settings``) from ``model``; the one request the server got."""
    request = ta.ModelRequest(
        instructions="You are terse.", items=items, tools=(ADD_SPEC,), settings=settings
    )
    with trio.fail_after(10):
        await collect(model, request)
    (sent,) = server.requests
    return sent


async def stream_error(
    server: SSEServer, model: Any, *replies: Reply, match: str | None = None
) -> ta.ModelError:
    """The :class:`ta.ModelError` a stream from ``model`` ends in, the server answering
    ``replies`` in turn."""
    server.add(*replies)
    with trio.fail_after(10), pytest.raises(ta.ModelError, match=match) as info:
        await collect(model, REQUEST)
    return info.value


def cut_inside_a_character(head: bytes, data: dict[str, Any]) -> list[Raw]:
    """The event ``head`` + ``data`` (holding "¡") after a keepalive comment, its bytes cut
    inside the two-byte character and its CRLF line end split across writes."""
    payload = json.dumps(data, ensure_ascii=False).encode()
    cut = payload.index("¡".encode()) + 1
    return [
        Raw(b": keepalive\r\n\r\n"),
        Raw(head + payload[:cut]),
        Raw(payload[cut:] + b"\r"),
        Raw(b"\n\r\n"),
    ]


async def run_adding(
    server: SSEServer, model: Any, answer: str, usage: ta.Usage, **options: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run of an agent with the add tool on "what is 2+3?" (the server scripted with a
    call and then ``answer``) that completes with ``answer`` and ``usage``; the two
    request bodies."""
    agent = ta.Agent(name="calc", instructions="Use tools.", model=model, tools=[add], **options)
    with trio.fail_after(10):
        result = await ta.run(agent, "what is 2+3?")
    result.raise_for_status()
    assert result.final_output == answer
    assert result.usage == usage
    first, second = (request.json for request in server.requests)
    return first, second


async def sent_with_env(
    server: SSEServer, monkeypatch: pytest.MonkeyPatch, model_class: type[Any], base_url: str
) -> RecordedRequest:
    """With OPENAI_API_KEY "sk-env" and OPENAI_BASE_URL ``base_url`` set, a model of
    ``model_class`` given neither finds the server; the one request it sent."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    model = model_class("gpt-test")
    assert model.base_url == f"{server.base_url}/v1"
    with trio.fail_after(10):
        await collect(model)
    (request,) = server.requests
    return request
