"""The eleven ops: one function per typed request class, each answering with an ``ack``
or raising :class:`ProtocolError` (sent back as an ``error`` frame).

Every op that names a run accepts any node of a tree started here (DESIGN §17): the
registry finds a child run through its root (``Registry.find``). In a cluster a tree
lives on its root's node and only the root has a row in the cluster's tables: another
node resolves a child's id by asking the nodes that run the principal's runs
(:func:`_tree_node`) and routes the op there; the ops on a child are applied there
without being recorded in the tables (a takeover does not replay them), and its events
(not in the cluster's log) are served by that node only."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .. import InboxFullError, Run, RunClosedError, RunStatus, UnknownCallError
from ._hosting import own_placed, start_run
from ._policies import effective_limits
from ._protocol import ProtocolError, RunInfo, ack_frame, error_frame
from ._registry import Registry, RunEntry
from ._requests import (
    Request,
    RunApprove,
    RunCancel,
    RunGet,
    RunInject,
    RunReject,
    RunsList,
    RunStart,
    RunSubscribe,
    RunUnsubscribe,
    RunWithdraw,
    SessionCancel,
    parse_request,
)
from ._sessions import items_bytes

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["apply_local", "execute_routed", "serve_request", "wire"]

logger = logging.getLogger("trio_agents.control")


async def serve_request(conn: Connection, request: Request) -> None:
    """Answer one request; no exception of an op leaves this function."""
    try:
        await _OPS[type(request)](conn, request)
    except ProtocolError as exc:
        await conn.send(error_frame(exc.code, exc.message, request.id))
    except Exception:
        logger.exception("control op %s failed", request.op)
        await conn.send(error_frame("internal", "internal error", request.id))


def _entry(conn: Connection, run_id: str) -> RunEntry:
    return conn.registry.lookup(conn.principal, run_id)


def _live(entry: RunEntry) -> Run:
    run = entry.run
    assert run is not None
    if run.status.is_terminal:
        raise ProtocolError("run_closed", f"run {entry.run_id} is closed (status {run.status})")
    return run


def _here(conn: Connection, run_id: str, *, nodes: bool = True) -> RunEntry | None:
    """The run, if this node serves it (always, without a cluster: lookups then answer
    ``not_found``); with a cluster, None when another node does (``nodes=False``: a
    root, as the cluster's rows are)."""
    registry = conn.registry
    if registry.cluster is None:
        return _entry(conn, run_id)
    entry = registry.find(conn.principal, run_id, nodes=nodes)
    if entry is None:
        return None
    fence = entry.tree.fence  # a child's tree is where its root is
    if fence is not None and fence.closed:
        # This node's attempt is over (stopped, handed over, or ending unpersisted):
        # the run goes on from its tables, wherever it is resumed.
        return None
    return entry


async def _row(conn: Connection, run_id: str) -> dict[str, Any]:
    cluster = conn.registry.cluster
    assert cluster is not None
    row = await cluster.owner_of(conn.principal, run_id)
    if row is None:
        raise ProtocolError("not_found", f"no run {run_id!r}")
    return row


def wire(request: Request) -> dict[str, Any]:
    """A request as its wire JSON (to route it to another node)."""
    data: dict[str, Any] = {"id": 0, "op": request.op}
    for field in attrs.fields(type(request)):
        if field.name == "id":
            continue
        value = getattr(request, field.name)
        if isinstance(value, tuple):
            value = [item.to_json() for item in value]
        data[field.name] = value
    return data


async def run_start(conn: Connection, request: RunStart) -> None:
    registry = conn.registry
    if request.agent not in registry.agents:
        raise ProtocolError("not_found", f"no agent {request.agent!r}")
    limits = effective_limits(request.limits, registry.limits.max_run_limits)
    registry.check_room(conn.principal)
    if request.subscribe is not None:
        conn.check_subscription_room(None)
    registry.take_start_token(conn.principal)
    cluster = registry.cluster
    placed = None
    if cluster is not None:
        run_id = f"run_{uuid.uuid4().hex}"
        # Known to the connection before it is placed: a placement cut here (the
        # connection aborted) is settled before the connection's disconnect, which
        # then cancels the run if it started (Router.send).
        cut = request.on_disconnect == "cancel"
        if cut:
            conn.placed.add(run_id)
        try:
            placed = await cluster.place(conn.principal, wire(request), run_id)
        except ProtocolError:
            conn.placed.discard(run_id)
            raise
        if placed is None:
            conn.placed.discard(run_id)
    if placed is not None:  # started on another node (this one is full)
        run_id = str(placed["run_id"])
        if request.on_disconnect == "cancel":  # a disconnect from here cancels it there
            await own_placed(registry, conn, run_id)
        await conn.send(ack_frame(request.id, run_id=run_id))
        if request.subscribe is not None and conn.room_for_subscription(run_id):
            conn.subscribe_remote(run_id, 1, request.subscribe)
        return
    entry = await start_run(
        registry,
        conn.principal,
        conn,
        request.agent,
        request.input,
        input_bytes=items_bytes(request.input),
        session_id=request.session_id,
        on_disconnect=request.on_disconnect,
        on_busy=request.on_busy,
        limits=limits,
    )
    await conn.send(ack_frame(request.id, run_id=entry.run_id))
    if request.subscribe is not None and conn.room_for_subscription(entry.run_id):
        conn.subscribe(entry, 1, request.subscribe)


async def apply_local(
    registry: Registry, principal: str, request: Request, command: int | None = None
) -> dict[str, Any]:
    """Answer a cancel, inject, withdraw, approve or reject for a run of this node;
    returns the ack's fields. Also what a cluster node runs for ops routed to it
    (``command``: its id, answered with the op's durable effect, so a takeover never
    applies it again — ``trio_agents.cluster._routing``)."""
    assert isinstance(request, RunCancel | RunInject | RunWithdraw | RunApprove | RunReject)
    entry = registry.lookup(principal, request.run_id)
    run = _live(entry)
    # A child run has no row in a cluster's tables: its ops are applied here only.
    cluster = registry.cluster if entry.root is None else None
    if isinstance(request, RunCancel):
        run.cancel(request.reason, mode=request.mode)
        if cluster is not None:  # acked once durable: a takeover ends it cancelled
            await cluster.record_cancel(entry.run_id, request.reason, request.mode, command)
        return {}
    if isinstance(request, RunWithdraw):
        withdrawn = run.withdraw(request.injection_id)
        if withdrawn and cluster is not None:
            await cluster.record_withdrawal(entry.run_id, request.injection_id, command)
        return {"withdrawn": withdrawn}
    if isinstance(request, RunInject):
        size = items_bytes(request.items)
        registry.check_inject(entry.tree, size)  # a tree is retained, and counted, as one
        try:
            injection_id = run.inject(request.items, when=request.when)
        except RunClosedError:
            raise ProtocolError("run_closed", f"run {entry.run_id} is closed") from None
        except InboxFullError as exc:
            raise ProtocolError("inbox_full", str(exc)) from None
        except (TypeError, ValueError) as exc:
            raise ProtocolError("invalid_request", str(exc)) from None
        entry.tree.injected_bytes += size
        if cluster is not None:  # acked once durable: a takeover injects it again
            await cluster.injection_persisted(entry.run_id, str(injection_id), command)
        return {"injection_id": injection_id}
    if entry.first_seq > 1:
        await _settled(run)
    approved = isinstance(request, RunApprove)
    message = None if isinstance(request, RunApprove) else request.message
    if cluster is not None:
        # Durable before it is applied (its answer too, when routed): a takeover
        # applies it to the call asked again, and never serves the command twice.
        _live(entry)
        if request.call_id not in run.statistics().pending_approvals:
            raise ProtocolError("not_found", str(UnknownCallError(request.call_id)))
        await cluster.record_decision(
            entry.run_id, request.call_id, approved=approved, message=message, command=command
        )
    try:
        if approved:
            run.approve(request.call_id)
        else:
            run.reject(request.call_id, message=message)
    except (RunClosedError, UnknownCallError) as exc:
        if cluster is not None:
            return {}  # recorded and answered already: the run ended (or moved) since
        if isinstance(exc, RunClosedError):
            raise ProtocolError("run_closed", f"run {entry.run_id} is closed") from None
        raise ProtocolError("not_found", str(exc)) from None
    return {}


async def _settled(run: Run) -> None:
    """A run just resumed by a takeover asks again for the approvals its earlier
    attempt waited for once it has loaded its session: an approval that comes first
    (routed while the owner was dead) waits for that (at most 10 s)."""
    with trio.move_on_after(10.0):
        async for update in run.updated:
            loading = update.status in (RunStatus.QUEUED, RunStatus.RUNNING)
            if not loading or update.turn > 0 or run.statistics().turn > 0:
                return


async def _control(
    conn: Connection, request: RunCancel | RunInject | RunWithdraw | RunApprove | RunReject
) -> None:
    registry = conn.registry
    if registry.cluster is None or _here(conn, request.run_id) is not None:
        data = await apply_local(registry, conn.principal, request)
    else:
        data = await _route(conn, wire(request), request.run_id)
    await conn.send(ack_frame(request.id, **data))


async def _route(conn: Connection, request: dict[str, Any], run_id: str) -> dict[str, Any]:
    """Route an op to the node running ``run_id``: a root's owner (its row), or, for a
    child run (no row), the node running its tree."""
    cluster = conn.registry.cluster
    assert cluster is not None
    try:
        data: dict[str, Any] = await cluster.route(conn.principal, request, run_id)
        return data
    except ProtocolError as exc:
        # The owner's own not_found (an unknown call id, ...) stands; a run without a
        # row may be a child run.
        if exc.code != "not_found" or await cluster.owner_of(conn.principal, run_id):
            raise
    node, _ = await _tree_node(conn, run_id)
    return await cluster.route_to(conn.principal, request, run_id, node)


async def _tree_node(conn: Connection, run_id: str) -> tuple[str, dict[str, Any]]:
    """A child run of a tree another node of the cluster runs: that node, and the run's
    ``run.get`` fields there. Asks each live node that runs (or ran, within
    ``retain_finished``) a run of the principal, in turn: none for a principal without
    runs elsewhere. The principal is the asking one's: another's child is not found.

    Raises:
        ProtocolError: ``not_found`` (no such run of the principal), ``internal``.
    """
    cluster = conn.registry.cluster
    assert cluster is not None
    get = {"id": 0, "op": "run.get", "run_id": run_id}
    for node in await cluster.tree_nodes(conn.principal, conn.registry.limits.retain_finished):
        try:
            answer = await cluster.route_to(conn.principal, get, run_id, node)
        except ProtocolError as exc:
            if exc.code in ("not_found", "invalid_request"):  # not there (or an older node)
                continue
            raise
        return node, answer["run"]
    raise ProtocolError("not_found", f"no run {run_id!r}")


async def _elsewhere(conn: Connection, run_id: str, what: str) -> None:
    """Refuse to serve the events of another node's child run (``invalid_request``);
    ``not_found`` if there is no such run of the principal."""
    node, _ = await _tree_node(conn, run_id)
    raise ProtocolError(
        "invalid_request",
        f"run {run_id} is a child run of a tree that node {node} of the cluster runs:"
        f" {what} on that node (a child's events are not in the cluster's log)",
    )


async def run_subscribe(conn: Connection, request: RunSubscribe) -> None:
    if request.tree:
        await _subscribe_tree(conn, request)
        return
    entry = _here(conn, request.run_id)
    from_seq = max(request.from_seq or 1, 1)
    if entry is not None and (conn.registry.cluster is None or from_seq >= entry.first_seq):
        conn.check_subscription_room(entry.run_id)
        await conn.send(ack_frame(request.id))
        conn.subscribe(entry, request.from_seq, request.events)
        return
    try:
        await _row(conn, request.run_id)
    except ProtocolError as exc:
        if exc.code != "not_found":
            raise
        await _elsewhere(conn, request.run_id, "subscribe to it")
    conn.check_subscription_room(request.run_id)
    await conn.send(ack_frame(request.id))
    conn.subscribe_remote(request.run_id, request.from_seq, request.events)


async def _subscribe_tree(conn: Connection, request: RunSubscribe) -> None:
    """``run.subscribe`` with ``"tree": true``: the run's subtree, merged in the order
    the events happened (``Run.events(tree=True)``), served by the node running it."""
    if request.from_seq:
        raise ProtocolError(
            "invalid_request",
            "from_seq must be 0 or absent with tree: true (a tree subscription replays"
            " from the oldest event the tree retains; seqs are per run)",
        )
    entry = _here(conn, request.run_id)
    if entry is None:
        try:
            await _row(conn, request.run_id)
        except ProtocolError as exc:
            if exc.code != "not_found":
                raise
            await _elsewhere(conn, request.run_id, "subscribe to its tree")
        raise ProtocolError(
            "invalid_request",
            f"run {request.run_id} runs on another node of the cluster: subscribe to its"
            " tree on that node (tree events are not in the cluster's log)",
        )
    conn.check_subscription_room(None, tree=entry.run_id)
    await conn.send(ack_frame(request.id))
    conn.subscribe_tree(entry, request.events)


async def run_unsubscribe(conn: Connection, request: RunUnsubscribe) -> None:
    if request.tree:
        if request.run_id not in conn.tree_subscriptions and _here(conn, request.run_id) is None:
            await _known(conn, request.run_id)
        await conn.send(ack_frame(request.id, unsubscribed=conn.unsubscribe_tree(request.run_id)))
        return
    if conn.registry.cluster is None or _here(conn, request.run_id) is not None:
        entry = _entry(conn, request.run_id)
        await conn.send(ack_frame(request.id, unsubscribed=conn.unsubscribe(entry.run_id)))
        return
    if request.run_id not in conn.subscriptions:
        await _known(conn, request.run_id)
    await conn.send(ack_frame(request.id, unsubscribed=conn.unsubscribe(request.run_id)))


async def _known(conn: Connection, run_id: str) -> dict[str, Any]:
    """The ``run.get`` fields of a run of the cluster this node does not run (a root's
    row, or a child's on the node running its tree); ``not_found`` if none."""
    try:
        return _info(await _row(conn, run_id))
    except ProtocolError as exc:
        if exc.code != "not_found":
            raise
    _, info = await _tree_node(conn, run_id)
    return info


def _info(row: dict[str, Any]) -> dict[str, Any]:
    # A row is a root's (children have none); its children are known on its node only.
    return RunInfo.from_json({**row, "children": None}).to_json()


async def run_get(conn: Connection, request: RunGet) -> None:
    entry = _here(conn, request.run_id)
    if entry is not None:
        await conn.send(ack_frame(request.id, run=conn.registry.info(entry).to_json()))
        return
    await conn.send(ack_frame(request.id, run=await _known(conn, request.run_id)))


async def runs_list(conn: Connection, request: RunsList) -> None:
    registry = conn.registry
    if registry.cluster is None:
        entries = registry.runs_of(conn.principal, nodes=request.all)
        runs = [registry.info(entry).to_json() for entry in entries]
    else:
        rows = await registry.cluster.list_runs(conn.principal, registry.limits.retain_finished)
        runs = []
        for row in rows:
            entry = _here(conn, row["run_id"], nodes=False)
            if entry is None:
                runs.append(_info(row))
                continue
            nodes = registry.nodes_of(entry) if request.all else [entry]
            runs.extend(registry.info(node).to_json() for node in nodes)
    await conn.send(ack_frame(request.id, runs=runs))


async def session_cancel(conn: Connection, request: SessionCancel) -> None:
    cluster = conn.registry.cluster
    if cluster is not None:
        row = await cluster.session_holder(conn.principal, request.session_id)
        if row is None:
            raise ProtocolError(
                "no_active_run", f"session {request.session_id!r} has no active run"
            )
        cancel = RunCancel(id=0, run_id=row["run_id"], reason=request.reason, mode=request.mode)
        try:
            if _here(conn, row["run_id"]) is not None:
                await apply_local(conn.registry, conn.principal, cancel)
            else:
                await cluster.route(conn.principal, wire(cancel), row["run_id"])
        except ProtocolError as exc:
            if exc.code != "run_closed":
                raise
            raise ProtocolError(
                "no_active_run", f"session {request.session_id!r} has no active run"
            ) from None
        await conn.send(ack_frame(request.id, run_id=row["run_id"]))
        return
    entry = conn.registry.session_holder(conn.principal, request.session_id)
    if entry is None or entry.run is None or entry.run.status.is_terminal:
        raise ProtocolError("no_active_run", f"session {request.session_id!r} has no active run")
    entry.run.cancel(request.reason, mode=request.mode)
    await conn.send(ack_frame(request.id, run_id=entry.run_id))


async def execute_routed(
    registry: Registry, principal: str, data: dict[str, Any], command: int
) -> dict[str, Any]:
    """Answer an op another node routed here (its wire JSON, command ``command``);
    returns the ack's fields.

    A ``run.start`` was placed here by a full node: it starts here, with no connection
    of this node as its owner (its ``on_disconnect`` applies on the node that placed
    it, which holds its client's connection, and here once that node is dead)."""
    request = parse_request(json.dumps(data))
    from ..cluster._routing import ROUTED_FROM, ROUTED_RUN

    cluster = registry.cluster
    assert cluster is not None
    if isinstance(request, RunStart):
        limits = effective_limits(request.limits, registry.limits.max_run_limits)
        registry.check_room(principal)
        if cluster.running() >= cluster.max_runs:
            raise ProtocolError("limit_exceeded", f"node {cluster.node_id} is full")
        entry = await start_run(
            registry,
            principal,
            None,
            request.agent,
            request.input,
            input_bytes=items_bytes(request.input),
            session_id=request.session_id,
            on_disconnect="continue",
            on_busy=request.on_busy,
            client_node=ROUTED_FROM.get() if request.on_disconnect == "cancel" else None,
            run_id=ROUTED_RUN.get(),
            command=command,
            limits=limits,
        )
        return {"run_id": entry.run_id}
    if isinstance(request, RunCancel | RunInject | RunWithdraw | RunApprove | RunReject):
        await cluster.wait_resumed(request.run_id)
        return await apply_local(registry, principal, request, command)
    if isinstance(request, RunGet):  # is a child run in a tree of this node? (_tree_node)
        entry = registry.lookup(principal, request.run_id)
        fence = entry.tree.fence
        if entry.root is None or (fence is not None and fence.closed):
            raise ProtocolError("not_found", f"no child run {request.run_id!r} here")
        return {"run": registry.info(entry).to_json()}
    raise ProtocolError("invalid_request", f"{request.op} is not routed")


_OPS: dict[type, Callable[[Connection, Any], Awaitable[None]]] = {
    RunStart: run_start,
    RunCancel: _control,
    RunInject: _control,
    RunWithdraw: _control,
    RunApprove: _control,
    RunReject: _control,
    RunSubscribe: run_subscribe,
    RunUnsubscribe: run_unsubscribe,
    RunGet: run_get,
    RunsList: runs_list,
    SessionCancel: session_cancel,
}
