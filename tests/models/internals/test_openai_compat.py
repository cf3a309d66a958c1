"""OpenAIChatModel against the quirks of the OpenAI-compatible servers people run
(llama-cpp-python, Ollama, llama.cpp, vLLM, LiteLLM proxies), each reproduced on the
real loopback server (``sse_server.py``; strict request validation in
``strict_servers.py``)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

import trio_agents as ta
from tests.support.chat_wire import DONE, chunk, text_reply, tool_reply
from tests.support.model_streams import collect
from tests.support.models_requests import add
from tests.support.models_requests import chat_model as make_model
from tests.support.sse_server import SSE, Raw, RecordedRequest, Reply, SSEServer
from tests.support.strict_servers import STRICT_SERVERS, llama_cpp_python
from trio_agents import (
    AssistantMessage,
    ModelError,
    ModelRequest,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from trio_agents.models import Finish, OpenAIChatModel, TextDelta, ToolCallDone
from trio_agents.models._openai import chat_messages, object_arguments

# ------------------------------------------------------- the request shape


TOOL_TURNS = (
    UserMessage("2+3, then 4+4?"),
    ToolCall("c1", "add", '{"a": 2, "b": 3}'),
    ToolResult("c1", "5"),
    AssistantMessage("Next:"),
    ToolCall("c2", "add", '{"a": 4, "b": 4}'),
    ToolResult("c2", "8"),
    ToolCall("c3", "add", '{"a": 4, "b"'),  # the model's bad JSON
    ToolResult("c3", "invalid JSON arguments", status="error"),
    ToolCall("c4", "add", ""),
    ToolResult("c4", "missing a and b", status="error"),
)


def test_assistant_tool_turns_have_string_content_and_object_arguments() -> None:
    messages = chat_messages("", TOOL_TURNS)
    assistants = [m for m in messages if m["role"] == "assistant"]
    assert [m["content"] for m in assistants] == ["", "Next:", "", ""]
    assert all(isinstance(m["content"], str) for m in messages)
    arguments = [m["tool_calls"][0]["function"]["arguments"] for m in assistants]
    assert arguments[:2] == ['{"a": 2, "b": 3}', '{"a": 4, "b": 4}']  # unchanged
    assert json.loads(arguments[2]) == {"_raw_arguments": '{"a": 4, "b"'}
    assert arguments[3] == "{}"
    assert all(None not in m.values() for m in messages)


def test_object_arguments() -> None:
    assert object_arguments('{"x": [1, 2]}') == '{"x": [1, 2]}'
    assert object_arguments("  ") == "{}"
    assert json.loads(object_arguments("[1]")) == {"_raw_arguments": "[1]"}
    assert json.loads(object_arguments("nope")) == {"_raw_arguments": "nope"}


@pytest.mark.parametrize("name", sorted(STRICT_SERVERS))
async def test_strict_server_accepts_every_shape_we_send(server: SSEServer, name: str) -> None:
    server.validate = STRICT_SERVERS[name]
    server.add(text_reply("ok"))
    request = ModelRequest("Be brief.", TOOL_TURNS, tools=(add.spec(),))
    with trio.fail_after(10):
        events = await collect(make_model(server), request)
    assert events[0] == TextDelta("ok")


@pytest.mark.parametrize(
    ("name", "status", "words"),
    [
        ("llama-cpp-python", 500, "Input should be a valid string"),
        ("ollama", 400, "invalid message content type"),
        ("llama.cpp", 400, "Expected 'content' or 'tool_calls'"),
    ],
)
async def test_strict_servers_reject_what_they_should(
    server: SSEServer, name: str, status: int, words: str
) -> None:
    # The control: the validators are not vacuous. A null content (what we used to
    # send), a null tool_call_id: each server's own answer comes back.
    server.validate = STRICT_SERVERS[name]
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None},
        {"role": "tool", "tool_call_id": None, "content": "x"},
    ]
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{server.base_url}/v1/chat/completions", json={"messages": messages}
        )
    assert response.status_code == status
    assert words in response.text


async def test_llama_cpp_python_schema_error_is_not_retried_and_reads_on_one_line(
    server: SSEServer,
) -> None:
    # What the old request shape got from llama-cpp-python: HTTP 500 with pydantic's
    # multi-line report. Retrying cannot help, so it fails at once.
    bad = [
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "tool", "tool_call_id": "c1", "content": "5"},
    ]
    old_request = json.dumps({"messages": bad}).encode()
    rejection = llama_cpp_python(RecordedRequest("POST", "/v1", {}, old_request, 0))
    assert rejection is not None
    server.add(rejection, text_reply("never"))
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(make_model(server, retry_base_delay=30))
    error = info.value
    assert len(server.requests) == 1
    assert not error.retryable
    assert error.status_code == 500
    assert "\n" not in str(error)
    assert "HTTP 500 internal_server_error: 1 validation error: {'type': 'string_type'" in str(
        error
    )


@pytest.mark.parametrize("name", sorted(STRICT_SERVERS))
async def test_full_tool_calling_run_over_a_strict_server(server: SSEServer, name: str) -> None:
    server.validate = STRICT_SERVERS[name]
    server.add(
        tool_reply(("call_a", "add", '{"a": 2, "b": 3}')),
        tool_reply(("call_b", "add", '{"a": 5, "b": 4}')),
        text_reply("2+3+4 = ", "9."),
    )
    agent = ta.Agent(name="calc", instructions="Use tools.", model=make_model(server), tools=[add])
    with trio.fail_after(10):
        result = await ta.run(agent, "what is 2+3+4?")
    result.raise_for_status()
    assert result.final_output == "2+3+4 = 9."
    assert len(server.requests) == 3
    last = server.requests[-1].json["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    assert last[2]["content"] == ""
    assert last[3] == {"role": "tool", "tool_call_id": "call_a", "content": "5"}


# ------------------------------------------------------ response quirks


async def test_missing_usage_is_unknown_not_zero(server: SSEServer) -> None:
    # A server that ignores stream_options.include_usage.
    server.add(Reply(events=[SSE(chunk("hi")), SSE(chunk(finish="stop")), DONE]))
    with trio.fail_after(10):
        events = await collect(make_model(server))
    assert events == [TextDelta("hi"), Finish("stop")]
    assert not any(isinstance(event, Usage) for event in events)


async def test_usage_with_nulls_is_unknown(server: SSEServer) -> None:
    nulls = {"choices": [], "usage": {"prompt_tokens": None, "completion_tokens": None}}
    server.add(Reply(events=[SSE(chunk("hi", finish="stop")), SSE(nulls), DONE]))
    with trio.fail_after(10):
        assert await collect(make_model(server)) == [TextDelta("hi"), Finish("stop")]


async def test_usage_on_the_finish_chunk_and_empty_choices(server: SSEServer) -> None:
    finish_with_usage = {
        **chunk(finish="stop"),
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
    }
    azure_first = {"id": "", "object": "", "created": 0, "model": "", "choices": []}
    server.add(
        Reply(
            events=[
                SSE(azure_first),
                SSE({"choices": None}),
                SSE(chunk("hi")),
                SSE(finish_with_usage),
                DONE,
            ]
        )
    )
    with trio.fail_after(10):
        events = await collect(make_model(server))
    assert events == [TextDelta("hi"), Usage(7, 3), Finish("stop")]


async def test_a_usage_chunk_with_an_empty_choice(server: SSEServer) -> None:
    # LiteLLM's proxy: the usage chunk comes after the finish, with a choice of its own.
    usage = {**chunk(), "usage": {"prompt_tokens": 8, "completion_tokens": 5}}
    server.add(Reply(events=[SSE(chunk("hi")), SSE(chunk(finish="stop")), SSE(usage), DONE]))
    with trio.fail_after(10):
        events = await collect(make_model(server))
    assert events == [TextDelta("hi"), Usage(8, 5), Finish("stop")]


async def test_running_usage_totals_keep_the_last(server: SSEServer) -> None:
    def with_usage(data: dict[str, Any], completion: int) -> dict[str, Any]:
        return {**data, "usage": {"prompt_tokens": 4, "completion_tokens": completion}}

    server.add(
        Reply(
            events=[
                SSE(with_usage(chunk("a"), 1)),
                SSE(with_usage(chunk("b"), 2)),
                SSE(with_usage(chunk(finish="stop"), 2)),
                DONE,
            ]
        )
    )
    with trio.fail_after(10):
        events = await collect(make_model(server))
    assert events == [TextDelta("a"), TextDelta("b"), Usage(4, 2), Finish("stop")]


@pytest.mark.parametrize(
    ("sent", "finish"),
    [
        ("stop", "stop"),
        ("length", "length"),
        ("content_filter", "content_filter"),
        ("eos_token", "stop"),
        ("max_tokens", "length"),
        ("abort", "abort"),  # unknown reasons pass through
    ],
)
async def test_finish_reasons_are_normalised(server: SSEServer, sent: str, finish: str) -> None:
    server.add(Reply(events=[SSE(chunk("x")), SSE(chunk(finish=sent)), DONE]))
    with trio.fail_after(10):
        events = await collect(make_model(server))
    assert events[-1] == Finish(finish)


@pytest.mark.parametrize("sent", ["stop", "function_call", "tool_calls"])
async def test_a_turn_with_tool_calls_finishes_with_tool_calls(
    server: SSEServer, sent: str
) -> None:
    server.add(tool_reply(("c1", "add", "{}"), finish=sent))
    with trio.fail_after(10):
        events = await collect(make_model(server))
    assert events[-1] == Finish("tool_calls")


async def test_length_with_a_cut_tool_call_stays_length(server: SSEServer) -> None:
    server.add(tool_reply(("c1", "add", '{"a": 1'), finish="length"))
    with trio.fail_after(10):
        events = await collect(make_model(server))
    assert events[-1] == Finish("length")


async def test_refusal_is_text(server: SSEServer) -> None:
    refusal = chunk()
    refusal["choices"][0]["delta"] = {"refusal": "I can't help with that."}
    server.add(Reply(events=[SSE(refusal), SSE(chunk(finish="stop")), DONE]))
    with trio.fail_after(10):
        events = await collect(make_model(server))
    assert events == [TextDelta("I can't help with that."), Finish("stop")]


# ------------------------------------------------------------ tool-call ids


async def test_an_id_reused_from_an_earlier_turn_gets_a_fresh_one(server: SSEServer) -> None:
    request = ModelRequest(
        "",
        (
            UserMessage("go"),
            ToolCall("call_1", "add", "{}"),
            ToolResult("call_1", "0"),
            ToolCall("call_1_2", "add", "{}"),  # already taken too
            ToolResult("call_1_2", "0"),
        ),
    )
    server.add(tool_reply(("call_1", "add", "{}"), ("call_1", "add", '{"a": 1}')))
    with trio.fail_after(10):
        events = await collect(make_model(server), request)
    ids = [e.call.call_id for e in events if isinstance(e, ToolCallDone)]
    assert ids == ["call_1_3", "call_1_4"]  # deterministic, unique, recognisable


async def test_a_fixed_id_mock_runs_to_completion(server: SSEServer) -> None:
    # A proxy's mock answers every tool turn with the same id: the run still completes,
    # and every request it sends has unique ids that match their results.
    server.add(
        tool_reply(("call_fixed", "add", '{"a": 1, "b": 1}')),
        tool_reply(("call_fixed", "add", '{"a": 2, "b": 2}')),
        tool_reply(("call_fixed", "add", '{"a": 3, "b": 3}')),
        text_reply("done"),
    )
    agent = ta.Agent(name="calc", model=make_model(server), tools=[add])
    with trio.fail_after(10):
        result = await ta.run(agent, "go")
    result.raise_for_status()
    assert result.final_output == "done"
    calls = [item for item in result.new_items if isinstance(item, ToolCall)]
    assert [call.call_id for call in calls] == ["call_fixed", "call_fixed_2", "call_fixed_3"]
    results = [item for item in result.new_items if isinstance(item, ToolResult)]
    assert [(r.call_id, r.output) for r in results] == [
        ("call_fixed", "2"),
        ("call_fixed_2", "4"),
        ("call_fixed_3", "6"),
    ]
    last = server.requests[-1].json["messages"]
    sent = [m["tool_calls"][0]["id"] for m in last if m.get("tool_calls")]
    assert sent == ["call_fixed", "call_fixed_2", "call_fixed_3"]


# ------------------------------------------------------------ error reasons


@pytest.mark.parametrize(
    ("status", "body", "reason", "retryable"),
    [
        # LiteLLM: "None" placeholders and the status repeated as the code.
        (
            400,
            {"error": {"message": "bad\nthing", "type": "None", "param": "None", "code": "400"}},
            "HTTP 400: bad thing",
            False,
        ),
        (500, {"error": {"message": "boom", "type": None, "code": 500}}, "HTTP 500: boom", True),
        # vLLM's top-level error object.
        (
            500,
            {"object": "error", "message": "x", "type": "BadRequestError", "code": 400},
            "HTTP 500 BadRequestError: x",
            False,
        ),
        (
            429,
            {"error": {"message": "quota", "type": "insufficient_quota", "code": None}},
            "HTTP 429 insufficient_quota: quota",
            False,
        ),
        (
            503,
            {"error": {"message": "busy", "type": "server_error"}},
            "HTTP 503 server_error: busy",
            True,
        ),
        (502, None, "HTTP 502 with an empty body", True),
    ],
)
async def test_error_reasons(
    server: SSEServer, status: int, body: Any, reason: str, retryable: bool
) -> None:
    reply = Reply.json(status, body) if body is not None else Reply(status=status, body=b"")
    server.add(reply)
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(make_model(server, max_retries=0))
    message = str(info.value)
    assert message == f"openai ({server.base_url}/v1/chat/completions): {reason}"
    assert info.value.retryable is retryable
    assert "None" not in message


async def test_error_in_the_stream_reads_on_one_line(server: SSEServer) -> None:
    error = {"error": {"code": 500, "message": "slot\nunavailable", "type": "server_error"}}
    server.add(Reply(events=[SSE(chunk("a")), SSE(error)]))
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(make_model(server))
    assert str(info.value) == (
        "openai: the server sent an error in the stream: server_error: slot unavailable"
    )


# ---------------------------------------------------- a 200 that is no stream


async def test_200_with_an_empty_body_fails_at_once(server: SSEServer) -> None:
    # What a server says when the prompt overflows its context, in some versions.
    server.add(Reply(events=[]), text_reply("never"))
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(make_model(server, retry_base_delay=30))
    assert len(server.requests) == 1
    assert not info.value.retryable
    assert info.value.status_code == 200
    assert "HTTP 200 (text/event-stream) with an empty body, not an event stream" in str(info.value)


async def test_200_with_a_text_body_fails_at_once_quoting_it(server: SSEServer) -> None:
    page = b"<html><body>context\nwindow exceeded</body></html>"
    server.add(Reply(status=200, headers=[("content-type", "text/html")], body=page))
    server.add(text_reply("never"))
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(make_model(server, retry_base_delay=30))
    assert len(server.requests) == 1
    assert "HTTP 200 (text/html), but the body is not an event stream:" in str(info.value)
    assert "context window exceeded" in str(info.value)


async def test_keepalives_then_nothing_is_a_stream_that_ended_early(server: SSEServer) -> None:
    # The control: a body that *was* an event stream and ended without an event is a
    # stream cut short, retried before any output.
    server.add(Reply(events=[Raw(b": keepalive\n\n")]), text_reply("ok"))
    with trio.fail_after(10):
        events = await collect(make_model(server, retry_base_delay=0.01))
    assert events[0] == TextDelta("ok")
    assert len(server.requests) == 2


# ------------------------------------------------------------------- base_url


def test_a_pasted_endpoint_url_is_accepted() -> None:
    model = OpenAIChatModel("m", base_url="http://127.0.0.1:8000/v1/chat/completions/")
    assert model.base_url == "http://127.0.0.1:8000/v1"
