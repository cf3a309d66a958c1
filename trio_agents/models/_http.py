"""What the HTTP model providers share: SSE decoding, retries, client ownership, the stream.

The providers (:mod:`._openai`, :mod:`._anthropic`) only describe their wire format: how
to build the request body from a :class:`~trio_agents.models.ModelRequest`, and how to
turn server-sent events into model events (a :class:`StreamParser`). Everything else
lives here:

* :class:`SSEDecoder` — an incremental ``text/event-stream`` decoder fed with bytes
  (``\\n``, ``\\r\\n`` and ``\\r`` line ends, split anywhere, multi-line ``data:``,
  comments, ``event:`` lines).
* :func:`backoff_delay` and :func:`parse_retry_after` — exponential backoff with
  jitter that honours ``Retry-After``.
* :class:`ClientOwnership` — DESIGN §8: a caller's client is used and never closed;
  ``async with model:`` owns one pooled client for the block; otherwise each stream
  opens and closes its own.
* :class:`ModelStream` — the async context manager and iterator ``stream()`` returns.

Why the stream is a class and not an async generator, and how it is closed: httpx's
response body is a chain of nested async generators (httpx ``aiter_bytes`` → ``aiter_raw``
→ its bound stream → the transport stream → httpcore's pool and connection streams).
When a consumer is cancelled *between* two reads, those generators are suspended at a
``yield``; closing only the outermost one leaves the inner ones to the garbage
collector, and Trio then warns (``ResourceWarning: Async generator ... was garbage
collected before it had been exhausted``). So on exit the stream resumes the body
iterator once more inside a cancel scope that is already cancelled: the next socket
read raises ``Cancelled`` at the bottom of the chain, every generator unwinds through
its own ``except``/``finally`` (httpcore closes the connection on the way), and nothing
is left for the garbage collector. This is exactly what happens when the cancellation
arrives during a read, so it is the path httpx and httpcore are built for.

The request side has the same hazard: ``client.stream(..., json=...)`` sends its body
through httpx's ``ByteStream``, whose ``__aiter__`` is an async generator, and a
cancellation that lands while httpcore writes the body abandons it. So a stream builds
its request with ``client.build_request``, swaps in a body stream whose iterator is a
plain object, and sends it with ``client.send(request, stream=True)`` — which is what
``client.stream()`` does inside — closing the response on every exit path, as
``client.stream()``'s ``finally`` would.
"""

from __future__ import annotations

import abc
import email.utils
import json
import random
import re
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, suppress
from types import TracebackType
from typing import Any, Final, Protocol, Self, final

import attrs
import httpx
import trio

from .._exceptions import ModelError
from .._items import ToolCall, ToolResult
from .._model import ModelEvent, ModelRequest

__all__ = [
    "PERMANENT_KINDS",
    "CallIds",
    "ClientOwnership",
    "ErrorInfo",
    "HTTPRequestSpec",
    "HTTPStreamingModel",
    "ModelStream",
    "SSEDecoder",
    "SSEEvent",
    "StreamParser",
    "backoff_delay",
    "error_detail",
    "http_error",
    "make_timeout",
    "one_line",
    "parse_error_body",
    "parse_json_event",
    "parse_retry_after",
    "stream_error",
]

MAX_RETRY_AFTER: Final = 60.0
"""A ``Retry-After`` longer than this (seconds) is not waited for: the call fails."""

CLEANUP_BOUND: Final = 5.0
"""Upper bound (seconds) on closing a response and a per-call client, shielded."""

DRAIN_BOUND: Final = 1.0
"""How long to read on after the end-of-stream marker so the connection can be reused."""

_BODY_HEAD_BYTES: Final = 2048
# How much of an error body (or of a JSON body where a stream was expected) is read.
_MAX_ERROR_BODY: Final = 64 * 1024
"""How much of a response body is kept to quote when it is not an event stream."""

MAX_LINE_BYTES: Final = 16 * 1024 * 1024
"""An event-stream line longer than this is treated as a protocol error."""

RETRYABLE_STATUS: Final = frozenset({408, 429})
"""Statuses below 500 that are retried (all 5xx are retried too)."""


# --------------------------------------------------------------------------- SSE


@attrs.frozen
class SSEEvent:
    """One dispatched server-sent event: its type, its data, and its last event id."""

    event: str = "message"
    data: str = ""
    id: str | None = None


_LINE_END = re.compile(rb"\r\n|\r|\n")


