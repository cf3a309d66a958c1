"""The bounds of a server: :class:`Limits`, the resources a host and its faces allow
(runs per principal, rates, sizes, timeouts, retention), and the lengths of a request's
ids, names and reasons, checked alike by every face. No I/O.
"""

from __future__ import annotations

import math
from typing import Any, Final

import attrs

from .._limits import UsageLimits

__all__ = ["MAX_ID_LENGTH", "MAX_NAME_LENGTH", "MAX_REASON_LENGTH", "Limits"]

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
    """Resource limits of a server: its host and its faces (the websocket channel reads its
    frame, ping and handshake bounds here; the HTTP faces have their own
    :class:`~trio_agents.faces.HttpLimits` beside them).

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
