"""The HTTP faces of the server (DESIGN §19): REST + SSE, A2A, AG-UI and the web UI,
each a client of one :class:`~trio_agents.hosting.RunHost`, all in one ASGI app.

:func:`http_app` composes the faces' routes (behind the websocket channel's bearer
auth) into an :class:`HttpApp`; :func:`serve_http` serves it with Hypercorn's Trio
worker. A face is a module ``_<name>.py`` here with ``routes(face: Face) -> Routes``,
listed in :data:`FACES`. Needs the ``serve`` extra: ``pip install 'trio-agents[serve]'``.
"""

from ._app import FACES as FACES
from ._app import Face as Face
from ._app import HttpApp as HttpApp
from ._app import HttpStatistics as HttpStatistics
from ._app import Routes as Routes
from ._app import http_app as http_app
from ._event_stream import EventStream as EventStream
from ._event_stream import sse_message as sse_message
from ._hypercorn import serve_http as serve_http
from ._shared import HTTP_STATUS as HTTP_STATUS
from ._shared import HttpError as HttpError
from ._shared import HttpLimits as HttpLimits
from ._shared import error_body as error_body
from ._shared import error_response as error_response
from ._shared import principal_of as principal_of
from ._shared import read_json as read_json

__all__ = [
    "FACES",
    "HTTP_STATUS",
    "EventStream",
    "Face",
    "HttpApp",
    "HttpError",
    "HttpLimits",
    "HttpStatistics",
    "Routes",
    "error_body",
    "error_response",
    "http_app",
    "principal_of",
    "read_json",
    "serve_http",
    "sse_message",
]
