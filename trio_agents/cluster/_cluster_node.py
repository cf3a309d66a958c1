""":class:`ClusterNode`: this process as a node of a cluster — the parts that make N
processes on one PostgreSQL database act as one server, wired together.

The parts, one job per module: ``_db.py`` (calls on the database), ``_schema.py`` (the
tables), ``_listener.py`` (LISTEN/NOTIFY), ``_eventlog.py`` (persisting and following
events), ``_routing.py`` (ops for runs of other nodes), ``_claims.py`` (one active run
per session), ``_takeover.py`` (leases, takeover), ``_session.py`` (the runs' sessions),
``_capacity.py`` (starts queued for capacity), ``_cluster_placement.py`` (where this node's runs
hold their sessions: the host's ``RunPlacement``).

A node is internal: made by :class:`~trio_agents.cluster.PostgresCluster` (the public
configuration), served by the node's host (``_cluster_host.ClusterHost``, what the
faces talk to). Its methods are the node's own surface for those parts: none reaches
into another module's privates.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, final

import trio

from .._items import Item, ToolCall
from .._limits import UsageLimits
from ..hosting._error_codes import ProtocolError
from ..hosting._host import Origin, StartRequest
from ..hosting._node_of_cluster import ClusterStatistics
from ..hosting._policies import limits_to_wire
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
from ._routing import (
    Executor,
    Reply,
    RoutedOp,
    Router,
    ok_reply,
    routed_reply,
    store_reply,
    to_wire,
)
from ._session import ClusterSession, session_key
from ._storable import storable_json
from ._takeover import Leases

if TYPE_CHECKING:
    from ..hosting._registry import Registry
    from ._cluster_placement import ClusterPlacement

__all__ = ["CONNECT_TIMEOUT", "ClusterNode", "idle_timeout"]

logger = logging.getLogger("trio_agents.cluster")

CONNECT_TIMEOUT = 10.0
"""Seconds a node waits for the database when it starts, then fails (ClusterDown)."""


@final
class ClusterNode:
    """This process's node of a cluster (see the module docstring): ``dsn``,
    ``node_id``, ``lease_ttl`` and ``max_runs`` as
    :class:`~trio_agents.cluster.PostgresCluster` checked them."""

    def __init__(self, dsn: str, node_id: str, lease_ttl: float, max_runs: int) -> None:
        self.dsn = dsn
        self.node_id = node_id
        self.lease_ttl = float(lease_ttl)
        self.max_runs = max_runs
        self.db = Database(dsn)
        # A transaction of a frozen node (a paused process or VM, a partition that
        # leaves its socket open) is ended by the server once idle this long, its row
        # locks with it: its runs can be taken over once their leases expire.
        self.db.idle_timeout = idle_timeout(self.lease_ttl)
        self.listener = Listener(dsn, self._on_message)
        self.writer = EventWriter(self.db, self.listener, self.node_id)
        self.writer.lease_ttl = self.lease_ttl
        self.router = Router(self.db, self.listener, self.node_id)
        self.leases = Leases(self)
        self.registry: Registry | None = None
        self.placement: ClusterPlacement | None = None
        self.dead = False
        self._nursery: trio.Nursery | None = None
        self._in_use = False
        # Runs being started here: their rows exist, they are not tracked yet (their
        # leases are renewed all the same: Leases.heartbeat).
        self.starting: set[str] = set()
        # This node's runs started with on_disconnect="cancel" by a client connected to
        # another node, by run id: that node (see check_clients).
        self._clients: dict[str, str] = {}

    def statistics(self) -> ClusterStatistics:
        """Counts for monitoring (see :class:`ClusterStatistics`)."""
        return ClusterStatistics(
            node_id=self.node_id,
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

    def room_freed(self) -> None:
        """A run of this node ended: scan at once if runs queued for capacity may wait."""
        if self.leases.queued:
            self.leases.wake()

    # -- the node's tasks -------------------------------------------------------------

    async def serve_node(
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
        self.registry = placement.registry
        self.placement = placement
        self.router.attach(execute, placement.registry.runs, self.leases.wait_resumed)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self.listener.run)
                nursery.start_soon(self.writer.run)
                with trio.move_on_after(CONNECT_TIMEOUT):
                    await self.listener.connected.wait()
                if not self.listener.connected.is_set():
                    raise ClusterDown(
                        f"cannot reach the cluster database: {self.listener.last_error}"
                    )
                nursery.start_soon(self.router.run)
                await nursery.start(self.leases.run)
                nursery.start_soon(self.leases.watchdog)
                task_status.started()
        finally:
            await self.db.aclose()

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("k")
        if kind == "run":
            self.listener.notify(("run", message.get("r")), message)
        elif kind == "cmd":
            if message.get("n") in (self.node_id, None):
                self.router.command(message)
        elif kind == "reply":
            if message.get("n") == self.node_id:
                self.router.replied(message)
        elif kind == "scan":
            if message.get("q"):
                self.leases.queued = True  # a run queued for capacity: scan when room frees
            self.leases.wake()
        elif kind == "connected":
            self.router.wake()
            self.leases.wake()

    # -- starting runs ----------------------------------------------------------------

    def session(self, principal: str, session_id: str | None, run_id: str) -> ClusterSession:
        """The session of a run (fenced by a new :class:`Fence`)."""
        session = ClusterSession(
            self.dsn, session_key(principal, session_id, run_id), self.node_id, Fence(), run_id
        )
        session.inner._idle_timeout = self.db.idle_timeout
        return session

    async def claim(
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
        self.starting.add(run_id)
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
            self.starting.discard(run_id)
            raise

    async def claim_queued(
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

    async def forget(self, run_id: str) -> None:
        """Delete the row of a run that never started (bad input)."""
        self.starting.discard(run_id)
        with trio.CancelScope(shield=True), trio.move_on_after(5.0):
            try:
                await self.db.call(
                    lambda conn: conn.execute(
                        "DELETE FROM trio_agents_runs WHERE run_id = %s", (run_id,)
                    )
                )
            except ClusterDown:
                logger.warning("could not delete the row of run %s", run_id)

    def track(
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
        self.starting.discard(run_id)
        log = RunLog(run_id, attempt, run, start_seq, fence)
        if self.dead:
            fence.closed = True
        # The run's session (fenced with it): its items are written with their events.
        session = getattr(run, "session", None)
        if not isinstance(session, ClusterSession) or session.fence is not fence:
            session = None
        self.writer.track(self._nursery, log, session)
        if client_node is not None and client_node != self.node_id:
            self._clients[run_id] = client_node
        return log

    async def check_clients(self) -> None:
        """Cancel this node's runs whose client is connected to a node that is dead
        (its lease expired, or it stopped): reason ``"client disconnected"``, durably,
        as that client's disconnect would have. One small query, only while such runs
        exist (the scan calls it)."""
        registry = self.registry
        watched: dict[str, str] = {}
        for run_id, node in list(self._clients.items()):
            log = self.writer.logs.get(run_id)
            if log is None or log.fence.closed or log.run.status.is_terminal:
                del self._clients[run_id]  # ended here (or moved on: its new owner watches)
            else:
                watched[run_id] = node
        if not watched or registry is None:
            return
        nodes = sorted(set(watched.values()))
        alive = await self.db.call(lambda conn: live_nodes(conn, nodes))
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
                await self.record_cancel(run_id, CLIENT_GONE, "immediate")
            except ProtocolError:
                logger.warning("could not record the cancel of run %s", run_id)

    def before_tool(self, run_id: str, attempt: int, fence: Fence) -> Callable[[ToolCall], Any]:
        """The ``before_tool`` barrier: record that a call starts before its tool runs."""
        return tool_start_barrier(self.db, run_id, self.node_id, attempt, fence)

    async def owner_of(self, principal: str, run_id: str) -> dict[str, Any] | None:
        """The run's row (None: no such run of ``principal``)."""
        rows = await self._rows("run_id = %s AND principal = %s", (run_id, principal))
        return rows[0] if rows else None

    async def unfinished(self, principal: str, run_ids: Iterable[str]) -> set[str]:
        """Which of ``run_ids`` (runs of ``principal``) have not finished."""
        rows = await self._rows(
            "run_id = ANY(%s) AND principal = %s AND NOT finished", (list(run_ids), principal)
        )
        return {str(row["run_id"]) for row in rows}

    # -- reading ----------------------------------------------------------------------

    async def _rows(self, where: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
        return await read_runs(self.db, where, params)

    async def list_runs(self, principal: str, retain: float) -> list[dict[str, Any]]:
        """The principal's unfinished runs and those finished less than ``retain`` s ago."""
        return await self._rows(
            "principal = %s AND (NOT finished OR updated_at > now() - make_interval(secs => %s))",
            (principal, retain),
        )

    async def session_holder(self, principal: str, session_id: str) -> dict[str, Any] | None:
        """The row of the run holding the principal's session, if any."""
        rows = await self._rows("active_key = %s", (session_key(principal, session_id, ""),))
        return rows[0] if rows else None

    async def follow(
        self,
        run_id: str,
        from_seq: int | None,
        mode: str,
        send: Callable[[dict[str, Any]], Awaitable[None]],
        *,
        absent_ends: bool = True,
    ) -> None:
        """Send a run's persisted events from ``from_seq`` on (``_eventlog.follow``)."""
        await follow(self.db, self.listener, run_id, from_seq, mode, send, absent_ends=absent_ends)

    async def child_of(self, principal: str, run_id: str) -> dict[str, Any] | None:
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
            found: dict[str, Any] | None = await self.db.call(read)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        return found

    async def route(self, principal: str, request: RoutedOp, run_id: str) -> Any:
        """Send an op (a typed value, :data:`~._routing.RoutedOp`) to the owner of
        ``run_id``; its ack fields come back (errors: ``not_found``, ``run_closed``, the
        owner's own). A cancel of a run queued for capacity that no node has claimed
        ends it at once (``Router.send``). The placement's routed cancels (a placed
        run's client gone, a session's holder superseded) come this way; the node's
        host hands its ops to the router itself."""
        return await self.router.send(principal, request, run_id=run_id)

    async def place(
        self, principal: str, request: StartRequest, run_id: str
    ) -> dict[str, Any] | None:
        """A start on a full node: start it, as ``run_id``, on a node with room
        (its ack fields), or, when every node is full, queue it for capacity (``_capacity.py``)
        and return its ``run_id``; None when this node has room.

        Raises:
            ProtocolError: ``limit_exceeded`` when the principal has as many runs
                queued for capacity as its active-run limit (``Limits``), the placed
                node's error, ``session_busy`` or ``internal``.
        """
        if self.running() < self.max_runs:
            return None

        nodes = await nodes_with_room(self.db, self.node_id)
        # The run's id is chosen by the placing node: if the chosen node never answers
        # (or this node stops waiting), the run's row tells whether it started
        # (Router.send).
        # The counts are as of each node's last heartbeat: the chosen node checks its
        # own room (authoritative) and refuses when full; then the next one is asked.
        for node in nodes:
            try:
                return await self.router.send(principal, request, run_id=run_id, target_node=node)
            except ProtocolError as exc:
                if exc.code != "limit_exceeded":
                    raise
        # Every node is full: queued for capacity (``_capacity.py``), claimed by the
        # first node with room, in the order of the starts.
        registry = self.registry
        bound = 100 if registry is None else registry.limits.max_runs_per_principal
        client = self.node_id if request.on_disconnect == "cancel" else None
        await enqueue_start(
            self.db, principal, to_wire(request), run_id, client_node=client, bound=bound
        )
        return {"run_id": run_id}

    async def record_cancel(
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
            await record_cancel(self.db, run_id, reason, mode, reply, recorded=recorded)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        return _sent(reply)

    async def record_child_cancel(
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
        log = self.writer.logs.get(child.root_id)
        if log is None or log.fence.closed:
            raise ProtocolError("internal", f"run {child.id} is moving to another node; retry")
        reply = routed_reply(origin, {})
        params = {
            "root": child.root_id,
            "node": self.node_id,
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
            recorded = await self.db.call(record)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        if not recorded:
            raise ProtocolError("internal", f"run {child.id} is moving to another node; retry")
        return _sent(reply)

    async def record_decision(
        self,
        run_id: str,
        call_id: str,
        *,
        approved: bool,
        message: str | None,
        origin: Origin | None = None,
        question: bool = False,
    ) -> bool:
        """Make an approval or rejection durable before it is applied: a takeover
        applies it to the call its run asks for again instead of asking the client. A
        routed one (``origin``: its command) is answered in the same transaction, so the
        node that takes the run over answers from it instead of applying it again.
        Returns whether that answer was stored and sent.

        The answer to a ``question`` (``ToolContext.request_approval``) is recorded for
        its exactly-once answer only, with this attempt: a takeover never applies it
        (the asking call does not survive the attempt), and its content is not kept.

        Raises:
            ProtocolError: ``not_found`` (the call has a decision already: the first
                one is the one applied), ``run_closed``, or ``internal`` (the database
                cannot be reached, or this node's attempt of the run has ended: retry).
        """
        log = self.writer.logs.get(run_id)
        if log is None or log.fence.closed:
            raise ProtocolError(
                "internal", "this node no longer runs the run (it is being taken over); retry"
            )
        reply = routed_reply(origin, {})
        decision: dict[str, Any] = {"approved": approved, "message": message}
        if question:
            decision["asked_in"] = log.attempt
        try:
            outcome = await record_decision(
                self.db, run_id, self.node_id, log.attempt, call_id, decision, reply
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
        return _sent(reply)

    async def record_withdrawal(
        self, run_id: str, injection_id: str, origin: Origin | None = None
    ) -> bool:
        """A withdrawn injection is never injected again by a takeover; a routed
        withdrawal (``origin``: its command) is answered in the same transaction.
        Returns whether that answer was stored and sent."""
        reply = routed_reply(origin, {"withdrawn": True})
        await record_withdrawal(self.db, run_id, injection_id, reply)
        return _sent(reply)

    async def injection_persisted(
        self, run_id: str, injection_id: str, origin: Origin | None = None
    ) -> None:
        """Wait (bounded) until an injection's ``inbox.injected`` event is persisted; a
        routed injection (``origin``: its command) is answered in the transaction that
        persists it.
        Call it before any checkpoint after the injection (so before that flush).

        Raises:
            ProtocolError: ``internal`` if it is not persisted within 10 s.
        """
        log = self.writer.logs.get(run_id)
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

    async def hand_over(self, cancel_runs: Callable[[], Awaitable[None]]) -> None:
        """Graceful stop: fence every run here, let their events up to now be written,
        stop them locally (``cancel_runs``), then release their rows so another node
        takes them over at once (a NOTIFY triggers its scan)."""
        self.leases.draining = True
        with trio.move_on_after(5.0):
            async with self.leases.scanning:  # a scan in flight resumes its runs first
                pass
        for log in list(self.writer.logs.values()):
            log.fence.closed = True
            log.fence.fence_seq = log.run.statistics().last_seq
        await cancel_runs()
        await self.writer.flush_now()
        with trio.move_on_after(5.0):
            for log in list(self.writer.logs.values()):
                await log.done.wait()
        with trio.move_on_after(5.0):
            await self.leases.lock.acquire()  # no heartbeat in flight: none comes after
            self.leases.stopped = True
            try:
                await release_node(self.db, self.node_id)
            except ClusterDown:
                logger.warning("could not release this node's runs; they wait for their lease")

    def lose_all(self, reason: str) -> int:
        """Stop every run of this node without persisting anything more (its leases
        may have expired: another node may take them over); returns how many."""
        count = 0
        for log in list(self.writer.logs.values()):
            if log.root is not None:  # a child run: stopped with its root
                log.fence.closed = True
                log.fence.fence_seq = None
            elif not log.fence.closed:
                log.fence.closed = True
                log.fence.fence_seq = None
                log.run.cancel(reason)
                self.leases.to_release.add(log.run_id)
                count += 1
        if count:
            logger.warning("node %s stopped %d runs: %s", self.node_id, count, reason)
        return count

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

    # -- run trees (DESIGN §17) -------------------------------------------------------

    async def tree_nodes(self, principal: str, retain: float) -> list[str]:
        """The other nodes where a tree of ``principal`` may hold a child run: the
        live owners of its unfinished runs and of those finished less than ``retain``
        s ago. Child runs have no rows (a tree lives on its root's node), so a child's
        id is resolved by asking these nodes (``ClusterHost._tree_node``); a principal with no
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
                (principal, self.node_id, retain),
            ).fetchall()
            return sorted(str(row[0]) for row in rows)

        try:
            return await self.db.call(read)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None


def _sent(reply: Reply | None) -> bool:
    """Whether the op's transaction stored its routed command's answer and notified
    the sender (:class:`~._routing.Answer`'s ``stored``): then the router sends nothing
    more."""
    return reply is not None and reply[2] is not None


def idle_timeout(lease_ttl: float) -> float:
    """How long a node's transaction may sit idle between statements before the server
    ends it: half the lease (its locks are gone before the lease expires), at least 1 s
    (a loaded machine's pauses), at most 5 s (the lock timeout)."""
    return min(max(lease_ttl / 2, 1.0), 5.0)
