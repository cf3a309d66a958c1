"""The OpenAI Responses API streaming wire format, for the loopback tests.

As OpenAI documents it (API reference, "Streaming events"): every event is an SSE event
whose ``event:`` line and JSON ``type`` name it, with an increasing
``sequence_number``; a response opens with ``response.created`` and
``response.in_progress``, each output item is framed by ``response.output_item.added``
and ``response.output_item.done`` (the done item is the complete one: text, arguments,
a reasoning item's ``encrypted_content``), text comes as ``response.output_text.delta``
inside a content part, function-call arguments as
``response.function_call_arguments.delta`` then ``.done``, and the stream ends with
``response.completed``, ``response.incomplete`` or ``response.failed`` (no
``[DONE]``). Errors mid-stream are ``{"type": "error", "code", "message", "param"}``.
"""

from __future__ import annotations

from typing import Any

import attrs

from tests.support.sse_server import SSE, Raw, Reply

__all__ = ["ResponseScript", "text_response", "tool_response"]


@attrs.define
class ResponseScript:
    """Builds one streamed response, event by event."""

    response_id: str = "resp_1"
    model: str = "gpt-test"
    events: list[SSE | Raw] = attrs.field(factory=list)
    output: list[dict[str, Any]] = attrs.field(factory=list)
    _sequence: int = 0

    def event(self, kind: str, **fields: Any) -> ResponseScript:
        self.events.append(SSE({"type": kind, "sequence_number": self._sequence, **fields}, kind))
        self._sequence += 1
        return self

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        return {
            "id": self.response_id,
            "object": "response",
            "created_at": 1700000000,
            "status": status,
            "model": self.model,
            "output": list(self.output),
            "error": None,
            "incomplete_details": None,
            "usage": None,
            **extra,
        }

    def start(self) -> ResponseScript:
        self.event("response.created", response=self._response("in_progress"))
        return self.event("response.in_progress", response=self._response("in_progress"))

    def reasoning(
        self, item_id: str, summary: str, encrypted: str | None = "gAAA"
    ) -> ResponseScript:
        index = len(self.output)
        added = {"id": item_id, "type": "reasoning", "summary": []}
        self.event("response.output_item.added", output_index=index, item=added)
        part = {"type": "summary_text", "text": ""}
        self.event(
            "response.reasoning_summary_part.added",
            item_id=item_id,
            output_index=index,
            summary_index=0,
            part=part,
        )
        self.event(
            "response.reasoning_summary_text.delta",
            item_id=item_id,
            output_index=index,
            summary_index=0,
            delta=summary,
        )
        done: dict[str, Any] = {
            "id": item_id,
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": summary}],
        }
        if encrypted is not None:
            done["encrypted_content"] = encrypted
        self.output.append(done)
        return self.event("response.output_item.done", output_index=index, item=done)

    def message(self, *parts: str, item_id: str = "msg_1") -> ResponseScript:
        index = len(self.output)
        added = {"id": item_id, "type": "message", "status": "in_progress", "role": "assistant"}
        self.event("response.output_item.added", output_index=index, item={**added, "content": []})
        empty = {"type": "output_text", "text": "", "annotations": []}
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        self.event("response.content_part.added", **where, part=empty)
        for part in parts:
            self.event("response.output_text.delta", **where, delta=part, logprobs=[])
        text = "".join(parts)
        self.event("response.output_text.done", **where, text=text, logprobs=[])
        full = {"type": "output_text", "text": text, "annotations": []}
        self.event("response.content_part.done", **where, part=full)
        done = {**added, "status": "completed", "content": [full]}
        self.output.append(done)
        return self.event("response.output_item.done", output_index=index, item=done)

    def function_call(
        self, call_id: str, name: str, *parts: str, item_id: str | None = None
    ) -> ResponseScript:
        index = len(self.output)
        item_id = item_id or f"fc_{index}"
        base = {"id": item_id, "type": "function_call", "call_id": call_id, "name": name}
        self.event(
            "response.output_item.added",
            output_index=index,
            item={**base, "arguments": "", "status": "in_progress"},
        )
        for part in parts:
            self.event(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=part,
            )
        arguments = "".join(parts)
        self.event(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=index,
            name=name,
            arguments=arguments,
        )
        done = {**base, "arguments": arguments, "status": "completed"}
        self.output.append(done)
        return self.event("response.output_item.done", output_index=index, item=done)

    def completed(
        self, input_tokens: int | None = 12, output_tokens: int = 5, cached: int = 0
    ) -> ResponseScript:
        usage = None
        if input_tokens is not None:
            usage = {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": input_tokens + output_tokens,
            }
        return self.event("response.completed", response=self._response("completed", usage=usage))

    def incomplete(self, reason: str) -> ResponseScript:
        usage = {"input_tokens": 12, "output_tokens": 64, "total_tokens": 76}
        return self.event(
            "response.incomplete",
            response=self._response(
                "incomplete", incomplete_details={"reason": reason}, usage=usage
            ),
        )

    def failed(self, code: str, message: str) -> ResponseScript:
        error = {"code": code, "message": message}
        return self.event("response.failed", response=self._response("failed", error=error))

    def error(self, code: str, message: str) -> ResponseScript:
        return self.event("error", code=code, message=message, param=None)

    def reply(self, **kwargs: Any) -> Reply:
        return Reply(events=list(self.events), **kwargs)


def text_response(*parts: str, **kwargs: Any) -> Reply:
    """A plain text answer."""
    return ResponseScript().start().message(*parts).completed(9, len(parts)).reply(**kwargs)


def tool_response(call_id: str, name: str, arguments: str) -> Reply:
    """One function call, its arguments in one delta."""
    return ResponseScript().start().function_call(call_id, name, arguments).completed().reply()
