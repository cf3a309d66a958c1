"""Structured output on the wire: the request bodies each provider sends, and whole runs
against the loopback SSE servers (``sse_server.py``)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.anthropic_wire import (
    message_end,
    message_start,
    text_block,
    tool_block,
)
from tests.support.chat_wire import text_reply, tool_reply
from tests.support.responses_wire import text_response
from tests.support.sse_server import Reply, SSEServer
from trio_agents import RunStatus, ToolResult, UserMessage
from trio_agents.models import (
    FINAL_ANSWER_TOOL,
    AnthropicModel,
    ModelRequest,
    OpenAIChatModel,
    OpenAIResponsesModel,
)


@attrs.frozen
class Point:
    """A point on the plane."""

    x: int
    y: int


POINT_SCHEMA = {
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x", "y"],
    "additionalProperties": False,
    "description": "A point on the plane.",
}


async def run(model: ta.Model, output_type: object = Point, **kwargs: Any) -> ta.RunResult:
    agent = ta.Agent(name="p", model=model, output_type=output_type, **kwargs)
    with trio.fail_after(10):
        result = await ta.run(agent, "where?")
    assert ta.conversation_problems(result.conversation) == []
    return result


# --------------------------------------------------------------- Chat Completions


async def test_chat_sends_a_json_schema_response_format(server: SSEServer) -> None:
    server.add(text_reply('{"x": 1,', ' "y": 2}'))
    model = OpenAIChatModel("gpt-test", base_url=f"{server.base_url}/v1")
    result = await run(model)
    assert result.final_output == Point(1, 2)
    (request,) = server.requests
    body = request.json
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "Point",
            "schema": POINT_SCHEMA,
            "strict": True,
            "description": "A point on the plane.",
        },
    }
    assert "tools" not in body  # native: no final-answer tool


async def test_chat_envelope_and_retry(server: SSEServer) -> None:
    server.add(text_reply('{"response": "many"}'), text_reply('{"response": 3}'))
    model = OpenAIChatModel("gpt-test", base_url=f"{server.base_url}/v1")
    result = await run(model, int)
    assert result.final_output == 3
    first, second = (r.json for r in server.requests)
    fmt = first["response_format"]["json_schema"]
    assert fmt["name"] == "output"
    assert fmt["schema"]["properties"] == {"response": {"type": "integer"}}
    feedback = second["messages"][-1]
    assert feedback["role"] == "user"
    assert "$: expected integer, got string" in feedback["content"]


async def test_chat_settings_response_format_wins(server: SSEServer) -> None:
    server.add(text_reply('{"x": 1, "y": 2}'))
    model = OpenAIChatModel(
        "gpt-test", base_url=f"{server.base_url}/v1", response_format={"type": "json_object"}
    )
    assert (await run(model)).final_output == Point(1, 2)
    assert server.requests[0].json["response_format"] == {"type": "json_object"}


async def test_chat_without_native_output_uses_the_final_answer_tool(server: SSEServer) -> None:
    server.add(tool_reply(("call_a", FINAL_ANSWER_TOOL, '{"x": 7, "y": 8}')))
    model = OpenAIChatModel("gpt-test", base_url=f"{server.base_url}/v1", native_output=False)
    result = await run(model)
    assert result.final_output == Point(7, 8)
    body = server.requests[0].json
    assert "response_format" not in body
    (tool,) = body["tools"]
    assert tool["function"]["name"] == FINAL_ANSWER_TOOL
    assert tool["function"]["parameters"] == POINT_SCHEMA
    assert result.conversation[-1] == ToolResult("call_a", "final answer accepted")


def test_native_output_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="native_output"):
        OpenAIChatModel("m", native_output="yes")
    with pytest.raises(TypeError, match="native_output"):
        OpenAIResponsesModel("m", native_output=1)


# ------------------------------------------------------------------- Responses API


async def test_responses_sends_a_text_format(server: SSEServer) -> None:
    server.add(text_response('{"x": 4', ', "y": 5}'))
    model = OpenAIResponsesModel("gpt-test", base_url=f"{server.base_url}/v1")
    result = await run(model)
    assert result.final_output == Point(4, 5)
    body = server.requests[0].json
    assert body["text"] == {
        "format": {
            "type": "json_schema",
            "name": "Point",
            "schema": POINT_SCHEMA,
            "strict": True,
            "description": "A point on the plane.",
        }
    }
    assert "tools" not in body


def test_responses_text_format_merges_with_text_settings() -> None:
    model = OpenAIResponsesModel("gpt-test", text={"verbosity": "low"})
    agent = ta.Agent(name="p", model=model, output_type=list[int])
    spec = agent._output
    assert spec is not None
    body = model.request_body(ModelRequest("", (UserMessage("hi"),), output=spec.spec))
    assert body["text"]["verbosity"] == "low"
    assert body["text"]["format"]["name"] == "output"
    assert body["text"]["format"]["schema"]["required"] == ["response"]


# ----------------------------------------------------------------------- Anthropic


def anthropic_answer(call_id: str, arguments: dict[str, Any], text: str = "") -> Reply:
    blocks = text_block(0, text) if text else []
    index = 1 if text else 0
    return Reply(
        events=[
            message_start(),
            *blocks,
            *tool_block(index, call_id, FINAL_ANSWER_TOOL, json.dumps(arguments)),
            *message_end("tool_use"),
        ]
    )


async def test_anthropic_answers_through_the_final_answer_tool(server: SSEServer) -> None:
    server.add(anthropic_answer("toolu_1", {"x": 1, "y": 2}, text="Here you go."))
    model = AnthropicModel("claude-test", base_url=server.base_url)
    result = await run(model)
    assert result.status is RunStatus.COMPLETED
    assert result.final_output == Point(1, 2)
    body = server.requests[0].json
    assert "response_format" not in body
    assert "output_format" not in body
    (tool,) = body["tools"]
    assert tool["name"] == FINAL_ANSWER_TOOL
    assert tool["input_schema"] == POINT_SCHEMA
    assert "A point on the plane." in tool["description"]
    assert result.conversation[-1] == ToolResult("toolu_1", "final answer accepted")


async def test_anthropic_retry_sends_the_error_as_a_tool_result(server: SSEServer) -> None:
    server.add(
        anthropic_answer("toolu_1", {"x": "left"}),
        anthropic_answer("toolu_2", {"x": 0, "y": 0}),
    )
    model = AnthropicModel("claude-test", base_url=server.base_url)
    result = await run(model)
    assert result.final_output == Point(0, 0)
    second = server.requests[1].json
    block = second["messages"][-1]["content"][-1]
    assert block["type"] == "tool_result"
    assert block["tool_use_id"] == "toolu_1"
    assert block["is_error"] is True
    assert "missing required property 'y'" in block["content"]


async def test_anthropic_retries_exhausted(server: SSEServer) -> None:
    server.add(
        anthropic_answer("toolu_1", {"x": "left"}), anthropic_answer("toolu_2", {"x": "right"})
    )
    model = AnthropicModel("claude-test", base_url=server.base_url)
    result = await run(model, output_retries=1)
    assert result.status is RunStatus.FAILED
    assert result.reason is not None
    assert result.reason.startswith("output validation failed: $: missing required property")
    assert len(server.requests) == 2


async def test_anthropic_cancel_mid_answer_leaves_a_valid_conversation(
    server: SSEServer,
) -> None:
    # The text and half of the final_answer call arrive, then the server holds the
    # stream open: the cancel lands while the answer is streaming.
    partial = tool_block(1, "toolu_1", FINAL_ANSWER_TOOL, '{"x": 1, ', '"y": 2}')[:2]
    server.add(
        Reply(events=[message_start(), *text_block(0, "Working on it"), *partial], end="hold")
    )
    agent = ta.Agent(
        name="p", model=AnthropicModel("claude-test", base_url=server.base_url), output_type=Point
    )
    with trio.fail_after(10):
        async with ta.open_run(agent, "where?") as handle:
            async for event in handle.events():
                if event.type == "response.text.delta":
                    await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                    handle.cancel("stop")
    result = handle.result
    assert result is not None
    assert (result.status, result.reason) == (RunStatus.CANCELLED, "stop")
    assert ta.conversation_problems(result.conversation) == []
    assert result.conversation[-1] == ta.AssistantMessage("Working on it", status="incomplete")
    with trio.fail_after(5):
        await server.connections[0].closed.wait()  # the stream was closed
