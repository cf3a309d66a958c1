"""``EventStream``'s own contract (a private module's): every message the source has
ready goes out in one body write, the read-ahead stays bounded, and keep-alives still
fill silences. Driven with a fake ASGI ``send`` that records each body write."""

from __future__ import annotations

from collections.abc import AsyncIterator, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from trio_agents.faces import EventStream, Face, HttpLimits, sse_message
from trio_agents.faces._event_stream import _BATCH_BYTES


def _face(limits: HttpLimits | None = None) -> Face:
    return Face(host=None, limits=limits or HttpLimits())  # type: ignore[arg-type]


class _Client:
    """The ASGI side: records body writes; ``gate`` (when set) holds each write."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.gate: trio.Event | None = None
        self.done = False

    async def send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] != "http.response.body":
            return
        if self.gate is not None:
            await self.gate.wait()
        self.bodies.append(message["body"])
        self.done = not message["more_body"]

    async def receive(self) -> MutableMapping[str, Any]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


def _stream(messages: AsyncIterator[bytes], face: Face | None = None) -> EventStream:
    @asynccontextmanager
    async def source() -> AsyncIterator[AsyncIterator[bytes]]:
        yield messages
        await trio.lowlevel.checkpoint()

    return EventStream(face or _face(), "p", source)


async def test_messages_ready_together_go_in_one_body_write() -> None:
    async def ready() -> AsyncIterator[bytes]:
        for seq in range(1, 101):  # no schedule point between them: all ready at once
            yield sse_message({"seq": seq}, id=str(seq))
        await trio.lowlevel.checkpoint()

    client = _Client()
    await _stream(ready())({}, client.receive, client.send)
    opened, *middle, last = client.bodies
    assert opened == b": stream open\n\n"
    assert last == b""
    assert client.done
    assert len(middle) == 1  # one write, not one per message
    expected = b"".join(sse_message({"seq": seq}, id=str(seq)) for seq in range(1, 101))
    assert middle[0] == expected  # in order, ids kept


async def test_read_ahead_is_bounded_while_the_client_does_not_read() -> None:
    read = 0
    big = sse_message("x" * 1000)

    async def endless() -> AsyncIterator[bytes]:
        nonlocal read
        while True:
            read += 1
            yield big
            await trio.lowlevel.checkpoint()

    client = _Client()
    client.gate = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stream(endless()), {}, client.receive, client.send)
        await trio.testing.wait_all_tasks_blocked()
        # the write of ": stream open" is held; the pump filled the batch and stopped
        assert read * len(big) <= _BATCH_BYTES + 2 * len(big)
        held = read
        await trio.testing.wait_all_tasks_blocked()
        assert read == held
        nursery.cancel_scope.cancel()


async def test_silence_gets_keepalives_then_messages_still_come(autojump_clock: Any) -> None:
    go = trio.Event()

    async def late() -> AsyncIterator[bytes]:
        await go.wait()
        yield sse_message({"seq": 1}, id="1")

    client = _Client()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            _stream(late(), _face(HttpLimits(keepalive_interval=5.0))),
            {},
            client.receive,
            client.send,
        )
        await trio.sleep(11)
        go.set()
    assert client.bodies == [
        b": stream open\n\n",
        b": keep-alive\n\n",
        b": keep-alive\n\n",
        sse_message({"seq": 1}, id="1"),
        b"",
    ]


def test_sse_message_encodes_one_data_line_per_line() -> None:
    assert sse_message({"a": "x\ny"}, id="3") == b'id: 3\ndata: {"a":"x\\ny"}\n\n'
    assert sse_message("one\ntwo") == b"data: one\ndata: two\n\n"
    assert sse_message({"é": 1}) == 'data: {"é":1}\n\n'.encode()
