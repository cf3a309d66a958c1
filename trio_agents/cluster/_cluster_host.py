"""A node of a cluster as a run host: :class:`ClusterHost`, the
:class:`~trio_agents.hosting.RunHost` every face of a clustered server talks to.

It wraps the host of one process (:class:`~trio_agents.hosting.LocalHost`: this node's
runs) and adds what makes N nodes act as one server:

- **Placement.** A start on a full node is placed on a node with room, or queued for
  capacity (``ClusterNode.place``); the owner's disconnect still cancels a run it
  placed elsewhere (its record's ``placed``, a routed cancel).
- **Routing.** An op on a run another node runs goes to that node as a command
  (``_routing.py``); the node that answers it gets the command's origin as explicit
  values (:class:`~trio_agents.hosting.Origin`: the node it came from, the run id a
  placed start must use, the command id its durable answer is stored under) and
  :meth:`ClusterHost.execute` answers it.
- **Durable records.** A cancel, an injection, a withdrawal and a decision on a run of
  this node are recorded in the cluster's tables before they are acked (a takeover
  applies them), a routed one's answer in the same transaction.
- **Remote follow.** The events of a run another node runs come from the cluster's
  persisted log; a subscription to a run of this node whose attempt here stops
  (lease lost, hand-over) continues from that log where it was.

A tree lives on its root's node. Its child runs' events are persisted under their own
ids (``trio_agents_children`` keeps each child's root, parent and last seq), so any
node follows a child, or a whole tree, from the cluster's log. Another node resolves a
child's id for an op by asking the nodes that run the principal's runs
(:meth:`ClusterHost._tree_node`) and routes the op there. A cancel of a child is
recorded in its row before it is applied (a takeover that resumes the child cancels
it); its other ops are applied there without being recorded.
"""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Literal, final

import trio

from .._agent import Agent
from .._events import RunStatus
from .._exceptions import UnknownCallError
from .._inbox import check_content
from .._items import Item
from .._run import Run
from ..hosting._error_codes import ProtocolError
from ..hosting._host import HostedEvent, Origin, StartRequest
from ..hosting._local import (
    LocalHost,
    check_from_seq,
    decide_here,
    host_errors,
    inject_here,
    live,
)
from ..hosting._policies import ContextHook, effective_limits, limits_to_wire
from ..hosting._registry import RunEntry
from ..hosting._requests import (
    RunApprove,
    RunCancel,
    RunGet,
    RunInject,
    RunReject,
    RunWithdraw,
)
from ..hosting._run_info import RunInfo
from ..hosting._run_tasks import start_run
from ..hosting._server_limits import Limits
from ..hosting._session_fork import fork_stored, item_index_of, item_position
from ..hosting._sessions import items_bytes
from ..sessions._postgres import PostgresSession
from ._cluster_placement import ClusterPlacement
from ._db import ClusterDown
from ._routing import Answer, Control, RoutedOp
from ._schema import session_key

if TYPE_CHECKING:
    from ._cluster_node import ClusterNode

__all__ = ["ClusterHost"]

logger = logging.getLogger("trio_agents.cluster")

_TERMINAL = ("completed", "failed", "cancelled")


def _info(row: Mapping[str, Any]) -> RunInfo:
    # A row is a root's (children have none); its children are known on its node only.
    return RunInfo.from_json({**row, "children": None})


@final
class _ClusterEvents:
    """The iterator of :meth:`ClusterHost.events`: this node's events of the run (if
    it runs it), then — once its attempt here stops — the cluster's persisted log from
    where it was; or the persisted log only (a run of another node)."""

    def __init__(
        self,
        follow: Callable[..., trio.MemoryReceiveChannel[HostedEvent]],
        stopping: Callable[[], bool],
        nursery: trio.Nursery,
        run_id: str,
        status_only: bool,
        local: Any,
        follow_from: int | None,
        *,
        tree: bool = False,
        absent_ends: bool = True,
    ) -> None:
        # The host's ClusterHost._follow, and whether the host is stopping.
        self._follow = follow
        self._stopping = stopping
        self._nursery = nursery
        self._run_id = run_id
        self._status_only = status_only
        self._local = local
        self._receive: trio.MemoryReceiveChannel[HostedEvent] | None = None
        if local is None:
            self._receive = follow(
                nursery, run_id, follow_from, status_only, tree=tree, absent_ends=absent_ends
            )

    def __aiter__(self) -> _ClusterEvents:
        return self

    async def __anext__(self) -> HostedEvent:
        local = self._local
        if local is not None:
            try:
                return await local.__anext__()  # type: ignore[no-any-return]
            except StopAsyncIteration:
                self._local = None
                # This node's attempt stopped and the run goes on elsewhere: follow its
                # persisted log from the first seq not given. Not while this node
                # stops: its clients re-subscribe elsewhere.
                if not local.moved or self._stopping():
                    raise
                self._receive = self._follow(
                    self._nursery, self._run_id, local.next_seq, self._status_only
                )
        if self._receive is None:
            raise StopAsyncIteration
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None


