"""The control server: runs driven over websockets (``trio-websocket``).

A server is faces over a host (DESIGN §20, :func:`trio_agents.hosting.serve`). This
module holds the websocket channel as a face, :class:`WebsocketFace` — its listeners,
its handshakes, its connections (``_connection.py``; the ops in ``_ops.py``, the
handshake checks in ``_auth.py``) — and :class:`ControlServer`, the convenience that
builds a host from its arguments (a :class:`~trio_agents.hosting.LocalHost`, or a
cluster node's host) and serves that one face over it.

Layout of the tasks (all in the nursery of :func:`~trio_agents.hosting.serve`)::

    serve()                         waits; on cancellation runs the bounded shutdown
    ├── the host's tasks            one per run, each in its own *shielded* scope, so a
    │                               run is only ever stopped by run.cancel(reason); the
    │                               reaper (and a cluster node's own tasks)
    └── connections (shielded)      accept loop + one task per connection
                                    (``_connection.py``)

Runs never live in a connection's nursery: a client that leaves (or is cut off)
takes none of them along, except runs it started with ``on_disconnect="cancel"``,
which are cancelled with reason ``"client disconnected"`` (the host's
:meth:`~trio_agents.hosting.RunHost.disconnected`).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, NoReturn, final

import attrs
import trio
from trio_websocket import WebSocketRequest, wrap_server_stream

from .. import Agent
from .._serving import closing_listeners, serving
from ..hosting import (
    ContextHook,
    LocalHost,
    PrincipalStatistics,
    RunHost,
    SessionFactory,
    sqlite_sessions,
)
from ..hosting import serve as serve_faces
from ..hosting._admission import Admitted, Gate, serve_admitted
from ._auth import Auth, check_handshake
from ._connection import Connection
from ._protocol import SUBPROTOCOL, Limits
from ._stream import GuardedStream

if TYPE_CHECKING:
    from ..hosting._node_of_cluster import NodeOfCluster

__all__ = [
    "Auth",
    "ControlServer",
    "ControlServerStatistics",
    "PrincipalStatistics",
    "SessionFactory",
    "WebsocketFace",
    "open_control_server",
    "sqlite_sessions",
]

logger = logging.getLogger("trio_agents.control")


@attrs.frozen
class ControlServerStatistics:
    """A snapshot of a :class:`ControlServer`, from :meth:`ControlServer.statistics`.

    Attributes:
        connections: open websocket connections.
        active_runs: runs not yet finished.
        retained_runs: finished runs still visible (``retain_finished``).
        subscriptions: event subscriptions over all connections.
    """

    connections: int
    active_runs: int
    retained_runs: int
    subscriptions: int


def _check_auth(auth: object, allowed_origins: object) -> None:
    if not (isinstance(auth, Mapping) or callable(auth)):
        raise TypeError("auth must be a mapping of token -> principal or a callable")
    if isinstance(allowed_origins, str):
        raise TypeError("allowed_origins must be a sequence of origins, not a str")


@final
class WebsocketFace:
    """The websocket control channel (subprotocol ``trio-agents.v1``) as a face of any
    :class:`~trio_agents.hosting.RunHost`, for :func:`trio_agents.hosting.serve`.

    Args:
        auth: bearer token → principal, as a mapping (tokens compared in constant
            time) or a callable returning the principal or None. A handshake without
            ``Authorization: Bearer <known token>`` gets HTTP 401, no upgrade.
        host: the address to listen on (None: every interface).
        port: the port (0 picks a free one; :attr:`port` is the bound one once open).
        allowed_origins: if given, a handshake whose ``Origin`` header is present
            and not in it gets HTTP 403 (a missing ``Origin`` — a non-browser client
            — is allowed).

    Its bounds (frame size, ping, send timeout, handshake timeout, subscriptions per
    connection, unauthenticated connections) are the host's
    :class:`~trio_agents.hosting.Limits`.
    """

    def __init__(
        self,
        *,
        auth: Auth,
        host: str | None = "127.0.0.1",
        port: int = 0,
        allowed_origins: Sequence[str] | None = None,
    ) -> None:
        _check_auth(auth, allowed_origins)
        self._auth = auth
        self._allowed_origins = None if allowed_origins is None else frozenset(allowed_origins)
        self._bind = host
        self.port = port
        self._opened = False
        self._connections: set[Connection] = set()
        self._accept_scope = trio.CancelScope()
        self._connections_scope = trio.CancelScope(shield=True)
        self._connections_done = trio.Event()
        self._gate: Gate | None = None
        self.shutdown_deadline = float("inf")

    @property
    def connections(self) -> int:
        """Open websocket connections."""
        return len(self._connections)

    @property
    def subscriptions(self) -> int:
        """Event subscriptions over all connections."""
        return sum(len(c.subscriptions) + len(c.tree_subscriptions) for c in self._connections)

    # ------------------------------------------------------ the face's lifecycle

    async def open(self, host: RunHost, nursery: trio.Nursery) -> int:
        """Listen, and serve connections over ``host`` in ``nursery``; returns the bound
        port (see :class:`~trio_agents.hosting.ServedFace`)."""
        if self._opened:
            raise RuntimeError("this WebsocketFace is already open")
        self._opened = True
        listeners = await trio.open_tcp_listeners(self.port, host=self._bind)
        self.port = listeners[0].socket.getsockname()[1]
        limits = host.limits
        # Admission (hosting/_admission.py): connections whose handshake is not yet
        # accepted are capped and shed oldest first, an accept failing with EMFILE sheds
        # one; handle_stream bounds the handshake itself (handshake_timeout).
        self._gate = Gate(
            max_pending=limits.max_unauthenticated_connections,
            max_pending_per_ip=limits.max_unauthenticated_per_ip,
            header_timeout=limits.handshake_timeout,
            idle_timeout=math.inf,
        )
        nursery.start_soon(self._serve_connections, host, listeners, self._gate)
        return self.port

    async def _serve_connections(
        self, host: RunHost, listeners: list[trio.SocketListener], gate: Gate
    ) -> None:
        async def handle(admitted: Admitted) -> None:
            await self.handle_stream(host, admitted.stream, on_accepted=admitted.accepted)

        try:
            async with closing_listeners(listeners):
                with self._connections_scope:
                    async with trio.open_nursery() as connections:
                        with self._accept_scope:
                            await serve_admitted(handle, listeners, gate, connections)
        finally:
            self._connections_done.set()

    def begin_shutdown(self, deadline: float) -> None:
        """Stop accepting; handshakes not yet accepted are owed nothing."""
        self.shutdown_deadline = deadline
        self._accept_scope.cancel()
        if self._gate is not None:
            self._gate.close_idle()

    def runs_stopped(self) -> None:
        """The runs are stopped: each connection flushes its subscriptions' terminal
        events, then closes with 1001."""
        for connection in list(self._connections):
            connection.begin_shutdown()

    async def wait_closed(self) -> None:
        """Wait until every connection is closed."""
        await self._connections_done.wait()

    def force_close(self) -> None:
        """Past the bound: cut whatever connection is left."""
        self._connections_scope.cancel()

    # -------------------------------------------------------------- connections

    async def handle_stream(
        self,
        host: RunHost,
        stream: trio.abc.Stream,
        *,
        on_accepted: Callable[[], None] | None = None,
    ) -> None:
        """Serve one client of ``host`` over ``stream`` (a TCP connection, or any byte
        stream: tests use ``trio.testing.memory_stream_pair``). Never raises but for
        cancellation: one bad client must not take the server down. ``on_accepted``
        is called once the handshake is accepted (an authenticated client)."""
        limits = host.limits
        guarded = GuardedStream(stream, limits.send_timeout)
        connection: Connection | None = None
        try:
            async with trio.open_nursery() as nursery:
                request: WebSocketRequest | None = None
                with trio.move_on_after(limits.handshake_timeout):
                    request = await wrap_server_stream(
                        nursery,
                        guarded,
                        message_queue_size=4,
                        max_message_size=limits.max_message_size,
                    )
                if request is not None:
                    principal = await check_handshake(request, self._auth, self._allowed_origins)
                    if principal is not None and not host.closing:
                        if on_accepted is not None:
                            on_accepted()
                        ws = await request.accept(subprotocol=SUBPROTOCOL)
                        connection = Connection(self, host, ws, guarded, principal)
                        self._connections.add(connection)
                        await connection.serve()
                nursery.cancel_scope.cancel()
        except BaseException as exc:
            cancelled, rest = (
                exc.split(trio.Cancelled)
                if isinstance(exc, BaseExceptionGroup)
                else ((exc, None) if isinstance(exc, trio.Cancelled) else (None, exc))
            )
            if rest is not None:
                if not isinstance(rest, Exception):
                    raise  # KeyboardInterrupt and friends
                logger.error("control connection crashed", exc_info=rest)
            if cancelled is not None:
                raise cancelled from None
        finally:
            if connection is not None:
                self._connections.discard(connection)
                host.disconnected(connection)
            with trio.CancelScope(shield=True):
                await guarded.aclose()


@attrs.frozen
class _Started:
    """``hosting.serve``'s start value (every face's port) as :meth:`ControlServer.serve`
    reports it: its one face's port."""

    server: ControlServer
    status: trio.TaskStatus[int]

    def started(self, ports: list[int | None] | None = None) -> None:
        assert ports is not None
        (port,) = ports
        assert port is not None
        self.server.port = port
        self.status.started(port)


