"""What a connection whose handshake is not accepted may cost the control server
(``Limits.max_unauthenticated_connections``, ``max_unauthenticated_per_ip``), over raw
loopback sockets: past a cap the oldest such connections are shed, an authenticated
client's connection is not counted, and a shutdown does not wait for them. (The HTTP
faces share the same admission: ``tests/faces/test_connection_admission.py``.)"""

from __future__ import annotations

import trio
import trio.testing

from tests.support.control_support import serving
from tests.support.http_support import AGENTS, read_until_closed
from trio_agents.control import Limits, connect

HANDSHAKE = (
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: trio-agents.v1\r\nAuthorization: Bearer tok-alice\r\n\r\n"
)


async def _upgraded(stream: trio.SocketStream) -> bool:
    await stream.send_all(HANDSHAKE)
    got = bytearray()
    while b"\r\n\r\n" not in got:
        data = await stream.receive_some()
        assert data, "closed instead of answering the handshake"
        got += data
    return bytes(got).startswith(b"HTTP/1.1 101")


async def test_past_the_per_address_cap_the_oldest_pending_connections_are_shed() -> None:
    limits = Limits(max_unauthenticated_per_ip=4, handshake_timeout=1000.0)
    async with (
        serving(AGENTS, limits=limits) as (server, url),
        connect(url, token="tok-alice") as client,  # accepted first: not counted
    ):
        flood: list[trio.SocketStream] = []
        for _ in range(10):
            flood.append(await trio.open_tcp_stream("127.0.0.1", server.port or 0))
            await trio.testing.wait_all_tasks_blocked()  # the server accepted it
        try:
            with trio.fail_after(30):
                for stream in flood[:6]:  # shed, the oldest first
                    assert await read_until_closed(stream)
                for stream in flood[6:]:
                    assert await _upgraded(stream)
                assert await client.list_runs() == []
        finally:
            for stream in flood:
                await stream.aclose()


async def test_a_pending_handshake_does_not_hold_up_a_shutdown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limits = Limits(handshake_timeout=1000.0, shutdown_timeout=100.0)
    async with serving(AGENTS, limits=limits) as (server, _url):
        idle = await trio.open_tcp_stream("127.0.0.1", server.port or 0)
        await trio.testing.wait_all_tasks_blocked()
        stopping = trio.current_time()
    assert trio.current_time() - stopping < limits.shutdown_timeout
    with trio.fail_after(1):
        assert await read_until_closed(idle)
    await idle.aclose()
