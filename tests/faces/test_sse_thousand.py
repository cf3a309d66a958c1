"""Adversarial: a thousand SSE connections on one run, each given every event.

The subscribers are raw loopback sockets speaking HTTP/1.1 (a request line, then the
chunked body read to its end) rather than a thousand HTTP clients: what is measured is
the server's fan-out, and a lean client keeps the test to seconds.
"""

from __future__ import annotations

import json

import trio

from tests.support.control_support import wait_until
from tests.support.http_support import TOKENS, blocker, client, serving, start, talker
from trio_agents.faces import HttpLimits

TOKEN = next(iter(TOKENS))


def _dechunk(raw: bytes) -> tuple[bytes, bytes]:
    """The head and the body of a chunked HTTP/1.1 response read to its end."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    body = bytearray()
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return head, bytes(body)
        body += rest[:size]
        assert rest[size : size + 2] == b"\r\n"
        rest = rest[size + 2 :]


async def _subscriber(port: int, run_id: str, results: list[list[dict[str, object]]]) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(
            f"GET /runs/{run_id}/events HTTP/1.1\r\nHost: t\r\n"
            f"Authorization: Bearer {TOKEN}\r\nConnection: close\r\n\r\n".encode()
        )
        raw = bytearray()
        # The body ends with the last chunk (the connection may stay open a moment).
        while not raw.endswith(b"\r\n0\r\n\r\n"):
            chunk = await stream.receive_some(65536)
            assert chunk, "the connection closed before the stream ended"
            raw += chunk
    head, body = _dechunk(bytes(raw))
    assert head.startswith(b"HTTP/1.1 200")
    events = []
    for message in body.decode().split("\n\n"):
        lines = message.split("\n")
        data = [line[6:] for line in lines if line.startswith("data: ")]
        if data:
            ids = [line[4:] for line in lines if line.startswith("id: ")]
            event = json.loads("\n".join(data))
            assert ids == [str(event["seq"])]
            events.append(event)
    results.append(events)


async def test_a_thousand_sse_connections_each_get_every_event() -> None:
    count = 1000
    words = 5
    agents = {"blocker": blocker(), "talker": talker(words)}
    limits = HttpLimits(max_streams_per_principal=count)
    async with serving(agents, limits=limits) as served, client(served.base) as alice:
        port = int(served.base.rsplit(":", 1)[1])
        # The talker waits behind a blocked run of its session: every subscriber is
        # attached before its first event.
        first = await start(alice, session_id="s")
        run_id = await start(alice, "talker", session_id="s", on_busy="enqueue")
        results: list[list[dict[str, object]]] = []
        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(_subscriber, port, run_id, results)
            await wait_until(lambda: served.app.statistics().streams == count)
            await alice.post(f"/runs/{first}/cancel", json={"reason": "go on"})
        assert len(results) == count
        expected = results[0]
        assert [event["seq"] for event in expected] == list(range(1, len(expected) + 1))
        kinds = [event["event"]["type"] for event in expected]  # type: ignore[index]
        assert kinds.count("response.text.delta") == words
        assert expected[-1]["event"]["status"] == "completed"  # type: ignore[index]
        assert all(events == expected for events in results)
        await wait_until(lambda: served.app.statistics().streams == 0)
