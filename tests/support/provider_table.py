"""The HTTP providers as a table, for the suites that run against every one of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

import trio_agents as ta
from tests.support.chat_wire import text_reply as chat_text_reply
from tests.support.responses_wire import text_response
from tests.support.sse_server import SSE, Reply
from trio_agents.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

__all__ = ["PROVIDERS", "REQUEST", "Provider"]

REQUEST = ta.ModelRequest(instructions="", items=(ta.UserMessage("hi"),), tools=())


def _anthropic_reply() -> Reply:
    def event(kind: str, **fields: Any) -> SSE:
        return SSE({"type": kind, **fields}, event=kind)

    message = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    return Reply(
        events=[
            event("message_start", message={**message, "usage": {"input_tokens": 1}}),
            event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            event("content_block_delta", index=0, delta={"type": "text_delta", "text": "ok"}),
            event("content_block_stop", index=0),
            event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 1}),
            event("message_stop"),
        ]
    )


@attrs.frozen
class Provider:
    prefix: str
    cls: type[Any]
    key_env: str
    base_env: str
    path: str  # the request path for a base URL of "<server>/v1"
    reply: Callable[[], Reply]
    key_header: str
    key_value: Callable[[str], str]
    # A complete, non-streamed answer: what a server that ignores "stream": true sends.
    whole: dict[str, Any]


PROVIDERS = {
    "openai": Provider(
        "openai",
        OpenAIChatModel,
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "/v1/chat/completions",
        lambda: chat_text_reply("ok"),
        "authorization",
        lambda key: f"Bearer {key}",
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}],
        },
    ),
    "openai-responses": Provider(
        "openai-responses",
        OpenAIResponsesModel,
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "/v1/responses",
        lambda: text_response("ok"),
        "authorization",
        lambda key: f"Bearer {key}",
        {"id": "resp_1", "object": "response", "status": "completed", "output": []},
    ),
    "anthropic": Provider(
        "anthropic",
        AnthropicModel,
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_BASE_URL",
        "/v1/messages",
        _anthropic_reply,
        "x-api-key",
        lambda key: key,
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "Hi"}],
            "stop_reason": "end_turn",
        },
    ),
}
