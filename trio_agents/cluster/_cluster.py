""":class:`PostgresCluster`: wires the node's parts together for a ControlServer.

The parts, one job per module: ``_db.py`` (calls on the database), ``_schema.py`` (the
tables), ``_listener.py`` (LISTEN/NOTIFY), ``_eventlog.py`` (persisting and following
events), ``_routing.py`` (ops for runs of other nodes), ``_claims.py`` (one active run
per session), ``_takeover.py`` (leases, takeover), ``_session.py`` (the runs' sessions).
Its public face is its configuration (``dsn``, ``node_id``, ``lease_ttl``, ``max_runs``)
and :meth:`~PostgresCluster.statistics` (issue 31); everything else — the methods the
node's host, its run tasks and its parts call, and its mutable state — is private
(underscored), documented here, not in the public API. The hosting layer calls the
few it needs through a Protocol (``hosting/_node.py``'s ``ClusterNode``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, final

import trio

from .._agent import Agent
from .._items import Item, ToolCall
from .._limits import UsageLimits
from ..hosting._host import Origin
from ..hosting._node import ClusterStatistics
from ..hosting._policies import limits_to_wire
from ..hosting._terms import ProtocolError
from ._capacity import enqueue_start
from ._claims import claim_queued, claim_run
from ._db import ClusterDown, Database
from ._eventlog import EventWriter, Fence, RunLog, follow
from ._listener import Listener
from ._queries import (
    CLIENT_GONE,
    live_nodes,
    nodes_with_room,
    read_runs,
    record_cancel,
    record_decision,
    record_withdrawal,
    release_node,
    tool_start_barrier,
)
from ._routing import Executor, Reply, Router, ok_reply, routed_reply, store_reply
from ._session import ClusterSession, session_key
from ._storable import storable_json
from ._takeover import Leases

if TYPE_CHECKING:
    from ..hosting._policies import ContextHook
    from ..hosting._registry import Registry
    from ..hosting._terms import Limits
    from ._cluster_host import ClusterHost
    from ._placement import ClusterPlacement

__all__ = ["ClusterStatistics", "PostgresCluster"]

logger = logging.getLogger("trio_agents.cluster")

CONNECT_TIMEOUT = 10.0
"""Seconds a node waits for the database when it starts, then fails (ClusterDown)."""


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
            placed on a node with room, or, when none has, queued until one has
            (``limit_exceeded`` past the principal's active-run limit of such runs).

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
        self._db = Database(dsn)
        # A transaction of a frozen node (a paused process or VM, a partition that
        # leaves its socket open) is ended by the server once idle this long, its row
        # locks with it: its runs can be taken over once their leases expire.
        self._db.idle_timeout = idle_timeout(self._lease_ttl)
        self._listener = Listener(dsn, self._on_message)
        self._writer = EventWriter(self._db, self._listener, self._node_id)
        self._writer.lease_ttl = self._lease_ttl
        self._router = Router(self._db, self._listener, self._node_id)
        self._leases = Leases(self)
        self._registry: Registry | None = None
        self._placement: ClusterPlacement | None = None
        self._dead = False
        self._nursery: trio.Nursery | None = None
        self._in_use = False
        # Runs being started here: their rows exist, they are not tracked yet (their
        # leases are renewed all the same: Leases.heartbeat).
        self._starting: set[str] = set()
        # This node's runs started with on_disconnect="cancel" by a client connected to
        # another node, by run id: that node (see _check_clients).
        self._clients: dict[str, str] = {}

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
            owned_runs=self._running(),
            takeovers=self._leases.takeovers,
            routed=self._router.routed,
            served=self._router.served,
            statements=self._db.statements,
            flushes=self._writer.flushes,
            reconnects=self._listener.reconnects,
        )

    def _sent(self, reply: Reply | None) -> bool:
        """Whether the op's transaction stored its routed command's answer and notified
        the sender: then the router sends nothing more."""
        if reply is None or reply[2] is None:
            return False
        self._router.answered(reply[0])
        return True

    def host(
        self,
        agents: Mapping[str, Agent],
        *,
        limits: Limits | None = None,
        run_options: Mapping[str, Any] | None = None,
        context: ContextHook | None = None,
    ) -> ClusterHost:
        """This node as the run host (a :class:`~trio_agents.hosting.RunHost`) that a
        server's faces talk to: its runs, and every other node's through the cluster's
        tables. ``agents``, ``limits``, ``run_options`` and ``context`` are as for
        :class:`~trio_agents.hosting.LocalHost`; sessions are the cluster's. One host
        per cluster object, served once."""
        from ._cluster_host import ClusterHost

        return ClusterHost(self, agents, limits=limits, run_options=run_options, context=context)

    _host_for = host  # the name servers used before host() (until they all call host)

    def _running(self) -> int:
        """Unfinished runs of this node."""
        return 0 if self._registry is None else self._registry.active_count

    def _room_freed(self) -> None:
        """A run of this node ended: scan at once if runs queued for capacity may wait."""
        if self._leases.queued:
            self._leases.wake()

    # -- the node's tasks -------------------------------------------------------------

    async def _serve_node(
        self,
        placement: ClusterPlacement,
        execute: Executor,
        *,
        task_status: trio.TaskStatus[None],
    ) -> None:
        """Run the node (listener, writer, router, leases) until cancelled; started once
        it listens and its node row exists."""
        if self._in_use:
            raise RuntimeError("a PostgresCluster serves one ControlServer, once")
        self._in_use = True
        self._registry = placement.registry
        self._placement = placement
        self._router.execute = execute
        self._router.serves_inline = self._serves
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._listener.run)
                nursery.start_soon(self._writer.run)
                with trio.move_on_after(CONNECT_TIMEOUT):
                    await self._listener.connected.wait()
                if not self._listener.connected.is_set():
                    raise ClusterDown(
                        f"cannot reach the cluster database: {self._listener.last_error}"
                    )
                nursery.start_soon(self._router.run)
                await nursery.start(self._leases.run)
                nursery.start_soon(self._leases.watchdog)
                task_status.started()
        finally:
            await self._db.aclose()

    def _serves(self, run_id: Any, principal: Any) -> bool:
        """Whether a routed op for ``run_id`` may be answered here at once (a run of
        this node; or no run: a start placed here)."""
        if run_id is None:
            return True
        registry = self._registry
        entry = None if registry is None else registry.runs.get(run_id)
        return (
            entry is not None
            and entry.principal == principal
            and not (entry.fence is not None and entry.fence.closed)
        )

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("k")
        if kind == "run":
            self._listener.notify(("run", message.get("r")), message)
        elif kind == "cmd":
            if message.get("n") in (self._node_id, None):
                self._router.command(message)
        elif kind == "reply":
            if message.get("n") == self._node_id:
                self._router.replied(message)
        elif kind == "scan":
            if message.get("q"):
                self._leases.queued = True  # a run queued for capacity: scan when room frees
            self._leases.wake()
        elif kind == "connected":
            self._router.wake()
            self._leases.wake()

    # -- starting runs ----------------------------------------------------------------

    def _session(self, principal: str, session_id: str | None, run_id: str) -> ClusterSession:
        """The session of a run (fenced by a new :class:`Fence`)."""
        session = ClusterSession(
            self._dsn, session_key(principal, session_id, run_id), self._node_id, Fence(), run_id
        )
        session.inner._idle_timeout = self._db.idle_timeout
        return session

    async def _claim(
        self,
        *,
        run_id: str,
        principal: str,
        session_id: str | None,
        agent: str,
        on_busy: str,
        cancel_holder: Callable[[str, str | None], Awaitable[None]],
        items: Sequence[Item] = (),
        client_node: str | None = None,
        command: int | None = None,
        limits: UsageLimits | None = None,
    ) -> str | None:
        """Insert a new run's row, claiming its session cluster-wide (``_claims.py``):
        None once claimed, else (``enqueue``/``interrupt``) the id of the run it is
        queued behind; :meth:`claim_queued` completes the claim. The row keeps the run's
        input (``options["input"]``) for a takeover that finds it missing from the
        session, and, for a run started with ``on_disconnect="cancel"``, the node that
        holds its client's connection (``options["client"]``): once that node is dead,
        the run is cancelled as its client's disconnect would (:meth:`_check_clients`).
        A start placed here by another node (``command``) inserts the row only while
        that node still waits for it (``internal`` otherwise). The run's ``limits``
        (``options["limits"]``) are its limits again after a takeover."""
        options: dict[str, Any] = {"input": [item.to_json() for item in items]}
        if limits is not None:
            options["limits"] = limits_to_wire(limits)
        if client_node is not None:
            options["client"] = client_node
        if on_busy == "interrupt":  # queued, it goes before the enqueued runs
            options["on_busy"] = on_busy
        # Its row's lease is renewed from its insert on, until the run is tracked (or
        # forgotten): the start may wait long (an interrupted holder's routed cancel).
        self._starting.add(run_id)
        try:
            return await claim_run(
                self,
                run_id=run_id,
                principal=principal,
                session_id=session_id,
                agent=agent,
                on_busy=on_busy,
                options=options,
                cancel_holder=cancel_holder,
                command=command,
            )
        except BaseException:
            self._starting.discard(run_id)
            raise

    async def _claim_queued(
        self,
        *,
        run_id: str,
        principal: str,
        session_id: str | None,
        on_busy: str,
        waiting: Callable[[], bool],
        cancel_holder: Callable[[str, str | None], Awaitable[None]],
        interrupted: str | None = None,
    ) -> bool:
        """Claim a queued run's session once its holder ends (``_claims.claim_queued``);
        False if the run ended first."""
        return await claim_queued(
            self,
            run_id=run_id,
            key=session_key(principal, session_id, run_id),
            on_busy=on_busy,
            waiting=waiting,
            cancel_holder=cancel_holder,
            interrupted=interrupted,
        )

    async def _forget(self, run_id: str) -> None:
        """Delete the row of a run that never started (bad input)."""
        self._starting.discard(run_id)
        with trio.CancelScope(shield=True), trio.move_on_after(5.0):
            try:
                await self._db.call(
                    lambda conn: conn.execute(
                        "DELETE FROM trio_agents_runs WHERE run_id = %s", (run_id,)
                    )
                )
            except ClusterDown:
                logger.warning("could not delete the row of run %s", run_id)

    def _track(
        self,
        run: Any,
        run_id: str,
        attempt: int,
        start_seq: int,
        fence: Fence,
        client_node: str | None = None,
    ) -> RunLog:
        """Persist the events of a run this node started or resumed, and the items it
        writes to its session, each with its ``run.item`` event (one transaction); if
        its client is connected to another node, ``client_node``, watch that node."""
        assert self._nursery is not None
        self._starting.discard(run_id)
        log = RunLog(run_id, attempt, run, start_seq, fence)
        if self._dead:
            fence.closed = True
        # The run's session (fenced with it): its items are written with their events.
        session = getattr(run, "session", None)
        if not isinstance(session, ClusterSession) or session.fence is not fence:
            session = None
        self._writer.track(self._nursery, log, session)
        if client_node is not None and client_node != self._node_id:
            self._clients[run_id] = client_node
        return log

    async def _check_clients(self) -> None:
        """Cancel this node's runs whose client is connected to a node that is dead
        (its lease expired, or it stopped): reason ``"client disconnected"``, durably,
        as that client's disconnect would have. One small query, only while such runs
        exist (the scan calls it)."""
        registry = self._registry
        watched: dict[str, str] = {}
        for run_id, node in list(self._clients.items()):
            log = self._writer.logs.get(run_id)
            if log is None or log.fence.closed or log.run.status.is_terminal:
                del self._clients[run_id]  # ended here (or moved on: its new owner watches)
            else:
                watched[run_id] = node
        if not watched or registry is None:
            return
        nodes = sorted(set(watched.values()))
        alive = await self._db.call(lambda conn: live_nodes(conn, nodes))
        for run_id, node in watched.items():
            if node in alive:
                continue
            self._clients.pop(run_id, None)
            entry = registry.runs.get(run_id)
            if entry is None or entry.run is None or entry.done.is_set():
                continue
            logger.info("run %s: its client's node %s is gone; cancelling it", run_id, node)
            entry.run.cancel(CLIENT_GONE)
            try:
                await self._record_cancel(run_id, CLIENT_GONE, "immediate")
            except ProtocolError:
                logger.warning("could not record the cancel of run %s", run_id)

    def _before_tool(self, run_id: str, attempt: int, fence: Fence) -> Callable[[ToolCall], Any]:
        """The ``before_tool`` barrier: record that a call starts before its tool runs."""
        return tool_start_barrier(self._db, run_id, self._node_id, attempt, fence)

    async def _wait_resumed(self, run_id: str) -> None:
        """Wait while ``run_id`` is being resumed here (a command may come first)."""
        await self._leases.wait_resumed(run_id)

    async def _owner_of(self, principal: str, run_id: str) -> dict[str, Any] | None:
        """The run's row (None: no such run of ``principal``)."""
        rows = await self._rows("run_id = %s AND principal = %s", (run_id, principal))
        return rows[0] if rows else None

    async def _unfinished(self, principal: str, run_ids: Iterable[str]) -> set[str]:
        """Which of ``run_ids`` (runs of ``principal``) have not finished."""
        rows = await self._rows(
            "run_id = ANY(%s) AND principal = %s AND NOT finished", (list(run_ids), principal)
        )
        return {str(row["run_id"]) for row in rows}

    # -- reading ----------------------------------------------------------------------

    async def _rows(self, where: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        return await read_runs(self._db, where, params)

    async def _list_runs(self, principal: str, retain: float) -> list[dict[str, Any]]:
        """The principal's unfinished runs and those finished less than ``retain`` s ago."""
        return await self._rows(
            "principal = %s AND (NOT finished OR updated_at > now() - make_interval(secs => %s))",
            (principal, retain),
        )

    async def _session_holder(self, principal: str, session_id: str) -> dict[str, Any] | None:
        """The row of the run holding the principal's session, if any."""
        rows = await self._rows("active_key = %s", (session_key(principal, session_id, ""),))
        return rows[0] if rows else None

    async def _follow(
        self,
        run_id: str,
        from_seq: int | None,
        mode: str,
        send: Callable[[dict[str, Any]], Awaitable[None]],
        *,
        absent_ends: bool = True,
    ) -> None:
        """Send a run's persisted events from ``from_seq`` on (``_eventlog.follow``)."""
        await follow(
            self._db, self._listener, run_id, from_seq, mode, send, absent_ends=absent_ends
        )

    async def _child_of(self, principal: str, run_id: str) -> dict[str, Any] | None:
        """A child run's row (its tree's root, parent, call, agent, last seq, whether it
        finished, and its root's owner), if ``run_id`` is a persisted child run of
        ``principal``'s (its root's)."""

        def read(conn: Any) -> dict[str, Any] | None:
            row = conn.execute(
                "SELECT c.root_id, c.parent_id, c.call_id, c.agent, c.last_seq, c.finished,"
                " r.owner FROM trio_agents_children AS c JOIN trio_agents_runs AS r"
                " ON r.run_id = c.root_id WHERE c.run_id = %s AND r.principal = %s",
                (run_id, principal),
            ).fetchone()
            if row is None:
                return None
            keys = ("root_id", "parent_id", "call_id", "agent", "seq", "finished", "owner")
            return {"run_id": run_id, **dict(zip(keys, row, strict=True))}

        try:
            found: dict[str, Any] | None = await self._db.call(read)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        return found

    async def _route(self, principal: str, request: dict[str, Any], run_id: str) -> Any:
        """Send an op to the owner of ``run_id``; its ack fields come back (errors:
        ``not_found``, ``run_closed``, the owner's own). A cancel of a run queued for
        capacity that no node has claimed ends it at once (``Router.send``)."""
        return await self._router.send(principal, request, run_id=run_id)

    async def _place(
        self, principal: str, request: dict[str, Any], run_id: str
    ) -> dict[str, Any] | None:
        """A ``run.start`` on a full node: start it, as ``run_id``, on a node with room
        (its ack fields), or, when every node is full, queue it for capacity (``_capacity.py``)
        and return its ``run_id``; None when this node has room.

        Raises:
            ProtocolError: ``limit_exceeded`` when the principal has as many runs
                queued for capacity as its active-run limit (``Limits``), the placed
                node's error, ``session_busy`` or ``internal``.
        """
        if self._running() < self._max_runs:
            return None

        nodes = await nodes_with_room(self._db, self._node_id)
        # The run's id is chosen by the placing node: if the chosen node never answers
        # (or this node stops waiting), the run's row tells whether it started
        # (Router.send).
        # The counts are as of each node's last heartbeat: the chosen node checks its
        # own room (authoritative) and refuses when full; then the next one is asked.
        for node in nodes:
            try:
                return await self._router.send(principal, request, run_id=run_id, target_node=node)
            except ProtocolError as exc:
                if exc.code != "limit_exceeded":
                    raise
        # Every node is full: queued for capacity (``_capacity.py``), claimed by the
        # first node with room, in the order of the starts.
        registry = self._registry
        bound = 100 if registry is None else registry.limits.max_runs_per_principal
        client = self._node_id if request.get("on_disconnect") == "cancel" else None
        await enqueue_start(self._db, principal, request, run_id, client_node=client, bound=bound)
        return {"run_id": run_id}

    async def _record_cancel(
        self, run_id: str, reason: str | None, mode: str, origin: Origin | None = None
    ) -> bool:
        """Make an acked cancel durable: a takeover ends the run cancelled (the first
        cancel's reason and mode are kept, as :meth:`trio_agents.Run.cancel` does). A
        routed cancel (``origin``: its command) was recorded by the node that sent it;
        its answer is stored here. Returns whether that answer was stored and sent.

        Raises:
            ProtocolError: ``internal`` when the database cannot be reached.
        """
        reply = routed_reply(origin, {})
        recorded = origin is not None and origin.command is not None
        try:
            await record_cancel(self._db, run_id, reason, mode, reply, recorded=recorded)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        return self._sent(reply)

    async def _record_child_cancel(
        self, child: Any, reason: str | None, mode: str, origin: Origin | None = None
    ) -> bool:
        """Make a cancel of a child run durable before it is applied (its row's
        ``cancel``; the first one's reason and mode stay): the takeover that resumes the
        child cancels it at once. Only while this node runs the tree's attempt (its
        root's row); a routed cancel's answer is stored in the same transaction.
        Returns whether that answer was stored and sent.

        Raises:
            ProtocolError: ``internal`` when the database cannot be reached, or this
                node's attempt of the tree has ended (retry: its next owner answers).
        """
        log = self._writer.logs.get(child.root_id)
        if log is None or log.fence.closed:
            raise ProtocolError("internal", f"run {child.id} is moving to another node; retry")
        reply = routed_reply(origin, {})
        params = {
            "root": child.root_id,
            "node": self._node_id,
            "attempt": log.attempt,
            "run_id": child.id,
            "parent": child.parent_id,
            "call": child.call_id,
            "agent": child.agent.name,
            "cancel": json.dumps(storable_json({"reason": reason, "mode": mode})),
        }

        def record(conn: Any) -> bool:
            found = conn.execute(
                "WITH root AS (SELECT run_id FROM trio_agents_runs WHERE run_id = %(root)s"
                " AND owner = %(node)s AND attempt = %(attempt)s FOR UPDATE)"
                " INSERT INTO trio_agents_children AS c"
                " (run_id, root_id, parent_id, call_id, agent, cancel)"
                " SELECT %(run_id)s, root.run_id, %(parent)s, %(call)s, %(agent)s, %(cancel)s"
                " FROM root ON CONFLICT (run_id) DO UPDATE SET"
                " cancel = COALESCE(c.cancel, EXCLUDED.cancel) RETURNING c.run_id",
                params,
            ).fetchone()
            if found is not None and reply is not None:
                store_reply(conn, *reply)
            return found is not None

        try:
            recorded = await self._db.call(record)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        if not recorded:
            raise ProtocolError("internal", f"run {child.id} is moving to another node; retry")
        return self._sent(reply)

    async def _record_decision(
        self,
        run_id: str,
        call_id: str,
        *,
        approved: bool,
        message: str | None,
        origin: Origin | None = None,
    ) -> bool:
        """Make an approval or rejection durable before it is applied: a takeover
        applies it to the call its run asks for again instead of asking the client. A
        routed one (``origin``: its command) is answered in the same transaction, so the
        node that takes the run over answers from it instead of applying it again.
        Returns whether that answer was stored and sent.

        Raises:
            ProtocolError: ``not_found`` (the call has a decision already: the first
                one is the one applied), ``run_closed``, or ``internal`` (the database
                cannot be reached, or this node's attempt of the run has ended: retry).
        """
        log = self._writer.logs.get(run_id)
        if log is None or log.fence.closed:
            raise ProtocolError(
                "internal", "this node no longer runs the run (it is being taken over); retry"
            )
        reply = routed_reply(origin, {})
        decision = {"approved": approved, "message": message}
        try:
            outcome = await record_decision(
                self._db, run_id, self._node_id, log.attempt, call_id, decision, reply
            )
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        if outcome == "decided":
            raise ProtocolError("not_found", f"no tool call {call_id!r} waits for approval")
        if outcome == "closed":
            raise ProtocolError("run_closed", f"run {run_id} is closed")
        if outcome == "lost":
            raise ProtocolError(
                "internal", "this node no longer runs the run (it is being taken over); retry"
            )
        return self._sent(reply)

    async def _record_withdrawal(
        self, run_id: str, injection_id: str, origin: Origin | None = None
    ) -> bool:
        """A withdrawn injection is never injected again by a takeover; a routed
        withdrawal (``origin``: its command) is answered in the same transaction.
        Returns whether that answer was stored and sent."""
        reply = routed_reply(origin, {"withdrawn": True})
        await record_withdrawal(self._db, run_id, injection_id, reply)
        return self._sent(reply)

    async def _injection_persisted(
        self, run_id: str, injection_id: str, origin: Origin | None = None
    ) -> None:
        """Wait (bounded) until an injection's ``inbox.injected`` event is persisted; a
        routed injection (``origin``: its command) is answered in the transaction that
        persists it.
        Call it before any checkpoint after the injection (so before that flush).

        Raises:
            ProtocolError: ``internal`` if it is not persisted within 10 s.
        """
        log = self._writer.logs.get(run_id)
        if log is None:
            return
        if origin is not None and origin.command is not None:
            reply = ok_reply({"injection_id": injection_id})
            log.replies[injection_id] = (origin.command, reply)
        with trio.move_on_after(10.0):
            await log.wait_injection(injection_id)
            return
        raise ProtocolError("internal", "the injection was queued but could not be persisted")

    # -- stopping ---------------------------------------------------------------------

    async def _hand_over(self, cancel_runs: Callable[[], Awaitable[None]]) -> None:
        """Graceful stop: fence every run here, let their events up to now be written,
        stop them locally (``cancel_runs``), then release their rows so another node
        takes them over at once (a NOTIFY triggers its scan)."""
        self._leases.draining = True
        with trio.move_on_after(5.0):
            async with self._leases.scanning:  # a scan in flight resumes its runs first
                pass
        for log in list(self._writer.logs.values()):
            log.fence.closed = True
            log.fence.fence_seq = log.run.statistics().last_seq
        await cancel_runs()
        await self._writer.flush_now()
        with trio.move_on_after(5.0):
            for log in list(self._writer.logs.values()):
                await log.done.wait()
        with trio.move_on_after(5.0):
            await self._leases.lock.acquire()  # no heartbeat in flight: none comes after
            self._leases.stopped = True
            try:
                await release_node(self._db, self._node_id)
            except ClusterDown:
                logger.warning("could not release this node's runs; they wait for their lease")

    def _lose_all(self, reason: str) -> int:
        """Stop every run of this node without persisting anything more (its leases
        may have expired: another node may take them over); returns how many."""
        count = 0
        for log in list(self._writer.logs.values()):
            if log.root is not None:  # a child run: stopped with its root
                log.fence.closed = True
                log.fence.fence_seq = None
            elif not log.fence.closed:
                log.fence.closed = True
                log.fence.fence_seq = None
                log.run.cancel(reason)
                self._leases.to_release.add(log.run_id)
                count += 1
        if count:
            logger.warning("node %s stopped %d runs: %s", self._node_id, count, reason)
        return count

    def _crash(self) -> None:
        """Stop talking to the database at once, as a killed process would (tests).

        Nothing more is persisted: no events, no session writes, no heartbeat; the
        node's runs are taken over once their leases expire."""
        self._dead = True
        self._db.dead = True
        self._listener.stop()
        for log in self._writer.logs.values():
            log.fence.closed = True
            log.fence.fence_seq = None

    # -- run trees (DESIGN §17) -------------------------------------------------------

    async def _tree_nodes(self, principal: str, retain: float) -> list[str]:
        """The other nodes where a tree of ``principal`` may hold a child run: the
        live owners of its unfinished runs and of those finished less than ``retain``
        s ago. Child runs have no rows (a tree lives on its root's node), so a child's
        id is resolved by asking these nodes (:meth:`_route_to`); a principal with no
        runs on other nodes costs this one query.

        Raises:
            ProtocolError: ``internal`` when the database cannot be reached.
        """

        def read(conn: Any) -> list[str]:
            rows = conn.execute(
                "SELECT DISTINCT owner FROM trio_agents_runs WHERE principal = %s"
                " AND owner IS NOT NULL AND owner <> %s"
                " AND (NOT finished OR updated_at > now() - make_interval(secs => %s))"
                # Live nodes only: a dead one would answer nothing (ROUTE_TIMEOUT), and
                # the trees it ran are gone from memory with it.
                " AND owner IN (SELECT node_id FROM trio_agents_nodes"
                " WHERE lease_expires_at > now())",
                (principal, self._node_id, retain),
            ).fetchall()
            return sorted(str(row[0]) for row in rows)

        try:
            return await self._db.call(read)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None

    async def _route_to(
        self, principal: str, request: dict[str, Any], run_id: str, node: str
    ) -> dict[str, Any]:
        """Send an op on ``run_id`` (a child run, which has no row) to ``node``, the
        node running its tree; its ack fields come back (errors: the node's own, e.g.
        ``not_found`` when the tree is not there)."""
        return await self._router.send(principal, request, run_id=run_id, target_node=node)


def idle_timeout(lease_ttl: float) -> float:
    """How long a node's transaction may sit idle between statements before the server
    ends it: half the lease (its locks are gone before the lease expires), at least 1 s
    (a loaded machine's pauses), at most 5 s (the lock timeout)."""
    return min(max(lease_ttl / 2, 1.0), 5.0)
