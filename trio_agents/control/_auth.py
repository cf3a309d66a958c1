"""The control server's handshake checks: bearer token → principal, origin, subprotocol."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from typing import TypeAlias

from trio_websocket import WebSocketRequest

from ._protocol import SUBPROTOCOL

__all__ = ["Auth", "authenticate", "check_handshake"]

logger = logging.getLogger("trio_agents.control")

Auth: TypeAlias = Mapping[str, str] | Callable[[str], str | None]
"""Bearer token → principal: a mapping, or a callable returning None for a bad token."""


def _header(request: WebSocketRequest, name: bytes) -> str | None:
    for key, value in request.headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def authenticate(auth: Auth, header: str | None) -> str | None:
    """The principal an ``Authorization`` header names, or None.

    A mapping's tokens are all compared, each in constant time, so the time taken does
    not tell which (or whether a) token matched. A callable that raises or returns
    something other than a str or None rejects the handshake.
    """
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    if isinstance(auth, Mapping):
        given = token.encode()
        found: str | None = None
        for known, name in auth.items():
            if hmac.compare_digest(given, known.encode()):
                found = name
        return found
    try:
        principal: object = auth(token)
    except Exception:
        logger.exception("the auth callable raised; rejecting the handshake")
        return None
    if principal is not None and not isinstance(principal, str):
        logger.error("the auth callable returned %r, not a str or None", principal)
        return None
    return principal


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
