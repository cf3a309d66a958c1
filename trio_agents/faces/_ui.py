"""The web UI face: the page at ``/ui`` and the one call it needs beyond REST,
``GET /agents`` (DESIGN §19).

``GET /agents`` lists each served agent's name and its ``Agent.description`` (null
when none was given): what its author chose to publish, never its instructions (the
system prompt is not for every token holder).

The page is static files shipped in the package (``faces/ui/``: HTML, CSS, plain
JavaScript — the run tree's timeline in its own ``timeline.js``, the comparison of two
runs and the replay of model calls in ``compare.js``; no build step, nothing fetched
from another host). They are *public* routes — they hold no run and no principal's
data — and every call the page makes is an ordinary authenticated REST call
(``Authorization: Bearer``, from ``fetch``), so the UI sees exactly what the REST face
lets its principal see and nothing more. The token never travels in a URL: the page
reads event streams with ``fetch`` rather than ``EventSource`` (which cannot send
headers) and re-attaches with ``Last-Event-ID``.

The files are read once, when the app is built, and served from memory with headers
that keep the page to itself: a Content-Security-Policy allowing only this origin
(``connect-src 'self'``: the page cannot send the token anywhere else), no referrer,
no framing, no caching of a stale script after an upgrade.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from ._face import Face, Routes
from ._http_requests import principal_of, shown_description

__all__ = ["UI_PATH", "routes"]

UI_PATH: Final = "/ui/"
"""Where the page is served (``trio-agents serve`` prints this URL)."""

_FILES: Final = {
    "index.html": "text/html; charset=utf-8",
    "ui.css": "text/css; charset=utf-8",
    "ui.js": "text/javascript; charset=utf-8",
    # The run tree's timeline (DESIGN §23): its own script and style beside the page's.
    "timeline.js": "text/javascript; charset=utf-8",
    "timeline.css": "text/css; charset=utf-8",
    # Two runs' conversations side by side, and the replay of recorded model calls.
    "compare.js": "text/javascript; charset=utf-8",
    "compare.css": "text/css; charset=utf-8",
}

_HEADERS: Final = {
    # Only this origin: no script, style or connection elsewhere; no <base>, no forms
    # posting away, never inside another site's frame.
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
        " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    # Revalidate every load: an upgraded server never runs yesterday's script.
    "Cache-Control": "no-cache",
}


def _load() -> dict[str, bytes]:
    folder = resources.files(__package__).joinpath("ui")
    return {name: folder.joinpath(name).read_bytes() for name in _FILES}


def routes(face: Face) -> Routes:
    """The UI's static files (public) and ``GET /agents`` (authenticated)."""
    files = _load()

    async def page(request: Request) -> Response:
        name = request.path_params.get("name") or "index.html"
        if name not in files:
            return Response(b"not found\n", status_code=404, media_type="text/plain")
        return Response(files[name], media_type=_FILES[name], headers=_HEADERS)

    async def bare(_request: Request) -> Response:
        # the page's relative links need the trailing slash
        return RedirectResponse(UI_PATH, status_code=308)

    async def agents(request: Request) -> Response:
        principal_of(request)  # behind the auth layer: a principal, or 401 before here
        # What a listing shows of an agent: its served name and the description its
        # author chose to publish (Agent.description), never its instructions.
        listed = [
            {"name": name, "description": shown_description(agent.description)}
            for name, agent in sorted(face.host.agents.items())
        ]
        return JSONResponse({"agents": listed}, headers={"Cache-Control": "no-store"})

    return Routes(
        public=[
            Route("/ui", bare, methods=["GET"]),
            Route(UI_PATH, page, methods=["GET"]),
            Route(UI_PATH + "{name}", page, methods=["GET"]),
        ],
        routes=[Route("/agents", agents, methods=["GET"])],
    )
