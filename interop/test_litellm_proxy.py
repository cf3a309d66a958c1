"""The providers against a real third-party server: LiteLLM's proxy (``make interop``).

Not part of ``make test``: it needs ``.venv-interop`` (PyPI once, then offline). What
each test shows is listed in docs/models.md ("Verified against").
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

import trio_agents as ta
from tests.support.anthropic_wire import message_end, message_start, text_block
from tests.support.chat_wire import text_reply, tool_reply
from tests.support.responses_wire import ResponseScript, text_response
from tests.support.sse_server import Reply, SSEServer
from tests.support.strict_servers import STRICT_SERVERS
from trio_agents import ModelError
from trio_agents._items import ToolCall, ToolResult, UserMessage
from trio_agents._model import Finish, ModelEvent, ModelRequest, TextDelta, Usage
from trio_agents.models import OpenAIChatModel, OpenAIResponsesModel

from .conftest import Proxy

REQUEST = ModelRequest(instructions="Be brief.", items=(UserMessage("hi"),))


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def chat(proxy: Proxy, model: str = "mock-gpt", **kwargs: Any) -> OpenAIChatModel:
    return OpenAIChatModel(model, base_url=proxy.base_url, api_key=proxy.key, **kwargs)


async def collect(model: OpenAIChatModel | OpenAIResponsesModel) -> list[ModelEvent]:
    async with model.stream(REQUEST) as stream:
        return [event async for event in stream]


@pytest.fixture
async def upstream(litellm_proxy: Proxy, nursery: trio.Nursery) -> SSEServer:
    """The loopback server the proxy's ``upstream`` model talks to."""
    server = SSEServer()
    await nursery.start(server.serve, litellm_proxy.upstream_port)
    return server


# ------------------------------------------------------------- LiteLLM's mock


async def test_mock_text_stream(litellm_proxy: Proxy) -> None:
    with trio.fail_after(60):
        events = await collect(chat(litellm_proxy))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert text == "Hello from the mock."
    # LiteLLM's usage chunk also carries an (empty) choice.
    usage = [e for e in events if isinstance(e, Usage)]
    assert len(usage) == 1
    assert usage[0].output_tokens > 0
    assert events[-1] == Finish("stop")


async def test_two_hundred_concurrent_runs_on_one_pooled_client(litellm_proxy: Proxy) -> None:
    model = chat(litellm_proxy)
    agent = ta.Agent(name="mock", model=model)
    results: list[ta.RunResult] = []

    async def one() -> None:
        results.append(await ta.run(agent, "hi"))

    with trio.fail_after(120):
        async with model, trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(one)
    assert [r.status for r in results] == ["completed"] * 200
    assert {r.final_output for r in results} == {"Hello from the mock."}


async def test_unknown_model_reason(litellm_proxy: Proxy) -> None:
    with trio.fail_after(60), pytest.raises(ModelError) as info:
        await collect(chat(litellm_proxy, "no-such-model", retry_base_delay=30))
    message = str(info.value)
    # LiteLLM sends {"type": "invalid_request_error", "code": "400", "param": null}.
    assert ": HTTP 400 invalid_request_error: " in message
    assert "Invalid model name passed in model=no-such-model" in message
    assert "None" not in message
    assert "400: 400" not in message
    assert "\n" not in message
    assert not info.value.retryable


async def test_dead_upstream_reason(litellm_proxy: Proxy) -> None:
    with trio.fail_after(60), pytest.raises(ModelError) as info:
        await collect(chat(litellm_proxy, "dead", max_retries=0))
    message = str(info.value)
    # A 500 with code "500" and a multi-line message: one line, no repeated status.
    assert ": HTTP 500 internal_server_error: litellm.InternalServerError" in message
    assert "500: 500" not in message
    assert "\n" not in message
    assert info.value.retryable  # the upstream being down is worth another try


# ------------------------------------------------- through the proxy, upstream


