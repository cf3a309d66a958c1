"""The twelve ops of the websocket channel: one function per typed request class, each
a call of the server's run host (:class:`~trio_agents.hosting.RunHost`) answered with
an ``ack``, or an ``error`` frame for the host's :class:`~trio_agents.hosting.HostError`
(or a :class:`ProtocolError` of the channel itself).

The channel is a face: it knows nothing of where a run runs. A clustered server's host
(``trio_agents.cluster``) places, routes and follows runs of other nodes behind the
same calls."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from ..hosting import HostError, Origin, StartRequest
from ..hosting._requests import (
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
    SessionFork,
)
from ._protocol import ErrorCode, ProtocolError, ack_frame, error_frame

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["serve_request", "wire_code"]

logger = logging.getLogger("trio_agents.control")

# The host's codes the channel has no code of its own for.
_WIRE_CODES: Final[dict[str, ErrorCode]] = {
    "unauthorized": "not_found",  # a run the principal may not see is one it cannot find
    "rate_limited": "limit_exceeded",
}


def wire_code(code: str) -> ErrorCode:
    """The ``error`` frame code of a host's error code (§10's, mostly the same)."""
    mapped = _WIRE_CODES.get(code)
    return mapped if mapped is not None else code  # type: ignore[return-value]


async def serve_request(conn: Connection, request: Request) -> None:
    """Answer one request; no exception of an op leaves this function."""
    try:
        await _OPS[type(request)](conn, request)
    except ProtocolError as exc:
        await conn.send(error_frame(exc.code, exc.message, request.id))
    except HostError as exc:
        await conn.send(error_frame(wire_code(exc.code), exc.message, request.id))
    except Exception:
        logger.exception("control op %s failed", request.op)
        await conn.send(error_frame("internal", "internal error", request.id))


def _limits(asked: Any) -> Mapping[str, float] | None:
    """``run.start``'s ``"limits"`` (validated fields), as the wire mapping: the host
    merges it with its ``max_run_limits`` before checking the limits together."""
    return dict(asked) if asked else None


async def run_start(conn: Connection, request: RunStart) -> None:
    host = conn.host
    if request.agent not in host.agents:
        raise ProtocolError("not_found", f"no agent {request.agent!r}")
    if request.subscribe is not None:
        conn.check_subscription_room(None)
    start = StartRequest(
        agent=request.agent,
        input=request.input,
        session_id=request.session_id,
        on_disconnect=request.on_disconnect,
        on_busy=request.on_busy,
        limits=_limits(request.limits),
    )
    run_id = await host.start(Origin(principal=conn.principal, owner=conn), start)
    await conn.send(ack_frame(request.id, run_id=run_id))
    if request.subscribe is not None and conn.room_for_subscription(run_id):
        # Acked already: a subscription that cannot be made sends nothing more.
        with contextlib.suppress(HostError, ProtocolError):
            ready = await conn.subscribe(run_id, 1, request.subscribe)
            ready.set()


async def _control(
    conn: Connection, request: RunCancel | RunInject | RunWithdraw | RunApprove | RunReject
) -> None:
    host, principal = conn.host, conn.principal
    fields: dict[str, Any] = {}
    match request:
        case RunCancel(run_id=run_id, reason=reason, mode=mode):
            await host.cancel(principal, run_id, reason, mode)
        case RunInject(run_id=run_id, items=items, when=when):
            fields["injection_id"] = await host.inject(principal, run_id, items, when)
        case RunWithdraw(run_id=run_id, injection_id=injection_id):
            fields["withdrawn"] = await host.withdraw(principal, run_id, injection_id)
        case RunApprove(run_id=run_id, call_id=call_id, content=content):
            await host.approve(principal, run_id, call_id, content)
        case RunReject(run_id=run_id, call_id=call_id, message=message):
            await host.reject(principal, run_id, call_id, message)
    await conn.send(ack_frame(request.id, **fields))


async def run_subscribe(conn: Connection, request: RunSubscribe) -> None:
    if request.tree and request.from_seq:
        raise ProtocolError(
            "invalid_request",
            "from_seq must be 0 or absent with tree: true (a tree subscription replays"
            " from the oldest event the tree retains; seqs are per run)",
        )
    from_seq = None if request.tree else request.from_seq
    ready = await conn.subscribe(request.run_id, from_seq, request.events, tree=request.tree)
    try:
        await conn.send(ack_frame(request.id))
    finally:
        ready.set()  # the subscription's events follow the ack


async def run_unsubscribe(conn: Connection, request: RunUnsubscribe) -> None:
    subscriptions = conn.tree_subscriptions if request.tree else conn.subscriptions
    if request.run_id not in subscriptions:
        await conn.host.get(conn.principal, request.run_id)  # not_found for no such run
    if request.tree:
        unsubscribed = conn.unsubscribe_tree(request.run_id)
    else:
        unsubscribed = conn.unsubscribe(request.run_id)
    await conn.send(ack_frame(request.id, unsubscribed=unsubscribed))


async def run_get(conn: Connection, request: RunGet) -> None:
    info = await conn.host.get(conn.principal, request.run_id)
    await conn.send(ack_frame(request.id, run=info.to_json()))


async def runs_list(conn: Connection, request: RunsList) -> None:
    runs = await conn.host.list(conn.principal, all=request.all)
    await conn.send(ack_frame(request.id, runs=[info.to_json() for info in runs]))


async def session_cancel(conn: Connection, request: SessionCancel) -> None:
    run_id = await conn.host.cancel_session(
        conn.principal, request.session_id, request.reason, request.mode
    )
    await conn.send(ack_frame(request.id, run_id=run_id))


async def session_fork(conn: Connection, request: SessionFork) -> None:
    items = await conn.host.fork_session(
        conn.principal, request.session_id, request.new_session_id, request.at
    )
    await conn.send(ack_frame(request.id, session_id=request.new_session_id, items=items))


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
    SessionFork: session_fork,
}
