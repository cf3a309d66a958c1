"""OpenAIResponsesModel against a real loopback HTTP server speaking the Responses API
SSE format byte for byte (``responses_wire.py`` on ``sse_server.py``): its own events,
tools, request shape, errors, full runs and reasoning items. What every provider
promises (retries, cancel closing the socket, client ownership and pooling) is in
test_provider_conformance.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support import models_requests as shared
from tests.support.model_streams import collect, collect_into
from tests.support.models_requests import responses_model as make_model
from tests.support.responses_wire import ResponseScript, text_response
from tests.support.sse_server import SSE, Raw, Reply, SSEServer
from trio_agents import (
    AssistantMessage,
    ModelError,
    ModelRequest,
    ToolCall,
    ToolResult,
    Usage,
    UserMessage,
)
from trio_agents.models import (
    Finish,
    ModelEvent,
    OpenAIResponsesModel,
    TextDelta,
    ToolCallDone,
    from_string,
)


def add_call(call_id: str, arguments: str) -> dict[str, Any]:
    """A call of the add tool as a function_call input item."""
    return {
        "type": "function_call",
        "call_id": call_id,
        "name": "add",
        "arguments": arguments,
    }


# ------------------------------------------------------------------- streaming


async def test_the_body_of_a_plain_request(server: SSEServer) -> None:
    # The events, path and headers of a text stream: test_provider_conformance.py.
    server.add(text_response("Hel", "lo", " wörld"))
    with trio.fail_after(10):
        await collect(make_model(server))
    assert server.requests[0].json == {
        "model": "gpt-test",
        "instructions": "Be brief.",
        "input": [{"role": "user", "content": "hi"}],
        "stream": True,
    }


async def test_function_calls_with_streamed_arguments(server: SSEServer) -> None:
    script = (
        ResponseScript()
        .start()
        .message("Let me check.")
        .function_call("call_a", "weather", *shared.WEATHER_PIECES)
        .function_call("call_b", "search", *shared.SEARCH_PIECES)
        .completed(50, 20)
    )
    server.add(script.reply())
    with trio.fail_after(10):
        got = await collect(make_model(server))
    # The Responses API always sends input_tokens_details.cached_tokens (here 0).
    assert got == [
        *shared.TWO_CALLS[:3],
        ta.Usage(50, 20, cache_read_tokens=0),
        Finish("tool_calls"),
    ]


async def test_arguments_from_deltas_when_the_done_item_has_none(server: SSEServer) -> None:
    # A minimal server: no arguments.done, and a done item without arguments.
    script = ResponseScript().start()
    added = {"id": "fc_0", "type": "function_call", "call_id": "c", "name": "f", "arguments": ""}
    script.event("response.output_item.added", output_index=0, item=added)
    for part in ('{"x"', ": 1}"):
        script.event(
            "response.function_call_arguments.delta", item_id="fc_0", output_index=0, delta=part
        )
    done = {"id": "fc_0", "type": "function_call", "call_id": "c", "name": "f"}
    script.event("response.output_item.done", output_index=0, item=done)
    server.add(script.completed(None).reply())
    with trio.fail_after(10):
        got = await collect(make_model(server))
    assert got == [ToolCallDone(ToolCall("c", "f", '{"x": 1}')), Finish("tool_calls")]


async def test_unstreamed_message_text_and_done_marker(server: SSEServer) -> None:
    # A minimal server: the text only in the done item, and a Chat-style [DONE] end.
    script = ResponseScript().start()
    item = {
        "id": "msg_9",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "whole", "annotations": []}],
    }
    script.event("response.output_item.done", output_index=0, item=item)
    server.add(Reply(events=[*script.events, SSE("[DONE]")]))
    with trio.fail_after(10):
        assert await collect(make_model(server)) == [TextDelta("whole"), Finish("stop")]


async def test_event_split_across_writes_and_crlf(server: SSEServer) -> None:
    delta = {"type": "response.output_text.delta", "item_id": "m", "output_index": 0}
    completed = json.dumps({"type": "response.completed", "response": {"status": "completed"}})
    head = b"event: response.output_text.delta\r\ndata: "
    events = shared.cut_inside_a_character(head, {**delta, "delta": "¡hola!"})
    end = Raw(b"event: response.completed\r\ndata: " + completed.encode() + b"\r\n\r\n")
    server.add(Reply(events=[*events, end]))
    with trio.fail_after(10):
        assert await collect(make_model(server)) == [TextDelta("¡hola!"), Finish("stop")]


async def test_request_body_format(server: SSEServer) -> None:
    server.add(text_response("ok"))
    sent = await shared.sent_request(
        server,
        make_model(server, api_key="sk-test", temperature=0.1, max_output_tokens=99),
        *shared.ADDING,
        AssistantMessage("", status="incomplete"),
        *shared.GO_ON,
        settings={"temperature": 0.5, "top_p": 0.9},
    )
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.json == {
        **shared.openai_settings("max_output_tokens"),
        "instructions": "You are terse.",
        "input": [
            {"role": "user", "content": "what is 2+3 and 4+4?"},
            {"role": "assistant", "content": "Let me add."},
            add_call("c1", '{"a": 2, "b": 3}'),
            add_call("c2", "not json"),
            {"type": "function_call_output", "call_id": "c1", "output": "5"},
            {"type": "function_call_output", "call_id": "c2", "output": "bad arguments"},
            {"role": "assistant", "content": "The answers are 5 a"},
            {"role": "user", "content": "go on"},
        ],
        "tools": [
            {
                "type": "function",
                "name": "add",
                "description": "Add two integers.",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
                "strict": False,
            }
        ],
        "stream": True,
    }


async def test_env_defaults_and_a_pasted_endpoint(
    server: SSEServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.add(text_response("hi"))
    base_url = f"{server.base_url}/v1/responses/"  # the endpoint, pasted whole
    request = await shared.sent_with_env(server, monkeypatch, OpenAIResponsesModel, base_url)
    assert request.headers["authorization"] == "Bearer sk-env"


def test_defaults_repr_and_validation() -> None:
    model = OpenAIResponsesModel("gpt-5-mini", api_key="sk-secret", store=False)
    assert model.base_url == "https://api.openai.com/v1"
    assert model.settings == {"store": False}
    assert "sk-secret" not in repr(model)
    with pytest.raises(ValueError, match="model"):
        OpenAIResponsesModel("")
    with pytest.raises(ValueError, match="reasoning_memory"):
        OpenAIResponsesModel("m", reasoning_memory=-1)


def test_from_string() -> None:
    model = from_string("openai-responses:gpt-5-mini")
    assert isinstance(model, OpenAIResponsesModel)
    assert (model.model, model.base_url) == ("gpt-5-mini", "https://api.openai.com/v1")
    local = from_string("openai-responses:gpt-oss:20b@http://127.0.0.1:11434/v1", store=False)
    assert isinstance(local, OpenAIResponsesModel)
    assert (local.model, local.base_url) == ("gpt-oss:20b", "http://127.0.0.1:11434/v1")
    assert local.settings == {"store": False}


# ------------------------------------------------------------------- reasoning


async def test_reasoning_items_go_back_with_their_calls(server: SSEServer) -> None:
    first = (
        ResponseScript()
        .start()
        .reasoning("rs_1", "I should add.", encrypted="enc-1")
        .function_call("call_1", "add", '{"a": 2, "b": 3}')
        .reasoning("rs_2", "And once more.", encrypted="enc-2")
        .function_call("call_2", "add", '{"a": 4, "b": 4}')
        .completed()
    )
    final = ResponseScript().start().reasoning("rs_3", "Done.").message("5 and 8").completed()
    server.add(first.reply(), final.reply(), text_response("again"))
    agent = ta.Agent(name="calc", model=make_model(server), tools=[shared.add])
    with trio.fail_after(10):
        result = await ta.run(agent, "2+3 and 4+4?")
        result.raise_for_status()
        follow_up = await ta.run(agent, [*result.conversation, UserMessage("thanks")])
    follow_up.raise_for_status()
    assert result.final_output == "5 and 8"
    second = server.requests[1].json["input"]
    assert [entry.get("type", entry.get("role")) for entry in second] == [
        "user",
        "reasoning",
        "function_call",
        "reasoning",
        "function_call",
        "function_call_output",
        "function_call_output",
    ]
    assert second[1] == {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "I should add."}],
        "encrypted_content": "enc-1",
    }
    assert second[3]["id"] == "rs_2"
    # The reasoning that led to the final answer is not kept; the calls' still is.
    third = server.requests[2].json["input"]
    assert [entry["id"] for entry in third if entry.get("type") == "reasoning"] == ["rs_1", "rs_2"]


async def test_store_false_asks_for_encrypted_reasoning_and_skips_plain_ids(
    server: SSEServer,
) -> None:
    first = (
        ResponseScript()
        .start()
        .reasoning("rs_plain", "no encrypted content", encrypted=None)
        .function_call("call_1", "add", '{"a": 1, "b": 1}')
        .reasoning("rs_enc", "encrypted", encrypted="enc")
        .function_call("call_2", "add", '{"a": 1, "b": 2}')
        .completed()
    )
    server.add(first.reply(), text_response("2 and 3"))
    model = make_model(server, store=False, include=["message.output_text.logprobs"])
    agent = ta.Agent(name="calc", model=model, tools=[shared.add])
    with trio.fail_after(10):
        result = await ta.run(agent, "go")
    result.raise_for_status()
    for request in server.requests:
        assert request.json["store"] is False
        assert request.json["include"] == [
            "message.output_text.logprobs",
            "reasoning.encrypted_content",
        ]
    second = server.requests[1].json["input"]
    # An unstored reasoning item can only be sent back encrypted: the plain one is left out.
    assert [entry["id"] for entry in second if entry.get("type") == "reasoning"] == ["rs_enc"]


async def test_reasoning_memory_is_bounded_and_unknown_calls_go_without(
    server: SSEServer,
) -> None:
    model = make_model(server, reasoning_memory=1)
    for n in (1, 2):
        script = (
            ResponseScript().start().reasoning(f"rs_{n}", "r").function_call(f"c{n}", "f", "{}")
        )
        server.add(script.completed().reply())
    server.add(text_response("ok"))
    with trio.fail_after(10):
        await collect(model)
        await collect(model)
        request = ModelRequest(
            "",
            (
                UserMessage("x"),
                ToolCall("c1", "f", "{}"),
                ToolResult("c1", "."),
                ToolCall("c2", "f", "{}"),
                ToolResult("c2", "."),
                ToolCall("from_a_session", "f", "{}"),
                ToolResult("from_a_session", "."),
            ),
        )
        await collect(model, request)
    sent = server.requests[2].json["input"]
    assert [entry.get("id") for entry in sent if entry.get("type") == "reasoning"] == ["rs_2"]
    assert all("id" not in entry for entry in sent if entry.get("type") == "function_call")


# ------------------------------------------------------------ finish and errors


@pytest.mark.parametrize(
    ("reason", "finish"),
    [("max_output_tokens", "length"), ("content_filter", "content_filter"), ("other", "other")],
)
async def test_incomplete_responses(server: SSEServer, reason: str, finish: str) -> None:
    server.add(ResponseScript().start().message("cut sh").incomplete(reason).reply())
    with trio.fail_after(10):
        events = await collect(make_model(server))
    assert events == [TextDelta("cut sh"), Usage(12, 64), Finish(finish)]


async def test_missing_usage_is_unknown(server: SSEServer) -> None:
    server.add(ResponseScript().start().message("hi").completed(None).reply())
    with trio.fail_after(10):
        assert await collect(make_model(server)) == [TextDelta("hi"), Finish("stop")]


async def test_failed_response_after_output(server: SSEServer) -> None:
    script = ResponseScript().start().message("Hel").failed("server_error", "The model\ncrashed.")
    server.add(script.reply(), text_response("never"))
    got: list[ModelEvent] = []
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect_into(got, make_model(server, retry_base_delay=0.01))
    assert got == [TextDelta("Hel")]
    assert str(info.value) == (
        "openai-responses: the response failed: server_error: The model crashed."
    )
    assert len(server.requests) == 1


async def test_error_event_before_output_is_retried(server: SSEServer) -> None:
    server.add(
        ResponseScript().start().error("server_error", "try again").reply(), text_response("ok")
    )
    with trio.fail_after(10):
        events = await collect(make_model(server, retry_base_delay=0.01))
    assert events[0] == TextDelta("ok")
    assert len(server.requests) == 2


async def test_invalid_prompt_error_event_is_not_retried(server: SSEServer) -> None:
    script = ResponseScript().start().error("invalid_prompt", "Invalid prompt.")
    server.add(script.reply(), text_response("never"))
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(make_model(server, retry_base_delay=0.01))
    assert not info.value.retryable
    assert "invalid_prompt: Invalid prompt." in str(info.value)
    assert len(server.requests) == 1


async def test_a_chat_style_error_object_in_the_stream_is_an_error(server: SSEServer) -> None:
    # LiteLLM's proxy answers a Responses stream it cannot produce with HTTP 200, a
    # typeless {"error": {...}} event and "[DONE]": that is no empty answer.
    error = {"message": "Error processing stream start", "type": "internal_server_error"}
    server.add(
        Reply(events=[SSE({"error": {**error, "param": None, "code": "500"}}), SSE("[DONE]")])
    )
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(make_model(server, max_retries=0))
    assert str(info.value) == (
        "openai-responses: the server sent an error in the stream:"
        " internal_server_error: Error processing stream start"
    )


async def test_400_fails_at_once_with_the_providers_message(server: SSEServer) -> None:
    body = {
        "error": {
            "message": "Unknown parameter: 'foo'.",
            "type": "invalid_request_error",
            "param": "foo",
            "code": "unknown_parameter",
        }
    }
    model = make_model(server, retry_base_delay=0)
    error = await shared.stream_error(server, model, Reply.json(400, body), text_response("never"))
    assert (error.status_code, error.retryable) == (400, False)
    assert str(error) == (
        f"openai-responses ({server.base_url}/v1/responses): HTTP 400 invalid_request_error:"
        " Unknown parameter: 'foo'."
    )
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("reply", "match"),
    [
        (Reply(events=[SSE("{not json", "response.output_text.delta")]), r"malformed JSON.*\{not"),
        # A server that ignored "stream": true and answered with the whole response.
        (Reply.json(200, {"id": "r", "object": "response"}), "expected an event stream"),
    ],
    ids=["malformed-json-names-the-line", "json-not-a-stream"],
)
async def test_a_bad_stream_is_an_error(server: SSEServer, reply: Reply, match: str) -> None:
    await shared.stream_error(server, make_model(server), reply, match=match)


async def test_arguments_for_an_unknown_call_are_an_error(server: SSEServer) -> None:
    script = ResponseScript().start()
    script.event(
        "response.function_call_arguments.delta", item_id="fc_9", output_index=3, delta="{"
    )
    server.add(script.reply())
    with trio.fail_after(10), pytest.raises(ModelError, match="never added"):
        await collect(make_model(server))


# --------------------------------------------------------------------- retries
# (A drop after output is never retried: test_provider_conformance.py.)


async def test_truncated_without_a_terminal_event_fails(server: SSEServer) -> None:
    truncated = ResponseScript().start().message("Hel").reply()
    model = make_model(server, retry_base_delay=0.01)
    match = "without the end-of-stream"
    await shared.stream_error(server, model, truncated, text_response("again"), match=match)
    assert len(server.requests) == 1


# ------------------------------------------------------------------ full runs


async def test_full_run_with_a_tool_call(server: SSEServer) -> None:
    server.add(
        ResponseScript()
        .start()
        .function_call("call_1", "add", '{"a": 2, ', '"b": 3}')
        .completed(30, 10)
        .reply(),
        text_response("The answer ", "is 5."),
    )
    model, answer, usage = (
        make_model(server),
        "The answer is 5.",
        Usage(30 + 9, 10 + 2, cache_read_tokens=0),
    )
    first, second = await shared.run_adding(
        server, model, answer, usage, model_settings={"temperature": 0}
    )
    assert first["temperature"] == 0
    assert first["tools"][0]["name"] == "add"
    assert second["instructions"] == "Use tools."
    assert second["input"] == [
        {"role": "user", "content": "what is 2+3?"},
        add_call("call_1", '{"a": 2, "b": 3}'),
        {"type": "function_call_output", "call_id": "call_1", "output": "5"},
    ]
