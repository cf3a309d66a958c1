"""The error codes of DESIGN §10, which every face and host shares: :data:`ErrorCode`,
:data:`ERROR_CODES`, and :class:`ProtocolError`, a request's refusal carrying one.

They began as the websocket channel's wire format (``control/_protocol.py`` re-exports
them); every face maps them to its own wire (an ``error`` frame, an HTTP status and JSON
body, a JSON-RPC error). No I/O.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias, get_args

__all__ = ["ERROR_CODES", "ErrorCode", "ProtocolError"]

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

# The same codes as ErrorCode, read from it: one list to keep.
ERROR_CODES: Final[tuple[str, ...]] = get_args(ErrorCode)
"""Every ``code`` an ``error`` frame can carry."""


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
