"""Prompt caching (DESIGN §21): ``model_settings={"cache": True}`` places Anthropic's
``cache_control`` breakpoints and sets OpenAI's ``prompt_cache_key``; the request
bodies as the loopback servers received them, over whole runs."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.provider_wires import WIRES
from tests.support.sse_server import SSEServer
from trio_agents.models import AnthropicModel, OpenAIChatModel


@ta.function_tool
def lookup(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@ta.function_tool
def forecast(city: str, days: int) -> str:
    """The forecast for a city."""
    return f"{days} sunny days in {city}"


def _breakpoints(body: dict[str, Any]) -> list[str]:
    """Where ``body`` has cache_control marks: "tool:<name>", "system", "<role>:<type>"."""
    found = [f"tool:{t['name']}" for t in body.get("tools", []) if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        found += ["system" for block in system if "cache_control" in block]
    for message in body["messages"]:
        found += [
            f"{message['role']}:{block['type']}"
            for block in message["content"]
            if "cache_control" in block
        ]
    return found


async def _two_requests(
    server: SSEServer, model: Any, settings: dict[str, Any], instructions: str = "Be brief."
) -> list[dict[str, Any]]:
    """A run that calls ``lookup`` and then answers; the two request bodies."""
    wire = WIRES[_wire_of(model)]
    server.add(wire.call("call_1", "lookup", '{"city": "Oslo"}'), wire.cached())
    agent = ta.Agent(
        name="weather",
        instructions=instructions,
        model=model,
        tools=[lookup, forecast],
        model_settings=settings,
    )
    with trio.fail_after(10):
        result = await ta.run(agent, "Weather in Oslo?")
    result.raise_for_status()
    bodies = [request.json for request in server.requests[-2:]]
    for body in bodies:
        assert "cache" not in body  # ours, never a body field
    return bodies


def _wire_of(model: Any) -> str:
    return {"OpenAIChatModel": "chat", "OpenAIResponsesModel": "responses"}.get(
        type(model).__name__, "anthropic"
    )


async def test_anthropic_breakpoints_on_tools_instructions_and_the_last_user_message(
    server: SSEServer,
) -> None:
    model = WIRES["anthropic"].model(server)
    first, second = await _two_requests(server, model, {"cache": True})
    assert _breakpoints(first) == ["tool:forecast", "system", "user:text"]
    assert first["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}
    ]
    # The next turn: the same tool and system marks (the cache written is read), the
    # third moved to the last user message, now the tool result.
    assert _breakpoints(second) == ["tool:forecast", "system", "user:tool_result"]
    assert second["messages"][0]["content"] == [{"type": "text", "text": "Weather in Oslo?"}]
    assert [t["name"] for t in second["tools"]] == ["lookup", "forecast"]


async def test_anthropic_never_more_than_four_breakpoints(server: SSEServer) -> None:
    # A caller's own system blocks already hold two marks: only two more fit.
    marked = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    model = AnthropicModel("claude-test", base_url=server.base_url, system=[marked, marked])
    first, _ = await _two_requests(server, model, {"cache": True}, instructions="")
    assert _breakpoints(first) == ["tool:forecast", "system", "system", "user:text"]
    assert len(_breakpoints(first)) == 4


async def test_anthropic_without_cache_has_no_breakpoints(server: SSEServer) -> None:
    first, second = await _two_requests(server, WIRES["anthropic"].model(server), {})
    assert _breakpoints(first) == _breakpoints(second) == []
    assert first["system"] == "Be brief."


@pytest.mark.parametrize("name", ["chat", "responses"])
async def test_openai_prompt_cache_key_is_stable_per_agent(name: str, server: SSEServer) -> None:
    wire = WIRES[name]
    first, second = await _two_requests(server, wire.model(server), {"cache": True})
    key = first["prompt_cache_key"]
    assert key.startswith("trio-agents-")
    assert second["prompt_cache_key"] == key  # every turn of the agent shares it
    other, _ = await _two_requests(server, wire.model(server), {"cache": True}, "Be long.")
    assert other["prompt_cache_key"] != key  # another prompt, another key
    given, _ = await _two_requests(server, wire.model(server), {"cache": "team-42"})
    assert given["prompt_cache_key"] == "team-42"
    plain, _ = await _two_requests(server, wire.model(server), {})
    assert "prompt_cache_key" not in plain


async def test_an_explicit_prompt_cache_key_wins(server: SSEServer) -> None:
    model = WIRES["chat"].model(server, cache=True, prompt_cache_key="mine")
    first, _ = await _two_requests(server, model, {})
    assert first["prompt_cache_key"] == "mine"


def test_a_cache_setting_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match="cache setting must be a bool or a non-empty str"):
        OpenAIChatModel("gpt-test", base_url="http://127.0.0.1:1/v1", cache=5)
    with pytest.raises(TypeError, match="cache setting"):
        AnthropicModel("claude-test", base_url="http://127.0.0.1:1", cache="")