@final
class ClusterHost(LocalHost):
    """The run host of one node of a cluster (see the module docstring).

    Made by :meth:`PostgresCluster.host <trio_agents.cluster.PostgresCluster.host>`
    (which ``ControlServer(cluster=...)`` calls) over the cluster's internal node, whose
    public methods are all it calls; its runs are placed by the node's
    :class:`~._placement.ClusterPlacement`. Sessions are the cluster's (PostgreSQL).
    """

    def __init__(
        self,
        node: ClusterNode,
        agents: Mapping[str, Agent],
        *,
        limits: Limits | None = None,
        run_options: Mapping[str, Any] | None = None,
        context: ContextHook | None = None,
    ) -> None:
        super().__init__(agents, limits=limits, run_options=run_options, context=context)
        self._node = node
        # The node's router: this host hands it the ops of runs other nodes run, as
        # typed values (it turns them into the cluster's wire, _routing.to_wire).
        self._router = node.router
        self._placement = ClusterPlacement(node, self._registry)
        self._registry.placement = self._placement
        self._stopping = False
        self._follows: set[trio.CancelScope] = set()

    # ------------------------------------------------------------------ serving

    async def _open(self, nursery: trio.Nursery) -> Callable[[], None]:
        stop_reaper = await super()._open(nursery)
        # Shielded: the node's tasks (event writer, router, leases) outlive the
        # cancellation until the shutdown has handed the runs over.
        cluster_scope = trio.CancelScope(shield=True)
        await nursery.start(self._serve_node, cluster_scope)

        def stop() -> None:
            stop_reaper()
            cluster_scope.cancel()

        return stop

    async def _serve_node(
        self, scope: trio.CancelScope, *, task_status: trio.TaskStatus[None]
    ) -> None:
        with scope:
            await self._node.serve_node(self._placement, self.execute, task_status=task_status)

    async def _stop_runs(self, deadline: float) -> None:
        """Hand the runs over to other nodes instead of cancelling them for good: the
        owners' ``on_disconnect="cancel"`` runs are cancelled first (the connections
        close), then every run is fenced, stopped here and released at once."""
        node = self._node
        if not node.dead:
            with trio.move_on_at(deadline):
                await self._placement.closing(list(self._owners.values()))
                await node.hand_over(self._cancel_runs)
        await self._cancel_runs()
        # Subscriptions end where this node's part of them does (the client
        # re-subscribes elsewhere from the next seq).
        self._stopping = True
        for scope in list(self._follows):
            scope.cancel()

    # ------------------------------------------------------------------ lookups

    def _here(self, principal: str, run_id: str, *, nodes: bool = True) -> RunEntry | None:
        """The run if this node serves it; None when another node does (``nodes=False``:
        a root, as the cluster's rows are)."""
        entry = self._registry.find(principal, run_id, nodes=nodes)
        if entry is None:
            return None
        fence = entry.tree.fence  # a child's tree is where its root is
        if fence is not None and fence.closed:
            # This node's attempt is over (stopped, handed over, or ending unpersisted):
            # the run goes on from its tables, wherever it is resumed.
            return None
        return entry

    async def _row(self, principal: str, run_id: str) -> dict[str, Any]:
        row = await self._node.owner_of(principal, run_id)
        if row is None:
            raise ProtocolError("not_found", f"no run {run_id!r}")
        return row

    async def _route(self, principal: str, request: Control, run_id: str) -> dict[str, Any]:
        """Route an op to the node running ``run_id``: a root's owner (its row), or, for a
        child run (no row), the node running its tree."""
        try:
            return await self._router.send(principal, request, run_id=run_id)
        except ProtocolError as exc:
            # The owner's own not_found (an unknown call id, ...) stands; a run without a
            # row may be a child run.
            if exc.code != "not_found" or await self._node.owner_of(principal, run_id):
                raise
        node, _ = await self._tree_node(principal, run_id)
        return await self._router.send(principal, request, run_id=run_id, target_node=node)

    async def _tree_node(self, principal: str, run_id: str) -> tuple[str, dict[str, Any]]:
        """A child run of a tree another node runs: that node, and the run's ``run.get``
        fields there. Asks each live node that runs (or ran, within
        ``retain_finished``) a run of the principal, in turn: none for a principal
        without runs elsewhere. Another principal's child is not found.

        Raises:
            ProtocolError: ``not_found`` (no such run of the principal), ``internal``.
        """
        get = RunGet(run_id=run_id)
        retain = self._registry.limits.retain_finished
        for node in await self._node.tree_nodes(principal, retain):
            try:
                # Addressed to that node (a child run has no row to find its owner by).
                answer = await self._router.send(principal, get, run_id=run_id, target_node=node)
            except ProtocolError as exc:
                if exc.code in ("not_found", "invalid_request"):  # not there (or an older node)
                    continue
                raise
            return node, answer["run"]
        raise ProtocolError("not_found", f"no run {run_id!r}")

    async def _known(self, principal: str, run_id: str) -> RunInfo:
        """A run of the cluster this node does not run (a root's row, or a child's on
        the node running its tree); ``not_found`` if none."""
        try:
            return _info(await self._row(principal, run_id))
        except ProtocolError as exc:
            if exc.code != "not_found":
                raise
        _, info = await self._tree_node(principal, run_id)
        return RunInfo.from_json(info)

    # ---------------------------------------------------------------------- ops

    async def start(self, origin: Origin, request: StartRequest) -> str:
        """Start a run here, or, on a full node, on a node with room (or queued for
        capacity until one has room)."""
        with host_errors():
            limits = self._admit(origin, request)
            owner = self._owner(origin)
            placed = await self._place(origin.principal, owner, request)
            if placed is not None:
                return placed
            entry = await self._start_here(origin, request, limits, owner)
        return entry.run_id

    async def _place(self, principal: str, owner: Any, request: StartRequest) -> str | None:
        """Place a start elsewhere when this node is full: the run's id, or None when
        this node has room."""
        run_id = f"run_{uuid.uuid4().hex}"
        # Known to the owner before it is placed: a placement cut here (the connection
        # aborted) is settled before the owner's disconnect, which then cancels the run
        # if it started (Router.send).
        cut = owner is not None and request.on_disconnect == "cancel"
        if cut:
            owner.placed.add(run_id)
        try:
            placed = await self._node.place(principal, request, run_id)
        except ProtocolError:
            if cut:
                owner.placed.discard(run_id)
            raise
        if placed is None:
            if cut:
                owner.placed.discard(run_id)
            return None
        run_id = str(placed["run_id"])
        if cut:  # a disconnect from here cancels it there
            await self._placement.own_placed(owner, run_id)
        return run_id

    async def get(self, principal: str, run_id: str) -> RunInfo:
        entry = self._here(principal, run_id)
        if entry is not None:
            await trio.lowlevel.checkpoint()
            return self._registry.info(entry)
        with host_errors():
            return await self._known(principal, run_id)

    async def list(self, principal: str, *, all: bool = False) -> list[RunInfo]:
        registry = self._registry
        with host_errors():
            rows = await self._node.list_runs(principal, registry.limits.retain_finished)
        runs: list[RunInfo] = []
        for row in rows:
            entry = self._here(principal, row["run_id"], nodes=False)
            if entry is None:
                runs.append(_info(row))
                continue
            nodes = registry.nodes_of(entry) if all else [entry]
            runs.extend(registry.info(node) for node in nodes)
        return runs

    async def _control(self, principal: str, request: Control) -> dict[str, Any]:
        """A cancel, inject, withdraw, approve or reject: applied here (and recorded),
        or routed, as the typed value it is, to the node running the run."""
        run_id = request.run_id
        with host_errors():
            if self._here(principal, run_id) is not None:
                return dict((await self._apply_here(principal, request, None)).fields)
            return await self._route(principal, request, run_id)

    async def cancel(
        self,
        principal: str,
        run_id: str,
        reason: str | None = None,
        mode: Literal["immediate", "after_turn"] = "immediate",
    ) -> None:
        await self._control(principal, RunCancel(run_id=run_id, reason=reason, mode=mode))

    async def inject(
        self,
        principal: str,
        run_id: str,
        items: tuple[Item, ...],
        when: Literal["next_turn", "now", "when_idle"] = "next_turn",
    ) -> str:
        request = RunInject(run_id=run_id, items=items, when=when)
        return str((await self._control(principal, request))["injection_id"])

    async def withdraw(self, principal: str, run_id: str, injection_id: str) -> bool:
        request = RunWithdraw(run_id=run_id, injection_id=injection_id)
        return bool((await self._control(principal, request))["withdrawn"])

    async def approve(
        self,
        principal: str,
        run_id: str,
        call_id: str,
        content: Mapping[str, Any] | None = None,
    ) -> None:
        request = RunApprove(
            run_id=run_id, call_id=call_id, content=None if content is None else dict(content)
        )
        await self._control(principal, request)

    async def reject(
        self, principal: str, run_id: str, call_id: str, message: str | None = None
    ) -> None:
        await self._control(principal, RunReject(run_id=run_id, call_id=call_id, message=message))

    async def cancel_session(
        self,
        principal: str,
        session_id: str,
        reason: str | None = None,
        mode: Literal["immediate", "after_turn"] = "immediate",
    ) -> str:
        with host_errors():
            row = await self._node.session_holder(principal, session_id)
            if row is None:
                raise ProtocolError("no_active_run", f"session {session_id!r} has no active run")
            run_id = row["run_id"]
            cancel = RunCancel(run_id=run_id, reason=reason, mode=mode)
            try:
                if self._here(principal, run_id) is not None:
                    await self._apply_here(principal, cancel, None)
                else:
                    await self._router.send(principal, cancel, run_id=run_id)
            except ProtocolError as exc:
                if exc.code != "run_closed":
                    raise
                raise ProtocolError(
                    "no_active_run", f"session {session_id!r} has no active run"
                ) from None
        return str(run_id)

    async def fork_session(
        self,
        principal: str,
        session_id: str,
        new_session_id: str,
        at: int | tuple[str, int] | None = None,
    ) -> int:
        """Fork the principal's session in the cluster's database (DESIGN §23), in one
        transaction (a consistent snapshot while a run on any node writes it), its
        tree's child sessions with it. ``at`` is an item index, None, or an event
        position ``(run_id, seq)`` of a run of that session, live or ended, on any
        node: resolved from the run's ``run.item`` events in the events table (each
        says where its item is in the session)."""
        with host_errors():
            if await self._node.session_holder(principal, new_session_id) is not None:
                raise ProtocolError("session_busy", f"session {new_session_id!r} has an active run")
            index = (
                await self._event_position(principal, session_id, *at)
                if isinstance(at, tuple)
                else at
            )
            dsn = self._node.dsn
            source = PostgresSession(dsn, session_key(principal, session_id, ""))
            try:
                return await fork_stored(
                    source,
                    session_key(principal, new_session_id, ""),
                    index,
                    session_id,
                    new_session_id,
                )
            finally:
                await source.aclose()

    async def _event_position(self, principal: str, session_id: str, run_id: str, seq: int) -> int:
        """The item index an event position stands for (see :func:`item_position`)."""
        info = await self.get(principal, run_id)  # not_found: unknown, or another's
        if info.session_id != session_id:
            raise ProtocolError(
                "invalid_request", f"run {run_id!r} did not run in session {session_id!r}"
            )

        def read(conn: Any) -> list[tuple[int, int | None]]:
            # Every run.item event of the run, in seq order: the table keeps them all
            # (no retention), written with their items in one transaction.
            rows = conn.execute(
                "SELECT seq, data FROM trio_agents_events"
                " WHERE run_id = %s AND type = 'run.item' ORDER BY seq",
                (run_id,),
            ).fetchall()
            return [(int(s), item_index_of(json.loads(data))) for s, data in rows]

        try:
            items = await self._node.db.call(read)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        return item_position(run_id, seq, items)

    async def wait_terminal(self, principal: str, run_id: str) -> RunInfo:
        async with self.events(principal, run_id, status_only=True) as updates:
            async for _ in updates:
                pass
        return await self.get(principal, run_id)

    @asynccontextmanager
    async def events(
        self,
        principal: str,
        run_id: str,
        *,
        from_seq: int | None = 1,
        tree: bool = False,
        status_only: bool = False,
    ) -> AsyncIterator[AsyncIterator[HostedEvent]]:
        """As :meth:`LocalHost.events`, for any run of the cluster: this node's runs as
        they happen (each event once persisted), another node's from the cluster's
        log — a child run's too (its events are persisted under its own id), and a
        tree's (its root's log and each descendant's, merged as they come)."""
        with host_errors():
            check_from_seq(from_seq, tree)
            entry = self._here(principal, run_id)
            start = max(from_seq or 1, 1)
            local = None
            absent_ends = True
            if entry is None:
                absent_ends = await self._persisted(principal, run_id)
            elif start >= _first_seq(entry) and not (tree and entry.tree.first_seq > 1):
                # All of it is this node's (a tree taken over here holds only this
                # attempt's events: its earlier ones come from the cluster's log).
                local = self._events_here(entry, from_seq, tree=tree, status_only=status_only)
            else:
                absent_ends = entry.root is None  # a child's row may be on its way
        async with trio.open_nursery() as nursery:
            events = _ClusterEvents(
                self._follow,
                lambda: self._stopping,
                nursery,
                run_id,
                status_only,
                local,
                from_seq,
                tree=tree,
                absent_ends=absent_ends,
            )
            try:
                yield events
            finally:
                nursery.cancel_scope.cancel()

    def _event_logs(self) -> Callable[[str], Any]:
        """Each event of a tree this node runs (a child run's too) is given once
        persisted: a client never sees an event a crash of this node could lose, whose
        seq the next attempt would reuse."""
        return self._node.writer.logs.get

    async def _persisted(self, principal: str, run_id: str) -> bool:
        """Whether a run of the principal another node runs has a row (a root's, or a
        persisted child run's); False for a child run the node running its tree has
        not persisted anything of yet (its first flush is on its way).

        Raises:
            ProtocolError: ``not_found`` (no such run of the principal), ``internal``.
        """
        try:
            await self._row(principal, run_id)
            return True
        except ProtocolError as exc:
            if exc.code != "not_found":
                raise
        if await self._node.child_of(principal, run_id) is not None:
            return True
        await self._tree_node(principal, run_id)  # not_found if it is nowhere
        return False

    def _follow(
        self,
        nursery: trio.Nursery,
        run_id: str,
        from_seq: int | None,
        status_only: bool,
        *,
        tree: bool = False,
        absent_ends: bool = True,
    ) -> trio.MemoryReceiveChannel[HostedEvent]:
        """Follow a run's persisted log (``tree``: its tree's logs) in ``nursery``; its
        events come out of the returned channel, which ends with the run (or when
        this node stops)."""
        send, receive = trio.open_memory_channel[HostedEvent](0)
        scope = trio.CancelScope()
        if self._stopping:
            scope.cancel()
        self._follows.add(scope)
        if tree:
            nursery.start_soon(self._follow_tree, run_id, status_only, send, scope, absent_ends)
        else:
            nursery.start_soon(
                self._follow_task, run_id, from_seq, status_only, send, scope, absent_ends
            )
        return receive

    async def _follow_tree(
        self,
        root_id: str,
        status_only: bool,
        channel: trio.MemorySendChannel[HostedEvent],
        scope: trio.CancelScope,
        absent_ends: bool,
    ) -> None:
        """Follow a tree's persisted logs: ``root_id``'s, and each descendant's from the
        ``run.child`` event that announces it, merged in the order they are persisted;
        ``root_id``'s terminal update comes last, after every descendant's log ended
        (as :meth:`Run.events` with ``tree=True`` ends)."""
        held: list[HostedEvent] = []
        followed = {root_id}

        async def follow_run(run_id: str, nursery: trio.Nursery, absent: bool) -> None:
            async def send(frame: dict[str, Any]) -> None:
                event = frame["event"]
                hosted = HostedEvent(frame["run_id"], frame["seq"], event)
                child = event.get("child_id")
                if event.get("type") == "run.child" and child not in followed:
                    # Announced again when a takeover resumes it (same id, its log
                    # continuing): followed once. Its row may not be written yet.
                    followed.add(str(child))
                    nursery.start_soon(follow_run, str(child), nursery, False)
                if status_only and event.get("type") not in ("run.updated", "events.dropped"):
                    return
                if (
                    run_id == root_id
                    and event.get("type") == "run.updated"
                    and event.get("status") in _TERMINAL
                ):
                    held.append(hosted)  # once every descendant's log ended
                    return
                await channel.send(hosted)

            await self._node.follow(run_id, 1, "all", send, absent_ends=absent)

        try:
            async with channel:
                with scope:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(follow_run, root_id, nursery, absent_ends)
                    for hosted in held:
                        await channel.send(hosted)
        except Exception:
            logger.exception("following the tree of %s failed", root_id)
        finally:
            self._follows.discard(scope)

    async def _follow_task(
        self,
        run_id: str,
        from_seq: int | None,
        status_only: bool,
        channel: trio.MemorySendChannel[HostedEvent],
        scope: trio.CancelScope,
        absent_ends: bool = True,
    ) -> None:
        async def send(frame: dict[str, Any]) -> None:
            await channel.send(HostedEvent(frame["run_id"], frame["seq"], frame["event"]))

        mode = "status" if status_only else "all"
        try:
            async with channel:
                with scope:
                    await self._node.follow(run_id, from_seq, mode, send, absent_ends=absent_ends)
        except Exception:
            logger.exception("following the events of %s failed", run_id)
        finally:
            self._follows.discard(scope)

    # ------------------------------------------------------------ applied here

    async def _apply_here(self, principal: str, request: Control, origin: Origin | None) -> Answer:
        """Apply a cancel, inject, withdraw, approve or reject to a run of this node and
        make it durable; returns its answer (a routed op's, ``origin``, stored with its
        durable effect when it has one). The one place an op is told apart by its type.

        A child run's cancel is recorded in its row before it is applied (a takeover
        that resumes the child cancels it); its other ops are applied here only."""
        entry = self._registry.lookup(principal, request.run_id)
        run = live(entry)
        child = entry.root is not None
        if child:
            await trio.lowlevel.checkpoint()
            run = live(entry)
        node = self._node
        match request:
            case RunCancel(reason=reason, mode=mode):
                if child:
                    # Durable (with a routed cancel's answer) before it is applied: if
                    # this node dies now, the takeover that resumes the child cancels it.
                    stored = await node.record_child_cancel(run, reason, mode, origin)
                    run.cancel(reason, mode=mode)
                else:
                    run.cancel(reason, mode=mode)
                    # Acked once durable: a takeover ends it cancelled.
                    stored = await node.record_cancel(entry.run_id, reason, mode, origin)
                return Answer({}, stored)
            case RunWithdraw(injection_id=injection_id):
                withdrawn = run.withdraw(injection_id)
                stored = False
                if withdrawn and not child:
                    stored = await node.record_withdrawal(entry.run_id, injection_id, origin)
                return Answer({"withdrawn": withdrawn}, stored)
            case RunInject(items=items, when=when):
                injection_id = inject_here(self._registry, entry, items, when)
                if not child:
                    # Acked once durable: a takeover injects it again.
                    await node.injection_persisted(entry.run_id, str(injection_id), origin)
                return Answer({"injection_id": injection_id})
            case RunApprove(call_id=call_id) | RunReject(call_id=call_id):
                message = request.message if isinstance(request, RunReject) else None
                approved = isinstance(request, RunApprove)
                content = request.content if isinstance(request, RunApprove) else None
                if child:
                    decide_here(entry, call_id, approved=approved, message=message, content=content)
                    return Answer({})
                stored = await self._decide_here(
                    entry, run, call_id, approved, message, origin, content
                )
                return Answer({}, stored)

    async def _decide_here(
        self,
        entry: RunEntry,
        run: Run,
        call_id: str,
        approved: bool,
        message: str | None,
        origin: Origin | None,
        content: Mapping[str, Any] | None = None,
    ) -> bool:
        """An approval or rejection: durable before it is applied (its answer too, when
        routed): a takeover applies it to the call asked again, and never serves the
        command twice. Returns whether a routed one's answer was stored and sent.

        An answer's ``content`` (a question's) is checked before anything is recorded
        (``invalid_request``: nothing decided). It is applied, not recorded: a question
        is asked by a running call, which a takeover does not resume mid-call (the
        call is interrupted, or runs again and asks again: docs/cluster.md)."""
        if entry.first_seq > 1:
            await _settled(run)
        live(entry)
        if call_id not in run.statistics().pending_approvals:
            raise ProtocolError("not_found", str(UnknownCallError(call_id)))
        # What the question asks is in the run's current status (updated on this
        # thread with its pending ids); a pending id that is no question's is a call.
        asked = run.updated.current.detail.get("questions") or ()
        question = next((q for q in asked if q.get("id") == call_id), None)
        if content is not None:
            schema = None if question is None else question.get("schema")
            try:
                check_content(call_id, schema, content, question=question is not None)
            except ValueError as exc:
                raise ProtocolError("invalid_request", str(exc)) from None
        stored = await self._node.record_decision(
            entry.run_id,
            call_id,
            approved=approved,
            message=message,
            origin=origin,
            question=question is not None,
        )
        # Recorded and answered already: the run may have ended (or moved) since.
        with contextlib.suppress(ProtocolError):
            decide_here(entry, call_id, approved=approved, message=message, content=content)
        return stored

    # ------------------------------------------------------------ routed ops

    async def execute(self, request: RoutedOp, origin: Origin) -> Answer:
        """Answer an op another node routed here (the router read it from the cluster's
        wire, ``_routing.from_wire``, and waited while its run is being resumed here);
        ``origin`` is where it comes from: the principal, the node that sent it, the run
        id of a placed start, and the command's id, under which a durable op stores its
        answer.

        A start was placed here by a full node: it starts here, with no owner on this
        node (its ``on_disconnect`` applies on the node that placed it, which holds its
        client's connection, and here once that node is dead)."""
        if isinstance(request, StartRequest):
            return Answer(await self._start_placed(request, origin))
        if isinstance(request, RunGet):  # is a child run in a tree of this node? (_tree_node)
            entry = self._registry.lookup(origin.principal, request.run_id)
            fence = entry.tree.fence
            if entry.root is None or (fence is not None and fence.closed):
                raise ProtocolError("not_found", f"no child run {request.run_id!r} here")
            return Answer({"run": self._registry.info(entry).to_json()})
        return await self._apply_here(origin.principal, request, origin)

    async def _start_placed(self, request: StartRequest, origin: Origin) -> dict[str, Any]:
        registry = self._registry
        node = self._node
        principal = origin.principal
        asked = None if request.limits is None else limits_to_wire(request.limits)
        limits = effective_limits(asked, registry.limits.max_run_limits)
        registry.check_room(principal)
        if node.running() >= node.max_runs:
            raise ProtocolError("limit_exceeded", f"node {node.node_id} is full")
        items = request.input
        entry = await start_run(
            registry,
            principal,
            None,
            request.agent,
            items,
            input_bytes=items_bytes(items),
            session_id=request.session_id,
            on_disconnect="continue",
            on_busy=request.on_busy,
            input_overlap=request.input_overlap,
            client_node=origin.node if request.on_disconnect == "cancel" else None,
            run_id=origin.run_id,
            command=origin.command,
            limits=limits,
        )
        return {"run_id": entry.run_id}


def _first_seq(entry: RunEntry) -> int:
    """The first seq of the run's events this node has: a run resumed here (a root, or
    a child its resumed tree resumed) continues its earlier attempts' log."""
    if entry.root is None:
        return entry.first_seq
    resume = None if entry.run is None else entry.run._options.resume
    return 1 if resume is None else resume.next_seq


async def _settled(run: Run) -> None:
    """A run just resumed by a takeover asks again for the approvals its earlier
    attempt waited for once it has loaded its session: an approval that comes first
    (routed while the owner was dead) waits for that (at most 10 s)."""
    with trio.move_on_after(10.0):
        async for update in run.updated:
            loading = update.status in (RunStatus.QUEUED, RunStatus.RUNNING)
            if not loading or update.turn > 0 or run.statistics().turn > 0:
                return
