"""The control channel: drive runs over websockets (``trio-websocket``).

Server side, :class:`WebsocketFace` is the channel as a face of any run host
(:func:`trio_agents.hosting.serve`), and :class:`ControlServer` (or
:func:`open_control_server`) the convenience that builds a host and serves that one face
over it, speaking the JSON wire format of ``docs/protocol.md`` (subprotocol
``trio-agents.v1``). The settings every face shares (:class:`Limits`, :data:`Auth`,
:class:`RunInfo`, :data:`ERROR_CODES`, ...) are ``trio_agents.hosting``'s, re-exported
here. Client side,
:func:`connect` gives a :class:`ControlClient` whose :meth:`~ControlClient.start`
returns a :class:`RemoteRun` with the verbs of a local :class:`~trio_agents.Run`.
"""

from .._events import event_from_json as event_from_json
from .._exceptions import ControlConnectionError as ControlConnectionError
from .._exceptions import ControlError as ControlError
from ..hosting import ContextHook as ContextHook
from ..hosting import RunStartInfo as RunStartInfo
from ._client import ControlClient as ControlClient
from ._client import RemoteRun as RemoteRun
from ._client import connect as connect
from ._protocol import ERROR_CODES as ERROR_CODES
from ._protocol import SUBPROTOCOL as SUBPROTOCOL
from ._protocol import Limits as Limits
from ._protocol import RunInfo as RunInfo
from ._server import Auth as Auth
from ._server import ControlServer as ControlServer
from ._server import ControlServerStatistics as ControlServerStatistics
from ._server import PrincipalStatistics as PrincipalStatistics
from ._server import SessionFactory as SessionFactory
from ._server import WebsocketFace as WebsocketFace
from ._server import open_control_server as open_control_server
from ._server import sqlite_sessions as sqlite_sessions

__all__ = [
    "ERROR_CODES",
    "SUBPROTOCOL",
    "Auth",
    "ContextHook",
    "ControlClient",
    "ControlConnectionError",
    "ControlError",
    "ControlServer",
    "ControlServerStatistics",
    "Limits",
    "PrincipalStatistics",
    "RemoteRun",
    "RunInfo",
    "RunStartInfo",
    "SessionFactory",
    "WebsocketFace",
    "connect",
    "event_from_json",
    "open_control_server",
    "sqlite_sessions",
]
