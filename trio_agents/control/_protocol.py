"""The wire format of the control channel, version 1 (subprotocol ``trio-agents.v1``).

One JSON object per websocket text frame. Requests carry a client-chosen ``id`` that
the answer (an ``ack`` or an ``error`` frame) echoes; ``event`` frames carry one run
event. This module builds answer frames; the codes, :class:`Limits` and
:class:`RunInfo` are the hosting layer's (``hosting/_error_codes.py``, ``_server_limits.py``,
``_run_info.py``; re-exported here), request frames are parsed in
``hosting/_requests.py``. No I/O. See ``docs/protocol.md`` for every frame.
"""

from __future__ import annotations

from typing import Any, Final

from ..hosting._error_codes import ERROR_CODES, ErrorCode, ProtocolError
from ..hosting._run_info import RunInfo
from ..hosting._server_limits import MAX_ID_LENGTH, MAX_NAME_LENGTH, MAX_REASON_LENGTH, Limits

__all__ = [
    "ERROR_CODES",
    "MAX_ID_LENGTH",
    "MAX_NAME_LENGTH",
    "MAX_REASON_LENGTH",
    "SUBPROTOCOL",
    "ErrorCode",
    "Limits",
    "ProtocolError",
    "RunInfo",
    "ack_frame",
    "error_frame",
]

SUBPROTOCOL: Final = "trio-agents.v1"
"""The websocket subprotocol of wire format version 1."""

# ---------------------------------------------------------------------- answers


def ack_frame(request_id: str | int, **data: Any) -> dict[str, Any]:
    """An ``ack`` frame answering ``request_id`` (extra fields per op)."""
    return {"type": "ack", "id": request_id, **data}


def error_frame(code: str, message: str, request_id: str | int | None) -> dict[str, Any]:
    """An ``error`` frame (``id`` is None when the request's id could not be read)."""
    return {"type": "error", "id": request_id, "code": code, "message": message}
