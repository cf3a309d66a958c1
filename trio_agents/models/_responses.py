"""``OpenAIResponsesModel``: the OpenAI Responses API over httpx, streamed.

Speaks ``POST {base_url}/responses`` with ``"stream": true``: the API OpenAI's own SDKs
and the OpenAI Agents SDK default to, also served by Ollama, vLLM and LiteLLM proxies.
See :mod:`._http` for retries, client ownership and stream closing.

**The conversation is ours.** Every request sends the whole conversation as ``input``
items (``previous_response_id`` is not used), so runs, sessions, injections and
cancellation repairs work exactly as with the other providers, and ``store: false``
(nothing kept at the provider) works too.

**Reasoning items.** A reasoning model's output starts with ``reasoning`` items, and
OpenAI asks for them to be sent back with the function calls they led to — between a
call and its result the model would otherwise lose its chain of thought. The
conversation's four item types have no place for them, and adding one would touch every
provider, the run core and every session store. So the model keeps them itself: each
reasoning item is remembered (in a bounded, least-recently-used map on the model) under
the id of the function call that follows it, and when a request contains that call,
its reasoning goes back right before it. Function calls are sent without their
server-side ``fc_`` ids, so a call whose reasoning is not known — the process restarted,
the conversation came from a session or another model — is still valid input; the model
just does without that reasoning. Reasoning that led to a final answer is not kept:
OpenAI drops reasoning from turns before the last user message anyway.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from .._exceptions import ModelError
from .._items import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from .._model import Finish, TextDelta, ToolCallDone, ToolSpec, Usage
from ._call_ids import CallIds
from ._error_bodies import parse_error_body
from ._http import (
    HTTPStreamingModel,
    bearer_headers,
    cached_tokens,
    check_count,
    prompt_cache_key,
    take_cache,
    take_native_output,
)
from ._model_stream import HTTPRequestSpec
from ._sse import SSEEvent, parse_json_event

if TYPE_CHECKING:
    from .._model import ModelEvent, ModelRequest, OutputSpec

__all__ = [
    "INCOMPLETE_REASONS",
    "OpenAIResponsesModel",
    "responses_input",
    "responses_text_format",
    "responses_tools",
]

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"
_PROVIDER: Final = "openai-responses"

INCOMPLETE_REASONS: Final[Mapping[str, str]] = {
    "max_output_tokens": "length",
    "content_filter": "content_filter",
}
"""``incomplete_details.reason`` of an incomplete response -> the
:class:`~trio_agents.models.Finish` reason (others pass through unchanged)."""

_RETRYABLE_CODES: Final = frozenset({"server_error", "rate_limit_exceeded", "internal_error"})
"""Error codes in a stream (``error``, ``response.failed``) worth asking again for."""

ENCRYPTED_REASONING: Final = "reasoning.encrypted_content"


Reasoning = Callable[[str], Sequence[Mapping[str, Any]]]
"""Looks up the reasoning items that preceded a function call, by its call id."""


def responses_input(
    items: Iterable[Item], *, reasoning: Reasoning | None = None
) -> list[dict[str, Any]]:
    """Convert a conversation to Responses API ``input`` items.

    User and assistant messages become ``{"role": ..., "content": text}`` (empty
    assistant text is left out), tool calls ``function_call`` items and tool results
    ``function_call_output`` items (their output is the result's text, whatever its
    status). ``reasoning(call_id)`` gives the reasoning items to send right before a
    call.
    """
    out: list[dict[str, Any]] = []
    for item in items:
        if isinstance(item, UserMessage):
            out.append({"role": "user", "content": item.content})
        elif isinstance(item, AssistantMessage):
            if item.content:
                out.append({"role": "assistant", "content": item.content})
        elif isinstance(item, ToolCall):
            if reasoning is not None:
                out.extend(dict(entry) for entry in reasoning(item.call_id))
            out.append(
                {
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                }
            )
        elif isinstance(item, ToolResult):
            out.append(
                {"type": "function_call_output", "call_id": item.call_id, "output": item.output}
            )
        else:
            raise TypeError(f"not a conversation item: {item!r}")
    return out


def responses_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Convert tool specs to Responses API function tools.

    ``strict`` is sent as ``false``: the Responses API makes function tools strict by
    default, and strict mode rejects schemas with optional parameters, which ordinary
    Python signatures have.
    """
    return [
        {
            "type": "function",
            "name": spec.name,
            "description": spec.description,
            "parameters": dict(spec.parameters),
            "strict": False,
        }
        for spec in tools
    ]


