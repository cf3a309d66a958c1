"""The terms every host and face shares: the error codes of DESIGN §10 and the
:class:`ProtocolError` that carries one, the server's :class:`Limits`, and
:class:`RunInfo`, what a host reports about a run.

They began as the websocket channel's wire format (``control/_protocol.py``, which
re-exports them); the hosts, the cluster and every face use them, so they live below
the faces. No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, Literal, TypeAlias

import attrs

from .._events import RunStatus
from .._limits import UsageLimits

__all__ = [
    "ERROR_CODES",
    "MAX_ID_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_REASON_LENGTH",
    "ErrorCode",
    "Limits",
    "ProtocolError",
    "RunInfo",
]

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
        max_unauthenticated_connections: connections whose handshake has not been
            accepted yet, in all; one more sheds the oldest of them, so a flood of idle
            or half-sent connections never holds every file descriptor (an ``accept``
            that fails with ``EMFILE`` sheds one too, and retries).
        max_unauthenticated_per_ip: the same, per client address.
        retain_finished: seconds a finished run stays visible (``run.get``,
            ``runs.list``, ``run.subscribe`` replays) after its terminal event.
        shutdown_timeout: the bound on a graceful shutdown (cancel runs, persist
            sessions, flush subscribers, close sockets with 1001).
        max_inject_bytes_per_run: bytes of items (as JSON) one run may be sent with
            ``run.inject`` over its life — injected items stay in its conversation and
            event log until it is forgotten; an inject beyond it answers
            ``limit_exceeded`` (the item count of the inbox is ``inbox_capacity``, a
            run option: ``inbox_full``).
        max_session_bytes_per_principal: bytes of in-memory sessions (``sessions=
            None``) one principal may hold, its items as JSON plus 512 bytes per
            session. Past it, idle sessions (no active or queued run) are evicted,
            least recently used first; a ``run.start`` that still does not fit answers
            ``limit_exceeded``.
        max_retained_bytes_per_principal: bytes (input and injected items, as JSON,
            plus 1 KiB per run) of one principal's finished runs kept for
            ``retain_finished``; past it, its oldest finished runs are forgotten early.
        max_run_limits: the most a client may ask for in ``run.start``'s ``"limits"``
            (a :class:`~trio_agents.UsageLimits`), and the limits of a run that asks
            none: each limit set here applies to every run, at the value the client
            asks if that is not above it (asking more answers ``invalid_request``;
            a ``wrap_up`` is not a maximum, only a default). None: clients may ask any
            limits, and a run that asks none has none.
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
    max_unauthenticated_connections: int = attrs.field(default=512, validator=_check_positive_int)
    max_unauthenticated_per_ip: int = attrs.field(default=64, validator=_check_positive_int)
    retain_finished: float = attrs.field(default=600.0, validator=_check_seconds)
    shutdown_timeout: float = attrs.field(default=10.0, validator=_check_seconds)
    max_inject_bytes_per_run: int = attrs.field(default=16 << 20, validator=_check_positive_int)
    max_session_bytes_per_principal: int = attrs.field(
        default=64 << 20, validator=_check_positive_int
    )
    max_retained_bytes_per_principal: int = attrs.field(
        default=64 << 20, validator=_check_positive_int
    )
    max_run_limits: UsageLimits | None = attrs.field(
        default=None,
        validator=attrs.validators.optional(attrs.validators.instance_of(UsageLimits)),
    )


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
        parent_id: the run this one is a child of (None at the root of a tree).
        root_id: the root of its tree (its own id at the root).
        children: its child runs' ids, in start order, live and finished; None when
            not known here (a cluster node answering for a tree another node runs).
        detail: the ``detail`` of the run's current status update, as its
            ``run.updated`` event carries it (``waiting`` and ``pending`` while it
            awaits approval; ``by`` and ``reason`` for a subtree's cancel); empty where
            not known (a run another cluster node runs).
    """

    run_id: str
    agent: str
    session_id: str | None
    status: RunStatus
    reason: str | None
    seq: int
    turn: int = 0
    pending_approvals: tuple[str, ...] = ()
    parent_id: str | None = None
    root_id: str = attrs.field(
        default=attrs.Factory(lambda self: self.run_id, takes_self=True)  # a root's
    )
    children: tuple[str, ...] | None = ()
    detail: Mapping[str, Any] = attrs.field(factory=dict)

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
            "parent_id": self.parent_id,
            "root_id": self.root_id,
            "children": None if self.children is None else list(self.children),
            "detail": dict(self.detail),
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
                detail=_detail(data.get("detail")),
                **_tree_fields(data),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed run info: {exc!r}") from None


def _detail(value: Any) -> dict[str, Any]:
    """A ``run`` object's ``detail`` (absent from an older server's: empty)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"detail must be an object, not {type(value).__name__}")
    return dict(value)


def _tree_fields(data: Any) -> dict[str, Any]:
    """The run-tree fields of a ``run`` object (absent from an older server's)."""
    parent_id = data.get("parent_id")
    children = data.get("children", ())
    return {
        "parent_id": None if parent_id is None else str(parent_id),
        "root_id": str(data.get("root_id") or data["run_id"]),
        "children": None if children is None else tuple(str(c) for c in children),
    }
