"""Admission of a server's TCP connections: what a client that holds no token may cost.

A connection costs a file descriptor from its accept on, and any client can open one.
Without a bound, a few hundred connections that never finish a request (idle, or a head
sent a byte at a time) exhaust the process's descriptors, every ``accept`` fails with
``EMFILE``, and every client — authenticated ones included — is locked out until
those connections time out. So a :class:`Gate` keeps, per server:

- **pending** connections — those that have not yet made an authenticated request —
  in the order they were accepted, at most ``max_pending`` in all and
  ``max_pending_per_ip`` per peer address. Admitting one past a cap *sheds* the oldest
  pending connection (of that address, or of all) instead of refusing the new one: the
  newest connection is the one most likely to be a real client about to send its
  request, and the oldest the one that had the longest time to send it. A pending
  connection that has sent nothing is shed first, then one waiting for a request head,
  then one being answered.
- **a deadline per connection while it waits for a request head**: ``header_timeout``
  from its accept (or from the end of its last response) while it is pending,
  ``idle_timeout`` (the keep-alive timeout) once it has made an authenticated request.
  No deadline while a request is being answered: an event stream may last hours.
- **shedding on ``EMFILE``**: an ``accept`` that fails for want of descriptors sheds
  one connection (the oldest pending one, else the oldest idle authenticated one) and
  tries again at once; with nothing to shed it waits a little (never a busy loop).

Shedding closes the socket synchronously (its descriptor is free before the next
``accept``) and cancels the connection's handler; the deadline is that same cancel scope's
(no timer task per connection). The server tells the gate when a request starts and ends
(:meth:`Admitted.request_started`, :meth:`Admitted.request_ended`) and when one was
authenticated (:meth:`Admitted.authenticated`).
"""

from __future__ import annotations

import errno
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, final

import attrs
import trio

__all__ = ["Admitted", "Gate", "GateStatistics", "serve_admitted"]

logger = logging.getLogger("trio_agents.connections")

# accept(2) failures that say the process or the system is out of a resource a
# connection needs (the ones trio.serve_listeners retries).
_CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
# How long the accept loop waits when it is out of descriptors and has nothing to shed.
_RETRY_AFTER: Final = 0.1
# At most one log line per this many seconds about a failing accept.
_LOG_EVERY: Final = 5.0


@attrs.frozen
class GateStatistics:
    """A snapshot of a :class:`Gate`.

    Attributes:
        connections: open connections.
        pending: of which, not yet authenticated.
        shed: connections closed so far to make room (a cap, or ``EMFILE``).
        timed_out: connections closed so far by their header or idle timeout.
    """

    connections: int
    pending: int
    shed: int
    timed_out: int


@final
class Admitted:
    """One admitted connection: its state in the :class:`Gate`, and its timer."""

    __slots__ = ("_busy", "_gate", "_scope", "closed", "ip", "spoke", "stream", "trusted")

    def __init__(self, gate: Gate, stream: trio.SocketStream, ip: str) -> None:
        self._gate = gate
        self.stream = stream
        self.ip = ip
        self.trusted = False
        self.closed = False
        self.spoke = False  # the client has sent something
        self._busy = 0
        # Around the connection's handler, its deadline the connection's: one that waits
        # too long for a request head is ended by it, and a shed one ends with it (one
        # waiting in a websocket handshake would otherwise sit out its timeout). No
        # task per connection for the timer: a flood costs what it must, no more.
        self._scope = trio.CancelScope(deadline=trio.current_time() + gate.header_timeout)

    @property
    def idle(self) -> bool:
        """Whether no request is being answered (the connection waits for a head)."""
        return self._busy == 0

    def request_started(self) -> None:
        """A request head arrived: no deadline until it is answered."""
        self._busy += 1
        self._scope.deadline = math.inf

    def request_ended(self) -> None:
        """A request was answered: the connection waits for the next head."""
        self._busy -= 1
        if self._busy == 0 and not self.closed:
            timeout = self._gate.idle_timeout if self.trusted else self._gate.header_timeout
            self._scope.deadline = trio.current_time() + timeout

    def accepted(self) -> None:
        """A long-lived exchange was authenticated (a websocket handshake): the
        connection is trusted, with no deadline for as long as it lasts."""
        self.authenticated()
        self.request_started()

    def authenticated(self) -> None:
        """A request on this connection carried a valid token: it is no longer pending
        (no cap counts it, and it is shed for descriptors only when idle and nothing
        pending is left)."""
        if not self.trusted:
            self.trusted = True
            self._gate._trust(self)

    def shed(self) -> None:
        """Close the socket now (synchronously: the descriptor is free on return)."""
        if self.closed:
            return
        self._gate._forget(self)
        self.closed = True
        self._scope.cancel()
        # trio's socket close frees the descriptor now, and wakes a task blocked on the
        # socket (it sees ClosedResourceError, as after its own close).
        self.stream.socket.close()

    def done(self) -> None:
        """The connection ended (its handler returned): forget it."""
        if not self.closed:
            self._gate._forget(self)
            self.closed = True


