"""``AnthropicModel``: the Anthropic Messages API over httpx, streamed.

Speaks ``POST {base_url}/v1/messages`` with ``"stream": true``. See :mod:`._http` for
retries, client ownership and stream closing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from .._exceptions import ModelError
from .._items import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from .._model import Finish, TextDelta, ToolCallDone, ToolSpec, Usage
from ._call_ids import CallIds
from ._error_bodies import stream_error
from ._http import HTTPStreamingModel, check_count, reason_map, take_cache
from ._model_stream import HTTPRequestSpec
from ._sse import SSEEvent, parse_json_event

if TYPE_CHECKING:
    from .._model import ModelEvent, ModelRequest

__all__ = [
    "MAX_CACHE_BREAKPOINTS",
    "AnthropicModel",
    "anthropic_messages",
    "anthropic_tools",
    "normalize_base_url",
    "place_cache_breakpoints",
]

DEFAULT_BASE_URL: Final = "https://api.anthropic.com"
API_VERSION: Final = "2023-06-01"
_PROVIDER: Final = "anthropic"

STOP_REASONS: Final[Mapping[str, str]] = reason_map(
    stop=("end_turn", "stop_sequence"),
    tool_calls=("tool_use",),
    length=("max_tokens", "model_context_window_exceeded"),
    content_filter=("refusal",),
)
"""Anthropic ``stop_reason`` -> the :class:`~trio_agents.models.Finish` reason
(others pass through unchanged)."""

_RETRYABLE_ERRORS: Final = frozenset({"overloaded_error", "api_error", "rate_limit_error"})


def normalize_base_url(base_url: str) -> str:
    """The API root for ``base_url``: requests go to ``{root}/v1/messages``.

    The Anthropic SDKs take the root (``https://api.anthropic.com``), while
    OpenAI-style configuration habitually ends in ``/v1``; both are accepted, as is
    the full endpoint, instead of posting to ``/v1/v1/messages`` and getting a 404.
    """
    root = base_url.rstrip("/")
    for suffix in ("/v1/messages", "/v1"):
        if root.endswith(suffix):
            return root.removesuffix(suffix)
    return root


def _tool_input(arguments: str) -> dict[str, Any]:
    """A call's raw JSON arguments as the object ``tool_use.input`` must be.

    Arguments that are not a JSON object (the model produced bad JSON; the tool call
    then failed with an error result) are sent as ``{"_raw_arguments": "<text>"}`` so
    the model can still see what it sent.
    """
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        return {"_raw_arguments": arguments}
    if isinstance(value, dict):
        return value
    return {"_raw_arguments": arguments}


def anthropic_messages(items: Iterable[Item]) -> list[dict[str, Any]]:
    """Convert a conversation to Messages API ``messages`` (content-block lists).

    Assistant text and tool calls become ``text`` and ``tool_use`` blocks of assistant
    messages; tool results become ``tool_result`` blocks (``is_error`` unless the
    status is ``ok``) of user messages. Consecutive messages of the same role are
    merged, as the API requires alternating roles (so the results of one turn share
    one user message, followed by any user text). Empty text is left out (the API
    rejects empty text blocks), and a final assistant message loses its trailing
    whitespace (the API rejects that in a prefill).
    """
    messages: list[dict[str, Any]] = []

    def add(role: str, block: dict[str, Any]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    for item in items:
        if isinstance(item, UserMessage):
            if item.content:
                add("user", {"type": "text", "text": item.content})
        elif isinstance(item, AssistantMessage):
            if item.content:
                add("assistant", {"type": "text", "text": item.content})
        elif isinstance(item, ToolCall):
            add(
                "assistant",
                {
                    "type": "tool_use",
                    "id": item.call_id,
                    "name": item.name,
                    "input": _tool_input(item.arguments),
                },
            )
        elif isinstance(item, ToolResult):
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": item.call_id,
                "content": item.output,
            }
            if item.status != "ok":
                block["is_error"] = True
            add("user", block)
        else:
            raise TypeError(f"not a conversation item: {item!r}")
    if messages and messages[-1]["role"] == "assistant":
        last = messages[-1]["content"][-1]
        if last["type"] == "text":
            last["text"] = last["text"].rstrip()
            if not last["text"]:
                messages[-1]["content"].pop()
                if not messages[-1]["content"]:
                    messages.pop()
    return messages


def anthropic_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Convert tool specs to Messages API ``tools`` (``name``, ``description``,
    ``input_schema``)."""
    return [
        {
            "name": spec.name,
            "description": spec.description,
            "input_schema": dict(spec.parameters),
        }
        for spec in tools
    ]


_EPHEMERAL: Final = {"type": "ephemeral"}
MAX_CACHE_BREAKPOINTS: Final = 4
"""The most ``cache_control`` breakpoints the Messages API accepts in one request."""


def place_cache_breakpoints(body: dict[str, Any]) -> None:
    """Mark ``body``'s prompt-cache breakpoints (``model_settings={"cache": True}``):
    the last tool definition, the instructions (``system``) and the last block of the
    last user message — the prefix in the API's order (tools, system, messages), each
    breakpoint caching all before it. They sit at the same places every turn, so a
    turn reads what the turn before wrote. Never more than the API's four, counting
    any ``cache_control`` the body already has (a caller's own ``system`` blocks)."""

    def count(blocks: object) -> int:
        if not isinstance(blocks, list):
            return 0
        return sum(1 for b in blocks if isinstance(b, dict) and "cache_control" in b)

    messages = body.get("messages") or []
    used = count(body.get("tools")) + count(body.get("system"))
    used += sum(count(m.get("content")) for m in messages if isinstance(m, dict))
    places: list[tuple[list[Any], int]] = []
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        places.append((tools, len(tools) - 1))
    system = body.get("system")
    if isinstance(system, str) and system:
        body["system"] = [{"type": "text", "text": system}]
        places.append((body["system"], 0))
    users = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    content = users[-1].get("content") if users else None
    if isinstance(content, list) and content:
        places.append((content, len(content) - 1))
    for blocks, index in places[: max(MAX_CACHE_BREAKPOINTS - used, 0)]:
        if isinstance(blocks[index], dict) and "cache_control" not in blocks[index]:
            blocks[index] = {**blocks[index], "cache_control": dict(_EPHEMERAL)}


@attrs.define
class _Block:
    kind: str
    call_id: str = ""
    name: str = ""
    initial_input: Any = None
    json_parts: list[str] = attrs.field(factory=list)


def _count(usage: Mapping[str, Any], key: str) -> int | None:
    value = usage.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@final
class _MessagesStreamParser:
    """Messages API events -> model events.

    Text deltas are yielded as they come; a tool call when its ``content_block_stop``
    arrives (arguments assembled from its ``input_json_delta`` fragments); the usage
    and the finish reason at ``message_stop``.
    """

    def __init__(self, call_ids: CallIds) -> None:
        self._call_ids = call_ids
        self._blocks: dict[int, _Block] = {}
        self._usage_seen = False
        # Anthropic's input_tokens counts only the uncached input: ours counts every
        # input token (DESIGN §21), so the three are kept apart and summed at the end.
        self._input_tokens = 0
        self._cache_read: int | None = None
        self._cache_write: int | None = None
        self._output_tokens = 0
        self._stop_reason: str | None = None
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def at_eof(self) -> list[ModelEvent] | None:
        return None  # the official API always ends with message_stop

    def feed(self, event: SSEEvent) -> list[ModelEvent]:
        data = parse_json_event(_PROVIDER, event)
        kind = data.get("type", event.event)
        if kind == "content_block_delta":
            return self._delta(data, event)
        if kind == "message_start":
            message = data.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self._set_usage(usage)
            return []
        if kind == "content_block_start":
            return self._block_start(data, event)
        if kind == "content_block_stop":
            return self._block_stop(data)
        if kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self._stop_reason = delta["stop_reason"]
            usage = data.get("usage")
            if isinstance(usage, dict):
                self._set_usage(usage)
            return []
        if kind == "message_stop":
            self._done = True
            reason = self._stop_reason or "end_turn"
            out: list[ModelEvent] = []
            if self._usage_seen:  # a proxy that reports none: unknown, not zero
                read, write = self._cache_read, self._cache_write
                out.append(
                    Usage(
                        self._input_tokens + (read or 0) + (write or 0),
                        self._output_tokens,
                        cache_read_tokens=read,
                        cache_write_tokens=write,
                    )
                )
            out.append(Finish(STOP_REASONS.get(reason, reason)))
            return out
        if kind == "error":
            error = data.get("error")
            error_type = error.get("type") if isinstance(error, dict) else None
            raise stream_error(_PROVIDER, data, retryable=error_type in _RETRYABLE_ERRORS)
        return []  # "ping" and event types added later

    def _set_usage(self, usage: Mapping[str, Any]) -> None:
        # message_start carries the input figures; a later message_delta may repeat
        # them (cumulative), so each figure it does carry replaces the earlier one.
        input_tokens = _count(usage, "input_tokens")
        if input_tokens is not None:
            self._input_tokens = input_tokens
            self._usage_seen = True
        read = _count(usage, "cache_read_input_tokens")
        if read is not None:
            self._cache_read = read
            self._usage_seen = True
        write = _count(usage, "cache_creation_input_tokens")
        if write is not None:
            self._cache_write = write
            self._usage_seen = True
        output = usage.get("output_tokens")
        if isinstance(output, int) and not isinstance(output, bool):
            self._output_tokens = output  # cumulative in message_delta
            self._usage_seen = True

    def _index(self, data: Mapping[str, Any], event: SSEEvent) -> int:
        index = data.get("index")
        if not isinstance(index, int) or isinstance(index, bool):
            raise ModelError(
                f"{_PROVIDER}: content block event without an index: {event.data[:300]!r}"
            )
        return index

    def _block_start(self, data: Mapping[str, Any], event: SSEEvent) -> list[ModelEvent]:
        index = self._index(data, event)
        block = data.get("content_block")
        if not isinstance(block, dict):
            raise ModelError(
                f"{_PROVIDER}: content_block_start without a block: {event.data[:300]!r}"
            )
        kind = block.get("type")
        if kind == "tool_use":
            call_id, name = block.get("id"), block.get("name")
            if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
                raise ModelError(
                    f"{_PROVIDER}: tool_use block without id or name: {event.data[:300]!r}"
                )
            self._blocks[index] = _Block("tool_use", call_id, name, block.get("input"))
            return []
        self._blocks[index] = _Block(str(kind))
        text = block.get("text")
        if kind == "text" and isinstance(text, str) and text:
            return [TextDelta(text)]
        return []

    def _delta(self, data: Mapping[str, Any], event: SSEEvent) -> list[ModelEvent]:
        index = self._index(data, event)
        delta = data.get("delta")
        if not isinstance(delta, dict):
            return []
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            return [TextDelta(text)] if isinstance(text, str) and text else []
        if kind == "input_json_delta":
            block = self._blocks.get(index)
            if block is None or block.kind != "tool_use":
                raise ModelError(
                    f"{_PROVIDER}: input_json_delta for block {index}, which is not a tool_use"
                )
            part = delta.get("partial_json")
            if isinstance(part, str):
                block.json_parts.append(part)
        return []  # thinking, signature, citations deltas are not model events here

    def _block_stop(self, data: Mapping[str, Any]) -> list[ModelEvent]:
        index = data.get("index")
        block = self._blocks.pop(index, None) if isinstance(index, int) else None
        if block is None or block.kind != "tool_use":
            return []
        arguments = "".join(block.json_parts)
        if not arguments.strip():
            initial = block.initial_input if isinstance(block.initial_input, dict) else {}
            arguments = json.dumps(initial, ensure_ascii=False)
        call_id = self._call_ids.unique(block.call_id)
        return [ToolCallDone(ToolCall(call_id, block.name, arguments))]


@final
class AnthropicModel(HTTPStreamingModel):
    """A model served over the Anthropic Messages API, streamed.

    Args:
        model: the model name (``"claude-3-5-haiku-latest"``, ...).
        base_url: the API root, default ``$ANTHROPIC_BASE_URL`` or
            ``https://api.anthropic.com`` (requests go to ``{base_url}/v1/messages``;
            a ``base_url`` ending in ``/v1`` or ``/v1/messages`` is accepted too).
        api_key: default ``$ANTHROPIC_API_KEY``, read at each call; sent as
            ``x-api-key`` (left out when there is none).
        client, max_retries, connect_timeout, retry_base_delay, retry_max_delay, rate_limit:
            as for every HTTP provider (docs/models.md, "HTTP behaviour").
        max_tokens: the response length limit the API requires (default 4096), sent
            in every body unless ``request.settings`` overrides it.
        **settings: request body fields (``temperature``, ``stop_sequences``, ...);
            ``request.settings`` override them.
    """

    _provider = _PROVIDER
    _api_key_env = "ANTHROPIC_API_KEY"
    _base_url_env = "ANTHROPIC_BASE_URL"
    _default_base_url = DEFAULT_BASE_URL
    _prices_provider = "anthropic"

    def _configure(self, settings: dict[str, Any]) -> None:
        # max_tokens first in the body, right after the model, as the API's examples have it
        given = dict(settings)
        settings.clear()
        settings["max_tokens"] = check_count("max_tokens", given.pop("max_tokens", 4096), 1)
        settings.update(given)

    def _api_root(self, base_url: str) -> str:
        return normalize_base_url(base_url)

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (settings merged: constructor, then request)."""
        body: dict[str, Any] = {"model": self._model, **self._settings, **request.settings}
        cache = take_cache(body)
        if request.instructions:
            body["system"] = request.instructions
        body["messages"] = anthropic_messages(request.items)
        if request.tools:
            body["tools"] = anthropic_tools(request.tools)
        if cache:
            place_cache_breakpoints(body)
        body["stream"] = True
        return body

    def _build_request(self, request: ModelRequest) -> HTTPRequestSpec:
        headers = {"anthropic-version": API_VERSION}
        api_key = self._current_api_key()
        if api_key:
            headers["x-api-key"] = api_key
        return HTTPRequestSpec(
            url=f"{self._base_url}/v1/messages",
            headers=headers,
            body=self.request_body(request),
        )

    def _new_parser(self, call_ids: CallIds) -> _MessagesStreamParser:
        return _MessagesStreamParser(call_ids)
