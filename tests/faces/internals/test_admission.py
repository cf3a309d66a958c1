"""The admission gate's own contract (``trio_agents/_admission.py``): which connection
is shed, and when. Through the servers: ``tests/faces/test_connection_admission.py``,
``tests/faces/test_connection_flood.py``, ``tests/control/test_control_admission.py``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio

from trio_agents._admission import Admitted, Gate


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


async def test_past_the_cap_an_idle_pending_connection_is_shed_before_a_busy_one() -> None:
    gate = _gate(max_pending=3)
    with _streams(4) as streams:
        first, second, third = (gate.admit(s) for s in streams[:3])
        first.request_started()  # being answered (a public route)
        fourth = gate.admit(streams[3])
        # The oldest idle one went, not the oldest.
        assert [a.closed for a in (first, second, third, fourth)] == [False, True, False, False]
        assert gate.statistics().pending == 3
        assert gate.statistics().shed == 1


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
