"""The Anthropic Messages API streaming wire format, for the loopback tests: the events
of one message, built by the piece (``message_start``, content blocks, the end)."""

from __future__ import annotations

from typing import Any

from tests.support.sse_server import SSE, Reply


def event(kind: str, **fields: Any) -> SSE:
    """One Messages API event: ``event: <kind>`` plus its JSON data."""
    return SSE({"type": kind, **fields}, event=kind)


def message_start(input_tokens: int = 25, **usage: int) -> SSE:
    return event(
        "message_start",
        message={
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "claude-test",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1, **usage},
        },
    )


def text_block(index: int, *parts: str) -> list[SSE]:
    return [
        event("content_block_start", index=index, content_block={"type": "text", "text": ""}),
        *[
            event("content_block_delta", index=index, delta={"type": "text_delta", "text": part})
            for part in parts
        ],
        event("content_block_stop", index=index),
    ]


def tool_block(index: int, call_id: str, name: str, *parts: str) -> list[SSE]:
    block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    return [
        event("content_block_start", index=index, content_block=block),
        *[
            event(
                "content_block_delta",
                index=index,
                delta={"type": "input_json_delta", "partial_json": part},
            )
            for part in parts
        ],
        event("content_block_stop", index=index),
    ]


def message_end(stop_reason: str = "end_turn", output_tokens: int = 12) -> list[SSE]:
    return [
        event(
            "message_delta",
            delta={"stop_reason": stop_reason, "stop_sequence": None},
            usage={"output_tokens": output_tokens},
        ),
        event("message_stop"),
    ]


def text_reply(*parts: str, **kwargs: Any) -> Reply:
    """A whole text answer; ``kwargs`` go to :class:`Reply` (drops, delays, ...)."""
    return Reply(events=[message_start(), *text_block(0, *parts), *message_end()], **kwargs)
