"""The admission gate's own contract (``trio_agents/_admission.py``): which connection
is shed, and when. Through the servers: ``tests/faces/test_connection_admission.py``,
``tests/faces/test_connection_flood.py``, ``tests/control/test_control_admission.py``."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import trio
import trio.testing

from trio_agents._serving import closing_listeners
from trio_agents.hosting._admission import Admitted, Gate, serve_admitted


@contextmanager
def _streams(n: int) -> Iterator[list[trio.SocketStream]]:
    """``n`` connected socket streams (the server's ends of socket pairs)."""
    pairs = [trio.socket.socketpair() for _ in range(n)]
    try:
        yield [trio.SocketStream(ours) for ours, _theirs in pairs]
    finally:
        for ours, theirs in pairs:
            ours.close()
            theirs.close()


def _closed(admitted: Admitted) -> bool:
    # (A call, not the attribute: mypy would take it as still False from an assert above.)
    return admitted.closed


def _gate(**overrides: int) -> Gate:
    options = {"max_pending": 100, "max_pending_per_ip": 100, **overrides}
    return Gate(header_timeout=10.0, idle_timeout=30.0, **options)


async def test_past_the_cap_the_oldest_silent_then_idle_pending_connection_is_shed() -> None:
    gate = _gate(max_pending=3)
    with _streams(5) as streams:
        busy, waiting, silent = (gate.admit(s) for s in streams[:3])
        busy.spoke = waiting.spoke = True
        busy.request_started()  # being answered (a public route)
        # waiting: sent part of a request head; silent: sent nothing yet.
        fourth = gate.admit(streams[3])
        assert [a.closed for a in (busy, waiting, silent, fourth)] == [False, False, True, False]
        fourth.spoke = True
        fifth = gate.admit(streams[4])  # no silent one left: the oldest waiting one goes
        assert [a.closed for a in (busy, waiting, fourth, fifth)] == [False, True, False, False]
        assert gate.statistics().pending == 3
        assert gate.statistics().shed == 2


async def test_an_authenticated_connection_is_not_counted_and_shed_last() -> None:
    gate = _gate(max_pending=2)
    with _streams(4) as streams:
        trusted: Admitted = gate.admit(streams[0])
        trusted.request_started()
        trusted.authenticated()
        trusted.request_ended()  # idle, waiting for its next request
        pending = [gate.admit(s) for s in streams[1:3]]
        assert not any(a.closed for a in [trusted, *pending])  # the cap counts 2, not 3
        # Out of descriptors: the pending ones go first, oldest first...
        assert gate.shed_for_descriptor()
        assert pending[0].closed
        assert not pending[1].closed
        assert gate.shed_for_descriptor()
        assert not trusted.closed
        # ... then an idle authenticated one; one being answered is never shed.
        busy = gate.admit(streams[3])
        busy.request_started()
        busy.authenticated()
        assert gate.shed_for_descriptor()
        assert _closed(trusted)
        assert not gate.shed_for_descriptor()
        assert not busy.closed
        assert gate.statistics().connections == 1


async def test_a_shed_connection_frees_its_descriptor_at_once() -> None:
    gate = _gate(max_pending_per_ip=1)
    with _streams(2) as streams:
        first = gate.admit(streams[0])
        gate.admit(streams[1])  # same address (a socket pair's): the first is shed
        assert first.closed
        assert streams[0].socket.fileno() == -1


async def test_a_connection_shed_before_its_handler_ran_is_let_go_cleanly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A cap of one: each connection sheds the one before it, often before that one's
    # task ran (the scheduler runs a batch in random order). Its socket is closed then:
    # the task must not wait on its descriptor (-1, or by then another connection's).
    gate = _gate(max_pending_per_ip=1)
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    handled: list[Admitted] = []

    async def handler(admitted: Admitted) -> None:
        handled.append(admitted)
        await trio.sleep_forever()

    clients: list[socket.socket] = []
    try:
        async with closing_listeners(listeners), trio.open_nursery() as nursery:
            nursery.start_soon(serve_admitted, handler, listeners, gate, nursery)
            await trio.testing.wait_all_tasks_blocked()
            # Blocking connects, no checkpoint between them: all 100 wait in the accept
            # queue, and the server accepts them back to back.
            for _ in range(100):
                client = socket.create_connection(("127.0.0.1", port))
                client.sendall(b"x")
                clients.append(client)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    finally:
        for client in clients:
            client.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert gate.statistics().shed == 99
