"""``OpenAIChatModel``: OpenAI-compatible Chat Completions over httpx, streamed.

Speaks ``POST {base_url}/chat/completions`` with ``"stream": true``, as served by
OpenAI and by OpenAI-compatible servers (vLLM, Ollama, llama.cpp server, LiteLLM
proxies, ...). See :mod:`._http` for retries, client ownership and stream closing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from .._exceptions import ModelError
from .._items import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from .._model import Finish, TextDelta, ToolCallDone, ToolSpec, Usage
from ._call_ids import CallIds
from ._error_bodies import stream_error
from ._http import (
    HTTPStreamingModel,
    bearer_headers,
    cached_tokens,
    prompt_cache_key,
    reason_map,
    take_cache,
    take_native_output,
)
from ._model_stream import HTTPRequestSpec
from ._sse import SSEEvent, parse_json_event

if TYPE_CHECKING:
    from .._model import ModelEvent, ModelRequest, OutputSpec

__all__ = [
    "FINISH_REASONS",
    "OpenAIChatModel",
    "chat_messages",
    "chat_response_format",
    "chat_tools",
    "object_arguments",
]

DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"
_PROVIDER: Final = "openai"


FINISH_REASONS: Final[Mapping[str, str]] = reason_map(
    stop=("stop", "eos", "eos_token", "stop_sequence", "end_turn"),
    length=("length", "max_tokens"),
    tool_calls=("tool_calls", "function_call", "tool_use"),
    content_filter=("content_filter",),
)
"""``finish_reason`` values seen from OpenAI-compatible servers -> the
:class:`~trio_agents.models.Finish` reason (others pass through unchanged)."""


def object_arguments(arguments: str) -> str:
    """A call's arguments as a JSON object string, which every server accepts back.

    Arguments that already are a JSON object are sent unchanged (byte for byte). Empty
    arguments become ``"{}"``; anything else (the model produced bad JSON, and the call
    got an error result) becomes ``{"_raw_arguments": "<text>"}``, so the model still
    sees what it sent: servers that parse the arguments (Ollama answers 400 "invalid
    tool call arguments", llama.cpp's templates need an object) reject the raw text.
    """
    if not arguments.strip():
        return "{}"
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return arguments
    return json.dumps({"_raw_arguments": arguments}, ensure_ascii=False)


def chat_messages(instructions: str, items: Iterable[Item]) -> list[dict[str, Any]]:
    """Convert a conversation to Chat Completions ``messages``.

    The instructions become the ``system`` message (none when empty). Tool calls that
    follow an assistant message, or each other, are grouped into one assistant
    message's ``tool_calls``; tool results become ``role: "tool"`` messages with their
    ``tool_call_id``. An incomplete assistant message is sent as plain assistant text.

    The shape is the one every common OpenAI-compatible server accepts: ``content`` is
    always a string — ``""`` on an assistant turn that only calls tools (OpenAI allows
    ``null`` there, but llama-cpp-python's schema answers HTTP 500 "Input should be a
    valid string" and Ollama 400 "invalid message content type" for a ``null`` without
    calls; leaving the key out breaks llama-cpp-python's templates) — tool results are
    strings, arguments are JSON objects (:func:`object_arguments`), and no key is ever
    ``null`` (llama.cpp's server throws on a ``null`` name or id).
    """
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    previous: Item | None = None
    for item in items:
        if isinstance(item, UserMessage):
            messages.append({"role": "user", "content": item.content})
        elif isinstance(item, AssistantMessage):
            messages.append({"role": "assistant", "content": item.content})
        elif isinstance(item, ToolCall):
            entry = {
                "id": item.call_id,
                "type": "function",
                "function": {"name": item.name, "arguments": object_arguments(item.arguments)},
            }
            if isinstance(previous, AssistantMessage | ToolCall):
                messages[-1].setdefault("tool_calls", []).append(entry)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [entry]})
        elif isinstance(item, ToolResult):
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        else:
            raise TypeError(f"not a conversation item: {item!r}")
        previous = item
    return messages


def chat_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """Convert tool specs to Chat Completions ``tools`` (function tools)."""
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": dict(spec.parameters),
            },
        }
        for spec in tools
    ]


def chat_response_format(output: OutputSpec) -> dict[str, Any]:
    """The Chat Completions ``response_format`` asking for JSON matching ``output``."""
    json_schema: dict[str, Any] = {
        "name": output.name,
        "schema": dict(output.schema),
        "strict": output.strict,
    }
    if output.description:
        json_schema["description"] = output.description
    return {"type": "json_schema", "json_schema": json_schema}


@attrs.define
class _PartialCall:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = attrs.field(factory=list)


@final
class _ChatStreamParser:
    """Chat Completions chunks -> model events.

    Text deltas are yielded as they come. Tool-call deltas are assembled per
    ``index``; the calls are yielded, in index order, when the stream ends, followed
    by the usage (from the ``include_usage`` chunk) and the finish reason.
    """

    def __init__(self, call_ids: CallIds) -> None:
        self._call_ids = call_ids
        self._calls: dict[int, _PartialCall] = {}
        self._last_index: int | None = None
        self._finish: str | None = None
        self._usage: Usage | None = None
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, event: SSEEvent) -> list[ModelEvent]:
        data = event.data.strip()
        if data == "[DONE]":
            self._done = True
            return self._final()
        if not data:
            return []
        chunk = parse_json_event(_PROVIDER, event)
        if chunk.get("error"):
            raise stream_error(_PROVIDER, chunk, retryable=False)
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            # Only what the server reported: servers that ignore `include_usage` send
            # none (or nulls), and that is unknown usage, never zero. Some servers send
            # running totals in every chunk, or put the usage on the finish chunk: the
            # last one wins.
            prompt, completion = (
                _int(usage.get("prompt_tokens")),
                _int(usage.get("completion_tokens")),
            )
            if prompt is not None or completion is not None:
                self._usage = Usage(
                    input_tokens=prompt or 0,
                    output_tokens=completion or 0,
                    cache_read_tokens=_cache_read(usage),
                    cache_write_tokens=_cache_write(usage),
                )
        out: list[ModelEvent] = []
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            return out
        for choice in choices:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # only the first choice (n=1)
            delta = choice.get("delta")
            if isinstance(delta, dict):
                for key in ("content", "refusal"):  # a refusal is the answer's text too
                    content = delta.get(key)
                    if isinstance(content, str) and content:
                        out.append(TextDelta(content))
                tool_calls = delta.get("tool_calls")
                if isinstance(tool_calls, list):
                    for fragment in tool_calls:
                        if isinstance(fragment, dict):
                            self._add_fragment(fragment, event)
            reason = choice.get("finish_reason")
            if isinstance(reason, str) and reason:
                self._finish = reason
        return out

    def at_eof(self) -> list[ModelEvent] | None:
        # Lenient with servers that end the body without "[DONE]": a finish reason
        # means the answer is complete. Without one, the stream was cut short.
        if self._finish is None:
            return None
        return self._final()

    def _add_fragment(self, fragment: dict[str, Any], event: SSEEvent) -> None:
        index = fragment.get("index")
        call_id = fragment.get("id")
        if not isinstance(index, int) or isinstance(index, bool):
            # Some servers leave out the index: a new id starts a new call.
            last = self._last_index
            current = self._calls.get(last) if last is not None else None
            if (
                last is None
                or current is None
                or (isinstance(call_id, str) and call_id and call_id != current.call_id)
            ):
                index = max(self._calls, default=-1) + 1
            else:
                index = last
        self._last_index = index
        call = self._calls.setdefault(index, _PartialCall())
        if isinstance(call_id, str) and call_id and not call.call_id:
            call.call_id = call_id
        function = fragment.get("function")
        if isinstance(function, dict):
            name = function.get("name")
            if isinstance(name, str) and name and name != call.name:
                # Normally sent once; tolerate servers that stream or repeat it.
                call.name += name
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                call.arguments.append(arguments)
            elif isinstance(arguments, dict):  # a few servers send an object
                call.arguments.append(json.dumps(arguments, ensure_ascii=False))
        elif function is not None:
            raise ModelError(f"{_PROVIDER}: malformed tool call delta: {event.data[:300]!r}")

    def _final(self) -> list[ModelEvent]:
        out: list[ModelEvent] = []
        for index in sorted(self._calls):
            partial = self._calls[index]
            if not partial.name:
                raise ModelError(f"{_PROVIDER}: tool call at index {index} has no function name")
            arguments = "".join(partial.arguments) or "{}"
            call_id = self._call_ids.unique(partial.call_id or f"call_{uuid.uuid4().hex[:24]}")
            out.append(ToolCallDone(ToolCall(call_id, partial.name, arguments)))
        if self._usage is not None:
            out.append(self._usage)
        reason = FINISH_REASONS.get(self._finish or "stop", self._finish or "stop")
        if self._calls and reason == "stop":
            # Ollama and llama.cpp have answered tool calls with "stop": the turn did
            # end in tool calls, and a "stop" would make it look like a final answer.
            reason = "tool_calls"
        out.append(Finish(reason))
        self._calls.clear()
        return out


def _cache_read(usage: Mapping[str, Any]) -> int | None:
    """The prompt tokens read from the cache: OpenAI's
    ``prompt_tokens_details.cached_tokens`` (LiteLLM's proxy fills it for every provider
    it fronts), else what a proxy passes on beside it — LiteLLM's top-level
    ``cache_read_input_tokens`` (an Anthropic model's), DeepSeek's
    ``prompt_cache_hit_tokens``. All count inside ``prompt_tokens`` (LiteLLM adds an
    Anthropic model's cache reads and writes to it: OpenAI's convention, and ours)."""
    found = cached_tokens(usage, "prompt_tokens_details")
    if found is not None:
        return found
    for key in ("cache_read_input_tokens", "prompt_cache_hit_tokens"):
        value = _int(usage.get(key))
        if value is not None:
            return value
    return None


def _cache_write(usage: Mapping[str, Any]) -> int | None:
    """The prompt tokens written to the cache, which OpenAI never reports: LiteLLM's
    ``prompt_tokens_details.cache_write_tokens`` (its newer releases; mirrored there as
    ``cache_creation_tokens``), else its top-level ``cache_creation_input_tokens`` (an
    Anthropic model's, every release)."""
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        for key in ("cache_write_tokens", "cache_creation_tokens"):
            value = _int(details.get(key))
            if value is not None:
                return value
    return _int(usage.get("cache_creation_input_tokens"))


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@final
class OpenAIChatModel(HTTPStreamingModel):
    """A model served over the OpenAI Chat Completions API, streamed.

    Works with OpenAI and any OpenAI-compatible server (vLLM, Ollama, llama.cpp server,
    LiteLLM proxies). Each call is a streaming ``POST {base_url}/chat/completions``
    with ``stream_options.include_usage``.

    Args:
        model: the model name (``"gpt-4o-mini"``, ``"llama3.1:8b"``, ...).
        base_url: the API root, default ``$OPENAI_BASE_URL`` or
            ``https://api.openai.com/v1``; a pasted ``.../chat/completions`` URL is
            accepted too.
        api_key: default ``$OPENAI_API_KEY``, read at each call; sent as a bearer
            token (left out when there is none, fine for local servers).
        client, max_retries, connect_timeout, retry_base_delay, retry_max_delay, rate_limit:
            as for every HTTP provider (docs/models.md, "HTTP behaviour").
        native_output: ask for structured output natively (a JSON-schema ``response_format``);
            False makes a run with an ``output_type`` use the ``final_answer`` tool
            instead, for servers that do not support the format.
        **settings: request body fields (``temperature``, ``max_tokens``, ...);
            ``request.settings`` override them. ``stream_options=None`` leaves the
            ``stream_options`` field out, for servers that reject it.
    """

    _provider = _PROVIDER
    _api_key_env = "OPENAI_API_KEY"
    _base_url_env = "OPENAI_BASE_URL"
    _default_base_url = DEFAULT_BASE_URL
    _prices_provider = "openai"

    def _configure(self, settings: dict[str, Any]) -> None:
        # Read by the run (docs/output.md): True means request.output is honoured here.
        self.native_output = take_native_output(settings)

    def _api_root(self, base_url: str) -> str:
        # A pasted endpoint URL is accepted: requests go to {base_url}/chat/completions.
        return base_url.removesuffix("/chat/completions")

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for ``request`` (settings merged: constructor, then request)."""
        settings = {**self._settings, **request.settings}
        stream_options = settings.pop("stream_options", {})
        key = prompt_cache_key(take_cache(settings), self._model, request)
        body: dict[str, Any] = {"model": self._model, **settings}
        if key is not None:
            body.setdefault("prompt_cache_key", key)  # an explicit one wins
        body["messages"] = chat_messages(request.instructions, request.items)
        if request.tools:
            body["tools"] = chat_tools(request.tools)
        if request.output is not None and self.native_output:
            # An explicit response_format in the settings wins.
            body.setdefault("response_format", chat_response_format(request.output))
        body["stream"] = True
        if stream_options is not None:
            body["stream_options"] = {**dict(stream_options), "include_usage": True}
        return body

    def _build_request(self, request: ModelRequest) -> HTTPRequestSpec:
        return HTTPRequestSpec(
            url=f"{self._base_url}/chat/completions",
            headers=bearer_headers(self._current_api_key()),
            body=self.request_body(request),
        )

    def _new_parser(self, call_ids: CallIds) -> _ChatStreamParser:
        return _ChatStreamParser(call_ids)
