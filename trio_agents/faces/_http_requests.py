"""What an HTTP face reads of a request: its principal (left on the ASGI scope by the
auth layer), its body within a bound, its JSON body; and how an answer shows a string
of the server's (an agent's description).
"""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Any, Final

from starlette.requests import Request

from .._text_cleaning import clean_text
from ..hosting._requests import reject_constant, unstorable
from ._http_errors import HttpError

__all__ = [
    "AUTHENTICATED_KEY",
    "PRINCIPAL_KEY",
    "principal_of",
    "read_body",
    "read_json",
    "shown_description",
]

# The key of the ASGI scope under which the auth layer leaves the principal.
PRINCIPAL_KEY: Final = "trio_agents.principal"
# The key of the ASGI scope under which serve_http leaves a function that the auth layer
# calls when the request's token is valid: the connection is no longer counted, nor
# timed, as an unauthenticated one (another ASGI server leaves none).
AUTHENTICATED_KEY: Final = "trio_agents.authenticated"


def principal_of(request: Request) -> str:
    """The authenticated principal of a request. Every route behind the auth layer has
    one; a public route (see :class:`~trio_agents.faces.Routes`) has none, and asking
    is a bug in that route."""
    principal = request.scope.get(PRINCIPAL_KEY)
    if not isinstance(principal, str):
        raise RuntimeError(f"{request.url.path} is a public route: it has no principal")
    return principal


def shown_description(description: str | None) -> str | None:
    """An agent's ``description`` as a listing shows it (``GET /agents``, the A2A agent
    card): cleaned as every user string entering an answer is (a lone surrogate would
    fail the whole answer's UTF-8 encoding)."""
    return None if description is None else clean_text(description)


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
        data = json.loads(body.decode("utf-8"), parse_constant=reject_constant)
    except UnicodeDecodeError:
        raise HttpError("invalid_json", "the body is not UTF-8") from None
    except RecursionError:
        raise HttpError("invalid_json", "JSON nested too deeply") from None
    except ValueError as exc:
        raise HttpError("invalid_json", f"not valid JSON: {exc}") from None
    # NUL and lone surrogates: valid JSON, but no session store can keep them (PostgreSQL
    # text refuses NUL, UTF-8 refuses a lone surrogate); the websocket channel refuses
    # them with the same checks (hosting/_requests.py), so every face answers the same.
    if unstorable(data):
        raise HttpError(
            "invalid_request",
            "a string holds a NUL character or a lone surrogate (U+D800..U+DFFF):"
            " strings must be Unicode text without NUL",
        )
    return data
