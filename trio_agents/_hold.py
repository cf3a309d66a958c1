"""Serving a run while a block holds its handle: the semantics of ``open_run``,
shared by :func:`~trio_agents.open_run` (``_entry.py``) and ``ctx.open_run``
(``_children.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from ._exception_groups import first_leaf, only_cancelled
from ._run import Run

__all__ = ["hold"]


@asynccontextmanager
async def hold(handle: Run) -> AsyncIterator[Run]:
    """Serve ``handle`` (its session claimed) in a nursery of the caller's while the
    ``async with`` body holds it: :func:`open_run`'s semantics, shared with
    ``ctx.open_run`` (``_children.py``)."""
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            go = trio.Event()
            await nursery.start(handle._serve, go)
            # The run starts at the body's first checkpoint: a cancel() on the body's
            # first line is guaranteed to come before any model call.
            go.set()
            try:
                yield handle
            except BaseException as exc:
                body_error = exc
                if not isinstance(exc, trio.Cancelled):
                    handle.cancel("caller exited")
    except BaseExceptionGroup as group:
        # Our run task raises only Cancelled (an outer cancellation) or a
        # BaseException like KeyboardInterrupt; never unwrap several real errors.
        if body_error is None:
            if only_cancelled(group):
                raise first_leaf(group) from None
            raise
        if not only_cancelled(group):
            raise
    if body_error is not None:
        raise body_error
