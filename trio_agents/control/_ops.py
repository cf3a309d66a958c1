"""The eleven ops: one function per typed request class, each answering with an ``ack``
or raising :class:`ProtocolError` (sent back as an ``error`` frame)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .. import InboxFullError, Run, RunClosedError, UnknownCallError
from ._protocol import ProtocolError, ack_frame, error_frame
from ._registry import RunEntry
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
)
from ._sessions import items_bytes

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["serve_request"]

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


async def run_start(conn: Connection, request: RunStart) -> None:
    registry = conn.registry
    if request.agent not in registry.agents:
        raise ProtocolError("not_found", f"no agent {request.agent!r}")
    registry.check_room(conn.principal)
    if request.subscribe is not None:
        conn.check_subscription_room(None)
    registry.take_start_token(conn.principal)
    entry = await registry.start_run(
        conn.principal,
        conn,
        request.agent,
        request.input,
        input_bytes=items_bytes(request.input),
        session_id=request.session_id,
        on_disconnect=request.on_disconnect,
        on_busy=request.on_busy,
    )
    await conn.send(ack_frame(request.id, run_id=entry.run_id))
    if request.subscribe is not None and conn.room_for_subscription(entry.run_id):
        conn.subscribe(entry, 1, request.subscribe)


async def run_cancel(conn: Connection, request: RunCancel) -> None:
    _live(_entry(conn, request.run_id)).cancel(request.reason, mode=request.mode)
    await conn.send(ack_frame(request.id))


async def run_inject(conn: Connection, request: RunInject) -> None:
    entry = _entry(conn, request.run_id)
    run = _live(entry)
    size = items_bytes(request.items)
    conn.registry.check_inject(entry, size)
    try:
        injection_id = run.inject(request.items, when=request.when)
    except RunClosedError:
        raise ProtocolError("run_closed", f"run {entry.run_id} is closed") from None
    except InboxFullError as exc:
        raise ProtocolError("inbox_full", str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise ProtocolError("invalid_request", str(exc)) from None
    entry.injected_bytes += size
    await conn.send(ack_frame(request.id, injection_id=injection_id))


async def run_withdraw(conn: Connection, request: RunWithdraw) -> None:
    withdrawn = _live(_entry(conn, request.run_id)).withdraw(request.injection_id)
    await conn.send(ack_frame(request.id, withdrawn=withdrawn))


async def _decide(conn: Connection, request: RunApprove | RunReject) -> None:
    entry = _entry(conn, request.run_id)
    run = _live(entry)
    try:
        if isinstance(request, RunApprove):
            run.approve(request.call_id)
        else:
            run.reject(request.call_id, message=request.message)
    except RunClosedError:
        raise ProtocolError("run_closed", f"run {entry.run_id} is closed") from None
    except UnknownCallError as exc:
        raise ProtocolError("not_found", str(exc)) from None
    await conn.send(ack_frame(request.id))


async def run_subscribe(conn: Connection, request: RunSubscribe) -> None:
    entry = _entry(conn, request.run_id)
    conn.check_subscription_room(entry.run_id)
    await conn.send(ack_frame(request.id))
    conn.subscribe(entry, request.from_seq, request.events)


async def run_unsubscribe(conn: Connection, request: RunUnsubscribe) -> None:
    entry = _entry(conn, request.run_id)
    await conn.send(ack_frame(request.id, unsubscribed=conn.unsubscribe(entry.run_id)))


async def run_get(conn: Connection, request: RunGet) -> None:
    entry = _entry(conn, request.run_id)
    await conn.send(ack_frame(request.id, run=entry.info().to_json()))


async def runs_list(conn: Connection, request: RunsList) -> None:
    runs = [entry.info().to_json() for entry in conn.registry.runs_of(conn.principal)]
    await conn.send(ack_frame(request.id, runs=runs))


async def session_cancel(conn: Connection, request: SessionCancel) -> None:
    entry = conn.registry.session_holder(conn.principal, request.session_id)
    if entry is None or entry.run is None or entry.run.status.is_terminal:
        raise ProtocolError("no_active_run", f"session {request.session_id!r} has no active run")
    entry.run.cancel(request.reason, mode=request.mode)
    await conn.send(ack_frame(request.id, run_id=entry.run_id))


_OPS: dict[type, Callable[[Connection, Any], Awaitable[None]]] = {
    RunStart: run_start,
    RunCancel: run_cancel,
    RunInject: run_inject,
    RunWithdraw: run_withdraw,
    RunApprove: _decide,
    RunReject: _decide,
    RunSubscribe: run_subscribe,
    RunUnsubscribe: run_unsubscribe,
    RunGet: run_get,
    RunsList: runs_list,
    SessionCancel: session_cancel,
}
