"""The three streaming providers, each with its loopback wire format, behind one face:
for the provider conformance suite (tests/models/test_provider_conformance.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

import attrs
import httpx

from tests.support import anthropic_wire, chat_wire
from tests.support.responses_wire import ResponseScript, text_response, tool_response
from tests.support.sse_server import SSE, Reply, SSEServer
from trio_agents import Usage
from trio_agents.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel


@attrs.frozen
class Wire:
    name: str
    # The model on a server (``base_url`` as its users write it), with the given options.
    model_on: Callable[..., Any]
    # A whole text answer streamed in ``parts``; keyword arguments go to Reply.
    text: Callable[..., Reply]
    # Streams ``parts`` and then keeps the response open.
    held: Callable[..., Reply]
    # Headers sent, then the connection drops before any output.
    dropped_before_output: Callable[[], Reply]
    # The provider's JSON error body carrying ``message``.
    error_body: Callable[[str], dict[str, Any]]
    # The request path for the server's base URL, how many events ``text`` sends before
    # the first part, and the usage it reports for three parts.
    path: str
    events_before_text: int
    text_usage: Usage
    # A whole answer of one tool call (call id, tool name, arguments).
    call: Callable[[str, str, str], Reply]
    # A text answer ("cached") whose usage reports prompt-cache figures in the
    # provider's own fields, and the Usage they come to.
    cached: Callable[[], Reply]
    cached_usage: Usage
    # How many runs the pool test cancels (each is a whole run: keep the suite fast).
    cancelled_runs: int = 200

    def model(self, server: SSEServer, **options: Any) -> Any:
        return self.model_on(server.base_url, **options)


def _openai_error(message: str) -> dict[str, Any]:
    return {"error": {"message": message}}


WIRES: Final = {
    "chat": Wire(
        "chat",
        lambda base, **o: OpenAIChatModel("gpt-test", base_url=f"{base}/v1", **o),
        chat_wire.text_reply,
        lambda *parts: Reply(events=[SSE(chat_wire.chunk(p)) for p in parts], end="hold"),
        lambda: Reply(events=[SSE(chat_wire.chunk("x"))], drop_after=0),
        _openai_error,
        "/v1/chat/completions",
        1,
        Usage(9, 3),
        lambda *call: chat_wire.tool_reply(call),
        # usage.prompt_tokens_details.cached_tokens: prompt_tokens counts them already.
        lambda: chat_wire.cached_reply("cached", 2006, 300, 1920),
        Usage(2006, 300, cache_read_tokens=1920),
        cancelled_runs=1000,
    ),
    "responses": Wire(
        "responses",
        lambda base, **o: OpenAIResponsesModel("gpt-test", base_url=f"{base}/v1", **o),
        text_response,
        lambda *parts: ResponseScript().start().message(*parts).reply(end="hold"),
        lambda: ResponseScript().start().reply(drop_after=1),
        _openai_error,
        "/v1/responses",
        4,
        Usage(9, 3, cache_read_tokens=0),  # the API always sends cached_tokens
        tool_response,
        # usage.input_tokens_details.cached_tokens: input_tokens counts them already.
        lambda: ResponseScript().start().message("cached").completed(2006, 300, 1920).reply(),
        Usage(2006, 300, cache_read_tokens=1920),
    ),
    "anthropic": Wire(
        "anthropic",
        lambda base, **o: AnthropicModel("claude-test", base_url=base, **o),
        anthropic_wire.text_reply,
        # The text block's start and deltas, never its stop.
        lambda *parts: Reply(
            events=[anthropic_wire.message_start(), *anthropic_wire.text_block(0, *parts)[:-1]],
            end="hold",
        ),
        lambda: anthropic_wire.text_reply("x", drop_after=0),
        lambda message: {"type": "error", "error": {"type": "api_error", "message": message}},
        "/v1/messages",
        2,
        Usage(25, 12),
        lambda *call: Reply(
            events=[
                anthropic_wire.message_start(),
                *anthropic_wire.tool_block(0, *call),
                *anthropic_wire.message_end("tool_use"),
            ]
        ),
        # Anthropic's input_tokens leaves the cache reads and writes out: ours counts
        # all three (50 + 1800 + 156).
        lambda: Reply(
            events=[
                anthropic_wire.message_start(
                    50, cache_read_input_tokens=1800, cache_creation_input_tokens=156
                ),
                *anthropic_wire.text_block(0, "cached"),
                *anthropic_wire.message_end(output_tokens=300),
            ]
        ),
        Usage(2006, 300, cache_read_tokens=1800, cache_write_tokens=156),
    ),
}


class RoutedTransport(httpx.AsyncBaseTransport):
    """Sends every request to ``server`` whatever its host (like a DNS override), over
    a real loopback socket: a model keeps the provider's default base URL, so it is
    priced as the provider's, while a test script answers it."""

    def __init__(self, server: SSEServer) -> None:
        self._server = httpx.URL(server.base_url)
        self._inner = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        request.url = request.url.copy_with(
            scheme=self._server.scheme, host=self._server.host, port=self._server.port
        )
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
