"""The hosting layer: :class:`RunHost`, the interface every face of the server (the
websocket control channel, HTTP + SSE, A2A, AG-UI, the web UI) is a client of, and
:func:`serve`, which composes any set of faces over any host (DESIGN §19 and §20).

A server is faces over a host: ``serve(host, faces)`` with a :class:`LocalHost` (one
process) or a cluster node's host (``PostgresCluster.host(...)``), and faces such as
``trio_agents.control.WebsocketFace`` and ``trio_agents.faces.HttpFaces``. What every
face and host shares lives here: :class:`Limits`, :data:`Auth`, :class:`RunInfo`,
:class:`HostError` and the error codes (:data:`ERROR_CODES`).

Layers, from the bottom: the run core (``trio_agents``) → ``hosting`` (the registry,
the ops, the serving) → the hosts and faces over it (``cluster``, ``control``,
``faces``), siblings that never import each other (docs/architecture.md).
"""

from ._bearer import Auth as Auth
from ._compose import ServedFace as ServedFace
from ._compose import open_server as open_server
from ._compose import serve as serve
from ._error_codes import ERROR_CODES as ERROR_CODES
from ._error_codes import ErrorCode as ErrorCode
from ._host import HostedEvent as HostedEvent
from ._host import HostError as HostError
from ._host import Origin as Origin
from ._host import RunHost as RunHost
from ._host import StartRequest as StartRequest
from ._local import HostStatistics as HostStatistics
from ._local import LocalHost as LocalHost
from ._placement import EventLog as EventLog
from ._placement import Fence as Fence
from ._placement import PlacedRun as PlacedRun
from ._placement import RunPlacement as RunPlacement
from ._placement import RunStart as RunStart
from ._policies import ContextHook as ContextHook
from ._policies import RunStartInfo as RunStartInfo
from ._registry import PrincipalStatistics as PrincipalStatistics
from ._run_info import RunInfo as RunInfo
from ._run_timeline import run_timeline as run_timeline
from ._server_limits import Limits as Limits
from ._sessions import SessionFactory as SessionFactory
from ._sessions import sqlite_sessions as sqlite_sessions

__all__ = [
    "ERROR_CODES",
    "Auth",
    "ContextHook",
    "ErrorCode",
    "EventLog",
    "Fence",
    "HostError",
    "HostStatistics",
    "HostedEvent",
    "Limits",
    "LocalHost",
    "Origin",
    "PlacedRun",
    "PrincipalStatistics",
    "RunHost",
    "RunInfo",
    "RunPlacement",
    "RunStart",
    "RunStartInfo",
    "ServedFace",
    "SessionFactory",
    "StartRequest",
    "open_server",
    "run_timeline",
    "serve",
    "sqlite_sessions",
]