@final
class SSEDecoder:
    """An incremental decoder for the ``text/event-stream`` format (WHATWG HTML §9.2).

    Feed it the body's bytes as they arrive, split anywhere (even inside a UTF-8
    character or between the ``\\r`` and ``\\n`` of a line end); it returns the events
    completed by each chunk. Comment lines (``: keepalive``) are skipped, ``data:``
    lines of one event are joined with ``\\n``, ``event:`` names the event type.
    """

    def __init__(self, *, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._buffer = bytearray()
        self._max_line_bytes = max_line_bytes
        self._first_line = True
        self._event_type = ""
        self._data: list[str] = []
        self._last_id: str | None = None
        self.lines = 0
        """How many complete lines have been decoded."""
        self.fields = 0
        """How many of them were event-stream lines: comments, ``data``, ``event``,
        ``id`` or ``retry`` fields (a body with none is not an event stream)."""

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Decode ``chunk`` and return the events it completed.

        Raises:
            ModelError: a line is not valid UTF-8, or is longer than the limit.
        """
        self._buffer += chunk
        events: list[SSEEvent] = []
        position = 0
        buffer = self._buffer
        while True:
            match = _LINE_END.search(buffer, position)
            if match is None:
                break
            if match.group() == b"\r" and match.end() == len(buffer):
                break  # maybe the first half of a "\r\n": wait for the next byte
            event = self._line(bytes(buffer[position : match.start()]))
            if event is not None:
                events.append(event)
            position = match.end()
        del buffer[:position]
        if len(buffer) > self._max_line_bytes:
            raise ModelError(
                f"event-stream line longer than {self._max_line_bytes} bytes:"
                f" {bytes(buffer[:200])!r}..."
            )
        return events

    def close(self) -> list[SSEEvent]:
        """Signal the end of the body; return an event left without its blank line.

        The spec drops an event the stream ended in the middle of; this decoder is
        lenient about the last blank line only: a final event whose lines were all
        complete is still returned. A last line without its line end is dropped.
        """
        events: list[SSEEvent] = []
        if self._buffer.endswith(b"\r"):
            events.extend(self.feed(b"\n"))
        self._buffer.clear()
        if self._data:
            event = self._line(b"")
            if event is not None:
                events.append(event)
        return events

    @property
    def pending(self) -> bytes:
        """Bytes of an unfinished line (for error messages)."""
        return bytes(self._buffer)

    def _line(self, raw: bytes) -> SSEEvent | None:
        self.lines += 1
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ModelError(
                f"event-stream line is not valid UTF-8 ({exc}): {raw[:200]!r}"
            ) from None
        if self._first_line:
            self._first_line = False
            line = line.removeprefix("\ufeff")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            self.fields += 1
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name in ("data", "event", "id", "retry"):
            self.fields += 1
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event_type = value
        elif name == "id" and "\0" not in value:
            self._last_id = value
        return None  # "retry" and unknown fields are ignored

    def _dispatch(self) -> SSEEvent | None:
        event_type, self._event_type = self._event_type, ""
        if not self._data:
            return None
        data, self._data = "\n".join(self._data), []
        return SSEEvent(event=event_type or "message", data=data, id=self._last_id)


def parse_json_event(provider: str, event: SSEEvent) -> dict[str, Any]:
    """Parse an event's data as a JSON object.

    Raises:
        ModelError: the data is not JSON or not an object; the message quotes it.
    """
    try:
        value = json.loads(event.data)
    except ValueError as exc:
        raise ModelError(
            f"{provider}: malformed JSON in the event stream ({exc}): {_quote(event.data)}"
        ) from None
    if not isinstance(value, dict):
        raise ModelError(
            f"{provider}: expected a JSON object in the event stream, got {_quote(event.data)}"
        )
    return value


def _quote(text: str, limit: int = 300) -> str:
    if len(text) > limit:
        return repr(text[:limit]) + "..."
    return repr(text)


# ----------------------------------------------------------------------- retries


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Return the delay a ``Retry-After`` header asks for, in seconds (``None`` if absent).

    Accepts the delta-seconds form (also fractional, as some servers send) and the
    HTTP-date form. A malformed value counts as absent; a date in the past is 0.
    """
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if seconds == seconds else None  # NaN -> None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


def backoff_delay(
    retry: int, *, base: float, maximum: float, retry_after: float | None = None
) -> float:
    """Seconds to wait before retry number ``retry`` (0 for the first retry).

    Exponential backoff with jitter: a random delay between half and all of
    ``min(maximum, base * 2**retry)``. A server's ``Retry-After`` wins when given.
    """
    if retry_after is not None:
        return retry_after
    ceiling = min(maximum, base * (2.0**retry))
    return ceiling / 2 + random.uniform(0.0, ceiling / 2)


def one_line(text: str, limit: int = 500) -> str:
    """``text`` on one line: runs of whitespace (newlines included) become one space,
    and more than ``limit`` characters are cut with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"


_NO_VALUE: Final = frozenset({"", "none", "null", "nil", "undefined"})

PERMANENT_KINDS: Final = (
    "invalid_request",
    "bad_request",
    "badrequest",
    "validation",
    "unprocessable",
    "context_length",
    "invalid_prompt",
    "invalid_api_key",
    "insufficient_quota",
    "authentication",
    "permission",
    "not_found",
    "notfound",
)
"""Error ``type``/``code`` fragments that say retrying the same request cannot help."""

_PERMANENT_MESSAGE: Final = re.compile(
    r"validation errors?\b|\binput should be\b|\bfield required\b"
    r"|failed to parse messages|invalid message content|invalid tool call arguments"
    r"|maximum context length|exceeds? (?:the )?context (?:window|length)",
    re.IGNORECASE,
)
"""Messages that are a schema-validation report or a context overflow: the request's fault."""


@attrs.frozen
class ErrorInfo:
    """What an error response body says.

    Attributes:
        kind: the error's ``type`` (or, without one, its ``code``), if it names one;
            placeholders such as ``"None"`` and a code equal to the HTTP status are
            not kinds.
        message: the server's message, on one line.
        permanent: the body says that sending the same request again cannot succeed
            (see :func:`parse_error_body`).
    """

    kind: str | None = None
    message: str | None = None
    permanent: bool = False

    def describe(self) -> str:
        """``"<kind>: <message>"``, or whichever of the two is there (may be empty)."""
        if self.kind and self.message:
            return f"{self.kind}: {self.message}"
        return self.kind or self.message or ""


def _kind_text(value: object, status: int | None) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = one_line(value, 100)
    else:
        return None
    if text.lower() in _NO_VALUE or (status is not None and text == str(status)):
        return None
    return text


def _kind_is_permanent(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int):
        return 400 <= value < 500 and value not in RETRYABLE_STATUS
    if isinstance(value, str):
        text = value.lower().replace("-", "_").replace(" ", "_")
        return any(fragment in text for fragment in PERMANENT_KINDS)
    return False


def parse_error_body(body: bytes, status: int | None = None) -> ErrorInfo:
    """Read an error response body (or an error event's JSON) into an :class:`ErrorInfo`.

    Understands ``{"error": {"type" | "code": ..., "message": ...}}`` (OpenAI,
    Anthropic, llama.cpp, llama-cpp-python, LiteLLM, vLLM), the same fields at the top
    level (older vLLM), ``{"error": "..."}`` (Ollama, TGI), ``{"detail": ...}``
    (FastAPI) and ``{"message": ...}``; otherwise the body's text is the message.

    ``permanent`` — the rule for not retrying a 5xx (or a 429): the body *blames the
    request*. That is an error ``type`` or ``code`` containing one of
    :data:`PERMANENT_KINDS` (``invalid_request_error``, ``BadRequestError``,
    ``context_length_exceeded``, ``insufficient_quota``, ...), a numeric ``code`` in
    400-499 other than 408/429, or a message that is a schema-validation report or a
    context overflow (pydantic's ``validation error``/``Input should be``/``Field
    required``, llama.cpp's ``Failed to parse messages``, ``maximum context length``).
    llama-cpp-python, for one, answers a request that fails its schema with HTTP 500
    and pydantic's report: the same request fails the same way every time.
    """
    text = body.decode("utf-8", errors="replace").strip()
    if not text:
        return ErrorInfo()
    try:
        data = json.loads(text)
    except ValueError:
        flat = one_line(text)
        return ErrorInfo(None, flat, bool(_PERMANENT_MESSAGE.search(flat)))
    if not isinstance(data, dict):
        return ErrorInfo(None, one_line(text))
    fields: Mapping[str, Any] = data
    error = data.get("error")
    if isinstance(error, dict):
        fields = error
    raw_message: object = fields.get("message")
    if isinstance(error, str) and error:
        raw_message = error
    if not raw_message:
        raw_message = data.get("detail") or data.get("message")
    if isinstance(raw_message, str):
        message: str | None = one_line(raw_message) or None
    elif raw_message:
        message = one_line(json.dumps(raw_message, ensure_ascii=False))
    else:
        message = None
    kinds = [fields.get("type"), fields.get("code"), data.get("error_type")]
    kind = next((k for k in (_kind_text(v, status) for v in kinds) if k), None)
    permanent = any(_kind_is_permanent(v) for v in kinds) or bool(
        message and _PERMANENT_MESSAGE.search(message)
    )
    if message is None and kind is None:
        message = one_line(text)
    return ErrorInfo(kind, message, permanent)


def error_detail(body: bytes, status: int | None = None) -> str | None:
    """The provider's error, as ``"<type or code>: <message>"`` on one line (``None``
    for an empty body); see :func:`parse_error_body`."""
    return parse_error_body(body, status).describe() or None


def http_error(label: str, status: int, body: bytes) -> ModelError:
    """The :class:`ModelError` for an HTTP error response, with a one-line message:
    ``"<label>: HTTP <status> <type or code>: <message>"``.

    Retryable: 408, 429 and 5xx, unless the body blames the request
    (:attr:`ErrorInfo.permanent`).
    """
    info = parse_error_body(body, status)
    message = f"{label}: HTTP {status}"
    if info.kind:
        message += f" {info.kind}"
    if info.message:
        message += f": {info.message}"
    elif not info.kind:
        message += " with an empty body"
    retryable = (status in RETRYABLE_STATUS or status >= 500) and not info.permanent
    return ModelError(message, status_code=status, retryable=retryable)


def stream_error(provider: str, data: Mapping[str, Any], *, retryable: bool) -> ModelError:
    """The :class:`ModelError` for an error object a server sent inside the stream."""
    info = parse_error_body(json.dumps(data).encode())
    detail = info.describe() or "error"
    return ModelError(
        f"{provider}: the server sent an error in the stream: {detail}",
        retryable=retryable and not info.permanent,
    )


# ----------------------------------------------------------------- tool-call ids


@final
class CallIds:
    """Keeps the tool-call ids of one response unique within the conversation.

    Some servers reuse ids: a proxy's mock that answers every turn with the same fixed
    id, small servers that number calls ``call_0``, ``call_1``, ... afresh in each
    response. The conversation needs unique ids (DESIGN §4), so a call whose id is
    already taken (by an item of the request, or by an earlier call of the same
    response) gets ``"<id>_<n>"`` with the smallest ``n >= 2`` that is free. It is
    deterministic, keeps the server's id recognisable, and stays within the
    ``[A-Za-z0-9_-]`` alphabet the strictest APIs accept. The new id is what the
    conversation stores and what later requests send, so the server sees consistent
    ids.
    """

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._taken = set(taken)

    def claim(self, call_id: str) -> str:
        """Return ``call_id``, or a fresh id derived from it if it is taken; either
        way the returned id is taken from now on."""
        unique = call_id
        number = 2
        while unique in self._taken:
            unique = f"{call_id}_{number}"
            number += 1
        self._taken.add(unique)
        return unique


# ------------------------------------------------------------- client ownership


def make_timeout(connect_timeout: float) -> httpx.Timeout:
    """The timeouts every model stream uses.

    No read timeout: a token stream may pause for as long as the model thinks, and
    deadlines are the caller's Trio cancel scopes. Connecting and each write are
    bounded by ``connect_timeout``. Waiting for a free connection in a client's pool
    is not bounded either: it is a queue, and Trio scopes bound it too.
    """
    return httpx.Timeout(connect=connect_timeout, read=None, write=connect_timeout, pool=None)


_ssl_context: ssl.SSLContext | None = None


def _shared_ssl_context() -> ssl.SSLContext:
    """One default SSL context for every client we create (building one costs ~30 ms)."""
    global _ssl_context
    if _ssl_context is None:
        _ssl_context = httpx.create_ssl_context()
    return _ssl_context


def _new_client(timeout: httpx.Timeout) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=timeout, verify=_shared_ssl_context())


