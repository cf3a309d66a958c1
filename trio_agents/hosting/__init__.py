"""The hosting layer: :class:`RunHost`, the interface every face of the server (the
websocket control channel, HTTP + SSE, A2A, AG-UI) is a client of (DESIGN §19).

Layers, from the bottom: the run core (``trio_agents``) → ``hosting`` (the registry and
the ops) → ``cluster`` (a host over PostgreSQL) → the faces (``control``, the HTTP
faces). A face imports ``hosting`` only, never ``cluster``; ``cluster`` imports no face.
"""

from ._host import HostedEvent, HostError, Origin, RunHost, StartRequest
from ._local import LocalHost
from ._placement import EventLog, Fence, PlacedRun, RunPlacement, RunStart

__all__ = [
    "EventLog",
    "Fence",
    "HostError",
    "HostedEvent",
    "LocalHost",
    "Origin",
    "PlacedRun",
    "RunHost",
    "RunPlacement",
    "RunStart",
    "StartRequest",
]
