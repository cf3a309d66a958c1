"""Serving the HTTP faces with Hypercorn's Trio worker.

Why not plain ``hypercorn.trio.serve``: Hypercorn writes every byte with a *shielded*
``send_all`` (``hypercorn/trio/tcp_server.py``, ``protocol_send``), so a client that
stops reading an event stream blocks that write — and the stream's task — forever, and
no cancel scope of the app can end it. The one place a bound can go is the byte stream
under Hypercorn. So :func:`serve_http` runs Hypercorn's own per-connection server
(``TCPServer``, the piece ``hypercorn.trio.serve`` runs for each accepted socket) over
a listener of ours whose streams bound each write by ``send_timeout``: a write still
blocked then closes the socket, Hypercorn sees the connection closed, and the app's
``receive()`` answers ``http.disconnect``. The shutdown is Hypercorn's too (stop
accepting, tell idle keep-alive connections to close, give the rest a bound).

The accept loop is ours as well (``trio_agents/_admission.py``): connections that have
not made an authenticated request yet are capped (in all and per client address; the
oldest shed first) and have ``header_timeout`` to send a request head, an ``accept``
that fails with ``EMFILE`` sheds one and tries again, and a connection's Hypercorn
machinery is built only once it has sent something. The auth layer tells the gate when
a request was authenticated, through the scope (:data:`AUTHENTICATED_KEY`).

A response started before its request's body was read first reads the rest of it
(:class:`_Exchange`): Hypercorn closes a connection whose request was incomplete when
its response ended, without saying so to the client, which would reuse it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, cast, final

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState

from .._serving import closing_listeners, send_within
from ..hosting._admission import Admitted, Gate, serve_admitted
from ._http_limits import HttpLimits
from ._http_requests import AUTHENTICATED_KEY

__all__ = ["serve_http"]

logger = logging.getLogger("trio_agents.faces")


@final
class _BoundedStream(trio.abc.HalfCloseableStream):
    """A socket stream whose ``send_all`` gives up after ``send_timeout`` seconds and
    closes the socket (nothing is ever written after a send that did not finish)."""

    def __init__(self, inner: trio.SocketStream, send_timeout: float) -> None:
        self.inner = inner
        self.send_timeout = send_timeout
        self.broken = False

    @property
    def socket(self) -> trio.socket.SocketType:
        """The socket (Hypercorn reads the peer's address from it)."""
        return self.inner.socket

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.broken:
            await trio.lowlevel.checkpoint()
            raise trio.BrokenResourceError("a previous send did not finish")
        try:
            sent = await send_within(self.inner, data, self.send_timeout)
        except BaseException:
            self.broken = True
            raise
        if not sent:
            self.broken = True
            logger.info(
                "an HTTP client read nothing for %g s; connection closed", self.send_timeout
            )
            raise trio.BrokenResourceError(f"the peer read nothing for {self.send_timeout:g} s")

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        await self.inner.send_eof()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        self.broken = True
        await self.inner.aclose()


def _config(limits: HttpLimits) -> Config:
    config = Config()
    config.graceful_timeout = limits.shutdown_timeout
    # Request heads and bodies are bounded here too: a head past 16 KiB is refused by
    # h11 before the app sees it; bodies are the app's (HttpLimits.max_body_bytes).
    config.h11_max_incomplete_size = 16 * 1024
    config.accesslog = None
    config.errorlog = logging.getLogger("trio_agents.faces.hypercorn")
    # No read timeout: an event stream's request reads nothing for hours. A client that
    # sends a head slowly, or nothing at all, is the gate's (header_timeout), and an
    # authenticated connection waiting for its next request Hypercorn's (keep-alive).
    config.read_timeout = None
    config.keep_alive_timeout = limits.keep_alive_timeout
    return config


async def serve_http(
    app: Callable[[Any, Any, Any], Awaitable[None]],
    host: str | None,
    port: int,
    *,
    limits: HttpLimits | None = None,
    on_shutdown: Callable[[], None] | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve the ASGI ``app`` (an :func:`~trio_agents.faces.http_app`) on
    ``host:port`` until cancelled (port 0 picks a free one).

    Start protocol: ``port = await nursery.start(serve_http, app, "127.0.0.1", 0)``
    returns the bound port. When the scope around it is cancelled: stop accepting,
    call ``on_shutdown`` (an :class:`~trio_agents.faces.HttpApp` passed as ``app`` is
    told itself), close idle keep-alive connections, let requests and event streams
    in flight finish within ``limits.shutdown_timeout`` (streams end with their run's
    terminal update, which a host shutting down emits), then close the rest and
    re-raise the cancellation.

    Connections that have made no authenticated request are bounded by ``limits``
    (``header_timeout``, ``max_unauthenticated_connections``,
    ``max_unauthenticated_per_ip``); an :func:`~trio_agents.faces.http_app` says which
    requests were authenticated (another ASGI app says none: all its connections are
    bounded so).
    """
    limits = limits if limits is not None else getattr(app, "limits", None) or HttpLimits()
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound: int = listeners[0].socket.getsockname()[1]
    config = _config(limits)
    context = WorkerContext(None)
    gate = Gate(
        max_pending=limits.max_unauthenticated_connections,
        max_pending_per_ip=limits.max_unauthenticated_per_ip,
        header_timeout=limits.header_timeout,
        idle_timeout=limits.keep_alive_timeout,
    )

    async def handle(admitted: Admitted) -> None:
        # (Called once the client has sent something: see serve_admitted.)
        stream = _BoundedStream(admitted.stream, limits.send_timeout)
        server = TCPServer(
            ASGIWrapper(_Tracked(app, admitted, limits)),
            config,
            context,
            ConnectionState({}),
            # Typed for its TLS stream; it uses the socket (for addresses) and the Stream calls.
            cast(Any, stream),
        )
        await server.run()

    # The connections live in a shielded nursery: a cancelled serve_http stops
    # accepting at once, but gives what is in flight its bound (connections.deadline).
    connections = trio.CancelScope(shield=True)
    stop = trio.Event()
    async with closing_listeners(listeners), trio.open_nursery() as nursery:
        handlers: trio.Nursery = await nursery.start(_hold, connections, stop)
        accepting = trio.CancelScope()
        handlers.start_soon(_accept, handle, listeners, gate, handlers, accepting)
        task_status.started(bound)
        try:
            await trio.sleep_forever()
        finally:
            accepting.cancel()
            connections.deadline = trio.current_time() + limits.shutdown_timeout
            told = getattr(app, "shutdown", None)
            if on_shutdown is not None:
                on_shutdown()
            elif callable(told):
                told()
            await context.terminated.set()  # no checkpoint: sets a trio.Event
            # Hypercorn closes its idle keep-alive connections on `terminated`; those
            # that never sent a byte never reached it.
            gate.close_idle()
            stop.set()
    raise AssertionError("unreachable")  # pragma: no cover


@final
class _Tracked:
    """The app as one connection's requests reach it: tells the connection's
    :class:`~trio_agents._admission.Admitted` when a request starts and ends, and leaves
    it under :data:`AUTHENTICATED_KEY` for the auth layer to call. An HTTP request goes
    through an :class:`_Exchange` (a response started before its body was read)."""

    def __init__(
        self,
        app: Callable[[Any, Any, Any], Awaitable[None]],
        admitted: Admitted,
        limits: HttpLimits,
    ):
        self.app = app
        self.admitted = admitted
        self.limits = limits

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.admitted.request_started()
        scope[AUTHENTICATED_KEY] = self.admitted.authenticated
        try:
            if scope["type"] == "http":
                exchange = _Exchange(receive, send, self.limits)
                await self.app(scope, exchange.receive, exchange.send)
            else:
                await self.app(scope, receive, send)
        finally:
            self.admitted.request_ended()


@final
class _Exchange:
    """One HTTP request's ``receive``/``send``: a response that starts before the app
    read the whole request body (an error answered from the head alone: 401, 404, 413)
    first reads the rest of it, replayed to the app if it asks.

    Why: Hypercorn keeps a connection alive only if the request was complete when the
    response ended; otherwise it closes it — after a response that did not say
    ``Connection: close``. A client writes a body after its head (httpx does, in a
    second write), so on a loaded machine the answer can end between the two: the
    client, told nothing, sends its next request on a connection the server is closing
    ("Server disconnected without sending a response"). So the body is read first, at
    most ``max_body_bytes`` of it within ``header_timeout``; past either, the response
    says ``Connection: close`` (the client opens a new connection), as it does if the
    client went away."""

    def __init__(self, receive: Any, send: Any, limits: HttpLimits) -> None:
        self._receive = receive
        self._send = send
        self._limits = limits
        self._complete = False  # the request's last message was read
        self._read_ahead: list[Any] = []

    async def receive(self) -> Any:
        if self._read_ahead:
            return self._read_ahead.pop(0)
        message = await self._receive()
        self._complete = self._complete or _last(message)
        return message

    async def send(self, message: Any) -> None:
        starts_early = message["type"] == "http.response.start" and not self._complete
        if starts_early and not await self._read_rest():
            headers = [*message.get("headers", ()), (b"connection", b"close")]
            message = {**message, "headers": headers}
        await self._send(message)

    async def _read_rest(self) -> bool:
        """Read the rest of the request body (kept for :meth:`receive`): True once it
        is all in, False if the client went away or was too slow or too big."""
        size = 0
        with trio.move_on_after(self._limits.header_timeout):
            while size <= self._limits.max_body_bytes:
                message = await self._receive()
                self._read_ahead.append(message)
                if _last(message):
                    self._complete = True
                    return bool(message["type"] == "http.request")
                size += len(message.get("body", b""))
        return False


def _last(message: Any) -> bool:
    """Whether ``message`` (from ``receive()``) is a request's last: the end of its
    body, or the client's disconnect."""
    return message["type"] != "http.request" or not message.get("more_body", False)


async def _hold(
    scope: trio.CancelScope, stop: trio.Event, *, task_status: trio.TaskStatus[trio.Nursery]
) -> None:
    with scope:
        async with trio.open_nursery() as handlers:
            task_status.started(handlers)
            await stop.wait()


async def _accept(
    handle: Callable[[Admitted], Awaitable[None]],
    listeners: list[trio.SocketListener],
    gate: Gate,
    handlers: trio.Nursery,
    scope: trio.CancelScope,
) -> None:
    with scope:
        await serve_admitted(handle, listeners, gate, handlers)
