"""What a connection that has not made an authenticated request may cost the HTTP
server (``HttpLimits.header_timeout``, ``max_unauthenticated_connections``,
``max_unauthenticated_per_ip``), over raw loopback sockets: it has ``header_timeout``
to send a request head, the oldest such connections are shed past a cap, and a
connection that made an authenticated request is neither timed nor counted as one.
(The flood against a server out of file descriptors: ``test_connection_flood.py``.)"""

from __future__ import annotations

import trio
import trio.testing

from tests.support.http_support import read_until_closed, serving
from trio_agents.faces import HttpLimits

REQUEST = b"GET /runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-alice\r\n\r\n"
ANONYMOUS = b"GET /runs HTTP/1.1\r\nHost: x\r\n\r\n"


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


async def _answer(stream: trio.SocketStream, request: bytes = REQUEST) -> bytes:
    """Send ``request``; the head of its answer (the body read by its Content-Length)."""
    await stream.send_all(request)
    got = bytearray()
    while b"\r\n\r\n" not in got:
        data = await stream.receive_some()
        assert data, "the server closed the connection instead of answering"
        got += data
    head, _, body = bytes(got).partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += await stream.receive_some()
    return head


async def test_a_connection_has_header_timeout_to_send_a_request_head(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limits = HttpLimits(header_timeout=5.0, keep_alive_timeout=1000.0)
    async with serving(limits=limits) as served:
        port = _port(served.base)
        idle = await trio.open_tcp_stream("127.0.0.1", port)
        half = await trio.open_tcp_stream("127.0.0.1", port)
        anonymous = await trio.open_tcp_stream("127.0.0.1", port)
        async with idle, half, anonymous:
            opened = trio.current_time()
            await half.send_all(REQUEST[:30])  # a head that never ends
            # Answered 401 and kept alive, but still not authenticated: timed the same.
            assert (await _answer(anonymous, ANONYMOUS)).startswith(b"HTTP/1.1 401")
            with trio.fail_after(100 * limits.header_timeout):
                for stream in (idle, half, anonymous):
                    assert await read_until_closed(stream)
            # Virtual time: closed by the header timeout, long before the keep-alive one
            # (the only bound there was before).
            assert limits.header_timeout <= trio.current_time() - opened < 30.0


async def test_an_authenticated_connection_is_kept_for_the_keep_alive_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limits = HttpLimits(header_timeout=5.0, keep_alive_timeout=60.0)
    async with serving(limits=limits) as served:
        stream = await trio.open_tcp_stream("127.0.0.1", _port(served.base))
        async with stream:
            assert (await _answer(stream)).startswith(b"HTTP/1.1 200")
            await trio.sleep(4 * limits.header_timeout)  # virtual time passes, idle
            assert (await _answer(stream)).startswith(b"HTTP/1.1 200")
            answered = trio.current_time()
            with trio.fail_after(10 * limits.keep_alive_timeout):
                assert await read_until_closed(stream)
            assert trio.current_time() - answered >= limits.keep_alive_timeout


async def test_past_the_per_address_cap_the_oldest_pending_connections_are_shed() -> None:
    limits = HttpLimits(max_unauthenticated_per_ip=4, header_timeout=1000.0)
    async with serving(limits=limits) as served:
        port = _port(served.base)
        # Authenticated first: it is not counted against the cap.
        trusted = await trio.open_tcp_stream("127.0.0.1", port)
        assert (await _answer(trusted)).startswith(b"HTTP/1.1 200")
        flood: list[trio.SocketStream] = []
        for _ in range(10):
            flood.append(await trio.open_tcp_stream("127.0.0.1", port))
            await trio.testing.wait_all_tasks_blocked()  # the server accepted it
        try:
            with trio.fail_after(30):
                for stream in flood[:6]:  # shed, the oldest first
                    assert await read_until_closed(stream)
                for stream in [*flood[6:], trusted]:  # still served
                    assert (await _answer(stream)).startswith(b"HTTP/1.1 200")
        finally:
            for stream in [trusted, *flood]:
                await stream.aclose()


async def test_past_the_total_cap_the_oldest_pending_connections_are_shed() -> None:
    limits = HttpLimits(
        max_unauthenticated_connections=4, max_unauthenticated_per_ip=3, header_timeout=1000.0
    )
    async with serving(limits=limits) as served:
        port = _port(served.base)
        opened: list[trio.SocketStream] = []
        # Three from each of two loopback addresses: under the per-address cap, past the
        # total one by two.
        for source in ("127.0.0.2",) * 3 + ("127.0.0.3",) * 3:
            opened.append(await trio.open_tcp_stream("127.0.0.1", port, local_address=source))
            await trio.testing.wait_all_tasks_blocked()
        try:
            with trio.fail_after(30):
                for stream in opened[:2]:
                    assert await read_until_closed(stream)
                for stream in opened[2:]:
                    assert (await _answer(stream)).startswith(b"HTTP/1.1 200")
        finally:
            for stream in opened:
                await stream.aclose()


async def test_a_connection_that_never_sent_a_byte_does_not_hold_up_a_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limits = HttpLimits(header_timeout=1000.0, shutdown_timeout=100.0)
    async with serving(limits=limits) as served:
        idle = await trio.open_tcp_stream("127.0.0.1", _port(served.base))
        await trio.testing.wait_all_tasks_blocked()
        stopping = trio.current_time()
    # (Leaving the block shut the server down.)
    assert trio.current_time() - stopping < limits.shutdown_timeout
    with trio.fail_after(1):
        assert await read_until_closed(idle)
    await idle.aclose()


# A request with a body the app answers without reading (a GET carrying a JSON body, as
# httpx sends for ``request("GET", url, json=...)``, answered 404 from the path alone).
EARLY = (
    b"GET /runs/no-such-run HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-alice\r\n"
    b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n"
)


async def test_a_request_answered_before_its_body_arrived_keeps_its_connection_usable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Hypercorn closes the connection after a response that ended before the request's
    # body was in (h11 cannot start the next cycle), yet without `Connection: close`:
    # a client reusing it — httpx writes a request's body after its head, and on a
    # loaded machine the answer can come between the two — had its next request
    # dropped ("Server disconnected without sending a response"). The server now reads
    # the rest of the body first, and it arrives: the connection serves the next request.
    async with serving() as served:
        stream = await trio.open_tcp_stream("127.0.0.1", _port(served.base))
        async with stream:
            heads: list[bytes] = []

            async def ask() -> None:
                heads.append(await _answer(stream, EARLY))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(ask)
                # The head is in and answered as far as it goes; only then the body.
                await trio.testing.wait_all_tasks_blocked()
                await stream.send_all(b"{}")
            assert heads[0].startswith(b"HTTP/1.1 404"), heads[0]
            assert b"connection: close" not in heads[0].lower(), heads[0]
            assert (await _answer(stream)).startswith(b"HTTP/1.1 200")


async def test_a_request_whose_body_never_comes_is_answered_with_connection_close(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The body still missing after header_timeout: the answer says the connection
    # closes, so no client sends another request on it.
    limits = HttpLimits(header_timeout=5.0, keep_alive_timeout=1000.0)
    async with serving(limits=limits) as served:
        stream = await trio.open_tcp_stream("127.0.0.1", _port(served.base))
        async with stream:
            head = await _answer(stream, EARLY)
            assert head.startswith(b"HTTP/1.1 404"), head
            assert b"connection: close" in head.lower(), head
            with trio.fail_after(1):
                assert await read_until_closed(stream)
