"""The control server: runs driven over websockets (``trio-websocket``).

Layout of the tasks (all in the nursery of :meth:`ControlServer.serve`)::

    serve()                         waits; on cancellation runs the bounded shutdown
    ├── run tasks                   one per run, each in its own *shielded* scope, so a
    │                               run is only ever stopped by run.cancel(reason)
    ├── reaper                      forgets finished runs after retain_finished
    └── connections (shielded)      accept loop + one task per connection
                                    (``_connection.py``)

Runs never live in a connection's nursery: a client that leaves (or is cut off)
takes none of them along, except runs it started with ``on_disconnect="cancel"``,
which are cancelled with reason ``"client disconnected"``. The jobs live in their own
modules: the handshake checks in ``_auth.py``, a connection's I/O in
``_connection.py``, the ops in ``_ops.py``; the runs themselves are the host's (the
hosting layer: the runs' bookkeeping and per-principal limits in
``hosting/_registry.py``, starting and hosting the runs, and what a disconnect does to
them, in ``hosting/_run_tasks.py``, sessions in ``hosting/_sessions.py``); this module
wires them together.
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
from .._util import closing_listeners, serving
from ..hosting import LocalHost
from ..hosting._admission import Admitted, Gate, serve_admitted
from ..hosting._policies import ContextHook
from ..hosting._registry import PrincipalStatistics
from ..hosting._sessions import SessionFactory, sqlite_sessions
from ._auth import Auth, check_handshake
from ._connection import Connection
from ._protocol import SUBPROTOCOL, Limits
from ._stream import GuardedStream

if TYPE_CHECKING:
    from ..hosting._node import NodeOfCluster

__all__ = [
    "Auth",
    "ControlServer",
    "ControlServerStatistics",
    "PrincipalStatistics",
    "SessionFactory",
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


@final
class ControlServer:
    """Serves agents' runs over websocket connections (subprotocol ``trio-agents.v1``).

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
            of its principal; runs survive the node). ``sessions`` must then be None:
            sessions are PostgreSQL sessions in the cluster's database. Shutting the
            server down hands its runs over to other nodes instead of cancelling them.
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
        if not (isinstance(auth, Mapping) or callable(auth)):
            raise TypeError("auth must be a mapping of token -> principal or a callable")
        if isinstance(allowed_origins, str):
            raise TypeError("allowed_origins must be a sequence of origins, not a str")
        self._auth = auth
        limits = limits if limits is not None else Limits()
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a Limits instance")
        self._allowed_origins = None if allowed_origins is None else frozenset(allowed_origins)
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

        self.port: int | None = None
        self._serving = False
        self._connections: set[Connection] = set()
        self._accept_scope = trio.CancelScope()
        self._connections_scope = trio.CancelScope(shield=True)
        self._connections_done = trio.Event()
        # Admission (trio_agents/_admission.py): connections whose handshake is not yet
        # accepted are capped and shed oldest first, an accept failing with EMFILE sheds
        # one; handle_stream bounds the handshake itself (handshake_timeout).
        self._gate = Gate(
            max_pending=limits.max_unauthenticated_connections,
            max_pending_per_ip=limits.max_unauthenticated_per_ip,
            header_timeout=limits.handshake_timeout,
            idle_timeout=math.inf,
        )
        self.shutdown_deadline = float("inf")

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

    @property
    def _registry(self) -> Any:
        # The host's run registry (what tests of the cluster's internals look into).
        return self._host._registry

    def statistics(self) -> ControlServerStatistics:
        """Counts of connections, runs, subscriptions and memory, for monitoring."""
        runs = self._host.statistics()
        return ControlServerStatistics(
            connections=len(self._connections),
            active_runs=runs.active_runs,
            retained_runs=runs.retained_runs,
            subscriptions=sum(
                len(c.subscriptions) + len(c.tree_subscriptions) for c in self._connections
            ),
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
        listeners = await trio.open_tcp_listeners(port, host=host)
        self.port = listeners[0].socket.getsockname()[1]
        # The listeners are closed at the end even if the host (a cluster) failed to start.
        async with closing_listeners(listeners), trio.open_nursery() as nursery:
            # The host's runs (and, with a cluster, the node's tasks) and its reaper.
            stop_host = await self._host._open(nursery)
            nursery.start_soon(self._serve_connections, listeners)
            task_status.started(self.port)
            try:
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await self._shutdown()
                stop_host()
        raise AssertionError("unreachable")  # pragma: no cover

    async def _serve_connections(self, listeners: list[trio.SocketListener]) -> None:
        try:
            with self._connections_scope:
                async with trio.open_nursery() as connections:
                    with self._accept_scope:
                        await serve_admitted(
                            self._handle_admitted, listeners, self._gate, connections
                        )
        finally:
            self._connections_done.set()

    async def _handle_admitted(self, admitted: Admitted) -> None:
        await self.handle_stream(admitted.stream, on_accepted=admitted.accepted)

    async def _shutdown(self) -> None:
        """The bounded, shielded shutdown (see :meth:`serve`)."""
        host = self._host
        self.shutdown_deadline = host._begin_shutdown()
        self._accept_scope.cancel()
        self._gate.close_idle()  # handshakes not yet accepted are owed nothing
        # Every run is stopped (a cluster's node: the connections' on_disconnect="cancel"
        # runs cancelled, the rest handed over to the other nodes)...
        await host._stop_runs(self.shutdown_deadline)
        # ... then the connections flush their subscriptions' terminal events and close.
        for connection in list(self._connections):
            connection.begin_shutdown()
        await host._wait_runs(self.shutdown_deadline)
        with trio.move_on_at(self.shutdown_deadline + 1.0):
            await self._connections_done.wait()
        # Past the bound: force whatever is left.
        self._connections_scope.cancel()
        host._force()

    # -------------------------------------------------------------- connections

    async def handle_stream(
        self, stream: trio.abc.Stream, *, on_accepted: Callable[[], None] | None = None
    ) -> None:
        """Serve one client over ``stream`` (a TCP connection, or any byte stream:
        tests use ``trio.testing.memory_stream_pair``). Never raises but for
        cancellation: one bad client must not take the server down. ``on_accepted``
        is called once the handshake is accepted (an authenticated client)."""
        limits = self._host.limits
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
                    if principal is not None and not self._host._closing:
                        if on_accepted is not None:
                            on_accepted()
                        ws = await request.accept(subprotocol=SUBPROTOCOL)
                        connection = Connection(self, self._host, ws, guarded, principal)
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
                self._host.disconnected(connection)
            with trio.CancelScope(shield=True):
                await guarded.aclose()


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
