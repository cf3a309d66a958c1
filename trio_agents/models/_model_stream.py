"""The stream: the async context manager and iterator an HTTP model's ``stream()`` returns.

:class:`ModelStream` sends the request (retrying what :mod:`._retry` allows), decodes
the body (:mod:`._sse`), hands each event to the provider's :class:`StreamParser`, and
closes the response and a per-call client on every exit path.

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

from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager, suppress
from types import TracebackType
from typing import Any, Final, Protocol, Self, final

import attrs
import httpx
import trio

from .._exceptions import ModelError
from .._model import ModelEvent, Usage
from ._call_ids import CallIds
from ._clients import CLEANUP_BOUND, ClientOwnership
from ._error_bodies import describe_exception, http_error, not_streamed_detail, one_line
from ._ratelimit import RateLimit, WaitNotice, estimate_tokens
from ._retry import MAX_RETRY_AFTER, Failure, RetryPolicy, parse_retry_after
from ._sse import SSEDecoder, SSEEvent

__all__ = ["DRAIN_BOUND", "HTTPRequestSpec", "ModelStream", "StreamParser"]

DRAIN_BOUND: Final = 1.0
"""How long to read on after the end-of-stream marker so the connection can be reused."""

_BODY_HEAD_BYTES: Final = 2048
# How much of an error body (or of a JSON body where a stream was expected) is read.
_MAX_ERROR_BODY: Final = 64 * 1024
"""How much of a response body is kept to quote when it is not an event stream."""


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
        retry: RetryPolicy,
        taken_call_ids: Iterable[str] = (),
        rate_limit: RateLimit | None = None,
        price: Callable[[Usage], Usage] | None = None,
        on_wait: Callable[[str | None], None] | None = None,
    ) -> None:
        self._provider = provider
        self._notice = WaitNotice(on_wait)  # tells the run while the rate limit holds us
        self._paused = False  # the last attempt's 429 paused the rate limit
        self._price = price
        self._spec = spec
        self._new_parser = new_parser
        self._taken_call_ids = frozenset(taken_call_ids)
        self._clients = clients
        self._timeout = timeout
        self._retry = retry
        self._limit = rate_limit
        self._estimate = 0  # the request's tokens, estimated from its body (rate limit)
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
        if self._limit is not None:
            # Before anything that needs cleaning up: a wait cancelled here leaves nothing.
            await self._limit.acquire_slot(self, self._notice)
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
                event = self._pending.popleft()
                if type(event) is Usage:
                    if self._limit is not None:
                        # The estimate is replaced once; a later usage event only adds.
                        self._limit.correct(self._estimate, event)
                        self._estimate = 0
                    if self._price is not None:
                        event = self._price(event)  # the model prices its own usage
                return event
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

    async def _retry_or_raise(self, failure: Failure) -> None:
        """Sleep before the next attempt, or raise the failure if it may not be retried."""
        delay = self._retry.delay(failure, self._attempts)
        if self._paused:
            # The 429's Retry-After pause: this request waits for the rate limit too.
            self._notice.waiting()
        await trio.sleep(delay)

    async def _attempt(self) -> Failure | None:
        """Send the request once; return why it failed, or ``None`` once streaming."""
        assert self._client is not None
        self._attempts += 1
        self._paused = False
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
                f"{self._label()}: the request cannot be built: {describe_exception(exc)}"
            ) from exc
        if self._limit is not None:
            # Every attempt, retries included, is a request the provider counts.
            self._estimate = estimate_tokens(len(request.content))
            await self._limit.before_request(self._estimate, self._notice)
            self._notice.resumed()
        try:
            request.stream = _RequestBody(request.content)
            # What `client.stream()` does, minus its generator-based request body; the
            # response is always closed by `_close_response` (on every exit path).
            response = await self._client.send(request, stream=True)
        except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            return Failure(self._transport_error(exc, "request failed"))
        except httpx.HTTPError as exc:
            raise ModelError(f"{self._label()}: request failed: {describe_exception(exc)}") from exc
        self._response = response
        status = self._status = response.status_code
        content_type = self._content_type = response.headers.get("content-type", "")
        if status >= 300:
            body = await self._read_error_body()
            error = http_error(self._label(), status, body)
            retry_after = parse_retry_after(response.headers.get("retry-after"))
            if status == 429 and retry_after is not None and self._limit is not None:
                # Every request sharing the limit waits; not longer than this one would.
                self._limit.pause(min(retry_after, MAX_RETRY_AFTER))
                self._paused = True
            await self._close_response()
            return Failure(error, retry_after)
        if "text/event-stream" not in content_type and "json" in content_type:
            body = await self._read_error_body()
            await self._close_response()
            detail = not_streamed_detail(body, status)
            raise ModelError(
                f"{self._label()}: expected an event stream, got HTTP {status}"
                f" {content_type!r}: {detail}",
                status_code=status,
            )
        return None

    def _transport_error(self, exc: httpx.HTTPError, what: str) -> ModelError:
        return ModelError(f"{self._label()}: {what}: {describe_exception(exc)}", retryable=True)

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
            await self._stream_failed(f"{describe_exception(exc)}", exc)
            return
        except httpx.HTTPError as exc:
            raise ModelError(
                f"{self._label()}: reading the response failed: {describe_exception(exc)}"
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
                await self._retry_midstream(Failure(exc))
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
                    f" {describe_exception(exc)}"
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
            await self._retry_midstream(Failure(error))
            return
        raise error

    async def _retry_midstream(self, failure: Failure) -> None:
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
        try:
            with trio.CancelScope(shield=True), trio.move_on_after(CLEANUP_BOUND):
                await self._close_response()
                if client is not None:
                    await client.aclose()
        finally:
            if self._limit is not None:
                # Once the connection is closed (or back in the pool), not before.
                self._limit.release_slot(self)


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