@final
class Gate:
    """The admission of one server's connections (see the module docstring)."""

    def __init__(
        self,
        *,
        max_pending: int,
        max_pending_per_ip: int,
        header_timeout: float,
        idle_timeout: float,
    ) -> None:
        self.max_pending = max_pending
        self.max_pending_per_ip = max_pending_per_ip
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        # dicts as ordered sets: insertion order is accept order, oldest first.
        self._pending: dict[Admitted, None] = {}
        self._pending_by_ip: dict[str, dict[Admitted, None]] = {}
        self._trusted: dict[Admitted, None] = {}
        self._shed = 0
        self._timed_out = 0

    def statistics(self) -> GateStatistics:
        return GateStatistics(
            connections=len(self._pending) + len(self._trusted),
            pending=len(self._pending),
            shed=self._shed,
            timed_out=self._timed_out,
        )

    def admit(self, stream: trio.SocketStream) -> Admitted:
        """Admit a new connection, shedding the oldest pending ones past a cap."""
        ip = _peer_ip(stream)
        same_ip = self._pending_by_ip.get(ip)
        if same_ip is not None and len(same_ip) >= self.max_pending_per_ip:
            self._shed_one(same_ip)
        if len(self._pending) >= self.max_pending:
            self._shed_one(self._pending)
        admitted = Admitted(self, stream, ip)
        self._pending[admitted] = None
        self._pending_by_ip.setdefault(ip, {})[admitted] = None
        return admitted

    def shed_for_descriptor(self) -> bool:
        """Shed one connection to free a descriptor: the oldest pending one (idle
        first), else the oldest idle authenticated one. False if there was none."""
        if self._pending:
            self._shed_one(self._pending)
            return True
        for admitted in self._trusted:
            if admitted.idle:
                self._shed += 1
                admitted.shed()
                return True
        return False

    def close_idle(self) -> None:
        """Shed every connection that has not made an authenticated request and waits
        for a request head (a server shutting down: none of them is owed an answer)."""
        for admitted in [a for a in self._pending if a.idle]:
            admitted.shed()

    def _shed_one(self, among: dict[Admitted, None]) -> None:
        # The oldest that has sent nothing yet; else the oldest waiting for a request
        # head; else the oldest. (A real client sends its request as soon as it is
        # connected: under a flood of idle connections it is never the one shed.)
        victim: Admitted | None = None
        for admitted in among:
            if not admitted.spoke:
                victim = admitted
                break
            if victim is None and admitted.idle:
                victim = admitted
        if victim is None:
            victim = next(iter(among))
        self._shed += 1
        victim.shed()

    def _trust(self, admitted: Admitted) -> None:
        if admitted.closed:
            return
        self._unpend(admitted)
        self._trusted[admitted] = None

    def _forget(self, admitted: Admitted) -> None:
        self._unpend(admitted)
        self._trusted.pop(admitted, None)

    def _unpend(self, admitted: Admitted) -> None:
        if admitted in self._pending:
            del self._pending[admitted]
            same_ip = self._pending_by_ip[admitted.ip]
            del same_ip[admitted]
            if not same_ip:
                del self._pending_by_ip[admitted.ip]


def _peer_ip(stream: trio.SocketStream) -> str:
    try:
        peer = stream.socket.getpeername()
    except OSError:  # already reset by the peer: it counts as its own address
        return "?"
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)


async def serve_admitted(
    handler: Callable[[Admitted], Awaitable[None]],
    listeners: Sequence[trio.SocketListener],
    gate: Gate,
    handlers: trio.Nursery,
) -> None:
    """Accept connections on ``listeners`` until cancelled, admit each through ``gate``
    and run ``handler(admitted)`` for it in ``handlers`` (within its deadline).
    ``trio.serve_listeners`` with admission: a failing ``accept`` for want of
    descriptors sheds a connection and retries (see the module docstring)."""
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(_accept_loop, handler, listener, gate, handlers)


async def _accept_loop(
    handler: Callable[[Admitted], Awaitable[None]],
    listener: trio.SocketListener,
    gate: Gate,
    handlers: trio.Nursery,
) -> None:
    logged_at = -math.inf
    failures = 0
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if exc.errno not in _CAPACITY_ERRNOS:
                raise
            failures += 1
            shed = gate.shed_for_descriptor()
            now = trio.current_time()
            if now - logged_at >= _LOG_EVERY:
                logged_at = now
                logger.warning(
                    "accept failed %d time(s) (%s: %s); %s",
                    failures,
                    errno.errorcode.get(exc.errno or 0, "?"),
                    exc.strerror,
                    "shedding connections to make room"
                    if shed
                    else f"nothing to shed, retrying every {_RETRY_AFTER:g} s",
                )
                failures = 0
            if shed:
                await trio.lowlevel.checkpoint()
            else:
                await trio.sleep(_RETRY_AFTER)
            continue
        handlers.start_soon(_run, handler, gate.admit(stream))


async def _run(handler: Callable[[Admitted], Awaitable[None]], admitted: Admitted) -> None:
    try:
        with admitted._scope:
            # The handler (Hypercorn's machinery, a websocket handshake) starts once the
            # client has sent something: an idle connection of a flood costs a socket
            # and no more. Shed or timed out meanwhile, the wait ends closed. (Shed before
            # this task ran, the socket is closed already: waiting on its descriptor, -1
            # or by now another connection's, would be a bug.)
            try:
                if not admitted.closed:
                    await trio.lowlevel.wait_readable(admitted.stream.socket)
            except trio.ClosedResourceError:
                pass
            else:
                if not admitted.closed:
                    admitted.spoke = True
                    await handler(admitted)
        if admitted._scope.cancelled_caught and not admitted.closed:
            admitted._gate._timed_out += 1  # its deadline passed (a shed one is closed)
    except Exception as exc:
        # One bad connection must never take the server down (the handlers' nursery is
        # the server's).
        logger.error("a connection's handler crashed", exc_info=exc)
    finally:
        admitted.done()
        await trio.aclose_forcefully(admitted.stream)
