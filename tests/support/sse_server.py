"""A real loopback HTTP/1.1 server for the model-provider tests.

Written directly on Trio sockets (``trio.serve_tcp`` on ``127.0.0.1``, port 0), so the
tests exercise httpx's real connection handling: connection pooling, chunked transfer
encoding, a peer that drops mid-stream, a client that closes its socket on cancel.

Each request the server receives takes the next :class:`Reply` of its script (or a
500 when the script is used up) and is recorded as a :class:`RecordedRequest`. Every
connection is recorded as a :class:`ConnectionRecord`, including *when the server saw
the client close it* (EOF or reset), which is how the tests check that leaving a model
stream closes the socket.

Usage (in a pytest-trio test)::

    server = SSEServer([Reply(events=[SSE({"x": 1}), SSE("[DONE]")])])
    await nursery.start(server.serve)
    ... talk to server.base_url ...
    assert server.requests[0].json == {...}
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from functools import partial
from typing import Any, Literal, TypeAlias

import attrs
import trio

__all__ = [
    "SSE",
    "ConnectionRecord",
    "Raw",
    "RecordedRequest",
    "Reply",
    "SSEServer",
    "unused_port",
]

_MAX_HEAD = 64 * 1024


@attrs.frozen
class SSE:
    """One server-sent event, encoded as ``event:`` / ``data:`` lines and a blank line.

    ``data`` may be a str (split on newlines into several ``data:`` lines) or any JSON
    value (encoded with ``json.dumps``). ``delay`` is slept before the event is sent.
    """

    data: Any
    event: str | None = None
    delay: float = 0.0

    def encode(self) -> bytes:
        """Return the event's bytes on the wire."""
        text = self.data if isinstance(self.data, str) else json.dumps(self.data)
        lines = []
        if self.event is not None:
            lines.append(f"event: {self.event}")
        lines.extend(f"data: {line}" for line in text.split("\n"))
        return ("\n".join(lines) + "\n\n").encode()


@attrs.frozen
class Raw:
    """Bytes sent exactly as given (one chunk of the body), after ``delay`` seconds."""

    data: bytes
    delay: float = 0.0

    def encode(self) -> bytes:
        """Return the bytes."""
        return self.data


BodyPart: TypeAlias = SSE | Raw


@attrs.frozen
class Reply:
    """What the server answers to one request.

    Args:
        status: the HTTP status code.
        headers: extra response headers (``content-type`` defaults to
            ``text/event-stream``, or ``application/json`` when ``body`` is set).
        events: the body, part by part; each part is written (and flushed) on its own.
        body: a plain body instead of ``events`` (sent with a ``content-length``).
        delay_before_headers: seconds to wait before sending the status line.
        drop_after: abort the connection after this many parts (mid-body: the client
            sees an incomplete chunked body).
        end: what happens after the last part: ``"complete"`` ends the chunked body and
            keeps the connection alive; ``"close"`` ends the body and closes the
            connection; ``"hold"`` keeps the response open until the client goes away.
    """

    status: int = 200
    headers: Sequence[tuple[str, str]] = ()
    events: Sequence[BodyPart] = ()
    body: bytes | None = None
    delay_before_headers: float = 0.0
    drop_after: int | None = None
    end: Literal["complete", "close", "hold"] = "complete"

    @classmethod
    def json(cls, status: int, payload: Any, headers: Sequence[tuple[str, str]] = ()) -> Reply:
        """A plain JSON reply (an error body, say)."""
        return cls(status=status, headers=headers, body=json.dumps(payload).encode())


@attrs.frozen
class RecordedRequest:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    connection: int

    @property
    def json(self) -> Any:
        """The body decoded as JSON."""
        return json.loads(self.body)


@attrs.define(eq=False)
class ConnectionRecord:
    """One accepted connection: how many requests it carried, when the client closed it."""

    number: int
    opened_at: float
    requests: int = 0
    closed_at: float | None = None
    closed: trio.Event = attrs.field(factory=trio.Event)
    """Set when the server saw the client close the connection (EOF or reset)."""
    server_closed: bool = False
    """The server closed the connection itself (``drop_after`` or ``end="close"``)."""