def responses_text_format(output: OutputSpec) -> dict[str, Any]:
    """The Responses API ``text.format`` asking for JSON matching ``output``."""
    fmt: dict[str, Any] = {
        "type": "json_schema",
        "name": output.name,
        "schema": dict(output.schema),
        "strict": output.strict,
    }
    if output.description:
        fmt["description"] = output.description
    return fmt


@final
class _ReasoningMemory:
    """Reasoning items by the call id of the function call that followed them (LRU)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, tuple[Mapping[str, Any], ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def remember(self, call_id: str, items: Sequence[Mapping[str, Any]]) -> None:
        if self._capacity == 0:
            return
        self._entries[call_id] = tuple(items)
        self._entries.move_to_end(call_id)
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    def recall(self, call_id: str) -> tuple[Mapping[str, Any], ...]:
        items = self._entries.get(call_id, ())
        if items:
            self._entries.move_to_end(call_id)
        return items


@attrs.define
class _Call:
    call_id: str
    name: str
    arguments: list[str] = attrs.field(factory=list)
    final_arguments: str | None = None
    emitted: bool = False


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@final
class _ResponsesStreamParser:
    """Responses API events -> model events.

    Text (and refusal) deltas are yielded as they come; a function call when its
    ``response.output_item.done`` arrives (arguments from the streamed deltas, or the
    item's own); the usage and the finish reason at the terminal
    ``response.completed`` / ``response.incomplete``; ``response.failed`` and ``error``
    raise. Reasoning items are remembered for the call that follows them.
    """

    def __init__(self, call_ids: CallIds, memory: _ReasoningMemory) -> None:
        self._call_ids = call_ids
        self._memory = memory
        self._calls: dict[int, _Call] = {}
        self._called = 0
        self._reasoning: list[Mapping[str, Any]] = []
        self._text_items: set[str] = set()
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def at_eof(self) -> list[ModelEvent] | None:
        return None  # the API always ends with a terminal response.* event

    def feed(self, event: SSEEvent) -> list[ModelEvent]:
        if event.data.strip() == "[DONE]":
            # Not part of the Responses format, but some proxies end with it; after a
            # terminal event it is never seen (anything after the end is ignored).
            self._done = True
            return self._terminal(None, None)
        data = parse_json_event(_PROVIDER, event)
        kind = data.get("type") or event.event
        if kind == "message" and isinstance(data.get("error"), dict):
            kind = "error"  # a Chat-style error object (LiteLLM's proxy sends these)
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            delta = _str(data.get("delta"))
            item_id = _str(data.get("item_id"))
            if item_id:
                self._text_items.add(item_id)
            return [TextDelta(delta)] if delta else []
        if kind == "response.function_call_arguments.delta":
            self._call_for(data, event).arguments.append(_str(data.get("delta")) or "")
            return []
        if kind == "response.function_call_arguments.done":
            self._call_for(data, event).final_arguments = _str(data.get("arguments"))
            return []
        if kind == "response.output_item.added":
            return self._item_added(data)
        if kind == "response.output_item.done":
            return self._item_done(data)
        if kind in ("response.completed", "response.incomplete"):
            self._done = True
            response = data.get("response")
            return self._terminal(kind, response if isinstance(response, dict) else None)
        if kind == "response.failed":
            response = data.get("response")
            error = response.get("error") if isinstance(response, dict) else None
            raise self._error("the response failed", error if isinstance(error, dict) else {})
        if kind == "error":
            nested = data.get("error")
            fields = {key: data.get(key) for key in ("code", "message", "param")}
            error = nested if isinstance(nested, dict) else fields  # its "type" is "error"
            raise self._error("the server sent an error in the stream", error)
        return []  # created, in_progress, content parts, reasoning summaries, ...

    # -- items

    def _item_added(self, data: Mapping[str, Any]) -> list[ModelEvent]:
        item = data.get("item")
        index = _int(data.get("output_index"))
        if not isinstance(item, dict) or item.get("type") != "function_call" or index is None:
            return []
        call_id = _str(item.get("call_id")) or _str(item.get("id")) or f"call_{index}"
        call = _Call(call_id, _str(item.get("name")) or "")
        initial = _str(item.get("arguments"))
        if initial:
            call.arguments.append(initial)
        self._calls[index] = call
        return []

    def _item_done(self, data: Mapping[str, Any]) -> list[ModelEvent]:
        item = data.get("item")
        if not isinstance(item, dict):
            return []
        kind = item.get("type")
        if kind == "reasoning":
            # The done item is the complete one (its encrypted_content included).
            self._reasoning.append(item)
            return []
        if kind == "message":
            return self._unstreamed_text(item)
        if kind != "function_call":
            return []
        index = _int(data.get("output_index"))
        call = self._calls.get(index) if index is not None else None
        if call is None:
            call = _Call(_str(item.get("call_id")) or "", "")
            self._calls[-1 - len(self._calls)] = call
        call.call_id = _str(item.get("call_id")) or call.call_id
        call.name = _str(item.get("name")) or call.name
        if isinstance(item.get("arguments"), str):
            call.final_arguments = item["arguments"]
        return self._emit(call)

    def _unstreamed_text(self, item: Mapping[str, Any]) -> list[ModelEvent]:
        """A message item whose text never came as deltas (a minimal server)."""
        if _str(item.get("id")) in self._text_items:
            return []
        content = item.get("content")
        parts = content if isinstance(content, list) else []
        text = "".join(
            part.get("text") or part.get("refusal") or ""
            for part in parts
            if isinstance(part, dict) and part.get("type") in ("output_text", "refusal")
        )
        return [TextDelta(text)] if text else []

    def _emit(self, call: _Call) -> list[ModelEvent]:
        if call.emitted:
            return []
        if not call.name:
            raise ModelError(f"{_PROVIDER}: function call {call.call_id!r} has no name")
        call.emitted = True
        self._called += 1
        arguments = call.final_arguments
        if arguments is None:
            arguments = "".join(call.arguments)
        call_id = self._call_ids.unique(call.call_id or f"call_{self._called}")
        if self._reasoning:
            self._memory.remember(call_id, self._reasoning)
            self._reasoning = []
        return [ToolCallDone(ToolCall(call_id, call.name, arguments or "{}"))]

    def _call_for(self, data: Mapping[str, Any], event: SSEEvent) -> _Call:
        index = _int(data.get("output_index"))
        call = self._calls.get(index) if index is not None else None
        if call is None:
            item_id = _str(data.get("item_id"))
            raise ModelError(
                f"{_PROVIDER}: arguments for a function call that was never added"
                f" (item {item_id!r}): {event.data[:300]!r}"
            )
        return call

    # -- the end

    def _terminal(self, kind: str | None, response: Mapping[str, Any] | None) -> list[ModelEvent]:
        out: list[ModelEvent] = []
        for index in sorted(self._calls):  # calls a server never marked done
            call = self._calls[index]
            if not call.emitted and call.name:
                out.extend(self._emit(call))
        usage = response.get("usage") if response is not None else None
        if isinstance(usage, dict):
            input_tokens = _int(usage.get("input_tokens"))
            output_tokens = _int(usage.get("output_tokens"))
            if input_tokens is not None or output_tokens is not None:
                cached = cached_tokens(usage, "input_tokens_details")
                out.append(Usage(input_tokens or 0, output_tokens or 0, cache_read_tokens=cached))
        if kind == "response.incomplete":
            details = response.get("incomplete_details") if response is not None else None
            reason = _str(details.get("reason")) if isinstance(details, dict) else None
            reason = reason or "incomplete"
            out.append(Finish(INCOMPLETE_REASONS.get(reason, reason)))
        else:
            out.append(Finish("tool_calls" if self._called else "stop"))
        return out

    def _error(self, what: str, error: Mapping[str, Any]) -> ModelError:
        info = parse_error_body(json.dumps({"error": dict(error)}).encode())
        code = error.get("code")
        retryable = code in _RETRYABLE_CODES and not info.permanent
        return ModelError(
            f"{_PROVIDER}: {what}: {info.describe() or 'no details'}", retryable=retryable
        )


@final
class OpenAIResponsesModel(HTTPStreamingModel):
    """A model served over the OpenAI Responses API, streamed.

    Works with OpenAI and servers that implement ``/v1/responses`` (Ollama, vLLM,
    LiteLLM proxies). Each call is a streaming ``POST {base_url}/responses`` carrying
    the whole conversation (``previous_response_id`` is not used). Reasoning items are
    kept by the model and sent back with the function calls they led to (see
    docs/models.md, "The Responses API"); with ``store=False`` the request asks for
    ``include=["reasoning.encrypted_content"]`` so they can be.

    Args:
        model: the model name (``"gpt-5-mini"``, ``"o4-mini"``, ...).
        base_url: the API root, default ``$OPENAI_BASE_URL`` or
            ``https://api.openai.com/v1``; a pasted ``.../responses`` URL is accepted
            too.
        api_key: default ``$OPENAI_API_KEY``, read at each call; sent as a bearer
            token (left out when there is none, fine for local servers).
        client, max_retries, connect_timeout, retry_base_delay, retry_max_delay, rate_limit:
            as for every HTTP provider (docs/models.md, "HTTP behaviour").
        native_output: ask for structured output natively (a JSON-schema ``text.format``);
            False makes a run with an ``output_type`` use the ``final_answer`` tool
            instead, for servers that do not support the format.
        reasoning_memory: how many calls' reasoning items to keep (0: none).
        **settings: request body fields (``max_output_tokens``, ``reasoning``,
            ``store``, ``temperature``, ...); ``request.settings`` override them.
    """

    _provider = _PROVIDER
    _api_key_env = "OPENAI_API_KEY"
    _base_url_env = "OPENAI_BASE_URL"
    _default_base_url = DEFAULT_BASE_URL
    _prices_provider = "openai"

    def _configure(self, settings: dict[str, Any]) -> None:
        memory = check_count("reasoning_memory", settings.pop("reasoning_memory", 4096), 0)
        # Read by the run (docs/output.md): True means request.output is honoured here.
        self.native_output = take_native_output(settings)
        self._memory = _ReasoningMemory(memory)

    def _api_root(self, base_url: str) -> str:
        return base_url.removesuffix("/responses")

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (settings merged: constructor, then request)."""
        settings = {**self._settings, **request.settings}
        key = prompt_cache_key(take_cache(settings), self._model, request)
        if key is not None:
            settings.setdefault("prompt_cache_key", key)  # an explicit one wins
        stored = settings.get("store", True) is not False
        if not stored:
            # Without storage, reasoning can only be sent back in its encrypted form.
            include = list(settings.get("include") or ())
            if ENCRYPTED_REASONING not in include:
                settings["include"] = [*include, ENCRYPTED_REASONING]

        def reasoning(call_id: str) -> list[Mapping[str, Any]]:
            items = self._memory.recall(call_id)
            # An unstored reasoning item without its encrypted content cannot be
            # referred to (the API answers 404 for its id): leave it out.
            return [item for item in items if stored or item.get("encrypted_content")]

        body: dict[str, Any] = {"model": self._model, **settings}
        if request.instructions:
            body["instructions"] = request.instructions
        body["input"] = responses_input(request.items, reasoning=reasoning)
        if request.tools:
            body["tools"] = responses_tools(request.tools)
        if request.output is not None and self.native_output:
            # Merged into a "text" setting (verbosity, ...); an explicit format wins.
            text = dict(body.get("text") or {})
            text.setdefault("format", responses_text_format(request.output))
            body["text"] = text
        body["stream"] = True
        return body

    def _build_request(self, request: ModelRequest) -> HTTPRequestSpec:
        headers = bearer_headers(self._current_api_key())
        return HTTPRequestSpec(
            url=f"{self._base_url}/responses", headers=headers, body=self.request_body(request)
        )

    def _new_parser(self, call_ids: CallIds) -> _ResponsesStreamParser:
        return _ResponsesStreamParser(call_ids, self._memory)