async def test_full_tool_run_through_the_proxy(litellm_proxy: Proxy, upstream: SSEServer) -> None:
    # A fixed-id upstream (the same call id every turn), relayed by the proxy.
    upstream.add(
        tool_reply(("call_fixed", "add", '{"a": 2, "b": 3}')),
        tool_reply(("call_fixed", "add", '{"a": 5, "b": 4}')),
        text_reply("2+3+4 = ", "9."),
    )
    agent = ta.Agent(name="calc", model=chat(litellm_proxy, "upstream"), tools=[add])
    with trio.fail_after(60):
        result = await ta.run(agent, "what is 2+3+4?")
    result.raise_for_status()
    assert result.final_output == "2+3+4 = 9."
    calls = [item.call_id for item in result.new_items if isinstance(item, ToolCall)]
    assert calls == ["call_fixed", "call_fixed_2"]
    assert len(upstream.requests) == 3
    # What LiteLLM forwarded of our conversation is still accepted by the strictest
    # servers' rules (llama-cpp-python, Ollama, llama.cpp).
    forwarded = upstream.requests[-1]
    for name, validate in STRICT_SERVERS.items():
        assert validate(forwarded) is None, name
    roles = [m["role"] for m in forwarded.json["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool"] or roles == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]


async def test_cancel_through_the_proxy_closes_our_socket(
    litellm_proxy: Proxy, upstream: SSEServer
) -> None:
    upstream.add(text_reply("Partial ", "answer", end="hold"))
    agent = ta.Agent(name="a", model=chat(litellm_proxy, "upstream"))
    with trio.fail_after(60):
        async with ta.open_run(agent, "hi") as run:
            async for event in run.events():
                if isinstance(event, ta.ResponseTextDelta) and event.text == "answer":
                    run.cancel("user pressed stop")
        # The proxy notices our disconnect and drops its upstream stream too.
        await upstream.connections[0].closed.wait()
    assert run.result is not None
    assert run.result.status == "cancelled"


async def test_responses_api_through_the_proxy(litellm_proxy: Proxy, upstream: SSEServer) -> None:
    upstream.add(
        ResponseScript()
        .start()
        .reasoning("rs_1", "Add them.", encrypted="enc-1")
        .function_call("call_1", "add", '{"a": 2, ', '"b": 3}')
        .completed(30, 10)
        .reply(),
        text_response("It is ", "5."),
    )
    model = OpenAIResponsesModel(
        "upstream", base_url=litellm_proxy.base_url, api_key=litellm_proxy.key
    )
    agent = ta.Agent(name="calc", model=model, tools=[add])
    with trio.fail_after(60):
        result = await ta.run(agent, "what is 2+3?")
    result.raise_for_status()
    assert result.final_output == "It is 5."
    second = upstream.requests[-1].json["input"]
    kinds = [entry.get("type", entry.get("role")) for entry in second]
    assert kinds == ["user", "reasoning", "function_call", "function_call_output"]
    assert [r for r in result.new_items if isinstance(r, ToolResult)] == [ToolResult("call_1", "5")]


async def test_httpx_client_given_is_left_open(litellm_proxy: Proxy) -> None:
    async with httpx.AsyncClient() as client:
        with trio.fail_after(60):
            events = await collect(chat(litellm_proxy, client=client))
        assert not client.is_closed
    assert events[-1] == Finish("stop")


async def test_anthropic_cache_figures_through_the_proxy(
    litellm_proxy: Proxy, upstream: SSEServer
) -> None:
    # The proxy turns Anthropic's cache figures (100 uncached input tokens, 800 read
    # from the cache, 50 written to it) into its own Chat Completions usage; ours reads
    # them back: every input token counted, the reads and the writes among them.
    upstream.add(
        Reply(
            events=[
                message_start(
                    input_tokens=100, cache_read_input_tokens=800, cache_creation_input_tokens=50
                ),
                *text_block(0, "cached"),
                *message_end(output_tokens=20),
            ]
        )
    )
    agent = ta.Agent(name="a", model=chat(litellm_proxy, "claude-upstream"))
    with trio.fail_after(60):
        result = await ta.run(agent, "hi")
    assert result.final_output == "cached"
    assert upstream.requests[-1].path.endswith("/v1/messages")  # Anthropic's API upstream
    assert result.usage == Usage(950, 20, cache_read_tokens=800, cache_write_tokens=50)
