"""What every HTTP face is built from: the :class:`Face` its ``routes`` function is
given (the host, the limits, the count of event streams), the :class:`Routes` it
returns, and :class:`FaceRoutes`, the type of that function. Below every face module
(they import it; it imports none of them) and below the app that composes them
(``_app.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, final

import attrs
import trio
from starlette.routing import BaseRoute

from ..hosting import RunHost
from ._http_errors import HttpError
from ._http_limits import HttpLimits

__all__ = ["Face", "FaceRoutes", "HttpStatistics", "Routes"]


@attrs.frozen(kw_only=True)
class Routes:
    """What one face serves.

    Attributes:
        routes: served to authenticated requests only (the request's principal:
            :func:`~trio_agents.faces.principal_of`).
        public: served without a token — only what holds no run and no principal's
            data (the web UI's static files, an agent card).
    """

    routes: Sequence[BaseRoute] = ()
    public: Sequence[BaseRoute] = ()


@attrs.frozen
class HttpStatistics:
    """A snapshot of an :class:`HttpApp`.

    Attributes:
        streams: open event streams (every face's).
        closing: whether the server is shutting down.
    """

    streams: int
    closing: bool


@final
@attrs.define(eq=False)
class Face:
    """What a face's ``routes`` function is given: the host, the limits, and the
    bookkeeping of event streams every face shares.

    Attributes:
        host: the run host every face is a client of.
        limits: the :class:`HttpLimits`.
    """

    host: RunHost
    limits: HttpLimits
    _streams: dict[str, int] = attrs.field(init=False, factory=dict)
    _closing: trio.Event = attrs.field(init=False, factory=trio.Event)
    # The replay token bucket of each principal that replayed: (tokens, refilled at).
    _replays: dict[str, tuple[float, float]] = attrs.field(init=False, factory=dict)

    @property
    def closing(self) -> bool:
        """Whether the server is shutting down (new streams are refused)."""
        return self._closing.is_set()

    async def wait_closing(self) -> None:
        """Wait until the server begins to shut down (what a face with a task of its
        own, the MCP face's session manager, stops on)."""
        await self._closing.wait()

    def begin_shutdown(self) -> None:
        """The server is shutting down: new event streams are refused from now on."""
        self._closing.set()

    def take_replay(self, principal: str) -> None:
        """Count one replay of ``principal`` against ``replay_rate`` /
        ``replay_burst`` (``limit_exceeded`` when its bucket is empty; O(1))."""
        rate, burst = self.limits.replay_rate, float(self.limits.replay_burst)
        now = trio.current_time()
        tokens, refilled = self._replays.get(principal, (burst, now))
        tokens = min(burst, tokens + (now - refilled) * rate)
        if tokens < 1.0:
            self._replays[principal] = (tokens, now)
            raise HttpError(
                "limit_exceeded",
                f"too many replays (at most {rate:g} per second, {burst:g} at once)",
            )
        self._replays[principal] = (tokens - 1.0, now)

    def open_stream(self, principal: str) -> Callable[[], None]:
        """Count an event stream of ``principal`` (``limit_exceeded`` past
        ``max_streams_per_principal``, 503 ``internal`` once shutting down); returns
        the function that un-counts it (call it exactly once)."""
        if self.closing:
            raise HttpError("internal", "the server is shutting down", status=503)
        held = self._streams.get(principal, 0)
        if held >= self.limits.max_streams_per_principal:
            raise HttpError(
                "limit_exceeded",
                f"{held} event streams are open; at most"
                f" {self.limits.max_streams_per_principal} per principal",
            )
        self._streams[principal] = held + 1
        done = False

        def close() -> None:
            nonlocal done
            if done:
                return
            done = True
            left = self._streams[principal] - 1
            if left:
                self._streams[principal] = left
            else:
                del self._streams[principal]

        return close

    def statistics(self) -> HttpStatistics:
        """Counts of open event streams."""
        return HttpStatistics(streams=sum(self._streams.values()), closing=self.closing)


class FaceRoutes(Protocol):
    """The ``routes`` function of a face module."""

    def __call__(self, face: Face) -> Routes: ...
