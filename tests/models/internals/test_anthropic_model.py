"""AnthropicModel against a real loopback HTTP server speaking the Messages API SSE
format byte for byte (see ``sse_server.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from tests.support.anthropic_wire import (
    event,
    message_end,
    message_start,
    text_block,
    text_reply,
    tool_block,
)
from tests.support.model_streams import collect, collect_into
from tests.support.models_requests import ADDING, run_adding, sent_request
from tests.support.models_requests import anthropic_model as make_model
from tests.support.sse_server import SSE, Raw, Reply, SSEServer
from trio_agents import (
    AssistantMessage,
    Item,
    ModelError,
    ToolCall,
    Usage,
    UserMessage,
)
from trio_agents.models import (
    AnthropicModel,
    Finish,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCallDone,
)
from trio_agents.models._anthropic import anthropic_messages


def text_part(text: str) -> dict[str, Any]:
    """A text content block of a message."""
    return {"type": "text", "text": text}


def add_use(call_id: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A call of the add tool as an assistant message's tool_use block holds it."""
    return {"type": "tool_use", "id": call_id, "name": "add", "input": arguments}


# ------------------------------------------------------------------- streaming


async def test_event_sequence_with_ping_and_input_json_delta(server: SSEServer) -> None:
    arguments = json.dumps({"city": 'Zürich "centre"', "tags": ["日本", "✓"]}, ensure_ascii=False)
    parts = [arguments[:1], arguments[1:10], arguments[10:17], arguments[17:]]
    events: list[SSE | Raw] = [
        message_start(20, cache_read_input_tokens=5),
        event("ping"),
        *text_block(0, "Let me ", "check ", "ünïcode."),
        event("ping"),
        *tool_block(1, "toolu_1", "weather", *parts),
        *tool_block(2, "toolu_2", "noargs"),
        *message_end("tool_use", output_tokens=42),
    ]
    server.add(Reply(events=events))
    with trio.fail_after(10):
        got = await collect(make_model(server))
    assert got == [
        TextDelta("Let me "),
        TextDelta("check "),
        TextDelta("ünïcode."),
        ToolCallDone(ToolCall("toolu_1", "weather", arguments)),
        ToolCallDone(ToolCall("toolu_2", "noargs", "{}")),
        Usage(25, 42, cache_read_tokens=5),
        Finish("tool_calls"),
    ]


@pytest.mark.parametrize(
    ("stop_reason", "finish"),
    [("end_turn", "stop"), ("max_tokens", "length"), ("stop_sequence", "stop"), ("odd", "odd")],
)
async def test_stop_reason_mapping(server: SSEServer, stop_reason: str, finish: str) -> None:
    server.add(Reply(events=[message_start(), *text_block(0, "x"), *message_end(stop_reason)]))
    with trio.fail_after(10):
        got = await collect(make_model(server))
    assert got[-1] == Finish(finish)


async def test_request_body_and_headers(server: SSEServer) -> None:
    server.add(text_reply("ok"))
    sent = await sent_request(
        server,
        make_model(server, api_key="sk-ant", max_tokens=512, temperature=0.9, top_k=5),
        *ADDING,
        UserMessage("and then?"),
        AssistantMessage("Then I was interrupted ", status="incomplete"),
        UserMessage("carry on"),
        settings={"temperature": 0.2},
    )
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert sent.json == {
        "model": "claude-test",
        "max_tokens": 512,
        "temperature": 0.2,
        "top_k": 5,
        "system": "You are terse.",
        "messages": [
            {"role": "user", "content": [text_part("what is 2+3 and 4+4?")]},
            {
                "role": "assistant",
                "content": [
                    text_part("Let me add."),
                    add_use("c1", {"a": 2, "b": 3}),
                    add_use("c2", {"_raw_arguments": "not json"}),
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "5"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "c2",
                        "content": "bad arguments",
                        "is_error": True,
                    },
                    text_part("and then?"),
                ],
            },
            {"role": "assistant", "content": [text_part("Then I was interrupted ")]},
            {"role": "user", "content": [text_part("carry on")]},
        ],
        "tools": [
            {
                "name": "add",
                "description": "Add two integers.",
                "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
            }
        ],
        "stream": True,
    }


def test_messages_merge_roles_and_trim_a_final_prefill() -> None:
    items: list[Item] = [
        UserMessage("one"),
        UserMessage(""),
        UserMessage("two"),
        AssistantMessage("partial answer  \n", status="incomplete"),
    ]
    assert anthropic_messages(items) == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "partial answer"}]},
    ]


async def test_env_defaults_and_no_key(server: SSEServer, monkeypatch: pytest.MonkeyPatch) -> None:
    server.add(text_reply("a"), text_reply("b"))
    with trio.fail_after(10):
        await collect(make_model(server))
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-env")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
        await collect(AnthropicModel("claude-test"))
    assert "x-api-key" not in server.requests[0].headers
    assert server.requests[1].headers["x-api-key"] == "sk-env"


def test_default_base_url() -> None:
    assert AnthropicModel("claude-3-5-haiku-latest").base_url == "https://api.anthropic.com"


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/", "/v1/messages"])
async def test_base_url_ending_in_v1_is_normalised(server: SSEServer, suffix: str) -> None:
    # OpenAI-style configuration ends in /v1: not /v1/v1/messages and a 404.
    server.add(text_reply("ok"))
    model = AnthropicModel("claude-test", base_url=server.base_url + suffix)
    assert model.base_url == server.base_url
    with trio.fail_after(10):
        assert (await collect(model))[0] == TextDelta("ok")
    assert server.requests[0].path == "/v1/messages"


