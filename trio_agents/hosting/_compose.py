"""A server is faces over a host: :func:`serve` composes any set of faces over any
:class:`~trio_agents.hosting.RunHost` (DESIGN §20).

The host owns the runs; a face owns its listeners and its clients. :func:`serve` opens
the host, then every face, and on cancellation runs one shutdown, shielded and bounded
by the host's ``limits.shutdown_timeout``, interleaving the two in the only order that
loses nothing::

    deadline = host.begin_shutdown()      no new run starts
    face.begin_shutdown(deadline)         each face stops accepting new clients
    host.stop_runs(deadline)              runs cancelled ("server shutdown"), or a
                                          cluster node's handed over
    face.runs_stopped()                   faces close their clients once the clients'
                                          subscriptions carried the terminal updates
    host.wait_runs(deadline)              repairs done, sessions written
    face.wait_closed()                    until deadline + 1 s at most
    face.force_close(); host.force_stop() past the bound: whatever is left

Like :func:`trio.serve_tcp`: ``await nursery.start(serve, host, faces)`` returns once
everything listens (with what each face's ``open`` returned: its port), and the
cancellation of the scope around it is the graceful shutdown; :func:`open_server` is
the same for the duration of a block.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import NoReturn, Protocol

import trio

from .._exception_groups import first_leaf, leaves, only_cancelled
from .._serving import serving
from ._host import RunHost

__all__ = ["ServedFace", "open_server", "serve"]

# A face still flushing past the runs' deadline gets this much more before it is cut
# (a terminal update emitted at the deadline still reaches its subscribers).
_FLUSH_GRACE = 1.0


class ServedFace(Protocol):
    """A face as :func:`serve` runs it: a client of the host that listens somewhere
    (``trio_agents.control.WebsocketFace``, ``trio_agents.faces.HttpFaces``). See the
    module docstring for when each method is called."""

    async def open(self, host: RunHost, nursery: trio.Nursery) -> int | None:
        """Listen, and serve clients over ``host`` from tasks in ``nursery`` (in a
        shielded scope of the face's own, so the shutdown decides when they stop);
        returns the bound port (None: the face listens on no port). Called once the
        host is open. An error here (the port is in use) stops the server."""
        ...

    def begin_shutdown(self, deadline: float) -> None:
        """Stop accepting new clients; the clients in flight have until ``deadline``."""
        ...

    def runs_stopped(self) -> None:
        """The host's runs are stopped: close each client once what it follows has
        carried its terminal update."""
        ...

    async def wait_closed(self) -> None:
        """Wait until every client is closed (bounded by the caller)."""
        ...

    def force_close(self) -> None:
        """Past the bound: close whatever client is left."""
        ...


async def serve(
    host: RunHost,
    faces: Sequence[ServedFace],
    *,
    task_status: trio.TaskStatus[list[int | None]] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Serve ``faces`` over ``host`` until cancelled.

    Start protocol: ``ports = await nursery.start(serve, host, [face, ...])`` returns
    what each face's ``open`` returned (its bound port), in order. When the scope
    around it is cancelled, the shutdown of the module docstring runs (shielded,
    bounded by ``host.limits.shutdown_timeout``), then the cancellation is re-raised.

    A face that fails to open (a port in use: ``OSError``) stops what was opened and
    raises its error as itself, not in a group, as :meth:`trio.Nursery.start` does; a
    host that fails to open (a cluster whose database is down) raises in a group.
    """
    faces = list(faces)
    opened: list[ServedFace] = []
    open_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            stop_host = await host.open(nursery)
            try:
                ports: list[int | None] = []
                for face in faces:
                    try:
                        ports.append(await face.open(host, nursery))
                    except BaseException as exc:
                        open_error = exc
                        raise
                    opened.append(face)
                task_status.started(ports)
                await trio.sleep_forever()
            finally:
                with trio.CancelScope(shield=True):
                    await _shut_down(host, opened)
                stop_host()
    except BaseExceptionGroup as group:
        rest = [leaf for leaf in leaves(group) if not isinstance(leaf, trio.Cancelled)]
        if open_error is not None and rest == [open_error]:
            raise open_error from None
        if only_cancelled(group):
            raise first_leaf(group) from None
        raise
    raise AssertionError("unreachable")  # pragma: no cover


async def _shut_down(host: RunHost, faces: list[ServedFace]) -> None:
    """The bounded shutdown of the module docstring."""
    deadline = host.begin_shutdown()
    for face in faces:
        face.begin_shutdown(deadline)
    await host.stop_runs(deadline)
    for face in faces:
        face.runs_stopped()
    await host.wait_runs(deadline)
    with trio.move_on_at(deadline + _FLUSH_GRACE):
        async with trio.open_nursery() as waiting:
            for face in faces:
                waiting.start_soon(face.wait_closed)
    for face in faces:
        face.force_close()
    host.force_stop()


@asynccontextmanager
async def open_server(
    host: RunHost, faces: Sequence[ServedFace]
) -> AsyncIterator[list[int | None]]:
    """Serve ``faces`` over ``host`` for the duration of the block (see :func:`serve`);
    the block gets what each face's ``open`` returned (its bound port). Leaving the
    block shuts the server down gracefully; an exception in the block propagates after
    that, as itself."""

    async def start(nursery: trio.Nursery) -> list[int | None]:
        ports: list[int | None] = await nursery.start(serve, host, faces)
        return ports

    async with serving(start) as ports:
        yield ports
