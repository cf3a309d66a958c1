"""Replay: send a recorded model request again (DESIGN §23).

A run started with ``record_requests=True`` keeps each request it sends in its event log
(``model.request``, :class:`~trio_agents.ModelRequestEvent`). :func:`replay` sends one
of them again — to the model that answered it or to another — and returns the response
assembled from its stream, for a side-by-side comparison. Nothing else happens: no run,
no tools called, no session written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import trio

from ._events import ModelRequestEvent
from ._exceptions import ModelError
from ._items import ToolCall
from ._model import (
    Finish,
    Model,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCallDone,
    Usage,
    model_strings,
)

__all__ = ["ModelResponse", "replay"]


@attrs.frozen
class ModelResponse:
    """A model's response to one request, assembled from its stream (what
    :func:`replay` returns).

    Attributes:
        text: the text it streamed, joined.
        tool_calls: the tool calls it made, in order.
        usage: the usage it reported (the sum, when it reported several), or None.
        finish_reason: its :class:`~trio_agents.models.Finish` reason, or None.
        events: every model event of the stream, in order.
    """

    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: Usage | None
    finish_reason: str | None
    events: tuple[ModelEvent, ...]

    def to_json(self) -> dict[str, Any]:
        """Return the response as a JSON-compatible dict (without ``events``)."""
        return {
            "text": self.text,
            "tool_calls": [call.to_json() for call in self.tool_calls],
            "usage": None if self.usage is None else self.usage.to_json(),
            "finish_reason": self.finish_reason,
        }


async def replay(
    request: ModelRequest | ModelRequestEvent | Mapping[str, Any], *, model: Model | str
) -> ModelResponse:
    """Send a recorded model request again and return the response.

    ``request`` is a :class:`~trio_agents.models.ModelRequest`, a ``model.request``
    event (:class:`ModelRequestEvent`, or its JSON as a face served it), or a request's
    JSON (:meth:`ModelRequest.to_json <trio_agents.models.ModelRequest.to_json>`).
    ``model`` is any model, or a model string as ``Agent(model=...)`` takes: the same
    model the request was recorded with, or another one. The request is sent as it was
    (its instructions, items, tools, settings and output spec): a provider writes the
    same HTTP request body for it. Cancellable like any model call (leaving closes the
    stream).

    Raises:
        ValueError: ``request`` is an event whose request was not recorded (too large,
            or not JSON), or is not a request.
        TypeError: ``model`` is neither a model nor a string.
        ModelError: the model failed, or yielded an event that is no model event.
    """
    resolved = _model(model)
    sent = _request(request)
    text: list[str] = []
    calls: list[ToolCall] = []
    events: list[ModelEvent] = []
    usage: Usage | None = None
    finish: str | None = None
    async with resolved.stream(sent) as stream:
        async for event in stream:
            if isinstance(event, TextDelta):
                text.append(event.text)
            elif isinstance(event, ToolCallDone):
                calls.append(event.call)
            elif isinstance(event, Usage):
                usage = event if usage is None else usage + event
            elif isinstance(event, Finish):
                finish = event.reason
            else:
                raise ModelError(f"model yielded an unknown event: {event!r:.200}")
            events.append(event)
    await trio.lowlevel.checkpoint()
    return ModelResponse("".join(text), tuple(calls), usage, finish, tuple(events))


def _model(model: Model | str) -> Model:
    if isinstance(model, str):
        return model_strings().resolve(model)
    if not isinstance(model, Model):
        raise TypeError(f"model must be a Model or a model string, not {type(model).__name__}")
    return model


def _request(request: ModelRequest | ModelRequestEvent | Mapping[str, Any]) -> ModelRequest:
    if isinstance(request, ModelRequest):
        return request
    if isinstance(request, Mapping) and request.get("type") == ModelRequestEvent.type:
        request = ModelRequestEvent.from_json(request)
    if isinstance(request, ModelRequestEvent):
        if request.request is None:
            raise ValueError(
                f"the request of turn {request.turn} of run {request.run_id} was not"
                f" recorded ({request.omitted}; {request.size} bytes)"
            )
        return request.request
    if isinstance(request, Mapping):
        return ModelRequest.from_json(request)
    raise ValueError(
        "request must be a ModelRequest, a model.request event or its JSON,"
        f" not {type(request).__name__}"
    )