@final
class ControlServer:
    """Serves agents' runs over websocket connections (subprotocol ``trio-agents.v1``):
    a convenience that builds a run host from its arguments and serves one
    :class:`WebsocketFace` over it (:func:`trio_agents.hosting.serve`). To serve other
    faces too (the HTTP faces), over the same host, build the host and call
    :func:`~trio_agents.hosting.serve` with every face.

    Args:
        agents: the agents clients may start, by the name they use in ``run.start``.
        sessions: where sessions live. None: in memory (lost with the process). A path
            (str or path-like): one SQLite file for every principal
            (:func:`sqlite_sessions`). A callable ``(principal, session_id) ->
            Session``: called once per run that names a session; if the object it
            returns has ``aclose()``, the server awaits it after the run ends.
        auth: bearer token → principal, as a mapping (tokens compared in constant
            time) or a callable returning the principal or None. A handshake without
            ``Authorization: Bearer <known token>`` gets HTTP 401, no upgrade.
        limits: the :class:`Limits` (default ``Limits()``).
        allowed_origins: if given, a handshake whose ``Origin`` header is present
            and not in it gets HTTP 403 (a missing ``Origin`` — a non-browser client
            — is allowed).
        run_options: options passed to every :func:`~trio_agents.serve_run`
            (``cleanup_timeout``, ``event_retention``, ``inbox_capacity``, ...).
        cluster: a :class:`~trio_agents.cluster.PostgresCluster`: this server is one
            node of a cluster that acts as one server (any node answers for every run
            of its principal; runs survive the node); its host is
            ``cluster.host(...)``. ``sessions`` must then be None: sessions are
            PostgreSQL sessions in the cluster's database. Shutting the server down
            hands its runs over to other nodes instead of cancelling them.
        context: the hook that supplies each run's ``context`` (contexts stay
            server-side: a client cannot send one), called as ``context(principal,
            info)`` — sync or async, ``info`` a :class:`~trio_agents.control.RunStartInfo` — on the node that
            runs the run, once per ``run.start`` and once per cluster takeover
            (``info.resumed``). Its return value is the run's ``context``
            (``ctx.context`` in tools). A hook that raises is a server fault: it is
            logged, the ``run.start`` answers ``internal`` and nothing is started.

    Limits a client may set on its runs (``run.start``'s ``"limits"``) are capped, and
    defaulted, by ``limits.max_run_limits``.

    Serve with ``port = await nursery.start(server.serve, host, port)`` or
    :func:`open_control_server`. Cancelling the scope around :meth:`serve` shuts the
    server down gracefully (see :meth:`serve`).
    """

    def __init__(
        self,
        agents: Mapping[str, Agent],
        *,
        sessions: str | os.PathLike[str] | SessionFactory | None = None,
        auth: Auth,
        limits: Limits | None = None,
        allowed_origins: Sequence[str] | None = None,
        run_options: Mapping[str, Any] | None = None,
        cluster: NodeOfCluster | None = None,
        context: ContextHook | None = None,
    ) -> None:
        if context is not None and not callable(context):
            raise TypeError("context must be a callable (principal, info) -> context")
        for name in ("context", "limits"):
            if run_options is not None and name in run_options:
                raise TypeError(
                    f"run_options cannot hold {name!r}: use ControlServer(context=...) for"
                    " contexts and Limits(max_run_limits=...) for limits"
                )
        if cluster is not None:
            # Any cluster object that makes a host of its node (a PostgresCluster): this
            # face never imports the cluster layer.
            if not callable(getattr(cluster, "host", None)):
                raise TypeError("cluster must be a PostgresCluster")
            if sessions is not None:
                raise ValueError(
                    "with a cluster, sessions must be None (they live in the cluster's database)"
                )
        for name, agent in agents.items():
            if not isinstance(name, str) or not isinstance(agent, Agent):
                raise TypeError("agents must map names (str) to Agent objects")
        _check_auth(auth, allowed_origins)
        limits = limits if limits is not None else Limits()
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a Limits instance")
        session_factory: SessionFactory | None
        if sessions is None:
            session_factory = None
        elif isinstance(sessions, str | os.PathLike):
            session_factory = sqlite_sessions(sessions)
        elif callable(sessions):
            session_factory = sessions
        else:
            raise TypeError("sessions must be None, a path or a callable")
        # The run host every face of this server shares: one process's, or, with a
        # cluster, this node's of the cluster.
        self._host: LocalHost
        if cluster is not None:
            self._host = cluster.host(
                agents, limits=limits, run_options=run_options, context=context
            )
        else:
            self._host = LocalHost(
                agents,
                sessions=session_factory,
                limits=limits,
                run_options=run_options,
                context=context,
            )
        self._cluster = cluster
        self._face = WebsocketFace(auth=auth, allowed_origins=allowed_origins)
        self.port: int | None = None
        self._serving = False

    @property
    def host(self) -> LocalHost:
        """The server's run host (:class:`~trio_agents.hosting.LocalHost`): the same
        registry the websocket channel serves, for the other faces (HTTP + SSE, A2A,
        AG-UI) of the same server. Served by :meth:`serve` (do not serve it again)."""
        return self._host

    @property
    def cluster(self) -> NodeOfCluster | None:
        """The cluster this server is a node of, if any."""
        return self._cluster

    @property
    def limits(self) -> Limits:
        """The server's :class:`Limits`."""
        return self._host.limits

    def statistics(self) -> ControlServerStatistics:
        """Counts of connections, runs, subscriptions and memory, for monitoring."""
        runs = self._host.statistics()
        return ControlServerStatistics(
            connections=self._face.connections,
            active_runs=runs.active_runs,
            retained_runs=runs.retained_runs,
            subscriptions=self._face.subscriptions,
        )

    def principal_statistics(self, principal: str) -> PrincipalStatistics:
        """What one principal holds: runs, retained bytes, in-memory sessions."""
        return self._host.principal_statistics(principal)

    # ------------------------------------------------------------------ serving

    async def serve(
        self,
        host: str | None,
        port: int,
        *,
        task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
    ) -> NoReturn:
        """Listen on ``host:port`` (port 0 picks a free one) and serve until cancelled.

        Start protocol: ``port = await nursery.start(server.serve, "127.0.0.1", 0)``
        returns the bound port. When the scope around it is cancelled, the shutdown,
        shielded and bounded by ``limits.shutdown_timeout``: stop accepting; cancel
        every run with reason ``"server shutdown"`` (their repair persists their
        sessions); let subscribers receive the terminal events; close every socket
        with 1001; then re-raise the cancellation.
        """
        if self._serving:
            raise RuntimeError("this ControlServer is already serving")
        self._serving = True
        # The face was made in __init__ (handle_stream serves a stream without serve);
        # where it listens is only known now.
        self._face._bind, self._face.port = host, port
        await serve_faces(self._host, [self._face], task_status=_Started(self, task_status))

    async def handle_stream(
        self, stream: trio.abc.Stream, *, on_accepted: Callable[[], None] | None = None
    ) -> None:
        """Serve one client over ``stream`` (a TCP connection, or any byte stream:
        tests use ``trio.testing.memory_stream_pair``). Never raises but for
        cancellation: one bad client must not take the server down. ``on_accepted``
        is called once the handshake is accepted (an authenticated client)."""
        await self._face.handle_stream(self._host, stream, on_accepted=on_accepted)


@asynccontextmanager
async def open_control_server(
    agents: Mapping[str, Agent],
    *,
    auth: Auth,
    host: str | None = "127.0.0.1",
    port: int = 0,
    sessions: str | os.PathLike[str] | SessionFactory | None = None,
    limits: Limits | None = None,
    allowed_origins: Sequence[str] | None = None,
    run_options: Mapping[str, Any] | None = None,
    cluster: NodeOfCluster | None = None,
    context: ContextHook | None = None,
) -> AsyncIterator[ControlServer]:
    """Serve a :class:`ControlServer` for the duration of the block (loopback, a free
    port by default; ``server.port`` is the bound port).

    Leaving the block shuts the server down gracefully (see
    :meth:`ControlServer.serve`); an exception in the block propagates after that.
    """
    server = ControlServer(
        agents,
        sessions=sessions,
        auth=auth,
        limits=limits,
        allowed_origins=allowed_origins,
        run_options=run_options,
        cluster=cluster,
        context=context,
    )

    async def start(nursery: trio.Nursery) -> ControlServer:
        await nursery.start(server.serve, host, port)
        return server

    async with serving(start) as served:
        yield served
