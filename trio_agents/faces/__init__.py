"""The HTTP faces of the server (DESIGN §19): REST + SSE, A2A, AG-UI and the web UI,
each a client of one :class:`~trio_agents.hosting.RunHost`, all in one ASGI app.

:class:`HttpFaces` serves them (or the ones named) over any host as one face of
:func:`trio_agents.hosting.serve`, beside the websocket channel's
:class:`~trio_agents.control.WebsocketFace`. Underneath, :func:`http_app` composes the
faces' routes (behind the bearer auth every face shares) into an :class:`HttpApp`, and
:func:`serve_http` serves it with Hypercorn's Trio worker. A face is a module
``_<name>.py`` here with ``routes(face: Face) -> Routes``, listed in the static table
of ``_app.py`` (:data:`FACES` names them). Needs the ``serve`` extra: ``pip install
'trio-agents[serve]'``.
"""

from ._app import FACES as FACES
from ._app import HttpApp as HttpApp
from ._app import http_app as http_app
from ._event_stream import EventStream as EventStream
from ._event_stream import sse_message as sse_message
from ._face import Face as Face
from ._face import HttpStatistics as HttpStatistics
from ._face import Routes as Routes
from ._http_errors import HTTP_STATUS as HTTP_STATUS
from ._http_errors import HttpError as HttpError
from ._http_errors import error_body as error_body
from ._http_errors import error_response as error_response
from ._http_face import HttpFaces as HttpFaces
from ._http_limits import HttpLimits as HttpLimits
from ._http_requests import principal_of as principal_of
from ._http_requests import read_json as read_json
from ._hypercorn import serve_http as serve_http

__all__ = [
    "FACES",
    "HTTP_STATUS",
    "EventStream",
    "Face",
    "HttpApp",
    "HttpError",
    "HttpFaces",
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
