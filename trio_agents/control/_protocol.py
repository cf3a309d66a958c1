"""The wire format of the control channel, version 1 (subprotocol ``trio-agents.v1``).

One JSON object per websocket text frame. Requests carry a client-chosen ``id`` that
the answer (an ``ack`` or an ``error`` frame) echoes; ``event`` frames carry one run
event. This module parses and validates request frames (every field, every type) and
builds answer frames; it does no I/O. See ``docs/protocol.md`` for every frame.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeAlias, final

import attrs

from .._events import (
    EventsDropped,
    InboxDelivered,
    InboxInjected,
    ResponseTextDelta,
    RunEvent,
    RunItemEvent,
    RunStatus,
    RunUpdated,
    ToolFinished,
    ToolProgress,
    ToolStarted,
)
from .._items import Item, coerce_items, item_from_json

__all__ = [
    "ERROR_CODES",
    "OPS",
    "SUBPROTOCOL",
    "ErrorCode",
    "Limits",
    "ProtocolError",
    "Request",
    "RunInfo",
    "ack_frame",
    "dumps",
    "error_frame",
    "event_frame",
    "event_from_json",
    "parse_request",
]

SUBPROTOCOL: Final = "trio-agents.v1"
"""The websocket subprotocol of wire format version 1."""

ErrorCode: TypeAlias = Literal[
    "invalid_json",
    "invalid_request",
    "unknown_op",
    "not_found",
    "run_closed",
    "session_busy",
    "no_active_run",
    "inbox_full",
    "limit_exceeded",
    "internal",
]

ERROR_CODES: Final[tuple[str, ...]] = (
    "invalid_json",
    "invalid_request",
    "unknown_op",
    "not_found",
    "run_closed",
    "session_busy",
    "no_active_run",
    "inbox_full",
    "limit_exceeded",
    "internal",
)
"""Every ``code`` an ``error`` frame can carry."""

MAX_ID_LENGTH: Final = 256
MAX_NAME_LENGTH: Final = 256
MAX_REASON_LENGTH: Final = 4096


def _check_positive_int(_i: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int")
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1")


def _check_seconds(_i: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a number")
    if not (value > 0 and not math.isnan(value)):
        raise ValueError(f"{attribute.name} must be > 0")


def _check_optional_seconds(i: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        _check_seconds(i, attribute, value)


@attrs.frozen(kw_only=True)
class Limits:
    """Resource limits of a :class:`~trio_agents.control.ControlServer`.

    Attributes:
        max_message_size: the largest request frame accepted, in characters (bytes
            for binary frames); a bigger one closes the connection with code 1009.
        max_runs_per_principal: active (not yet finished) runs one principal may have;
            a ``run.start`` beyond it answers ``limit_exceeded``.
        max_subscriptions_per_connection: ``run.subscribe`` (and ``run.start`` with
            ``subscribe``) beyond it answers ``limit_exceeded``.
        outbound_queue_size: frames queued for one connection's writer; producers
            (acks, subscriptions) wait when it is full, the runs never do.
        send_timeout: a connection whose frame send stays blocked longer than this is
            aborted (a slow or stuck reader); its runs go on.
        start_rate: sustained ``run.start`` requests per second per principal (a token
            bucket refilled at this rate)...
        start_burst: ...holding at most this many tokens.
        ping_interval: seconds between keepalive pings (None: no pings).
        ping_timeout: a ping not answered within this many seconds marks the peer
            dead; the connection is aborted.
        handshake_timeout: seconds a new TCP connection has to finish its handshake.
        retain_finished: seconds a finished run stays visible (``run.get``,
            ``runs.list``, ``run.subscribe`` replays) after its terminal event.
        shutdown_timeout: the bound on a graceful shutdown (cancel runs, persist
            sessions, flush subscribers, close sockets with 1001).
    """

    max_message_size: int = attrs.field(default=1 << 20, validator=_check_positive_int)
    max_runs_per_principal: int = attrs.field(default=64, validator=_check_positive_int)
    max_subscriptions_per_connection: int = attrs.field(default=256, validator=_check_positive_int)
    outbound_queue_size: int = attrs.field(default=256, validator=_check_positive_int)
    send_timeout: float = attrs.field(default=10.0, validator=_check_seconds)
    start_rate: float = attrs.field(default=10.0, validator=_check_seconds)
    start_burst: int = attrs.field(default=20, validator=_check_positive_int)
    ping_interval: float | None = attrs.field(default=20.0, validator=_check_optional_seconds)
    ping_timeout: float = attrs.field(default=20.0, validator=_check_seconds)
    handshake_timeout: float = attrs.field(default=10.0, validator=_check_seconds)
    retain_finished: float = attrs.field(default=600.0, validator=_check_seconds)
    shutdown_timeout: float = attrs.field(default=10.0, validator=_check_seconds)


class ProtocolError(Exception):
    """A request frame could not be served; becomes an ``error`` frame.

    Attributes:
        code: one of :data:`ERROR_CODES`.
        message: a human-readable explanation.
        request_id: the request's ``id`` when it could be read, else None.
    """

    def __init__(self, code: ErrorCode, message: str, request_id: str | int | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code: ErrorCode = code
        self.message = message
        self.request_id = request_id


@final
@attrs.frozen
class Request:
    """A validated request frame: its ``id``, ``op`` and the op's fields."""

    id: str | int
    op: str
    fields: Mapping[str, Any]


