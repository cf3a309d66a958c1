""":class:`PostgresCluster`: wires the node's parts together for a ControlServer.

The parts, one job per module: ``_db.py`` (calls on the database), ``_schema.py`` (the
tables), ``_listener.py`` (LISTEN/NOTIFY), ``_eventlog.py`` (persisting and following
events), ``_routing.py`` (ops for runs of other nodes), ``_claims.py`` (one active run
per session), ``_takeover.py`` (leases, takeover), ``_session.py`` (the runs' sessions).
The control server calls the methods below; they are internal (underscore-free names on
a private-by-convention surface documented here, not in the public API).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from .._items import ToolCall
from .._resume import Resume
from ..control._protocol import ProtocolError
from ._claims import claim_run
from ._db import ClusterDown, Conn, Database
from ._eventlog import EventWriter, Fence, RunLog, follow
from ._listener import Listener
from ._routing import Router
from ._schema import CHANNEL
from ._session import RETRY_FOR, ClusterSession, session_key
from ._takeover import Claimed, Leases

if TYPE_CHECKING:
    from ..control._registry import Registry

__all__ = ["ClusterStatistics", "PostgresCluster"]

logger = logging.getLogger("trio_agents.cluster")

Executor = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


@attrs.frozen
class ClusterStatistics:
    """What :meth:`PostgresCluster.statistics` reports about this node.

    Attributes:
        node_id: this node.
        owned_runs: unfinished runs this node runs.
        takeovers: runs this node took over from other nodes.
        routed: ops this node sent to other nodes.
        served: ops other nodes sent to this one.
        statements: database transactions this node ran (sessions excluded).
        flushes: event-log flushes.
        reconnects: LISTEN reconnections after a lost connection.
    """

    node_id: str
    owned_runs: int
    takeovers: int
    routed: int
    served: int
    statements: int
    flushes: int
    reconnects: int


def _default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@final
class PostgresCluster:
    """Makes N :class:`~trio_agents.control.ControlServer` processes on one PostgreSQL
    database act as one server (DESIGN §12; the tables are described in
    :mod:`trio_agents.cluster`).

    Args:
        dsn: a libpq connection string or URI of the database every node shares. The
            tables are created (or migrated) on first use.
        node_id: this node's name, unique in the cluster (default: host, pid and a
            random suffix). A node restarted with the same id takes its old runs back
            once their leases expire, like any other node.
        lease_ttl: seconds a node's runs stay its own without a heartbeat (renewed
            every ``lease_ttl / 3``): how long after a crash another node takes them
            over.
        max_runs: unfinished runs this node runs at most; a ``run.start`` beyond it is
            placed on a node with room (``limit_exceeded`` when none has).

    Give it to ``ControlServer(agents, auth=..., cluster=cluster)`` (one cluster object
    per server); ``sessions`` must then be None: runs' sessions are PostgreSQL sessions
    in the cluster's database.
    """

    def __init__(
        self,
        dsn: str,
        *,
        node_id: str | None = None,
        lease_ttl: float = 10.0,
        max_runs: int = 100,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise TypeError("dsn must be a non-empty str")
        if node_id is not None and (not isinstance(node_id, str) or not node_id):
            raise TypeError("node_id must be a non-empty str or None")
        if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, int | float):
            raise TypeError("lease_ttl must be a number")
        if not lease_ttl > 0:
            raise ValueError(f"lease_ttl must be > 0, got {lease_ttl!r}")
        if isinstance(max_runs, bool) or not isinstance(max_runs, int):
            raise TypeError("max_runs must be an int")
        if max_runs < 1:
            raise ValueError(f"max_runs must be >= 1, got {max_runs!r}")
        self._dsn = dsn
        self._node_id = node_id if node_id is not None else _default_node_id()
        self._lease_ttl = float(lease_ttl)
        self._max_runs = max_runs
        self.db = Database(dsn)
        self.listener = Listener(dsn, self._on_message)
        self.writer = EventWriter(self.db, self.listener, self._node_id)
        self.router = Router(self.db, self.listener, self._node_id)
        self.leases = Leases(self)
        self.registry: Registry | None = None
        self.execute: Executor | None = None
        self.dead = False
        self._nursery: trio.Nursery | None = None
        self._resuming: set[str] = set()
        self._resumed = trio.Event()
        self._in_use = False

    def __repr__(self) -> str:
        return f"<PostgresCluster node_id={self._node_id!r} lease_ttl={self._lease_ttl}>"

    @property
    def dsn(self) -> str:
        """The database's connection string."""
        return self._dsn

    @property
    def node_id(self) -> str:
        """This node's id."""
        return self._node_id

    @property
    def lease_ttl(self) -> float:
        """Seconds this node's runs stay its own without a heartbeat."""
        return self._lease_ttl

    @property
    def max_runs(self) -> int:
        """Unfinished runs this node runs at most."""
        return self._max_runs

    def statistics(self) -> ClusterStatistics:
        """Counts for monitoring (see :class:`ClusterStatistics`)."""
        return ClusterStatistics(
            node_id=self._node_id,
            owned_runs=self.running(),
            takeovers=self.leases.takeovers,
            routed=self.router.routed,
            served=self.router.served,
            statements=self.db.statements,
            flushes=self.writer.flushes,
            reconnects=self.listener.reconnects,
        )

    def running(self) -> int:
        """Unfinished runs of this node."""
        return 0 if self.registry is None else self.registry.active_count

    # -- the node's tasks -------------------------------------------------------------

    async def serve_node(
        self, registry: Registry, execute: Executor, *, task_status: trio.TaskStatus[None]
    ) -> None:
        """Run the node (listener, writer, router, leases) until cancelled; started once
        it listens and its node row exists."""
        if self._in_use:
            raise RuntimeError("a PostgresCluster serves one ControlServer, once")
        self._in_use = True
        self.registry = registry
        self.execute = execute
        self.router.execute = execute
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.listener.run)
                nursery.start_soon(self.writer.run)
                nursery.start_soon(self.router.run)
                await self.listener.connected.wait()
                await nursery.start(self.leases.run)
                task_status.started()
        finally:
            await self.db.aclose()

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("k")
        if kind == "run":
            self.listener.notify(("run", message.get("r")))
        elif kind == "cmd":
            if message.get("n") in (self._node_id, None):
                self.router.wake()
        elif kind == "reply":
            if message.get("n") == self._node_id:
                self.listener.notify(("reply", message.get("c")))
        elif kind == "scan":
            self.leases.wake()
        elif kind == "connected":
            self.router.wake()
            self.leases.wake()

    # -- starting runs ----------------------------------------------------------------

    def session(self, principal: str, session_id: str | None, run_id: str) -> ClusterSession:
        """The session of a run (fenced by a new :class:`Fence`)."""
        return ClusterSession(
            self._dsn, session_key(principal, session_id, run_id), self._node_id, Fence()
        )

    async def claim(
        self,
        *,
        run_id: str,
        principal: str,
        session_id: str | None,
        agent: str,
        on_busy: str,
        cancel_holder: Callable[[str, str | None], Awaitable[None]],
    ) -> None:
        """Insert a new run's row, claiming its session cluster-wide (``_claims.py``)."""
        await claim_run(
            self,
            run_id=run_id,
            principal=principal,
            session_id=session_id,
            agent=agent,
            on_busy=on_busy,
            options={},
            cancel_holder=cancel_holder,
        )

    async def forget(self, run_id: str) -> None:
        """Delete the row of a run that never started (bad input)."""
        with trio.CancelScope(shield=True), trio.move_on_after(5.0):
            try:
                await self.db.call(
                    lambda conn: conn.execute(
                        "DELETE FROM trio_agents_runs WHERE run_id = %s", (run_id,)
                    )
                )
            except ClusterDown:
                logger.warning("could not delete the row of run %s", run_id)

    def track(self, run: Any, run_id: str, attempt: int, start_seq: int, fence: Fence) -> RunLog:
        """Persist the events of a run this node started or resumed."""
        assert self._nursery is not None
        log = RunLog(run_id, attempt, run, start_seq, fence)
        if self.dead:
            fence.closed = True
        self.writer.track(self._nursery, log)
        return log

    def before_tool(self, run_id: str, attempt: int, fence: Fence) -> Callable[[ToolCall], Any]:
        """The ``before_tool`` barrier: record that a call starts before its tool runs."""
        db = self.db

        async def barrier(call: ToolCall) -> None:
            backoff = 0.05
            give_up = trio.current_time() + RETRY_FOR
            while True:
                if fence.closed:
                    raise RuntimeError("this node no longer runs the call")
                try:
                    await db.call(
                        lambda conn: conn.execute(
                            "INSERT INTO trio_agents_tool_starts (run_id, call_id, attempt)"
                            " VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                            (run_id, call.call_id, attempt),
                        )
                    )
                    return
                except ClusterDown:
                    if db.dead or trio.current_time() + backoff > give_up:
                        raise
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 1.0)

        return barrier

    async def resume(self, claimed: Claimed) -> None:
        """Continue a run this node just claimed (``_takeover.py``)."""
        registry = self.registry
        assert registry is not None
        self._resuming.add(claimed.run_id)
        try:
            if claimed.agent not in registry.agents:
                await self.leases.fail(
                    claimed, f"agent {claimed.agent!r} is not served by node {self._node_id}"
                )
                return
            resume = Resume(
                attempt=claimed.attempt,
                next_seq=claimed.last_seq + 1,
                started=claimed.started,
                reason=f"node {claimed.previous_owner} stopped",
            )
            try:
                entry = await registry.resume_run(claimed, resume)
            except Exception as exc:
                logger.exception("resuming run %s failed", claimed.run_id)
                await self.leases.fail(claimed, f"could not resume: {exc!r}")
                return
            run = entry.run
            assert run is not None
            for injected in claimed.reinject:
                try:
                    run.inject(list(injected.items), when=injected.when)  # type: ignore[arg-type]
                except Exception:
                    logger.exception("re-injecting into run %s failed", claimed.run_id)
        finally:
            self._resuming.discard(claimed.run_id)
            self._resumed.set()
            self._resumed = trio.Event()
        self.router.wake()  # commands that waited for the run's new owner

    async def wait_resumed(self, run_id: str) -> None:
        """Wait while ``run_id`` is being resumed here (a command may come first)."""
        while run_id in self._resuming:
            await self._resumed.wait()

    async def owner_of(self, principal: str, run_id: str) -> dict[str, Any] | None:
        """The run's row (None: no such run of ``principal``)."""
        rows = await self._rows("run_id = %s AND principal = %s", (run_id, principal))
        return rows[0] if rows else None

    # -- reading ----------------------------------------------------------------------

    async def _rows(self, where: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        columns = (
            "run_id, agent, session_id, status, reason, last_seq, turn, pending, owner,"
            " finished, principal"
        )

        def read(conn: Conn) -> list[dict[str, Any]]:
            return [
                {
                    "run_id": r[0],
                    "agent": r[1],
                    "session_id": r[2],
                    "status": r[3],
                    "reason": r[4],
                    "seq": int(r[5]),
                    "turn": int(r[6]),
                    "pending_approvals": json.loads(r[7]),
                    "owner": r[8],
                    "finished": bool(r[9]),
                    "principal": r[10],
                }
                for r in conn.execute(
                    f"SELECT {columns} FROM trio_agents_runs WHERE {where} ORDER BY created_at",
                    params,
                ).fetchall()
            ]

        try:
            return await self.db.call(read)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None

    async def list_runs(self, principal: str, retain: float) -> list[dict[str, Any]]:
        """The principal's unfinished runs and those finished less than ``retain`` s ago."""
        return await self._rows(
            "principal = %s AND (NOT finished OR updated_at > now() - make_interval(secs => %s))",
            (principal, retain),
        )

    async def session_holder(self, principal: str, session_id: str) -> dict[str, Any] | None:
        """The row of the run holding the principal's session, if any."""
        rows = await self._rows(
            "active_key = %s", (session_key(principal, session_id, ""),)
        )
        return rows[0] if rows else None

    async def follow(
        self,
        run_id: str,
        from_seq: int | None,
        mode: str,
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        """Send a run's persisted events from ``from_seq`` on (``_eventlog.follow``)."""
        await follow(self.db, self.listener, run_id, from_seq, mode, send)

    async def route(self, principal: str, request: dict[str, Any], row: dict[str, Any]) -> Any:
        """Send an op to the owner of ``row``'s run; its ack fields come back."""
        return await self.router.send(
            principal, request, run_id=row["run_id"], target_node=None, owner=row["owner"]
        )

    async def place(self, principal: str, request: dict[str, Any]) -> dict[str, Any] | None:
        """A ``run.start`` on a full node: start it on a node with room (its ack
        fields), or None when this node has room."""
        if self.running() < self._max_runs:
            return None

        def pick(conn: Conn) -> list[str]:
            return [
                str(row[0])
                for row in conn.execute(
                    "SELECT node_id FROM trio_agents_nodes WHERE node_id <> %s AND NOT draining"
                    " AND lease_expires_at > now() AND running < max_runs"
                    " ORDER BY running::float / max_runs LIMIT 3",
                    (self._node_id,),
                ).fetchall()
            ]

        try:
            nodes = await self.db.call(pick)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        # The counts are as of each node's last heartbeat: the chosen node checks its
        # own room (authoritative) and refuses when full; then the next one is asked.
        for node in nodes:
            try:
                return await self.router.send(
                    principal, request, run_id=None, target_node=node, owner=node
                )
            except ProtocolError as exc:
                if exc.code != "limit_exceeded":
                    raise
        raise ProtocolError(
            "limit_exceeded", "every node of the cluster runs as many runs as it may"
        )

    async def record_withdrawal(self, run_id: str, injection_id: str) -> None:
        """A withdrawn injection is never injected again by a takeover."""
        await self.db.call(
            lambda conn: conn.execute(
                "INSERT INTO trio_agents_withdrawals (run_id, injection_id) VALUES (%s, %s)"
                " ON CONFLICT DO NOTHING",
                (run_id, injection_id),
            )
        )

    async def injection_persisted(self, run_id: str, injection_id: str) -> None:
        """Wait (bounded) until an injection's ``inbox.injected`` event is persisted.

        Raises:
            ProtocolError: ``internal`` if it is not persisted within 10 s.
        """
        log = self.writer.logs.get(run_id)
        if log is None:
            return
        with trio.move_on_after(10.0):
            await log.wait_injection(injection_id)
            return
        raise ProtocolError("internal", "the injection was queued but could not be persisted")

    # -- stopping ---------------------------------------------------------------------

    async def hand_over(self, cancel_runs: Callable[[], Awaitable[None]]) -> None:
        """Graceful stop: fence every run here, let their events up to now be written,
        stop them locally (``cancel_runs``), then release their rows so another node
        takes them over at once (a NOTIFY triggers its scan)."""
        self.leases.draining = True
        for log in list(self.writer.logs.values()):
            log.fence.closed = True
            log.fence.fence_seq = log.run.statistics().last_seq
        await cancel_runs()
        await self.writer.flush_now()
        with trio.move_on_after(5.0):
            for log in list(self.writer.logs.values()):
                await log.done.wait()
        node = self._node_id

        def release(conn: Conn) -> None:
            conn.execute(
                "UPDATE trio_agents_runs SET released = true, lease_expires_at = now()"
                " WHERE owner = %s AND NOT finished",
                (node,),
            )
            conn.execute("DELETE FROM trio_agents_nodes WHERE node_id = %s", (node,))
            conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps({"k": "scan"})))

        with trio.move_on_after(5.0):
            try:
                await self.db.call(release)
            except ClusterDown:
                logger.warning("could not release this node's runs; they wait for their lease")

    def crash(self) -> None:
        """Stop talking to the database at once, as a killed process would (tests).

        Nothing more is persisted: no events, no session writes, no heartbeat; the
        node's runs are taken over once their leases expire."""
        self.dead = True
        self.db.dead = True
        self.listener.stop()
        for log in self.writer.logs.values():
            log.fence.closed = True
            log.fence.fence_seq = None
