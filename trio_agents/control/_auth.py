"""The control server's handshake checks: bearer token → principal (``hosting/_bearer.py``,
shared with the HTTP faces), origin, subprotocol."""

from __future__ import annotations

from trio_websocket import WebSocketRequest

from ..hosting._bearer import Auth, authenticate
from ._protocol import SUBPROTOCOL

__all__ = ["Auth", "authenticate", "check_handshake"]


def _header(request: WebSocketRequest, name: bytes) -> str | None:
    for key, value in request.headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


async def check_handshake(
    request: WebSocketRequest, auth: Auth, allowed_origins: frozenset[str] | None
) -> str | None:
    """Authenticate; reject (401/403/400) and return None, or return the principal."""
    principal = authenticate(auth, _header(request, b"authorization"))
    if principal is None:
        await request.reject(
            401,
            extra_headers=[(b"WWW-Authenticate", b'Bearer realm="trio-agents"')],
            body=b"a valid 'Authorization: Bearer <token>' header is required\n",
        )
        return None
    origin = _header(request, b"origin")
    if allowed_origins is not None and origin is not None and origin not in allowed_origins:
        await request.reject(403, body=b"origin not allowed\n")
        return None
    if SUBPROTOCOL not in request.proposed_subprotocols:
        await request.reject(400, body=f"subprotocol {SUBPROTOCOL} required\n".encode())
        return None
    return principal