@final
class ClientOwnership:
    """Which ``httpx.AsyncClient`` a model uses, and who closes it (DESIGN §8).

    * A client given by the caller is used for every stream and never closed.
    * Between :meth:`open` and :meth:`close` (``async with model:``) the model owns one
      pooled client; nested blocks share it, and the outermost one closes it.
    * Otherwise every stream gets a client of its own and closes it when it ends.
    """

    def __init__(self, client: httpx.AsyncClient | None, timeout: httpx.Timeout) -> None:
        self._given = client
        self._timeout = timeout
        self._pooled: httpx.AsyncClient | None = None
        self._depth = 0

    @property
    def pooled(self) -> httpx.AsyncClient | None:
        """The pooled client of an ``async with model:`` block, if one is open."""
        return self._pooled

    def borrow(self) -> tuple[httpx.AsyncClient, bool]:
        """Return ``(client, owned)``: ``owned`` means the borrower must close it."""
        if self._given is not None:
            return self._given, False
        if self._pooled is not None:
            return self._pooled, False
        return _new_client(self._timeout), True

    def open(self) -> None:
        """Enter an ``async with model:`` block."""
        self._depth += 1
        if self._given is None and self._pooled is None:
            self._pooled = _new_client(self._timeout)

    async def close(self) -> None:
        """Leave an ``async with model:`` block; the outermost one closes the pool."""
        self._depth -= 1
        if self._depth > 0 or self._pooled is None:
            return
        client, self._pooled = self._pooled, None
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_BOUND):
            await client.aclose()


