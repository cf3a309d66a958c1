"""The Chat Completions SSE wire format, as OpenAI sends it, for the loopback tests."""

from __future__ import annotations

from typing import Any

from tests.support.sse_server import SSE, Raw, Reply

__all__ = ["DONE", "cached_reply", "chunk", "text_reply", "tool_reply", "usage_chunk"]

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


def usage_chunk(prompt: int, completion: int, cached: int | None = None) -> dict[str, Any]:
    """The final chunk ``stream_options.include_usage`` asks for (with OpenAI's
    ``prompt_tokens_details.cached_tokens`` when ``cached`` is given)."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached, "audio_tokens": 0}
        usage["completion_tokens_details"] = {"reasoning_tokens": 0, "audio_tokens": 0}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "gpt-test",
        "choices": [],
        "usage": usage,
    }


def text_reply(*parts: str, **kwargs: Any) -> Reply:
    events: list[SSE | Raw] = [SSE(chunk("", role="assistant"))]
    events += [SSE(chunk(part)) for part in parts]
    events += [SSE(chunk(finish="stop")), SSE(usage_chunk(9, len(parts))), DONE]
    return Reply(events=events, **kwargs)


def cached_reply(text: str, prompt: int, completion: int, cached: int) -> Reply:
    """A text answer whose usage says ``cached`` of its ``prompt`` tokens were read
    from the prompt cache."""
    events: list[SSE | Raw] = [SSE(chunk("", role="assistant")), SSE(chunk(text))]
    events += [SSE(chunk(finish="stop")), SSE(usage_chunk(prompt, completion, cached)), DONE]
    return Reply(events=events)


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
