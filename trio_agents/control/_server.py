"""The control server: runs driven over websockets (``trio-websocket``).

Layout of the tasks (all in the nursery of :meth:`ControlServer.serve`)::

    serve()                         waits; on cancellation runs the bounded shutdown
    ├── run tasks                   one per run, each in its own *shielded* scope, so a
    │                               run is only ever stopped by run.cancel(reason)
    ├── reaper                      forgets finished runs after retain_finished
    └── connections (shielded)      accept loop + one task per connection:
        └── connection nursery      trio-websocket's reader, our reader (requests),
                                    writer (the only sender of frames), pinger,
                                    one forwarder per subscription

Runs never live in a connection's nursery: a client that leaves (or is cut off)
takes none of them along, except runs it started with ``on_disconnect="cancel"``,
which are cancelled with reason ``"client disconnected"``.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, NoReturn, TypeAlias, final

import attrs
import trio
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    wrap_server_stream,
)

from .. import (
    Agent,
    EventsDropped,
    InboxFullError,
    Item,
    Run,
    RunClosedError,
    RunUpdated,
    UnknownCallError,
    serve_run,
)
from .._util import first_leaf, only_cancelled  # shared helpers, not the run's internals
from ..sessions import Session
from ._protocol import (
    SUBPROTOCOL,
    Limits,
    ProtocolError,
    Request,
    RunInfo,
    ack_frame,
    error_frame,
    event_frame,
    parse_request,
)
from ._stream import GuardedStream

__all__ = [
    "Auth",
    "ControlServer",
    "ControlServerStatistics",
    "SessionFactory",
    "open_control_server",
    "sqlite_sessions",
]

logger = logging.getLogger("trio_agents.control")

Auth: TypeAlias = Mapping[str, str] | Callable[[str], str | None]
"""Bearer token → principal: a mapping, or a callable returning None for a bad token."""

SessionFactory: TypeAlias = Callable[[str, str], Session]
"""``factory(principal, session_id) -> Session``; called once per run that names a session."""

_SessionKey: TypeAlias = tuple[str, str]


def sqlite_sessions(path: str | os.PathLike[str]) -> SessionFactory:
    """A session factory storing every principal's sessions in one SQLite file.

    The stored session id is ``json.dumps([principal, session_id])``, so two
    principals' ``"s1"`` never meet. Each run gets its own
    :class:`~trio_agents.sessions._sqlite.SQLiteSession`, closed when the run ends.
    """
    from ..sessions._sqlite import SQLiteSession

    resolved = os.fspath(path)

    def factory(principal: str, session_id: str) -> Session:
        return SQLiteSession(resolved, json.dumps([principal, session_id]))

    return factory


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


@attrs.define(eq=False)
class _RunEntry:
    run_id: str
    principal: str
    agent: str
    session_id: str | None
    on_disconnect: str
    owner: _Connection | None
    run: Run | None = None
    done: trio.Event = attrs.field(factory=trio.Event)
    host_scope: trio.CancelScope = attrs.field(factory=lambda: trio.CancelScope(shield=True))

    def info(self) -> RunInfo:
        assert self.run is not None
        stats = self.run.statistics()
        result = self.run.result
        reason = result.reason if result is not None else None
        return RunInfo(
            run_id=self.run_id,
            agent=self.agent,
            session_id=self.session_id,
            status=stats.status,
            reason=reason,
            seq=stats.last_seq,
            turn=stats.turn,
            pending_approvals=stats.pending_approvals,
        )


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for child in exc.exceptions for leaf in _leaves(child)]
    return [exc]


def _header(request: WebSocketRequest, name: bytes) -> str | None:
    for key, value in request.headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


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
    ) -> None:
        for name, agent in agents.items():
            if not isinstance(name, str) or not isinstance(agent, Agent):
                raise TypeError("agents must map names (str) to Agent objects")
        if not (isinstance(auth, Mapping) or callable(auth)):
            raise TypeError("auth must be a mapping of token -> principal or a callable")
        if isinstance(allowed_origins, str):
            raise TypeError("allowed_origins must be a sequence of origins, not a str")
        self._agents = dict(agents)
        self._auth = auth
        self._limits = limits if limits is not None else Limits()
        if not isinstance(self._limits, Limits):
            raise TypeError("limits must be a Limits instance")
        self._allowed_origins = None if allowed_origins is None else frozenset(allowed_origins)
        self._run_options = dict(run_options or {})
        self._memory_sessions: dict[_SessionKey, Session] = {}
        self._session_factory: SessionFactory | None
        if sessions is None:
            self._session_factory = None
        elif isinstance(sessions, str | os.PathLike):
            self._session_factory = sqlite_sessions(sessions)
        elif callable(sessions):
            self._session_factory = sessions
        else:
            raise TypeError("sessions must be None, a path or a callable")

        self.port: int | None = None
        self._serving = False
        self._closing = False
        self._nursery: trio.Nursery | None = None
        self._runs: dict[str, _RunEntry] = {}
        self._active_sessions: dict[_SessionKey, _RunEntry] = {}
        self._finished: deque[tuple[float, str]] = deque()
        self._finished_wakeup = trio.Event()
        self._buckets: dict[str, tuple[float, float]] = {}
        self._connections: set[_Connection] = set()
        self._accept_scope = trio.CancelScope()
        self._connections_scope = trio.CancelScope(shield=True)
        self._connections_done = trio.Event()
        self.shutdown_deadline = float("inf")

    @property
    def limits(self) -> Limits:
        """The server's :class:`Limits`."""
        return self._limits

    def statistics(self) -> ControlServerStatistics:
        """Counts of connections, runs and subscriptions, for monitoring."""
        active = sum(1 for e in self._runs.values() if not e.done.is_set())
        return ControlServerStatistics(
            connections=len(self._connections),
            active_runs=active,
            retained_runs=len(self._runs) - active,
            subscriptions=sum(len(c.subscriptions) for c in self._connections),
        )

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
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                reaper_scope = trio.CancelScope()
                nursery.start_soon(self._reaper, reaper_scope)
                nursery.start_soon(self._serve_connections, listeners)
                task_status.started(self.port)
                try:
                    await trio.sleep_forever()
                finally:
                    with trio.CancelScope(shield=True):
                        await self._shutdown()
                    reaper_scope.cancel()
        except BaseExceptionGroup as group:
            if only_cancelled(group):
                raise first_leaf(group) from None
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _serve_connections(self, listeners: list[trio.SocketListener]) -> None:
        try:
            with self._connections_scope:
                async with trio.open_nursery() as connections:
                    with self._accept_scope:
                        await trio.serve_listeners(
                            self._handle_stream,
                            listeners,
                            handler_nursery=connections,
                        )
        finally:
            self._connections_done.set()

    async def _shutdown(self) -> None:
        """The bounded, shielded shutdown (see :meth:`serve`)."""
        self._closing = True
        self.shutdown_deadline = trio.current_time() + self._limits.shutdown_timeout
        self._accept_scope.cancel()
        for entry in list(self._runs.values()):
            if entry.run is not None and not entry.done.is_set():
                entry.run.cancel("server shutdown")
        for connection in list(self._connections):
            connection.begin_shutdown()
        with trio.move_on_at(self.shutdown_deadline):
            for entry in list(self._runs.values()):
                await entry.done.wait()
        with trio.move_on_at(self.shutdown_deadline + 1.0):
            await self._connections_done.wait()
        # Past the bound: force whatever is left.
        self._connections_scope.cancel()
        for entry in list(self._runs.values()):
            entry.host_scope.cancel()

    async def _reaper(self, scope: trio.CancelScope) -> None:
        with scope:
            retain = self._limits.retain_finished
            while True:
                if not self._finished:
                    self._finished_wakeup = trio.Event()
                    await self._finished_wakeup.wait()
                    continue
                finished_at, run_id = self._finished[0]
                await trio.sleep_until(finished_at + retain)
                self._finished.popleft()
                self._runs.pop(run_id, None)

    # -------------------------------------------------------------- connections

    async def _handle_stream(self, stream: trio.SocketStream) -> None:
        """One TCP connection; nothing it raises may reach the accept loop."""
        guarded = GuardedStream(stream)
        connection: _Connection | None = None
        try:
            async with trio.open_nursery() as nursery:
                request: WebSocketRequest | None = None
                with trio.move_on_after(self._limits.handshake_timeout):
                    request = await wrap_server_stream(
                        nursery,
                        guarded,
                        message_queue_size=4,
                        max_message_size=self._limits.max_message_size,
                    )
                if request is not None:
                    principal = await self._check_handshake(request)
                    if principal is not None and not self._closing:
                        ws = await request.accept(subprotocol=SUBPROTOCOL)
                        connection = _Connection(self, ws, guarded, principal)
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
                self._connection_closed(connection)
            with trio.CancelScope(shield=True):
                await guarded.aclose()

    async def _check_handshake(self, request: WebSocketRequest) -> str | None:
        """Authenticate; reject (401/403/400) and return None, or return the principal."""
        principal = self._authenticate(_header(request, b"authorization"))
        if principal is None:
            await request.reject(
                401,
                extra_headers=[(b"WWW-Authenticate", b'Bearer realm="trio-agents"')],
                body=b"a valid 'Authorization: Bearer <token>' header is required\n",
            )
            return None
        origin = _header(request, b"origin")
        if (
            self._allowed_origins is not None
            and origin is not None
            and origin not in self._allowed_origins
        ):
            await request.reject(403, body=b"origin not allowed\n")
            return None
        if SUBPROTOCOL not in request.proposed_subprotocols:
            await request.reject(400, body=f"subprotocol {SUBPROTOCOL} required\n".encode())
            return None
        return principal

    def _authenticate(self, header: str | None) -> str | None:
        if header is None:
            return None
        scheme, _, token = header.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        if isinstance(self._auth, Mapping):
            given = token.encode()
            found: str | None = None
            for known, name in self._auth.items():
                # Compare with every token, in constant time each.
                if hmac.compare_digest(given, known.encode()):
                    found = name
            return found
        try:
            principal: object = self._auth(token)
        except Exception:
            logger.exception("the auth callable raised; rejecting the handshake")
            return None
        if principal is not None and not isinstance(principal, str):
            logger.error("the auth callable returned %r, not a str or None", principal)
            return None
        return principal

    def _connection_closed(self, connection: _Connection) -> None:
        for entry in self._runs.values():
            if entry.owner is connection:
                entry.owner = None
                if (
                    entry.on_disconnect == "cancel"
                    and entry.run is not None
                    and not entry.done.is_set()
                ):
                    entry.run.cancel("client disconnected")

    # --------------------------------------------------------------------- runs

    def lookup(self, principal: str, run_id: str) -> _RunEntry:
        """The run ``run_id`` of ``principal``; another principal's is not found."""
        entry = self._runs.get(run_id)
        if entry is None or entry.principal != principal or entry.run is None:
            raise ProtocolError("not_found", f"no run {run_id!r}")
        return entry

    def runs_of(self, principal: str) -> list[_RunEntry]:
        """Every visible run of ``principal``."""
        return [e for e in self._runs.values() if e.principal == principal and e.run is not None]

    def active_on(self, principal: str, session_id: str) -> _RunEntry | None:
        """The active run on a principal's session, if any."""
        return self._active_sessions.get((principal, session_id))

    def check_can_start(self, principal: str) -> None:
        """Raise ``limit_exceeded`` (or ``internal`` while shutting down)."""
        if self._closing:
            raise ProtocolError("internal", "the server is shutting down")
        active = sum(
            1 for e in self._runs.values() if e.principal == principal and not e.done.is_set()
        )
        if active >= self._limits.max_runs_per_principal:
            raise ProtocolError(
                "limit_exceeded",
                f"at most {self._limits.max_runs_per_principal} active runs per principal",
            )

    def take_start_token(self, principal: str) -> None:
        """The ``run.start`` rate limit: a token bucket per principal."""
        now = trio.current_time()
        rate, burst = self._limits.start_rate, float(self._limits.start_burst)
        tokens, last = self._buckets.get(principal, (burst, now))
        tokens = min(burst, tokens + (now - last) * rate)
        if tokens < 1.0:
            self._buckets[principal] = (tokens, now)
            raise ProtocolError(
                "limit_exceeded", f"too many run.start requests (at most {rate:g} per second)"
            )
        self._buckets[principal] = (tokens - 1.0, now)

    async def start_run(
        self,
        owner: _Connection,
        agent_name: str,
        items: tuple[Item, ...],
        session_id: str | None,
        on_disconnect: str,
    ) -> _RunEntry:
        """Start a run in the server's nursery; the session slot must be free."""
        assert self._nursery is not None
        agent = self._agents[agent_name]
        principal = owner.principal
        key = None if session_id is None else (principal, session_id)
        if key is not None and key in self._active_sessions:
            raise ProtocolError("session_busy", f"session {session_id!r} has an active run")
        entry = _RunEntry(
            run_id=f"run_{uuid.uuid4().hex}",
            principal=principal,
            agent=agent_name,
            session_id=session_id,
            on_disconnect=on_disconnect,
            owner=owner,
        )
        # Reserve the run id and the session slot before the first await.
        self._runs[entry.run_id] = entry
        if key is not None:
            self._active_sessions[key] = entry
        try:
            session = None if key is None else self._session_for(key)
            entry.run = await self._nursery.start(self._run_task, entry, agent, items, session)
        except BaseException:
            self._release(entry)
            self._runs.pop(entry.run_id, None)
            entry.done.set()
            raise
        return entry

    def _session_for(self, key: _SessionKey) -> Session:
        if self._session_factory is None:
            session = self._memory_sessions.get(key)
            if session is None:
                from ..sessions._memory import MemorySession

                session = self._memory_sessions[key] = MemorySession(key[1])
            return session
        return self._session_factory(*key)

    def _release(self, entry: _RunEntry) -> None:
        if entry.session_id is not None:
            key = (entry.principal, entry.session_id)
            if self._active_sessions.get(key) is entry:
                del self._active_sessions[key]

    async def _run_task(
        self,
        entry: _RunEntry,
        agent: Agent,
        items: tuple[Item, ...],
        session: Session | None,
        *,
        task_status: trio.TaskStatus[Run],
    ) -> None:
        try:
            # Shielded: only run.cancel(reason) stops a run (shutdown uses "server
            # shutdown"); the scope is cancelled only to force a run past the bound.
            with entry.host_scope:
                await serve_run(
                    agent,
                    items,
                    session=session,
                    run_id=entry.run_id,
                    task_status=task_status,
                    **self._run_options,
                )
        finally:
            self._release(entry)
            entry.done.set()
            if entry.run is not None:
                self._finished.append((trio.current_time(), entry.run_id))
                self._finished_wakeup.set()
            if session is not None and self._session_factory is not None:
                aclose = getattr(session, "aclose", None)
                if aclose is not None:
                    with trio.move_on_after(5.0, shield=True):
                        try:
                            await aclose()
                        except Exception:
                            logger.exception("closing the session of %s failed", entry.run_id)