# ------------------------------------------------------------------- the stream


class StreamParser(Protocol):
    """Turns one provider's server-sent events into model events.

    A fresh parser is made for every HTTP attempt.
    """

    @property
    def done(self) -> bool:
        """Whether the end-of-stream marker (``[DONE]``, ``message_stop``) was seen."""
        ...

    def feed(self, event: SSEEvent) -> list[ModelEvent]:
        """Handle one event; return the model events it completes.

        Raises:
            ModelError: the event is malformed, or is the provider's error event
                (``retryable`` tells whether asking again could help).
        """
        ...

    def at_eof(self) -> list[ModelEvent] | None:
        """The body ended without the end marker: the final events, or ``None`` if
        the response is incomplete (the stream ended early)."""
        ...


@attrs.frozen
class HTTPRequestSpec:
    """One provider request: where to POST which JSON body with which headers."""

    url: str
    headers: Mapping[str, str]
    body: Mapping[str, Any]


@attrs.frozen
class _Failure:
    error: ModelError
    retry_after: float | None = None


@final
class ModelStream(AbstractAsyncContextManager[AsyncIterator[ModelEvent]]):
    """The async context manager returned by an HTTP model's ``stream()``.

    Entering it sends the request (retrying connection failures, 429 and 5xx with
    backoff); it then iterates the model events of the response. A drop before any
    event was yielded is retried too; after that it is a :class:`ModelError`
    ("stream ended early ..."). Leaving it, normally or by cancellation, closes the
    response (so the socket, unless the body was complete and the connection can go
    back to the pool) and a per-call client, shielded and bounded in time.
    """

    def __init__(
        self,
        *,
        provider: str,
        spec: HTTPRequestSpec,
        new_parser: Callable[[CallIds], StreamParser],
        clients: ClientOwnership,
        timeout: httpx.Timeout,
        max_retries: int,
        retry_base_delay: float,
        retry_max_delay: float,
        taken_call_ids: Iterable[str] = (),
    ) -> None:
        self._provider = provider
        self._spec = spec
        self._new_parser = new_parser
        self._taken_call_ids = frozenset(taken_call_ids)
        self._clients = clients
        self._timeout = timeout
        self._max_retries = max_retries
        self._retry_base_delay = retry_base_delay
        self._retry_max_delay = retry_max_delay
        self._state = "new"  # new -> open -> closed
        self._client: httpx.AsyncClient | None = None
        self._owns_client = False
        self._response: httpx.Response | None = None
        self._body: AsyncIterator[bytes] | None = None
        self._decoder = SSEDecoder()
        self._parser = new_parser(CallIds(self._taken_call_ids))
        self._pending: deque[ModelEvent] = deque()
        self._status = 0
        self._content_type = ""
        self._body_head = bytearray()
        self._finished = False
        self._attempts = 0
        self._events_seen = 0
        self._yielded = 0

    # -- the context manager

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        if self._state != "new":
            raise RuntimeError("a model stream can only be entered once")
        self._state = "open"
        self._client, self._owns_client = self._clients.borrow()
        try:
            await self._open_with_retries()
        except BaseException:
            await self._cleanup()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._cleanup()

    # -- the iterator

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ModelEvent:
        if self._state != "open":
            raise RuntimeError("the model stream was read outside its `async with` block")
        while True:
            if self._pending:
                self._yielded += 1
                return self._pending.popleft()
            if self._finished:
                raise StopAsyncIteration
            await self._read_more()

    # -- internals

    def _label(self) -> str:
        return f"{self._provider} ({self._spec.url})"

    async def _open_with_retries(self) -> None:
        while True:
            failure = await self._attempt()
            if failure is None:
                return
            await self._retry_or_raise(failure)

    async def _retry_or_raise(self, failure: _Failure) -> None:
        """Sleep before the next attempt, or raise the failure if it may not be retried."""
        error = failure.error
        if not error.retryable:
            raise error
        if self._attempts > self._max_retries:
            if self._attempts > 1:
                raise ModelError(
                    f"{error} (gave up after {self._attempts} attempts)",
                    status_code=error.status_code,
                    retryable=True,
                ) from error.__cause__
            raise error
        if failure.retry_after is not None and failure.retry_after > MAX_RETRY_AFTER:
            raise ModelError(
                f"{error} (the server asked to retry after {failure.retry_after:g} s;"
                f" not waiting longer than {MAX_RETRY_AFTER:g} s)",
                status_code=error.status_code,
                retryable=True,
            ) from error.__cause__
        delay = backoff_delay(
            self._attempts - 1,
            base=self._retry_base_delay,
            maximum=self._retry_max_delay,
            retry_after=failure.retry_after,
        )
        await trio.sleep(delay)

    async def _attempt(self) -> _Failure | None:
        """Send the request once; return why it failed, or ``None`` once streaming."""
        assert self._client is not None
        self._attempts += 1
        self._decoder = SSEDecoder()
        self._parser = self._new_parser(CallIds(self._taken_call_ids))
        self._pending.clear()
        self._events_seen = 0
        self._body_head.clear()
        headers = {"accept": "text/event-stream", **self._spec.headers}
        try:
            request = self._client.build_request(
                "POST",
                self._spec.url,
                json=dict(self._spec.body),
                headers=headers,
                timeout=self._timeout,
            )
        except (TypeError, ValueError) as exc:
            # A setting that is not JSON, a header that is not ASCII: never worth a retry.
            raise ModelError(
                f"{self._label()}: the request cannot be built: {_describe(exc)}"
            ) from exc
        try:
            request.stream = _RequestBody(request.content)
            # What `client.stream()` does, minus its generator-based request body; the
            # response is always closed by `_close_response` (on every exit path).
            response = await self._client.send(request, stream=True)
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            return _Failure(self._transport_error(exc, "request failed"))
        except httpx.HTTPError as exc:
            raise ModelError(f"{self._label()}: request failed: {_describe(exc)}") from exc
        self._response = response
        status = self._status = response.status_code
        content_type = self._content_type = response.headers.get("content-type", "")
        if status >= 300:
            body = await self._read_error_body()
            error = http_error(self._label(), status, body)
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            await self._close_response()
            return _Failure(error, retry_after)
        if "text/event-stream" not in content_type and "json" in content_type:
            body = await self._read_error_body()
            await self._close_response()
            detail = _not_streamed_detail(body, status)
            raise ModelError(
                f"{self._label()}: expected an event stream, got HTTP {status}"
                f" {content_type!r}: {detail}",
                status_code=status,
            )
        return None

    def _transport_error(self, exc: httpx.HTTPError, what: str) -> ModelError:
        return ModelError(f"{self._label()}: {what}: {_describe(exc)}", retryable=True)

    def _not_an_event_stream(self) -> ModelError:
        """The body ended cleanly with nothing event-stream-like in it.

        That is the server's answer, not a broken transfer (a drop is a transport
        error, handled apart): asking again gets the same answer, so it is not retried.
        Servers do this when a prompt overflows their context, for one.
        """
        head = bytes(self._body_head)
        what = f"HTTP {self._status}"
        if self._content_type:
            what += f" ({self._content_type})"
        if not head.strip():
            reason = f"{what} with an empty body, not an event stream"
        else:
            text = one_line(head.decode("utf-8", errors="replace"), 300)
            reason = f"{what}, but the body is not an event stream: {text!r}"
        return ModelError(f"{self._label()}: {reason}", status_code=self._status)

    async def _read_error_body(self) -> bytes:
        """The body's first :data:`_MAX_ERROR_BODY` bytes: enough for any error message,
        and a huge body (a whole non-streamed answer, a page) is not held in memory."""
        body = bytearray()
        try:
            # Through _next_chunk: the body iterator it keeps is unwound by
            # _close_response, where a loop left early would leave httpx's async
            # generators to the garbage collector.
            while len(body) < _MAX_ERROR_BODY:
                chunk = await self._next_chunk()
                if chunk is None:
                    break
                body += chunk
        except httpx.HTTPError:
            pass
        return bytes(body[:_MAX_ERROR_BODY])

    async def _next_chunk(self) -> bytes | None:
        assert self._response is not None
        if self._body is None:
            self._body = self._response.aiter_bytes()
        try:
            return await self._body.__anext__()
        except StopAsyncIteration:
            return None

    async def _read_more(self) -> None:
        """Read one chunk and parse it; sets ``_pending`` / ``_finished`` or raises."""
        if self._parser_done():
            await self._drain()
            self._finished = True
            return
        try:
            chunk = await self._next_chunk()
        except httpx.TransportError as exc:
            await self._stream_failed(f"{_describe(exc)}", exc)
            return
        except httpx.HTTPError as exc:
            raise ModelError(
                f"{self._label()}: reading the response failed: {_describe(exc)}"
            ) from exc
        if chunk is None:
            events = self._decoder.close()
            self._handle_events(events)
            if self._parser_done():
                self._finished = True
                return
            if self._events_seen == 0 and self._decoder.fields == 0:
                await self._close_response()
                raise self._not_an_event_stream()
            final = self._parser.at_eof()
            if final is None:
                pending = self._decoder.pending
                reason = "the server ended the response without the end-of-stream event"
                if pending:
                    reason += f" (last, unfinished line: {pending[:200]!r})"
                await self._stream_failed(reason, None)
                return
            self._pending.extend(final)
            self._finished = True
            return
        if len(self._body_head) < _BODY_HEAD_BYTES:
            self._body_head += chunk[: _BODY_HEAD_BYTES - len(self._body_head)]
        try:
            self._handle_events(self._decoder.feed(chunk))
        except ModelError as exc:
            if exc.retryable and self._yielded == 0:
                await self._retry_midstream(_Failure(exc))
                return
            raise

    def _parser_done(self) -> bool:
        return self._parser.done

    def _handle_events(self, events: list[SSEEvent]) -> None:
        for event in events:
            if self._parser.done:
                return  # anything after the end marker is ignored
            self._events_seen += 1
            try:
                self._pending.extend(self._parser.feed(event))
            except ModelError:
                raise
            except Exception as exc:
                # A parser is written for well-formed events; whatever a server sends,
                # what reaches the caller is a ModelError naming the event.
                raise ModelError(
                    f"{self._label()}: could not read the event {event.data[:300]!r}:"
                    f" {_describe(exc)}"
                ) from exc

    async def _stream_failed(self, reason: str, cause: BaseException | None) -> None:
        """The body broke off: retry if nothing was yielded yet, else fail clearly."""
        error = ModelError(
            f"{self._label()}: the stream ended early after {self._events_seen} events"
            f" ({self._yielded} model events delivered): {reason}",
            retryable=True,
        )
        error.__cause__ = cause
        if self._yielded == 0:
            await self._retry_midstream(_Failure(error))
            return
        raise error

    async def _retry_midstream(self, failure: _Failure) -> None:
        """Retry an attempt whose body failed before any model event was yielded."""
        await self._close_response()
        await self._retry_or_raise(failure)
        await self._open_with_retries()

    async def _drain(self) -> None:
        """Read to the end of the body after the end marker, so the connection can be
        reused; give up (closing the connection instead) after a short bound."""
        with trio.move_on_after(DRAIN_BOUND):
            try:
                while await self._next_chunk() is not None:
                    pass
            except httpx.HTTPError:
                pass

    async def _close_response(self) -> None:
        body, response = self._body, self._response
        self._body = None
        self._response = None
        if body is not None:
            await _unwind(body)
        if response is not None:
            with suppress(httpx.HTTPError):
                await response.aclose()

    async def _cleanup(self) -> None:
        """Close the response and a per-call client; shielded, bounded."""
        self._state = "closed"
        client = self._client if self._owns_client else None
        self._client = None
        with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_BOUND):
            await self._close_response()
            if client is not None:
                await client.aclose()


