"""Recorded requests and their replay (DESIGN §23), on a loopback server speaking each
provider's wire format: a recorded request sent again is the same HTTP request body,
byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pytest

import trio_agents as ta
from tests.support.provider_wires import WIRES, Wire
from tests.support.sse_server import SSEServer


@ta.function_tool
async def lookup(city: str, units: str = "metric") -> str:
    """Look up the weather of a city."""
    return f"sunny in {city} ({units})"


@pytest.fixture(params=list(WIRES))
def wire(request: pytest.FixtureRequest) -> Wire:
    return WIRES[request.param]


def _agent(model: Any) -> ta.Agent:
    return ta.Agent(
        name="weather",
        instructions="Answer with the weather. Use the tool.",
        model=model,
        tools=[lookup],
        model_settings={"temperature": 0.25, "max_tokens": 200},
    )


async def _recorded(run: ta.Run) -> list[dict[str, Any]]:
    """The run's model.request events as a face serves them (JSON text, read back)."""
    return [
        json.loads(json.dumps(event.to_json()))
        async for event in run.events()
        if event.type == "model.request"
    ]


async def test_a_replayed_request_is_the_same_http_request_byte_for_byte(
    wire: Wire, server: SSEServer
) -> None:
    server.add(wire.call("call_w1", "lookup", '{"city": "Oslo"}'), wire.text("It is ", "sunny."))
    async with ta.open_run(
        _agent(wire.model(server)), "Weather in Oslo?", record_requests=True
    ) as run:
        pass
    assert run.result is not None
    assert run.result.status == "completed", run.result.reason
    recorded = await _recorded(run)
    assert [event["turn"] for event in recorded] == [1, 2]
    assert all(event["omitted"] is None for event in recorded)
    assert recorded[0]["model"] == wire.model(server).model
    assert len(server.requests) == 2
    # Each recorded request, replayed on a new model object of the same provider: the
    # server receives the very bytes the run's request was.
    server.add(
        wire.call("call_w1", "lookup", '{"city": "Oslo"}'), wire.text("Still ", "sunny", ".")
    )
    first = await ta.replay(recorded[0], model=wire.model(server))
    second = await ta.replay(recorded[1], model=wire.model(server))
    assert len(server.requests) == 4
    assert server.requests[2].body == server.requests[0].body
    assert server.requests[3].body == server.requests[1].body
    assert server.requests[2].path == server.requests[0].path == wire.path
    # The responses, assembled from their streams.
    assert [call.name for call in first.tool_calls] == ["lookup"]
    assert first.tool_calls[0].arguments == '{"city": "Oslo"}'
    assert second.text == "Still sunny."
    assert second.tool_calls == ()
    assert second.usage == wire.text_usage
    assert second.finish_reason is not None
    assert second.to_json()["text"] == "Still sunny."


async def test_a_request_replays_on_another_model(server: SSEServer) -> None:
    # Recorded on Chat Completions, replayed on Anthropic: the same request, in the
    # other provider's wire format.
    chat, anthropic = WIRES["chat"], WIRES["anthropic"]
    server.add(chat.text("Hi."))
    async with ta.open_run(_agent(chat.model(server)), "Hello", record_requests=True) as run:
        pass
    (recorded,) = await _recorded(run)
    server.add(anthropic.text("Hello ", "there."))
    response = await ta.replay(recorded, model=anthropic.model(server))
    assert response.text == "Hello there."
    sent = server.requests[-1]
    assert sent.path == anthropic.path
    body = sent.json
    assert body["system"] == "Answer with the weather. Use the tool."
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "Hello"}]}]
    assert [tool["name"] for tool in body["tools"]] == ["lookup"]
    assert body["temperature"] == 0.25


async def test_replay_takes_a_model_request_and_a_model_string(server: SSEServer) -> None:
    server.add(WIRES["chat"].text("pong"))
    request = ta.ModelRequest("Be brief.", (ta.UserMessage("ping"),))
    response = await ta.replay(request, model=f"openai:gpt-test@{server.base_url}/v1")
    assert response.text == "pong"
    assert server.requests[0].json["messages"][-1] == {"role": "user", "content": "ping"}
