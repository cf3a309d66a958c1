"""What every HTTP face shares: the limits, the error answer, the principal of a
request, reading a JSON body within a bound.

Errors travel as one JSON shape on every face that answers plain HTTP (REST, the web
UI's calls, AG-UI's refusals before its stream starts)::

    {"error": {"code": "<DESIGN §10 code>", "message": "<text safe to show>"}}

with the HTTP status :data:`HTTP_STATUS` gives the code. A face that must answer in
its own envelope (A2A's JSON-RPC errors) catches :class:`HttpError` and
:class:`~trio_agents.hosting.HostError` itself; the codes stay the same.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from contextlib import aclosing
from typing import Any, Final

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse

from .._text_cleaning import clean_text
from ..hosting._requests import UNSTORABLE, reject_constant, unstorable

__all__ = [
    "HTTP_STATUS",
    "HttpError",
    "HttpLimits",
    "error_body",
    "error_response",
    "principal_of",
    "read_json",
    "shown_description",
]

HTTP_STATUS: Final[Mapping[str, int]] = {
    "invalid_json": 400,
    "invalid_request": 400,
    "unknown_op": 404,
    "not_found": 404,
    "run_closed": 409,
    "session_busy": 409,
    "no_active_run": 409,
    "inbox_full": 429,
    "limit_exceeded": 429,
    "unauthorized": 401,
    "internal": 500,
}
"""The HTTP status of each error code, where the situation does not say another: the
codes are DESIGN §10's (the websocket channel's), plus ``unauthorized`` (401), since an
HTTP request is authenticated on its own (the websocket channel refuses its handshake
with a bare 401 instead). What only HTTP tells apart is in the status, never in a new
code: a body too large is 413 ``limit_exceeded``, a method a route does not take 405
``unknown_op``, a server shutting down 503 ``internal`` (as the channel answers
``internal`` to a ``run.start`` then)."""

# A host's codes that are not §10's, as the websocket channel maps them (control/_ops).
HOST_CODES: Final[Mapping[str, str]] = {
    "unauthorized": "not_found",  # a run the principal may not see is one it cannot find
    "rate_limited": "limit_exceeded",
}

# The key of the ASGI scope under which the auth layer leaves the principal.
PRINCIPAL_KEY: Final = "trio_agents.principal"
# The key of the ASGI scope under which serve_http leaves a function that the auth layer
# calls when the request's token is valid: the connection is no longer counted, nor
# timed, as an unauthenticated one (another ASGI server leaves none).
AUTHENTICATED_KEY: Final = "trio_agents.authenticated"


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
        max_streams_per_principal: open event streams one principal may hold; one
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


class HttpError(Exception):
    """An HTTP face refuses a request: answered with ``status`` and the JSON error body.

    Attributes:
        code: the error code (a key of :data:`HTTP_STATUS`).
        message: a human-readable explanation, safe to show the client.
        status: the HTTP status (default: :data:`HTTP_STATUS` [``code``]).
        headers: extra response headers (``WWW-Authenticate``, ``Allow``, ...).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if code not in HTTP_STATUS:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = HTTP_STATUS[code] if status is None else status
        self.headers = dict(headers or {})


def error_body(code: str, message: str) -> dict[str, Any]:
    """The JSON body of an error answer."""
    return {"error": {"code": code, "message": message}}


def error_response(
    code: str,
    message: str,
    *,
    status: int | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The HTTP answer of an error: its status (default: the code's), the JSON error
    body."""
    return JSONResponse(
        error_body(code, message),
        status_code=HTTP_STATUS.get(code, 500) if status is None else status,
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


def shown_description(description: str | None) -> str | None:
    """An agent's ``description`` as a listing shows it (``GET /agents``, the A2A agent
    card): cleaned as every user string entering an answer is (a lone surrogate would
    fail the whole answer's UTF-8 encoding)."""
    return None if description is None else clean_text(description)


def principal_of(request: Request) -> str:
    """The authenticated principal of a request. Every route behind the auth layer has
    one; a public route (see :class:`~trio_agents.faces.Routes`) has none, and asking
    is a bug in that route."""
    principal = request.scope.get(PRINCIPAL_KEY)
    if not isinstance(principal, str):
        raise RuntimeError(f"{request.url.path} is a public route: it has no principal")
    return principal


# NUL and lone surrogates: valid JSON, but no session store can keep them (PostgreSQL
# text refuses NUL, UTF-8 refuses a lone surrogate); the websocket channel refuses them
# with the same checks (hosting/_requests.py), so every face answers the same.
_UNSTORABLE: Final = UNSTORABLE
_unstorable = unstorable
_reject_constant = reject_constant


async def read_body(request: Request, max_bytes: int) -> bytes:
    """The request's body, read chunk by chunk and refused (413 ``limit_exceeded``) once past
    ``max_bytes`` — a declared ``Content-Length`` past it is refused before reading."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            length = int(declared)
        except ValueError:
            raise HttpError("invalid_request", "Content-Length is not a number") from None
        if length > max_bytes:
            raise HttpError(
                "limit_exceeded",
                f"the body is {length} bytes; at most {max_bytes} are read",
                status=413,
            )
    chunks: list[bytes] = []
    size = 0
    async with aclosing(request.stream()) as stream:
        async for chunk in stream:
            size += len(chunk)
            if size > max_bytes:
                raise HttpError("limit_exceeded", f"the body is over {max_bytes} bytes", status=413)
            chunks.append(chunk)
    return b"".join(chunks)


async def read_json(request: Request, max_bytes: int, *, empty: Any = None) -> Any:
    """The request's JSON body (within ``max_bytes``; ``empty`` for no body at all, if
    given).

    Raises:
        HttpError: ``limit_exceeded`` (413); ``invalid_json`` (not UTF-8 JSON, NaN or
            Infinity, nested too deeply, or an empty body where one is needed);
            ``invalid_request`` (a string holding NUL or a lone surrogate).
    """
    body = await read_body(request, max_bytes)
    if not body.strip():
        if empty is not None:
            return empty
        raise HttpError("invalid_json", "the request needs a JSON body")
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise HttpError("invalid_json", "the body is not UTF-8") from None
    except RecursionError:
        raise HttpError("invalid_json", "JSON nested too deeply") from None
    except ValueError as exc:
        raise HttpError("invalid_json", f"not valid JSON: {exc}") from None
    if _unstorable(data):
        raise HttpError(
            "invalid_request",
            "a string holds a NUL character or a lone surrogate (U+D800..U+DFFF):"
            " strings must be Unicode text without NUL",
        )
    return data