@final
class _RequestBody(httpx.AsyncByteStream):
    """A request body whose iterator is a plain object, not an async generator.

    httpx's own ``ByteStream.__aiter__`` is an async generator: a cancellation that
    lands while httpcore writes the body (between its ``yield`` and the socket send)
    abandons it to the garbage collector, and Trio warns. Each ``async for`` gets a
    fresh one-chunk iterator, so the body can be sent again (auth flows, retries).
    """

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __aiter__(self) -> AsyncIterator[bytes]:
        return _OneChunk(self._data)


@final
class _OneChunk:
    """An async iterator over exactly one bytes chunk (none when empty)."""

    def __init__(self, data: bytes) -> None:
        self._data: bytes | None = data or None

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        if self._data is None:
            raise StopAsyncIteration
        data, self._data = self._data, None
        return data


async def _unwind(body: AsyncIterator[bytes]) -> None:
    """Finish the (nested async generator) body iterator without leaving any of it to
    the garbage collector: resume it under an already-cancelled scope, so the next read
    raises ``Cancelled`` at the bottom of httpx's generator chain and unwinds it all.

    Buffered data may come out first; it is discarded. If the iterator still has not
    finished after many steps (a transport that never checkpoints), it is closed.
    """
    with trio.CancelScope(shield=True) as scope:
        scope.cancel()
        try:
            for _ in range(10_000):
                await body.__anext__()
        except StopAsyncIteration:
            return
        except httpx.HTTPError:
            return
    aclose = getattr(body, "aclose", None)
    if aclose is not None and not scope.cancelled_caught:
        await aclose()