@attrs.frozen
class RunInfo:
    """What ``run.get`` and ``runs.list`` report about a run.

    Attributes:
        run_id: the run's id.
        agent: the name the agent is registered under on the server.
        session_id: the session the run uses (None: no session).
        status: its current status.
        reason: why it failed or was cancelled (None otherwise).
        seq: the seq of its latest event.
        turn: the number of model calls started.
        pending_approvals: ids of tool calls waiting for approval.
    """

    run_id: str
    agent: str
    session_id: str | None
    status: RunStatus
    reason: str | None
    seq: int
    turn: int = 0
    pending_approvals: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The ``run`` object of a ``run.get`` ack."""
        return {
            "run_id": self.run_id,
            "agent": self.agent,
            "session_id": self.session_id,
            "status": self.status.value,
            "reason": self.reason,
            "seq": self.seq,
            "turn": self.turn,
            "pending_approvals": list(self.pending_approvals),
        }

    @classmethod
    def from_json(cls, data: Any) -> RunInfo:
        """Read the ``run`` object of a ``run.get`` ack (raises ``ValueError`` if bad)."""
        try:
            return cls(
                run_id=str(data["run_id"]),
                agent=str(data["agent"]),
                session_id=data.get("session_id"),
                status=RunStatus(data["status"]),
                reason=data.get("reason"),
                seq=int(data["seq"]),
                turn=int(data.get("turn", 0)),
                pending_approvals=tuple(str(c) for c in data.get("pending_approvals", ())),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed run info: {exc!r}") from None


# ---------------------------------------------------------------- field validators

_Validator: TypeAlias = Callable[[str, Any], Any]


def _string(max_length: int) -> _Validator:
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string")
        if not value:
            raise ValueError(f"{name} must not be empty")
        if len(value) > max_length:
            raise ValueError(f"{name} is longer than {max_length} characters")
        return value

    return check


def _optional(check: _Validator) -> _Validator:
    def optional(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)

    return optional


def _choice(*choices: str | None) -> _Validator:
    def check(name: str, value: Any) -> Any:
        if value not in choices or (value is not None and not isinstance(value, str)):
            shown = ", ".join("null" if c is None else repr(c) for c in choices)
            raise ValueError(f"{name} must be one of {shown}")
        return value

    return check


def _message_text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    if len(value) > MAX_REASON_LENGTH:
        raise ValueError(f"{name} is longer than {MAX_REASON_LENGTH} characters")
    return value


def _seq(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0 or null")
    return value


def _items(name: str, value: Any) -> tuple[Item, ...]:
    if not isinstance(value, str | list | dict):
        raise ValueError(f"{name} must be a string, an item object or a list of items")
    try:
        items = tuple(coerce_items(value))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: {exc}") from None
    except RecursionError:
        raise ValueError(f"{name}: nested too deeply") from None
    if not items:
        raise ValueError(f"{name} must hold at least one item")
    return items


_Field: TypeAlias = tuple[_Validator, bool, Any]  # validator, required, default

_RUN_ID: _Field = (_string(MAX_NAME_LENGTH), True, None)

OPS: Final[Mapping[str, Mapping[str, _Field]]] = {
    "run.start": {
        "agent": (_string(MAX_NAME_LENGTH), True, None),
        "input": (_items, True, None),
        "session_id": (_optional(_string(MAX_NAME_LENGTH)), False, None),
        "on_disconnect": (_choice("continue", "cancel"), False, "continue"),
        "on_busy": (_choice("reject", "interrupt", "enqueue"), False, "reject"),
        "subscribe": (_choice("all", "status", None), False, None),
    },
    "run.cancel": {
        "run_id": _RUN_ID,
        "reason": (_optional(_message_text), False, None),
        "mode": (_choice("immediate", "after_turn"), False, "immediate"),
    },
    "run.inject": {
        "run_id": _RUN_ID,
        "items": (_items, True, None),
        "when": (_choice("next_turn", "now", "when_idle"), False, "next_turn"),
    },
    "run.withdraw": {
        "run_id": _RUN_ID,
        "injection_id": (_string(MAX_NAME_LENGTH), True, None),
    },
    "run.approve": {
        "run_id": _RUN_ID,
        "call_id": (_string(MAX_NAME_LENGTH), True, None),
        "message": (_optional(_message_text), False, None),
    },
    "run.reject": {
        "run_id": _RUN_ID,
        "call_id": (_string(MAX_NAME_LENGTH), True, None),
        "message": (_optional(_message_text), False, None),
    },
    "run.subscribe": {
        "run_id": _RUN_ID,
        "from_seq": (_seq, False, None),
        "events": (_choice("all", "status"), False, "all"),
    },
    "run.unsubscribe": {"run_id": _RUN_ID},
    "run.get": {"run_id": _RUN_ID},
    "runs.list": {},
    "session.cancel": {
        "session_id": (_string(MAX_NAME_LENGTH), True, None),
        "reason": (_optional(_message_text), False, None),
        "mode": (_choice("immediate", "after_turn"), False, "immediate"),
    },
}
"""Every op and its fields: ``name -> (validator, required, default)``."""


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_request(text: str | bytes) -> Request:
    """Parse and validate one request frame.

    Raises:
        ProtocolError: ``invalid_json`` (not JSON, or a binary frame),
            ``invalid_request`` (not an object, bad ``id``, missing/unknown/wrong
            fields) or ``unknown_op``. ``request_id`` is set once the id was read.
    """
    if not isinstance(text, str):
        raise ProtocolError("invalid_json", "binary frames are not accepted; send JSON text")
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ProtocolError("invalid_json", "JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise ProtocolError("invalid_json", f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("invalid_request", "a request must be a JSON object")
    request_id = data.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        raise ProtocolError("invalid_request", "id must be a string or an integer")
    if isinstance(request_id, str) and len(request_id) > MAX_ID_LENGTH:
        raise ProtocolError("invalid_request", f"id is longer than {MAX_ID_LENGTH} characters")
    if isinstance(request_id, int) and abs(request_id) >= 2**53:
        raise ProtocolError("invalid_request", "an integer id must be below 2**53")
    op = data.get("op")
    if not isinstance(op, str):
        raise ProtocolError("invalid_request", "op must be a string", request_id)
    spec = OPS.get(op)
    if spec is None:
        shown = op if len(op) <= 64 else op[:61] + "..."
        raise ProtocolError("unknown_op", f"unknown op {shown!r}", request_id)
    unknown = sorted(set(data) - set(spec) - {"id", "op"})
    if unknown:
        shown_fields = ", ".join(repr(name[:64]) for name in unknown[:5])
        raise ProtocolError(
            "invalid_request", f"unknown field(s) for {op}: {shown_fields}", request_id
        )
    fields: dict[str, Any] = {}
    for name, (check, required, default) in spec.items():
        if name not in data:
            if required:
                raise ProtocolError("invalid_request", f"{op} needs {name!r}", request_id)
            fields[name] = default
            continue
        try:
            value = check(name, data[name])
        except ValueError as exc:
            raise ProtocolError("invalid_request", str(exc), request_id) from None
        fields[name] = default if value is None and default is not None else value
    return Request(request_id, op, fields)


# ---------------------------------------------------------------------- answers


def dumps(frame: Mapping[str, Any]) -> str:
    """Encode a frame as compact JSON (ASCII-only, so any str is sendable)."""
    return json.dumps(frame, separators=(",", ":"), allow_nan=False)


def ack_frame(request_id: str | int, **data: Any) -> dict[str, Any]:
    """An ``ack`` frame answering ``request_id`` (extra fields per op)."""
    return {"type": "ack", "id": request_id, **data}


def error_frame(code: str, message: str, request_id: str | int | None) -> dict[str, Any]:
    """An ``error`` frame (``id`` is None when the request's id could not be read)."""
    return {"type": "error", "id": request_id, "code": code, "message": message}


def event_frame(event: RunEvent) -> dict[str, Any]:
    """An ``event`` frame carrying ``event.to_json()``."""
    return {"type": "event", "run_id": event.run_id, "seq": event.seq, "event": event.to_json()}


# ------------------------------------------------------------- events, read back


def _items_tuple(values: Any) -> tuple[Item, ...]:
    return tuple(item_from_json(value) for value in values)


def event_from_json(data: Mapping[str, Any]) -> RunEvent:
    """Rebuild a run event from its ``to_json()`` form (what ``event`` frames carry).

    Raises:
        ValueError: unknown event type or malformed fields.
    """
    try:
        kind = data["type"]
        run_id, seq = str(data["run_id"]), int(data["seq"])
        if kind == "run.updated":
            return RunUpdated(
                run_id=run_id,
                seq=seq,
                status=RunStatus(data["status"]),
                reason=data.get("reason"),
                turn=int(data["turn"]),
                at=float(data["at"]),
                detail=dict(data.get("detail") or {}),
            )
        if kind == "response.text.delta":
            return ResponseTextDelta(
                run_id=run_id, seq=seq, turn=int(data["turn"]), text=str(data["text"])
            )
        if kind == "run.item":
            return RunItemEvent(
                run_id=run_id, seq=seq, turn=int(data["turn"]), item=item_from_json(data["item"])
            )
        if kind == "tool.started":
            return ToolStarted(
                run_id=run_id,
                seq=seq,
                call_id=str(data["call_id"]),
                name=str(data["name"]),
                arguments=str(data["arguments"]),
            )
        if kind == "tool.progress":
            return ToolProgress(
                run_id=run_id,
                seq=seq,
                call_id=str(data["call_id"]),
                name=str(data["name"]),
                message=str(data["message"]),
                data=dict(data.get("data") or {}),
            )
        if kind == "tool.finished":
            return ToolFinished(
                run_id=run_id,
                seq=seq,
                call_id=str(data["call_id"]),
                name=str(data["name"]),
                status=str(data["status"]),
                output=str(data["output"]),
            )
        if kind == "inbox.injected":
            return InboxInjected(
                run_id=run_id,
                seq=seq,
                injection_id=str(data["injection_id"]),
                when=str(data["when"]),
                items=_items_tuple(data["items"]),
            )
        if kind == "inbox.delivered":
            return InboxDelivered(
                run_id=run_id,
                seq=seq,
                injection_id=str(data["injection_id"]),
                turn=int(data["turn"]),
            )
        if kind == "events.dropped":
            return EventsDropped(
                run_id=run_id,
                seq=seq,
                first_missing_seq=int(data["first_missing_seq"]),
                count=int(data["count"]),
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed event: {exc!r}") from None
    raise ValueError(f"unknown event type {data.get('type')!r}")