def unused_port() -> int:
    """A loopback port that nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@attrs.define(eq=False)
class _ConnectionReader:
    """Reads a connection in a task of its own, so EOF is noticed at any time."""

    record: ConnectionRecord
    buffer: bytearray = attrs.field(factory=bytearray)
    eof: bool = False
    _wakeup: trio.Event = attrs.field(factory=trio.Event)

    async def run(self, stream: trio.SocketStream) -> None:
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    break  # EOF: the client closed its end
                self.buffer += data
                self._wake()
        except trio.BrokenResourceError:
            pass  # reset by the client
        except trio.ClosedResourceError:
            self.eof = True  # the server closed the socket itself (a scripted drop)
            self._wake()
            return
        self.eof = True
        self.record.closed_at = trio.current_time()
        self.record.closed.set()
        self._wake()

    def _wake(self) -> None:
        self._wakeup.set()
        self._wakeup = trio.Event()

    async def wait_for_data(self) -> None:
        await self._wakeup.wait()

    async def read_until(self, marker: bytes) -> bytes | None:
        while True:
            index = self.buffer.find(marker)
            if index >= 0:
                head = bytes(self.buffer[: index + len(marker)])
                del self.buffer[: index + len(marker)]
                return head
            if self.eof:
                return None
            if len(self.buffer) > _MAX_HEAD:
                raise ValueError("request head too large")
            await self.wait_for_data()

    async def read_exactly(self, size: int) -> bytes | None:
        while len(self.buffer) < size:
            if self.eof:
                return None
            await self.wait_for_data()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data


@attrs.define(eq=False)
class SSEServer:
    """A scripted HTTP/1.1 server on ``127.0.0.1``; start it with ``nursery.start``."""

    script: list[Reply] = attrs.field(factory=list, converter=list)
    validate: Callable[[RecordedRequest], Reply | None] | None = None
    """Checks each request first: a reply it returns is sent instead of the next
    scripted one (which stays for the next request). See ``strict_servers.py``."""
    requests: list[RecordedRequest] = attrs.field(factory=list, init=False)
    connections: list[ConnectionRecord] = attrs.field(factory=list, init=False)
    port: int = attrs.field(default=0, init=False)
    _request_seen: trio.Event = attrs.field(factory=trio.Event, init=False)

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    def add(self, *replies: Reply) -> None:
        """Append replies to the script."""
        self.script.extend(replies)

    async def serve(
        self, port: int = 0, *, task_status: trio.TaskStatus[SSEServer] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on a loopback port (0: a free one) and serve until cancelled."""
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, self._handle, port, host="127.0.0.1")
            )
            self.port = listeners[0].socket.getsockname()[1]
            task_status.started(self)

    async def wait_for_requests(self, count: int) -> None:
        """Wait until at least ``count`` requests have arrived."""
        while len(self.requests) < count:
            await self._request_seen.wait()

    def _next_reply(self) -> Reply:
        if self.script:
            return self.script.pop(0)
        return Reply.json(500, {"error": {"message": "the test script has no reply left"}})

    async def _handle(self, stream: trio.SocketStream) -> None:
        record = ConnectionRecord(number=len(self.connections), opened_at=trio.current_time())
        self.connections.append(record)
        reader = _ConnectionReader(record)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.run, stream)
            # BrokenResourceError: the client went away while we were writing.
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await self._serve_connection(stream, reader, record)
            nursery.cancel_scope.cancel()

    async def _serve_connection(
        self, stream: trio.SocketStream, reader: _ConnectionReader, record: ConnectionRecord
    ) -> None:
        while True:
            head = await reader.read_until(b"\r\n\r\n")
            if head is None:
                return
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            method, path, _version = request_line.split(" ", 2)
            headers: dict[str, str] = {}
            for line in header_lines:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.read_exactly(int(headers.get("content-length", "0")))
            if body is None:
                return
            record.requests += 1
            recorded = RecordedRequest(method, path, headers, body, record.number)
            self.requests.append(recorded)
            self._request_seen.set()
            self._request_seen = trio.Event()
            rejection = self.validate(recorded) if self.validate is not None else None
            reply = rejection if rejection is not None else self._next_reply()
            keep_alive = await self._respond(stream, reader, record, reply)
            if not keep_alive:
                return

    async def _respond(
        self,
        stream: trio.SocketStream,
        reader: _ConnectionReader,
        record: ConnectionRecord,
        reply: Reply,
    ) -> bool:
        """Send one reply; return whether the connection stays usable."""
        if reply.delay_before_headers:
            await trio.sleep(reply.delay_before_headers)
        headers = {name.lower(): value for name, value in reply.headers}
        reason = _REASONS.get(reply.status, "Status")
        lines = [f"HTTP/1.1 {reply.status} {reason}"]
        if reply.body is not None:
            headers.setdefault("content-type", "application/json")
            headers["content-length"] = str(len(reply.body))
        else:
            headers.setdefault("content-type", "text/event-stream")
            headers["transfer-encoding"] = "chunked"
            headers.setdefault("cache-control", "no-cache")
        if reply.end == "close":
            headers["connection"] = "close"
        lines.extend(f"{name}: {value}" for name, value in headers.items())
        await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if reply.body is not None:
            await stream.send_all(reply.body)
            if reply.end == "close":
                record.server_closed = True
                return False
            return True
        for count, part in enumerate(reply.events):
            if reply.drop_after is not None and count >= reply.drop_after:
                record.server_closed = True
                await trio.aclose_forcefully(stream)
                return False
            if part.delay:
                await trio.sleep(part.delay)
            data = part.encode()
            if data:
                await stream.send_all(b"%x\r\n%s\r\n" % (len(data), data))
        if reply.drop_after is not None:
            record.server_closed = True
            await trio.aclose_forcefully(stream)
            return False
        if reply.end == "hold":
            await record.closed.wait()
            return False
        await stream.send_all(b"0\r\n\r\n")
        if reply.end == "close":
            record.server_closed = True
            return False
        return True


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    529: "Overloaded",
}


def sse_lines(events: Iterable[Any]) -> list[BodyPart]:
    """Wrap JSON payloads as :class:`SSE` events (a helper for scripts)."""
    return [event if isinstance(event, SSE | Raw) else SSE(event) for event in events]
