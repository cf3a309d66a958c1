"""The limits of the HTTP faces: :class:`HttpLimits`."""

from __future__ import annotations

import math
from typing import Any

import attrs

__all__ = ["HttpLimits"]


def _positive_int(_i: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name} must be an int >= 1")


def _seconds(_i: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a number")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{attribute.name} must be a finite number > 0")


@attrs.frozen(kw_only=True)
class HttpLimits:
    """Limits of the HTTP faces (the host's own limits — runs per principal, start
    rate, inbox bytes — apply to every face alike and are the host's).

    Attributes:
        max_body_bytes: the largest request body read; a bigger one answers 413
            (``limit_exceeded``) without being read past the bound. The websocket
            channel's ``max_message_size`` by default.
        send_timeout: an event stream whose write stays blocked longer than this (a
            client that stopped reading) is cut; its runs go on, and it may re-attach
            with ``Last-Event-ID``.
        keepalive_interval: seconds of silence after which an event stream sends a
            comment line, so proxies and clients see the connection alive.
        max_streams_per_principal: open event streams one principal may hold, with
            the replays (``POST /runs/{id}/replay``) it has waiting for a model; one
            more answers 429 (``limit_exceeded``).
        max_tree_resume_events: a tree stream re-attached by ``Last-Event-ID`` looks
            this many replayed events ahead for the one named before giving up (and
            saying ``events.dropped``).
        shutdown_timeout: how long open streams and requests are given once the
            server shuts down (streams end at once: they are told nothing more comes).
        keep_alive_timeout: a keep-alive connection of an authenticated client that
            sends no new request for this long is closed (after any response, event
            streams included).
        header_timeout: a connection that has not made an authenticated request yet
            has this long to send a complete request head, from its accept or from the
            end of its last response; then it is closed.
        max_unauthenticated_connections: connections that have not made an
            authenticated request yet, in all; one more sheds the oldest of them (one
            that has sent nothing first, then one waiting for a request head), so a
            flood of idle or half-sent connections never holds every file descriptor of
            the process. An ``accept`` that fails with ``EMFILE`` sheds one too.
        max_unauthenticated_per_ip: the same, per client address.
        replay_rate: sustained replays (``POST /runs/{id}/replay``) per second per
            principal, a token bucket of ``replay_burst``: each replay is a model call
            the server pays for; one more answers 429 (``limit_exceeded``).
        replay_burst: the replays one principal may make at once before
            ``replay_rate`` applies.
    """

    max_body_bytes: int = attrs.field(default=1 << 20, validator=_positive_int)
    send_timeout: float = attrs.field(default=10.0, validator=_seconds)
    keepalive_interval: float = attrs.field(default=15.0, validator=_seconds)
    max_streams_per_principal: int = attrs.field(default=1024, validator=_positive_int)
    max_tree_resume_events: int = attrs.field(default=10_000, validator=_positive_int)
    shutdown_timeout: float = attrs.field(default=10.0, validator=_seconds)
    keep_alive_timeout: float = attrs.field(default=30.0, validator=_seconds)
    header_timeout: float = attrs.field(default=10.0, validator=_seconds)
    max_unauthenticated_connections: int = attrs.field(default=512, validator=_positive_int)
    max_unauthenticated_per_ip: int = attrs.field(default=64, validator=_positive_int)
    replay_rate: float = attrs.field(default=0.2, validator=_seconds)
    replay_burst: int = attrs.field(default=5, validator=_positive_int)
