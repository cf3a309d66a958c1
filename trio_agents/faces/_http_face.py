"""The HTTP faces as one face of :func:`trio_agents.hosting.serve`: :class:`HttpFaces`
builds the ASGI app of the chosen faces (:func:`~trio_agents.faces.http_app`) over the
host it is given and serves it with Hypercorn (:func:`~trio_agents.faces.serve_http`).

Its shutdown is :func:`~trio_agents.faces.serve_http`'s, started when the server's
begins: stop accepting, refuse new event streams (503), close idle keep-alive
connections, and give requests and streams in flight ``limits.shutdown_timeout`` —
a stream ends with its run's terminal update, which the host's shutdown emits.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import final

import trio

from ..hosting import Auth, RunHost
from ._app import FACES, HttpApp, http_app
from ._http_limits import HttpLimits
from ._hypercorn import serve_http

__all__ = ["HttpFaces"]


@final
class HttpFaces:
    """REST + SSE, A2A, AG-UI and the web UI (or the ones named in ``faces``) on one
    port, as a face of any :class:`~trio_agents.hosting.RunHost`, for
    :func:`trio_agents.hosting.serve`.

    Args:
        auth: bearer token → principal (the websocket channel's
            :data:`~trio_agents.hosting.Auth`).
        host: the address to listen on (None: every interface).
        port: the port (0 picks a free one; :attr:`port` is the bound one once open).
        limits: the :class:`HttpLimits` (default ``HttpLimits()``).
        faces: the faces served, by name (default: every face in :data:`FACES`).

    Attributes:
        app: the :class:`HttpApp` once open (None before).
    """

    def __init__(
        self,
        *,
        auth: Auth,
        host: str | None = "127.0.0.1",
        port: int = 0,
        limits: HttpLimits | None = None,
        faces: Iterable[str] = FACES,
    ) -> None:
        limits = limits if limits is not None else HttpLimits()
        if not isinstance(limits, HttpLimits):
            raise TypeError("limits must be an HttpLimits")
        self._auth = auth
        self._bind = host
        self.port = port
        self._limits = limits
        self._faces = tuple(faces)
        self.app: HttpApp | None = None
        # serve_http runs in a shielded scope of its own: the server's cancellation does
        # not reach it; begin_shutdown cancels it, which starts its graceful shutdown.
        self._scope = trio.CancelScope(shield=True)
        self._closed = trio.Event()

    async def open(self, host: RunHost, nursery: trio.Nursery) -> int:
        """Build the app over ``host`` and listen; returns the bound port (see
        :class:`~trio_agents.hosting.ServedFace`)."""
        if self.app is not None:
            raise RuntimeError("this HttpFaces is already open")
        self.app = http_app(host, auth=self._auth, limits=self._limits, faces=self._faces)
        port: int = await nursery.start(self._serve, self.app)
        self.port = port
        return port

    async def _serve(self, app: HttpApp, *, task_status: trio.TaskStatus[int]) -> None:
        try:
            with self._scope:
                await serve_http(app, self._bind, self.port, task_status=task_status)
        finally:
            self._closed.set()

    def begin_shutdown(self, deadline: float) -> None:
        """Start serve_http's graceful shutdown (its own bound is
        ``limits.shutdown_timeout``)."""
        self._scope.cancel()

    def runs_stopped(self) -> None:
        """Nothing to do: an event stream ends with its run's terminal update."""

    async def wait_closed(self) -> None:
        """Wait until serve_http has closed every connection."""
        await self._closed.wait()

    def force_close(self) -> None:
        """Nothing to force: serve_http bounds its own shutdown."""
