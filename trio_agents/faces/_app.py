"""The ASGI app of the HTTP faces: one Starlette app composed of every face's routes.

Every face is a module ``trio_agents/faces/_<name>.py`` with a function
``routes(face: Face) -> Routes`` (``_face.py``), listed in the static table
:data:`FACE_ROUTES` — adding a face is one import and one line there, and the import
tools see every face (none is imported from a string). No face imports another (an
import-linter contract of ``make lint``); what they share is in ``_face.py``,
``_http_errors.py``, ``_http_limits.py``, ``_http_requests.py`` and
``_event_stream.py``, below them.

The app puts each face's :attr:`Routes.routes` behind the bearer-token layer (the
websocket channel's :data:`~trio_agents.hosting.Auth`, compared in constant time;
tokens are read from the ``Authorization`` header only, never from a URL) and its
:attr:`Routes.public` (static files, an agent card) in front of it. So a route is
authenticated unless its face says otherwise, and a path no face serves answers 401
without a token and 404 with one: nothing tells an anonymous client what exists.

Errors: :class:`~trio_agents.hosting.HostError` and :class:`HttpError` raised by a
route become the JSON error answer (``_http_errors.py``); so do Starlette's own 404
and 405; anything else is logged and answers 500 ``internal``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from typing import Any, Final, final

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Router

from ..hosting import HostError, RunHost
from ..hosting._bearer import Auth, authenticate
from . import _a2a, _agui, _mcp, _rest, _ui
from ._face import Face, FaceRoutes, HttpStatistics
from ._http_errors import HOST_CODES, HttpError, error_response
from ._http_limits import HttpLimits
from ._http_requests import AUTHENTICATED_KEY, PRINCIPAL_KEY

__all__ = ["FACES", "FACE_ROUTES", "HttpApp", "http_app"]

logger = logging.getLogger("trio_agents.faces")

FACE_ROUTES: Final[Mapping[str, FaceRoutes]] = {
    # One line per face: its name and its module's routes function.
    "rest": _rest.routes,
    "a2a": _a2a.routes,
    "agui": _agui.routes,
    "ui": _ui.routes,
    "mcp": _mcp.routes,
}
"""Every face :func:`http_app` can serve, by name."""

FACES: Final[tuple[str, ...]] = tuple(FACE_ROUTES)
"""The faces :func:`http_app` serves by default, by name."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def face_routes(name: str) -> FaceRoutes:
    """The ``routes`` function of the face ``name`` (``ValueError`` for no such face)."""
    try:
        return FACE_ROUTES[name]
    except (KeyError, TypeError):
        raise ValueError(f"no face {name!r} (known: {', '.join(FACES)})") from None


@final
class _Authenticated:
    """The bearer-token layer: the principal on the request's scope, or 401."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], auth: Auth):
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # websockets are the control channel's, elsewhere
            raise HTTPException(404)
        principal = authenticate(self.auth, Headers(scope=scope).get("authorization"))
        if principal is None:
            response = error_response(
                "unauthorized",
                "a valid 'Authorization: Bearer <token>' header is required",
                headers={"WWW-Authenticate": 'Bearer realm="trio-agents"'},
            )
            await response(scope, receive, send)
            return
        scope[PRINCIPAL_KEY] = principal
        trusted = scope.get(AUTHENTICATED_KEY)
        if callable(trusted):
            trusted()
        await self.app(scope, receive, send)


async def _on_http_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HttpError)
    return error_response(exc.code, exc.message, status=exc.status, headers=exc.headers)


async def _on_host_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HostError)
    return error_response(HOST_CODES.get(exc.code, exc.code), exc.message)


async def _on_starlette(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response("not_found", "no such route")
    if exc.status_code == 405:
        # No op of this face is this method on this path: §10's unknown_op, in a 405.
        return error_response(
            "unknown_op", "this route does not take this method", status=405, headers=exc.headers
        )
    code = "internal" if exc.status_code >= 500 else "invalid_request"
    response = error_response(code, str(exc.detail), headers=exc.headers)
    response.status_code = exc.status_code
    return response


async def _on_crash(request: Request, exc: Exception) -> Response:
    logger.error("%s %s crashed", request.method, request.url.path, exc_info=exc)
    return error_response("internal", "the server failed to answer; the error is logged")


@final
class HttpApp:
    """The ASGI app of the HTTP faces (see the module docstring); build it with
    :func:`http_app`, serve it with :func:`~trio_agents.faces.serve_http` (or any
    ASGI server running on Trio)."""

    def __init__(self, face: Face, app: Starlette) -> None:
        self.face = face
        self._app = app

    @property
    def host(self) -> RunHost:
        """The run host every face is a client of."""
        return self.face.host

    @property
    def limits(self) -> HttpLimits:
        """The :class:`HttpLimits`."""
        return self.face.limits

    def statistics(self) -> HttpStatistics:
        """Counts of open event streams, for monitoring and tests."""
        return self.face.statistics()

    def shutdown(self) -> None:
        """The server is shutting down: new event streams are refused (503)."""
        self.face.begin_shutdown()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def http_app(
    host: RunHost,
    *,
    auth: Auth,
    limits: HttpLimits | None = None,
    faces: Iterable[str] = FACES,
) -> HttpApp:
    """The ASGI app serving ``faces`` (by name, default: every face in :data:`FACES`) of
    ``host``, authenticated with ``auth`` (token → principal, the same as the
    websocket channel's)."""
    if not (isinstance(auth, dict) or hasattr(auth, "items") or callable(auth)):
        raise TypeError("auth must be a mapping of token -> principal or a callable")
    limits = limits if limits is not None else HttpLimits()
    if not isinstance(limits, HttpLimits):
        raise TypeError("limits must be an HttpLimits")
    face = Face(host, limits)
    public: list[BaseRoute] = []
    private: list[BaseRoute] = []
    for name in faces:
        served = face_routes(name)(face)
        public.extend(served.public)
        private.extend(served.routes)
    app = Starlette(
        routes=[*public, Mount("", app=_Authenticated(Router(routes=private), auth))],
        exception_handlers={
            HttpError: _on_http_error,
            HostError: _on_host_error,
            HTTPException: _on_starlette,
            Exception: _on_crash,
        },
    )
    return HttpApp(face, app)
