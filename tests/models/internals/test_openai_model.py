"""OpenAIChatModel against a real loopback HTTP server speaking the Chat Completions SSE
format byte for byte (see ``sse_server.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.chat_wire import DONE, chunk, text_reply, usage_chunk
from tests.support.model_streams import REQUEST, collect, collect_into
from tests.support.sse_server import SSE, Raw, Reply, SSEServer
from trio_agents import (
    AssistantMessage,
    ModelError,
    ModelRequest,
    ToolCall,
    ToolResult,
    ToolSpec,
    Usage,
    UserMessage,
)
from trio_agents.models import Finish, ModelEvent, OpenAIChatModel, TextDelta, ToolCallDone
from trio_agents.models._openai import chat_messages


def make_model(server: SSEServer, **kwargs: Any) -> OpenAIChatModel:
    return OpenAIChatModel("gpt-test", base_url=f"{server.base_url}/v1", **kwargs)


# ------------------------------------------------------------------- streaming


async def test_text_stream_usage_and_done(server: SSEServer) -> None:
    server.add(text_reply("Hel", "lo", " wörld"))
    with trio.fail_after(10):
        events = await collect(make_model(server))
    assert events == [
        TextDelta("Hel"),
        TextDelta("lo"),
        TextDelta(" wörld"),
        Usage(9, 3),
        Finish("stop"),
    ]
    (request,) = server.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.headers["accept"] == "text/event-stream"
    assert "authorization" not in request.headers  # no key: fine for local servers
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

    args_0 = json.dumps({"city": 'Zürich "centre"', "days": 3}, ensure_ascii=False)
    args_1 = json.dumps({"q": "日本語 ✓"}, ensure_ascii=False)
    pieces_0 = [args_0[:3], args_0[3:9], args_0[9:15], args_0[15:]]  # split inside strings
    pieces_1 = [args_1[:5], args_1[5:8], args_1[8:]]
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
        got = await collect(make_model(server))
    assert got == [
        TextDelta("Let me check."),
        ToolCallDone(ToolCall("call_a", "weather", args_0)),
        ToolCallDone(ToolCall("call_b", "search", args_1)),
        Usage(50, 20),
        Finish("tool_calls"),
    ]


async def test_event_split_across_writes_and_crlf(server: SSEServer) -> None:
    payload = json.dumps(chunk("¡hola!"), ensure_ascii=False).encode()
    cut = payload.index("¡".encode()) + 1  # inside the two-byte character
    events: list[SSE | Raw] = [
        Raw(b": keepalive\r\n\r\n"),
        Raw(b"data: " + payload[:cut]),
        Raw(payload[cut:] + b"\r"),
        Raw(b"\n\r\n"),
        SSE(chunk(finish="stop")),
        Raw(b"data: [DONE]\r\n\r\n"),
    ]
    server.add(Reply(events=events))
    with trio.fail_after(10):
        got = await collect(make_model(server))
    assert got == [TextDelta("¡hola!"), Finish("stop")]


async def test_request_body_format(server: SSEServer) -> None:
    server.add(text_reply("ok"))
    tool = ToolSpec(
        "add", "Add two integers.", {"type": "object", "properties": {"a": {"type": "integer"}}}
    )
    request = ModelRequest(
        instructions="You are terse.",
        items=(
            UserMessage("what is 2+3 and 4+4?"),
            AssistantMessage("Let me add."),
            ToolCall("c1", "add", '{"a": 2, "b": 3}'),
            ToolCall("c2", "add", '{"a": 4, "b": 4}'),
            ToolResult("c1", "5"),
            ToolResult("c2", "boom", status="error"),
            ToolCall("c3", "add", "{}"),
            ToolResult("c3", "cancelled: stop", status="cancelled"),
            AssistantMessage("The answers are 5 a", status="incomplete"),
            UserMessage("go on"),
        ),
        tools=(tool,),
        settings={"temperature": 0.5, "top_p": 0.9},
    )
    model = make_model(server, api_key="sk-test", temperature=0.1, max_tokens=99)
    with trio.fail_after(10):
        await collect(model, request)
    (sent,) = server.requests
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.headers["content-type"] == "application/json"
    assert sent.json == {
        "model": "gpt-test",
        "temperature": 0.5,
        "max_tokens": 99,
        "top_p": 0.9,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "what is 2+3 and 4+4?"},
            {
                "role": "assistant",
                "content": "Let me add.",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 4, "b": 4}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
            {"role": "tool", "tool_call_id": "c2", "content": "boom"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": "c3", "type": "function", "function": {"name": "add", "arguments": "{}"}}
                ],
            },
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
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.base_url}/v1/")
    server.add(text_reply("hi"))
    model = OpenAIChatModel("gpt-test")
    assert model.base_url == f"{server.base_url}/v1"
    with trio.fail_after(10):
        await collect(model)
    assert server.requests[0].headers["authorization"] == "Bearer sk-env"


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
    error = {"error": {"message": "Invalid 'messages'.", "type": "invalid_request_error"}}
    server.add(Reply.json(400, error), text_reply("never"))
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(make_model(server, retry_base_delay=0))
    assert info.value.status_code == 400
    assert not info.value.retryable
    assert "HTTP 400" in str(info.value)
    assert "invalid_request_error: Invalid 'messages'." in str(info.value)
    assert len(server.requests) == 1


async def test_malformed_json_names_the_line(server: SSEServer) -> None:
    server.add(Reply(events=[SSE(chunk("a")), SSE("{not json"), DONE]))
    with trio.fail_after(10), pytest.raises(ModelError, match=r"malformed JSON.*\{not json"):
        await collect(make_model(server))


async def test_error_object_in_the_stream(server: SSEServer) -> None:
    server.add(Reply(events=[SSE(chunk("a")), SSE({"error": {"message": "model crashed"}})]))
    with trio.fail_after(10), pytest.raises(ModelError, match="model crashed"):
        await collect(make_model(server))


async def test_json_instead_of_event_stream(server: SSEServer) -> None:
    server.add(Reply.json(200, {"choices": []}))
    with trio.fail_after(10), pytest.raises(ModelError, match="expected an event stream"):
        await collect(make_model(server))


# --------------------------------------------------------------------- retries


async def test_drop_after_output_is_not_retried(server: SSEServer) -> None:
    parts = [SSE(chunk("Hel")), SSE(chunk("lo")), SSE(chunk("!"))]
    server.add(Reply(events=parts, drop_after=2), text_reply("again"))
    got: list[ModelEvent] = []
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect_into(got, make_model(server, retry_base_delay=0.01))
    assert got == [TextDelta("Hel"), TextDelta("lo")]
    assert "stream ended early after 2 events" in str(info.value)
    assert "RemoteProtocolError" in str(info.value)
    assert len(server.requests) == 1  # never silently re-asked


async def test_truncated_stream_without_done_fails(server: SSEServer) -> None:
    server.add(Reply(events=[SSE(chunk("Hel"))]), text_reply("again"))
    with trio.fail_after(10), pytest.raises(ModelError, match="ended early after 1 events"):
        await collect(make_model(server, retry_base_delay=0.01))
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
    @ta.function_tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

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
    agent = ta.Agent(
        name="calc",
        instructions="Use tools.",
        model=make_model(server),
        tools=[add],
        model_settings={"temperature": 0},
    )
    with trio.fail_after(10):
        result = await ta.run(agent, "what is 2+3?")
    result.raise_for_status()
    assert result.final_output == "The answer is 5."
    assert result.usage == Usage(30 + 9, 10 + 2)
    first, second = (request.json for request in server.requests)
    assert first["temperature"] == 0
    assert first["tools"][0]["function"]["name"] == "add"
    assert second["messages"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "what is 2+3?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
    ]
