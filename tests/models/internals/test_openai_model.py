"""OpenAIChatModel against a real loopback HTTP server speaking the Chat Completions SSE
format byte for byte (see ``sse_server.py``)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from tests.support import models_requests as shared
from tests.support.chat_wire import DONE, chunk, text_reply, usage_chunk
from tests.support.model_streams import REQUEST, collect
from tests.support.models_requests import chat_model as make_model
from tests.support.sse_server import SSE, Raw, Reply, SSEServer
from trio_agents import (
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from trio_agents.models import Finish, OpenAIChatModel, TextDelta
from trio_agents.models._openai import chat_messages


def add_call(call_id: str, arguments: str) -> dict[str, Any]:
    """A call of the add tool as an assistant message's ``tool_calls`` holds it."""
    return {"id": call_id, "type": "function", "function": {"name": "add", "arguments": arguments}}


# ------------------------------------------------------------------- streaming


async def test_a_stream_asks_for_usage(server: SSEServer) -> None:
    # The events, path and headers of a text stream: test_provider_conformance.py.
    server.add(text_reply("Hel", "lo", " wörld"))
    with trio.fail_after(10):
        await collect(make_model(server))
    (request,) = server.requests
    assert request.json["stream"] is True
    assert request.json["stream_options"] == {"include_usage": True}


async def test_tool_call_deltas_over_many_chunks_and_two_indices(server: SSEServer) -> None:
    def call(index: int, arguments: str, **first: str) -> dict[str, Any]:
        fragment: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
        if first:
            fragment["id"] = first["id"]
            fragment["type"] = "function"
            fragment["function"]["name"] = first["name"]
        return fragment

    pieces_0, pieces_1 = shared.WEATHER_PIECES, shared.SEARCH_PIECES
    events: list[SSE | Raw] = [
        SSE(chunk(role="assistant", content=None)),
        SSE(chunk("Let me check.")),
        SSE(chunk(tool_calls=[call(0, "", id="call_a", name="weather")])),
        SSE(chunk(tool_calls=[call(0, pieces_0[0])])),
        SSE(chunk(tool_calls=[call(1, "", id="call_b", name="search")])),
        SSE(chunk(tool_calls=[call(0, pieces_0[1])])),
        SSE(chunk(tool_calls=[call(1, pieces_1[0])])),
        SSE(chunk(tool_calls=[call(0, pieces_0[2]), call(1, pieces_1[1])])),
        SSE(chunk(tool_calls=[call(1, pieces_1[2])])),
        SSE(chunk(tool_calls=[call(0, pieces_0[3])])),
        SSE(chunk(finish="tool_calls")),
        SSE(usage_chunk(50, 20)),
        DONE,
    ]
    server.add(Reply(events=events))
    with trio.fail_after(10):
        assert await collect(make_model(server)) == shared.TWO_CALLS


async def test_event_split_across_writes_and_crlf(server: SSEServer) -> None:
    events: list[SSE | Raw] = [
        *shared.cut_inside_a_character(b"data: ", chunk("¡hola!")),
        SSE(chunk(finish="stop")),
        Raw(b"data: [DONE]\r\n\r\n"),
    ]
    server.add(Reply(events=events))
    with trio.fail_after(10):
        got = await collect(make_model(server))
    assert got == [TextDelta("¡hola!"), Finish("stop")]