async def test_no_usage_reported_is_unknown_not_zero(server: SSEServer) -> None:
    # A proxy translating to the Messages format without usage fields.
    start = event("message_start", message={"id": "m", "type": "message", "role": "assistant"})
    stop = [event("message_delta", delta={"stop_reason": "max_tokens"}), event("message_stop")]
    server.add(Reply(events=[start, *text_block(0, "cut"), *stop]))
    with trio.fail_after(10):
        assert await collect(make_model(server)) == [TextDelta("cut"), Finish("length")]


# ---------------------------------------------------------------------- errors


async def test_error_event_after_output(server: SSEServer) -> None:
    error = {"type": "overloaded_error", "message": "Overloaded"}
    events = [message_start(), *text_block(0, "Hel")[:2], event("error", error=error)]
    server.add(Reply(events=events), text_reply("never"))
    got: list[ModelEvent] = []
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect_into(got, make_model(server, retry_base_delay=0.01))
    assert got == [TextDelta("Hel")]
    assert "overloaded_error: Overloaded" in str(info.value)
    assert len(server.requests) == 1


async def test_error_event_before_output_is_retried(server: SSEServer) -> None:
    error = {"type": "overloaded_error", "message": "Overloaded"}
    server.add(Reply(events=[message_start(), event("error", error=error)]), text_reply("ok"))
    with trio.fail_after(10):
        got = await collect(make_model(server, retry_base_delay=0.01))
    assert got[0] == TextDelta("ok")
    assert len(server.requests) == 2


async def test_400_fails_with_the_providers_message(server: SSEServer) -> None:
    body = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens: too large"},
    }
    server.add(Reply.json(400, body))
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(make_model(server))
    assert info.value.status_code == 400
    assert "invalid_request_error: max_tokens: too large" in str(info.value)


async def test_529_then_success(server: SSEServer) -> None:
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server.add(Reply.json(529, body), text_reply("ok"))
    with trio.fail_after(10):
        got = await collect(make_model(server, retry_base_delay=0.01))
    assert got[0] == TextDelta("ok")


async def test_truncated_without_message_stop_fails(server: SSEServer) -> None:
    events = [message_start(), *text_block(0, "a", "b")]
    server.add(Reply(events=events))
    with trio.fail_after(10), pytest.raises(ModelError, match="stream ended early after 5 events"):
        await collect(make_model(server))


async def test_drop_mid_stream_fails(server: SSEServer) -> None:
    events = [message_start(), *text_block(0, "a", "b", "c")]
    server.add(Reply(events=events, drop_after=3))
    with trio.fail_after(10), pytest.raises(ModelError, match="ended early after 3 events"):
        await collect(make_model(server))


async def test_input_json_delta_for_a_text_block_is_an_error(server: SSEServer) -> None:
    bad = event(
        "content_block_delta", index=0, delta={"type": "input_json_delta", "partial_json": "{"}
    )
    events = [message_start(), *text_block(0, "a")[:2], bad]
    server.add(Reply(events=events))
    with trio.fail_after(10), pytest.raises(ModelError, match="not a tool_use"):
        await collect(make_model(server))


# ---------------------------------------------------------------- cancellation


async def test_full_run_with_a_tool_call(server: SSEServer) -> None:
    server.add(
        Reply(
            events=[
                message_start(30),
                *text_block(0, "Adding."),
                *tool_block(1, "toolu_1", "add", '{"a": 2', ', "b": 3}'),
                *message_end("tool_use", output_tokens=10),
            ]
        ),
        Reply(events=[message_start(50), *text_block(0, "It is ", "5."), *message_end()]),
    )
    first, second = await run_adding(server, make_model(server), "It is 5.", Usage(80, 22))
    assert first["tools"][0]["name"] == "add"
    assert second["system"] == "Use tools."
    assert second["messages"] == [
        {"role": "user", "content": [text_part("what is 2+3?")]},
        {
            "role": "assistant",
            "content": [text_part("Adding."), add_use("toolu_1", {"a": 2, "b": 3})],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"}],
        },
    ]


def test_max_tokens_leads_the_settings_and_the_body_wherever_it_was_given() -> None:
    request = ModelRequest(instructions="", items=(UserMessage("hi"),), tools=(), settings={})
    defaulted = AnthropicModel("m", temperature=0.5)
    assert list(defaulted.settings) == ["max_tokens", "temperature"]
    assert list(defaulted.request_body(request))[:3] == ["model", "max_tokens", "temperature"]
    given_last = AnthropicModel("m", top_k=5, max_tokens=7)
    assert list(given_last.settings.items()) == [("max_tokens", 7), ("top_k", 5)]


def test_the_stop_reason_tables_are_plain_dicts() -> None:
    from trio_agents.models._anthropic import STOP_REASONS
    from trio_agents.models._openai import FINISH_REASONS

    for table in (STOP_REASONS, FINISH_REASONS):
        assert type(table) is dict
        assert json.loads(json.dumps(table)) == table
    assert STOP_REASONS["model_context_window_exceeded"] == "length"
    assert FINISH_REASONS["function_call"] == "tool_calls"
