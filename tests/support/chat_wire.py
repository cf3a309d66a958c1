"""The Chat Completions SSE wire format, as OpenAI sends it, for the loopback tests."""

from __future__ import annotations

from typing import Any

from tests.support.sse_server import SSE, Raw, Reply

__all__ = ["DONE", "chunk", "text_reply", "tool_reply", "usage_chunk"]

DONE = SSE("[DONE]")


def chunk(
    content: str | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str | None = None,
    role: str | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` as OpenAI sends it."""
    delta: dict[str, Any] = {}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-test",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": None,
    }


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    """The final chunk ``stream_options.include_usage`` asks for."""
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-test",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def text_reply(*parts: str, **kwargs: Any) -> Reply:
    events: list[SSE | Raw] = [SSE(chunk("", role="assistant"))]
    events += [SSE(chunk(part)) for part in parts]
    events += [SSE(chunk(finish="stop")), SSE(usage_chunk(9, len(parts))), DONE]
    return Reply(events=events, **kwargs)


def tool_reply(*calls: tuple[str, str, str], finish: str = "tool_calls") -> Reply:
    """A response with whole tool calls ``(call_id, name, arguments)``, one per chunk."""
    events: list[SSE | Raw] = [SSE(chunk(role="assistant", content=None))]
    for index, (call_id, name, arguments) in enumerate(calls):
        fragment = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        events.append(SSE(chunk(tool_calls=[fragment])))
    events += [SSE(chunk(finish=finish)), SSE(usage_chunk(20, 5)), DONE]
    return Reply(events=events)