async def test_request_body_format(server: SSEServer) -> None:
    server.add(text_reply("ok"))
    sent = await shared.sent_request(
        server,
        make_model(server, api_key="sk-test", temperature=0.1, max_tokens=99),
        *shared.ADDING,
        ToolCall("c3", "add", "{}"),
        ToolResult("c3", "cancelled: stop", status="cancelled"),
        *shared.GO_ON,
        settings={"temperature": 0.5, "top_p": 0.9},
    )
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.headers["content-type"] == "application/json"
    assert sent.json == {
        **shared.openai_settings("max_tokens"),
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "what is 2+3 and 4+4?"},
            {
                "role": "assistant",
                "content": "Let me add.",
                "tool_calls": [
                    add_call("c1", '{"a": 2, "b": 3}'),
                    add_call("c2", '{"_raw_arguments": "not json"}'),
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
            {"role": "tool", "tool_call_id": "c2", "content": "bad arguments"},
            {"role": "assistant", "content": "", "tool_calls": [add_call("c3", "{}")]},
            {"role": "tool", "tool_call_id": "c3", "content": "cancelled: stop"},
            {"role": "assistant", "content": "The answers are 5 a"},
            {"role": "user", "content": "go on"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "description": "Add two integers.",
                    "parameters": {
                        "type": "object",
                        "properties": {"a": {"type": "integer"}},
                    },
                },
            }
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def test_chat_messages_without_instructions() -> None:
    assert chat_messages("", [UserMessage("x")]) == [{"role": "user", "content": "x"}]


async def test_env_defaults(server: SSEServer, monkeypatch: pytest.MonkeyPatch) -> None:
    server.add(text_reply("hi"))
    base_url = f"{server.base_url}/v1/"
    request = await shared.sent_with_env(server, monkeypatch, OpenAIChatModel, base_url)
    assert request.headers["authorization"] == "Bearer sk-env"


def test_default_base_url() -> None:
    assert OpenAIChatModel("gpt-4o-mini").base_url == "https://api.openai.com/v1"


async def test_stream_options_none_leaves_the_field_out(server: SSEServer) -> None:
    server.add(text_reply("hi"))
    with trio.fail_after(10):
        await collect(make_model(server, stream_options=None))
    assert "stream_options" not in server.requests[0].json


async def test_finish_reason_without_done_is_accepted(server: SSEServer) -> None:
    # Some OpenAI-compatible servers end the body without "data: [DONE]".
    server.add(Reply(events=[SSE(chunk("hi")), SSE(chunk(finish="length"))]))
    with trio.fail_after(10):
        assert await collect(make_model(server)) == [TextDelta("hi"), Finish("length")]


# ---------------------------------------------------------------------- errors


async def test_400_fails_at_once_with_the_providers_message(server: SSEServer) -> None:
    body = {"error": {"message": "Invalid 'messages'.", "type": "invalid_request_error"}}
    model = make_model(server, retry_base_delay=0)
    error = await shared.stream_error(server, model, Reply.json(400, body), text_reply("never"))
    assert (error.status_code, error.retryable) == (400, False)
    assert "HTTP 400" in str(error)
    assert "invalid_request_error: Invalid 'messages'." in str(error)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (Reply(events=[SSE(chunk("a")), SSE("{not json"), DONE]), r"malformed JSON.*\{not json"),
        (Reply(events=[SSE(chunk("a")), SSE({"error": {"message": "crashed"}})]), "crashed"),
        (Reply.json(200, {"choices": []}), "expected an event stream"),
    ],
    ids=["malformed-json-names-the-line", "error-object-in-the-stream", "json-not-a-stream"],
)
async def test_a_bad_stream_is_an_error(server: SSEServer, reply: Reply, match: str) -> None:
    await shared.stream_error(server, make_model(server), reply, match=match)


# --------------------------------------------------------------------- retries
# (A drop after output is never retried: test_provider_conformance.py.)


async def test_truncated_stream_without_done_fails(server: SSEServer) -> None:
    truncated = Reply(events=[SSE(chunk("Hel"))])
    model = make_model(server, retry_base_delay=0.01)
    match = "ended early after 1 events"
    await shared.stream_error(server, model, truncated, text_reply("again"), match=match)
    assert len(server.requests) == 1


# ------------------------------------------------------------ client ownership


async def test_stream_cannot_be_reused(server: SSEServer) -> None:
    server.add(text_reply("one"))
    stream_cm = make_model(server).stream(REQUEST)
    with trio.fail_after(10):
        async with stream_cm as stream:
            events = [event async for event in stream]
        assert events
        with pytest.raises(RuntimeError, match="outside its `async with` block"):
            await stream.__anext__()
        with pytest.raises(RuntimeError, match="only be entered once"):
            async with stream_cm:
                pass


# ------------------------------------------------------------------ full runs


async def test_full_run_with_a_tool_call(server: SSEServer) -> None:
    call = {"index": 0, "id": "call_1", "type": "function"}
    server.add(
        Reply(
            events=[
                SSE(chunk(tool_calls=[{**call, "function": {"name": "add", "arguments": ""}}])),
                SSE(chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"a": 2, '}}])),
                SSE(chunk(tool_calls=[{"index": 0, "function": {"arguments": '"b": 3}'}}])),
                SSE(chunk(finish="tool_calls")),
                SSE(usage_chunk(30, 10)),
                DONE,
            ]
        ),
        text_reply("The answer ", "is 5."),
    )
    model, answer, usage = make_model(server), "The answer is 5.", Usage(30 + 9, 10 + 2)
    first, second = await shared.run_adding(
        server, model, answer, usage, model_settings={"temperature": 0}
    )
    assert first["temperature"] == 0
    assert first["tools"][0]["function"]["name"] == "add"
    assert second["messages"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "what is 2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [add_call("call_1", '{"a": 2, "b": 3}')],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