def _describe(exc: BaseException) -> str:
    text = one_line(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# -------------------------------------------------------------------- the model


class HTTPStreamingModel(abc.ABC):
    """Base class of the HTTP providers: client ownership, retries, ``stream()``.

    Subclasses describe the request (:meth:`_build_request`) and the response format
    (:meth:`_new_parser`); they are used as ``async with model:`` to share one pooled
    client (see :class:`ClientOwnership`).
    """

    _provider: str = "model"

    def __init__(
        self,
        *,
        client: httpx.AsyncClient | None,
        max_retries: int,
        connect_timeout: float,
        retry_base_delay: float,
        retry_max_delay: float,
    ) -> None:
        if client is not None and not isinstance(client, httpx.AsyncClient):
            raise TypeError(f"client must be an httpx.AsyncClient, not {type(client).__name__}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be an int >= 0, got {max_retries!r}")
        for name, value in (
            ("connect_timeout", connect_timeout),
            ("retry_base_delay", retry_base_delay),
            ("retry_max_delay", retry_max_delay),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        self._timeout = make_timeout(float(connect_timeout))
        self._clients = ClientOwnership(client, self._timeout)
        self._max_retries = max_retries
        self._retry_base_delay = float(retry_base_delay)
        self._retry_max_delay = float(retry_max_delay)

    @property
    def max_retries(self) -> int:
        """How many times a request is retried before any output (so attempts - 1)."""
        return self._max_retries

    async def __aenter__(self) -> Self:
        """Own one pooled ``httpx.AsyncClient`` until the block ends (no-op with ``client=``)."""
        await trio.lowlevel.checkpoint()
        self._clients.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Close the pooled client (shielded, bounded)."""
        await self._clients.close()

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        """Open a streaming response for ``request`` (see :class:`ModelStream`).

        Raises:
            ModelError: on entering, when the provider fails (after the retries);
                while iterating, when the stream breaks off or is malformed.
        """
        return ModelStream(
            provider=self._provider,
            spec=self._build_request(request),
            new_parser=self._new_parser,
            taken_call_ids=(
                item.call_id for item in request.items if isinstance(item, ToolCall | ToolResult)
            ),
            clients=self._clients,
            timeout=self._timeout,
            max_retries=self._max_retries,
            retry_base_delay=self._retry_base_delay,
            retry_max_delay=self._retry_max_delay,
        )

    @abc.abstractmethod
    def _build_request(self, request: ModelRequest) -> HTTPRequestSpec:
        """The provider's HTTP request for ``request``."""

    @abc.abstractmethod
    def _new_parser(self, call_ids: CallIds) -> StreamParser:
        """A fresh parser for one response; it makes its tool-call ids unique with
        ``call_ids`` (:meth:`CallIds.claim`)."""


def _not_streamed_detail(body: bytes, status: int) -> str:
    """What to say about a JSON body that came where an event stream was expected.

    Only a body that *is* an error (an ``"error"`` member, or Anthropic's
    ``{"type": "error", ...}``) is read as one. Anything else — a whole non-streamed
    answer, say Anthropic's ``{"type": "message", ...}`` — is quoted, cut to a few
    hundred characters: its ``type`` names what it is, not an error.
    """
    text = body.decode("utf-8", errors="replace")
    if not text.strip():
        return "an empty body"
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and (data.get("error") or data.get("type") == "error"):
        detail = error_detail(body, status)
        if detail:
            return detail
    return repr(one_line(text, 300))
