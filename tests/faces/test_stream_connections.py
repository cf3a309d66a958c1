"""What happens to the connection once an event stream ends, on every face that streams
(REST's ``/runs/{id}/events``, A2A's ``SendStreamingMessage``, AG-UI): an HTTP/1.0
request and a ``Connection: close`` request are answered with a body that ends by
closing the connection; after a finished stream on a keep-alive connection, the
connection is kept alive and, left idle, closed after the keep-alive timeout. Raw sockets, so nothing but the server decides when the connection ends."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import pytest
import trio

from tests.support.http_support import client, serving, start
from trio_agents.faces import HttpLimits

TOKEN = "Authorization: Bearer tok-alice\r\n"

# A request of each face's event stream, for a run of the agent "talker" (which ends):
# (method, target, body). The REST one needs the run started first.
Request = Callable[[str], Awaitable[tuple[str, str, bytes]]]


async def _rest(base: str) -> tuple[str, str, bytes]:
    async with client(base) as http:
        run_id = await start(http, "talker")
    return "GET", f"/runs/{run_id}/events", b""


async def _a2a(_base: str) -> tuple[str, str, bytes]:
    message = {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendStreamingMessage",
        "params": {"message": message, "metadata": {"agent": "talker"}},
    }
    return "POST", "/a2a", json.dumps(body).encode()


async def _agui(_base: str) -> tuple[str, str, bytes]:
    messages = [{"id": "m", "role": "user", "content": "go"}]
    body = {"threadId": "t1", "runId": "ag-1", "messages": messages}
    return "POST", "/ag-ui/talker", json.dumps(body).encode()


FACES = pytest.mark.parametrize("request_of", [_rest, _a2a, _agui], ids=["rest", "a2a", "agui"])


def _head(method: str, target: str, body: bytes, version: str, extra: str = "") -> bytes:
    length = f"Content-Length: {len(body)}\r\nContent-Type: application/json\r\n" if body else ""
    return (
        f"{method} {target} HTTP/{version}\r\nHost: x\r\n{TOKEN}{length}{extra}\r\n".encode() + body
    )


async def _read_until_closed(stream: trio.SocketStream) -> bytes:
    """Everything the server sends, up to its closing the connection (b"" read)."""
    got = bytearray()
    while data := await stream.receive_some():
        got += data
    return bytes(got)


async def _one_response(stream: trio.SocketStream) -> bytes:
    """One chunked response (an event stream's), read up to its last chunk."""
    got = bytearray()
    while not got.endswith(b"\r\n0\r\n\r\n"):
        data = await stream.receive_some()
        assert data, f"the server closed a keep-alive connection mid-response: {bytes(got)!r}"
        got += data
    return bytes(got)


@FACES
@pytest.mark.parametrize(
    ("version", "extra"), [("1.0", ""), ("1.1", "Connection: close\r\n")], ids=["http10", "close"]
)
async def test_a_stream_asked_to_close_ends_by_closing_the_connection(
    request_of: Request, version: str, extra: str
) -> None:
    async with serving() as served:
        port = int(served.base.rsplit(":", 1)[1])
        method, target, body = await request_of(served.base)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(_head(method, target, body, version, extra))
            # The run ends by itself; before the fix the body ended but the socket stayed
            # open for good (an HTTP/1.0 client, nginx's default upstream, hung here).
            with trio.fail_after(30):
                got = await _read_until_closed(stream)
        head, _, rest = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), got[:300]
        assert b"text/event-stream" in head
        if version == "1.0":
            # No chunked encoding for an HTTP/1.0 client: the close is the body's end.
            assert b"transfer-encoding" not in head.lower()
        else:
            assert rest.endswith(b"0\r\n\r\n")
        assert served.app.statistics().streams == 0


@FACES
async def test_after_a_finished_stream_the_connection_is_kept_alive_then_closed_when_idle(
    request_of: Request, autojump_clock: trio.testing.MockClock
) -> None:
    limits = HttpLimits(keep_alive_timeout=60.0)
    async with serving(limits=limits) as served:
        port = int(served.base.rsplit(":", 1)[1])
        method, target, body = await request_of(served.base)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(_head(method, target, body, "1.1"))
            with trio.fail_after(30):
                first = await _one_response(stream)
            head = first.partition(b"\r\n\r\n")[0].lower()
            assert head.startswith(b"http/1.1 200")
            assert b"connection: close" not in head  # kept alive
            # Left idle, the connection is closed by the server after the keep-alive
            # timeout (virtual time). Before the fix the keep-alive timer was never armed
            # after a stream, and the idle connection held its socket forever.
            opened = trio.current_time()
            with trio.fail_after(10 * limits.keep_alive_timeout):
                assert await _read_until_closed(stream) == b""
            assert trio.current_time() - opened >= limits.keep_alive_timeout - 1
