"""Steering ops pushed to the worker whose attempt runs the run.

A workflow update records the op, then its local activity (:func:`push_op`, asyncio,
on whichever worker handles the update) sends it to the address the running attempt
announced (:class:`~._types.AttemptStarted`): one JSON line over TCP to the
:func:`serve_ops` listener in that worker's Trio thread, which applies it to the run and
answers with the run's real answer (measured: update → ``run.inject`` about 13 ms p50,
against about 90 ms for an attempt polling its workflow with queries). When that
attempt runs in the activity's own worker process — the usual case where the server
dispatches activities eagerly: the attempt's activity goes to the worker that scheduled
it, whose sticky queue then gets the run's workflow tasks — the worker hands the op to
its Trio thread directly, without the connection.

Wire: the client sends ``{"run_id": ..., "key": ..., "op": SteeringOp}`` and one
newline; the server answers one :class:`~._types.OpAnswer` line and closes.

The listener must be reachable from the other workers and servers (on several machines:
a routable interface), so it takes an op only with the key it drew at start-up: an
address is ``"<key>@<host>:<port>"``, and only the workflow's history and the shared
store hold it (both written by the attempt that announced it). Anyone else who reaches
the port steers nothing: a request without the key is answered as if no attempt of the
run were here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

import trio

from .._error_text import summarize
from ._types import OpAnswer, SteeringOp

__all__ = ["not_here", "push_op", "push_op_here", "serve_ops"]

log = logging.getLogger("trio_agents.temporal")

_MAX_LINE = 1 << 20  # an op carries items: bounded, as the control channel's messages are


async def _read_line(stream: trio.SocketStream) -> bytes:
    buffer = bytearray()
    while b"\n" not in buffer:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        buffer += chunk
        if len(buffer) > _MAX_LINE:
            raise ValueError("op too large")
    return bytes(buffer.split(b"\n", 1)[0])


def not_here() -> OpAnswer:
    """The answer for a run with no attempt here (or a push without this worker's key):
    pending, so the workflow waits for where the run is now."""
    return OpAnswer(ok=True, pending=True, message="no attempt of the run here")


async def serve_ops(
    find: Callable[[str], Any],
    host: str,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve pushed ops on ``host`` (a free port); ``task_status.started(address)``, the
    address to push to (``"<key>@<host>:<port>"``, the key drawn here).

    ``find(run_id)`` returns the attempt running the run here (an object with ``async
    apply(op) -> OpAnswer``) or None.
    """
    key = secrets.token_urlsafe(24)

    async def answer(request: object) -> OpAnswer:
        given = request.get("key") if isinstance(request, dict) else None
        if not (isinstance(given, str) and hmac.compare_digest(given, key)):
            log.warning("a pushed op without this worker's key was refused")
            return not_here()
        assert isinstance(request, dict)
        op = SteeringOp(**request["op"])
        attempt = find(str(request["run_id"]))
        if attempt is None:
            # The attempt ended (its result is on its way to the workflow) or moved:
            # not this op's answer, so the workflow waits for where the run is now (the
            # next attempt, its park or its end).
            return not_here()
        try:
            answered: OpAnswer = await attempt.apply(op)
        except Exception as exc:  # a fault of this op is its own answer
            log.exception("a pushed %s op failed", op.op)
            return OpAnswer(ok=False, code="internal", message=f"the op failed: {summarize(exc)}")
        return answered

    async def handle(stream: trio.SocketStream) -> None:
        # One bad or slow peer must never take the listener down: every failure is its
        # own, and the op has a bound (the update's local activity has one too).
        try:
            with trio.move_on_after(30):
                answered = await answer(json.loads(await _read_line(stream)))
                await stream.send_all(json.dumps(dataclasses.asdict(answered)).encode() + b"\n")
        except (OSError, ValueError, KeyError, TypeError, trio.BrokenResourceError):
            pass
        except Exception:
            # Never out of the handler: the listener shares its nursery with every
            # attempt this worker runs.
            log.exception("a pushed op's connection failed")
        finally:
            await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host=host)
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handle, listeners)
        task_status.started(f"{key}@{host}:{port}")


def _place(address: str) -> tuple[str, str, int]:
    """``(key, host, port)`` of an address (an address of an earlier version, with no
    key, has an empty one)."""
    key, _, place = address.rpartition("@")
    host, _, port = place.rpartition(":")
    return key, host, int(port)


def _request_line(run_id: str, key: str, op: SteeringOp) -> bytes:
    request = {"run_id": run_id, "key": key, "op": dataclasses.asdict(op)}
    return json.dumps(request).encode() + b"\n"


def _answer(line: bytes) -> OpAnswer:
    if not line:
        raise ConnectionError("the attempt's worker closed the connection without answering")
    return OpAnswer(**json.loads(line))


async def push_op_here(address: str, run_id: str, op: SteeringOp) -> OpAnswer:
    """:func:`push_op` from Trio: what a host uses to push an op that Temporal already
    recorded (a cancel) straight to the attempt, with no workflow task in between.

    Raises:
        OSError: the attempt's worker is unreachable.
        ValueError: its answer was not an op answer.
    """
    key, host, port = _place(address)
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        await stream.send_all(_request_line(run_id, key, op))
        try:
            return _answer(await _read_line(stream))
        except (TypeError, KeyError) as exc:
            raise ValueError(f"not an op answer: {exc}") from None


async def push_op(address: str, run_id: str, op: SteeringOp) -> OpAnswer:
    """Send ``op`` to the attempt at ``address`` (``"<key>@<host>:<port>"``, as
    :func:`serve_ops` gave it) and return its answer.

    Raises:
        OSError: the attempt's worker is unreachable (it died: a later attempt catches
            up with the op from the workflow's history).
    """
    key, host, port = _place(address)
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(_request_line(run_id, key, op))
        await writer.drain()
        answer = await reader.readline()
    finally:
        writer.close()
        await writer.wait_closed()
    return _answer(answer)
