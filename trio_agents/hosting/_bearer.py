"""Bearer token → principal, shared by every face that authenticates a client (the
websocket handshake, the HTTP faces' auth layer): one :data:`Auth`, one constant-time
compare."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from typing import TypeAlias

__all__ = ["Auth", "authenticate"]

logger = logging.getLogger("trio_agents.hosting")

Auth: TypeAlias = Mapping[str, str] | Callable[[str], str | None]
"""Bearer token → principal: a mapping, or a callable returning None for a bad token."""


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