# ------------------------------------------------------------------- a connection


@final
class _Connection:
    """One accepted websocket: requests in, frames out, through one writer task."""

    def __init__(
        self, server: ControlServer, ws: WebSocketConnection, stream: GuardedStream, principal: str
    ) -> None:
        self.server = server
        self.ws = ws
        self.stream = stream
        self.principal = principal
        self.limits = server.limits
        self.subscriptions: dict[str, trio.CancelScope] = {}
        self._out_send, self._out_receive = trio.open_memory_channel[str | None](
            self.limits.outbound_queue_size
        )
        self._nursery: trio.Nursery | None = None
        self._reader_scope = trio.CancelScope()
        self._shutting_down = False
        self._flushed = trio.Event()
        self._subscriptions_changed = trio.Event()

    def begin_shutdown(self) -> None:
        """Stop reading requests; the connection then flushes and closes with 1001."""
        self._shutting_down = True
        self._reader_scope.cancel()

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._writer)
            if self.limits.ping_interval is not None:
                nursery.start_soon(self._pinger, self.limits.ping_interval)
            with self._reader_scope:
                if self._shutting_down:  # shutdown began before we got here
                    self._reader_scope.cancel()
                await self._reader()
            if self._shutting_down:
                with trio.move_on_at(self.server.shutdown_deadline):
                    await self._close_gracefully()
            nursery.cancel_scope.cancel()

    async def _close_gracefully(self) -> None:
        # Runs were cancelled first: subscriptions end after their terminal events.
        while self.subscriptions:
            self._subscriptions_changed = trio.Event()
            await self._subscriptions_changed.wait()
        await self._out_send.send(None)
        await self._flushed.wait()
        await self.ws.aclose(1001, "server shutdown")

    async def _abort(self, reason: str) -> None:
        """Cut off a slow or dead peer: best-effort 1008 close, then drop the socket.

        The 1008 frame only goes out if no frame was cut in half (``GuardedStream``).
        """
        logger.info("aborting control connection of %r: %s", self.principal, reason)
        with trio.move_on_after(1.0, shield=True):
            await self.ws.aclose(1008, reason)
        with trio.CancelScope(shield=True):
            await self.stream.aclose()
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    # ---------------------------------------------------------------- tasks

    async def _writer(self) -> None:
        async for text in self._out_receive:
            if text is None:
                self._flushed.set()
                return
            with trio.move_on_after(self.limits.send_timeout) as timer:
                try:
                    await self.ws.send_message(text)
                except ConnectionClosed:
                    assert self._nursery is not None
                    self._nursery.cancel_scope.cancel()
                    return
            if timer.cancelled_caught:
                await self._abort("send timeout")
                return

    async def _pinger(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            with trio.move_on_after(self.limits.ping_timeout) as timer:
                try:
                    await self.ws.ping()
                except ConnectionClosed:
                    return
                except ValueError:  # a random payload collided with one in flight
                    continue
            if timer.cancelled_caught:
                await self._abort("ping timeout")
                return

    async def _reader(self) -> None:
        while True:
            try:
                message = await self.ws.get_message()
            except ConnectionClosed:
                return
            await self._handle(message)

    async def send(self, frame: Mapping[str, Any]) -> None:
        """Queue one frame for the writer (waits while the queue is full)."""
        text = json.dumps(frame, separators=(",", ":"), default=repr)
        await self._out_send.send(text)

    # -------------------------------------------------------------- requests

    async def _handle(self, message: str | bytes) -> None:
        try:
            request = parse_request(message)
        except ProtocolError as exc:
            await self.send(error_frame(exc.code, exc.message, exc.request_id))
            return
        await self._serve_request(request)

    async def _serve_request(self, request: Request) -> None:
        """Answer one request; no exception of a handler leaves this method."""
        try:
            await _OPS[request.op](self, request)
        except ProtocolError as exc:
            await self.send(error_frame(exc.code, exc.message, request.id))
        except Exception:
            logger.exception("control op %s failed", request.op)
            await self.send(error_frame("internal", "internal error", request.id))

    def _entry(self, request: Request) -> _RunEntry:
        return self.server.lookup(self.principal, request.fields["run_id"])

    @staticmethod
    def _live(entry: _RunEntry) -> Run:
        run = entry.run
        assert run is not None
        if run.status.is_terminal:
            raise ProtocolError("run_closed", f"run {entry.run_id} is closed (status {run.status})")
        return run

    async def op_run_start(self, request: Request) -> None:
        f = request.fields
        if f["agent"] not in self.server._agents:
            raise ProtocolError("not_found", f"no agent {f['agent']!r}")
        self.server.check_can_start(self.principal)
        if f["subscribe"] is not None:
            self._check_subscription_room(None)
        self.server.take_start_token(self.principal)
        session_id = f["session_id"]
        if session_id is not None and self.server.active_on(self.principal, session_id):
            if f["on_busy"] == "reject":
                raise ProtocolError("session_busy", f"session {session_id!r} has an active run")
            # interrupt / enqueue: wait for the session off the reader, ack later.
            assert self._nursery is not None
            self._nursery.start_soon(self._start_when_free, request)
            return
        await self._start(request)

    async def _start_when_free(self, request: Request) -> None:
        try:
            session_id = request.fields["session_id"]
            while (holder := self.server.active_on(self.principal, session_id)) is not None:
                if request.fields["on_busy"] == "interrupt" and holder.run is not None:
                    holder.run.cancel("superseded")
                await holder.done.wait()
            self.server.check_can_start(self.principal)
            await self._start(request)
        except ProtocolError as exc:
            await self.send(error_frame(exc.code, exc.message, request.id))
        except Exception:
            logger.exception("control op run.start failed")
            await self.send(error_frame("internal", "internal error", request.id))

    async def _start(self, request: Request) -> None:
        f = request.fields
        entry = await self.server.start_run(
            self, f["agent"], f["input"], f["session_id"], f["on_disconnect"]
        )
        await self.send(ack_frame(request.id, run_id=entry.run_id))
        if f["subscribe"] is not None and self._room_for_subscription(entry.run_id):
            self._subscribe(entry, 1, f["subscribe"])

    async def op_run_cancel(self, request: Request) -> None:
        run = self._live(self._entry(request))
        run.cancel(request.fields["reason"], mode=request.fields["mode"])
        await self.send(ack_frame(request.id))

    async def op_run_inject(self, request: Request) -> None:
        entry = self._entry(request)
        run = self._live(entry)
        try:
            injection_id = run.inject(request.fields["items"], when=request.fields["when"])
        except RunClosedError:
            raise ProtocolError("run_closed", f"run {entry.run_id} is closed") from None
        except InboxFullError as exc:
            raise ProtocolError("inbox_full", str(exc)) from None
        except (TypeError, ValueError) as exc:
            raise ProtocolError("invalid_request", str(exc)) from None
        await self.send(ack_frame(request.id, injection_id=injection_id))

    async def op_run_withdraw(self, request: Request) -> None:
        run = self._live(self._entry(request))
        withdrawn = run.withdraw(request.fields["injection_id"])
        await self.send(ack_frame(request.id, withdrawn=withdrawn))

    async def _decide(self, request: Request, *, approve: bool) -> None:
        entry = self._entry(request)
        run = self._live(entry)
        call_id = request.fields["call_id"]
        try:
            if approve:
                run.approve(call_id)
            else:
                run.reject(call_id, message=request.fields["message"])
        except RunClosedError:
            raise ProtocolError("run_closed", f"run {entry.run_id} is closed") from None
        except UnknownCallError as exc:
            raise ProtocolError("not_found", str(exc)) from None
        await self.send(ack_frame(request.id))

    async def op_run_approve(self, request: Request) -> None:
        await self._decide(request, approve=True)

    async def op_run_reject(self, request: Request) -> None:
        await self._decide(request, approve=False)

    async def op_run_subscribe(self, request: Request) -> None:
        entry = self._entry(request)
        self._check_subscription_room(entry.run_id)
        await self.send(ack_frame(request.id))
        self._subscribe(entry, request.fields["from_seq"], request.fields["events"])

    async def op_run_unsubscribe(self, request: Request) -> None:
        entry = self._entry(request)
        scope = self.subscriptions.pop(entry.run_id, None)
        if scope is not None:
            scope.cancel()
            self._subscriptions_changed.set()
        await self.send(ack_frame(request.id, unsubscribed=scope is not None))

    async def op_run_get(self, request: Request) -> None:
        entry = self._entry(request)
        await self.send(ack_frame(request.id, run=entry.info().to_json()))

    async def op_runs_list(self, request: Request) -> None:
        runs = [entry.info().to_json() for entry in self.server.runs_of(self.principal)]
        await self.send(ack_frame(request.id, runs=runs))

    async def op_session_cancel(self, request: Request) -> None:
        session_id = request.fields["session_id"]
        entry = self.server.active_on(self.principal, session_id)
        if entry is None or entry.run is None or entry.run.status.is_terminal:
            raise ProtocolError("no_active_run", f"session {session_id!r} has no active run")
        entry.run.cancel(request.fields["reason"], mode=request.fields["mode"])
        await self.send(ack_frame(request.id, run_id=entry.run_id))

    # ---------------------------------------------------------- subscriptions

    def _room_for_subscription(self, run_id: str | None) -> bool:
        return (run_id is not None and run_id in self.subscriptions) or len(
            self.subscriptions
        ) < self.limits.max_subscriptions_per_connection

    def _check_subscription_room(self, run_id: str | None) -> None:
        if not self._room_for_subscription(run_id):
            raise ProtocolError(
                "limit_exceeded",
                f"at most {self.limits.max_subscriptions_per_connection} subscriptions"
                " per connection",
            )

    def _subscribe(self, entry: _RunEntry, from_seq: int | None, mode: str) -> None:
        """(Re)subscribe to a run; a second subscription to it replaces the first."""
        old = self.subscriptions.pop(entry.run_id, None)
        if old is not None:
            old.cancel()
        scope = trio.CancelScope()
        self.subscriptions[entry.run_id] = scope
        assert self._nursery is not None
        self._nursery.start_soon(self._forward, entry, from_seq, mode, scope)

    async def _forward(
        self, entry: _RunEntry, from_seq: int | None, mode: str, scope: trio.CancelScope
    ) -> None:
        assert entry.run is not None
        try:
            with scope:
                async for event in entry.run.events(from_seq):
                    if mode == "status" and not isinstance(event, RunUpdated | EventsDropped):
                        continue
                    await self.send(event_frame(event))
        except Exception:
            logger.exception("forwarding the events of %s failed", entry.run_id)
        finally:
            if self.subscriptions.get(entry.run_id) is scope:
                del self.subscriptions[entry.run_id]
            self._subscriptions_changed.set()


_OPS: dict[str, Callable[[_Connection, Request], Any]] = {
    "run.start": _Connection.op_run_start,
    "run.cancel": _Connection.op_run_cancel,
    "run.inject": _Connection.op_run_inject,
    "run.withdraw": _Connection.op_run_withdraw,
    "run.approve": _Connection.op_run_approve,
    "run.reject": _Connection.op_run_reject,
    "run.subscribe": _Connection.op_run_subscribe,
    "run.unsubscribe": _Connection.op_run_unsubscribe,
    "run.get": _Connection.op_run_get,
    "runs.list": _Connection.op_runs_list,
    "session.cancel": _Connection.op_session_cancel,
}


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
    )
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(server.serve, host, port)
            try:
                yield server
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        others = [
            leaf
            for leaf in _leaves(group)
            if leaf is not body_error and not isinstance(leaf, trio.Cancelled)
        ]
        if others:
            raise
        if body_error is not None:
            raise body_error from None
        raise first_leaf(group) from None
