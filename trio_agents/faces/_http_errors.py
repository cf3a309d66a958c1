"""The error answer of every HTTP face: :data:`HTTP_STATUS`, :class:`HttpError`, the
JSON error body.

Errors travel as one JSON shape on every face that answers plain HTTP (REST, the web
UI's calls, AG-UI's refusals before its stream starts)::

    {"error": {"code": "<DESIGN §10 code>", "message": "<text safe to show>"}}

with the HTTP status :data:`HTTP_STATUS` gives the code. A face that must answer in
its own envelope (A2A's JSON-RPC errors) catches :class:`HttpError` and
:class:`~trio_agents.hosting.HostError` itself; the codes stay the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from starlette.responses import JSONResponse

__all__ = ["HOST_CODES", "HTTP_STATUS", "HttpError", "error_body", "error_response"]

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
