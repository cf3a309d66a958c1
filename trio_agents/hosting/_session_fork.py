"""The host op ``fork_session`` (DESIGN §23), what its one-process and cluster forms
share: resolving an event position ``(run_id, seq)`` to an item index from a run this
process remembers, and forking a session of a store (a factory's, the cluster's).

Every refusal is a :class:`ProtocolError` (the host turns it into its
:class:`~trio_agents.hosting.HostError`): ``not_found`` for a session that holds no
items (another principal's included: its stored id is another one), ``invalid_request``
for a bad position or a new id that already holds items, ``session_busy`` when the new
id has an active run.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from .._events import EventsDropped, RunItemEvent
from .._run import Run
from ..sessions import Session, SessionExistsError, fork_session
from ._error_codes import ProtocolError
from ._sessions import SessionFactory

__all__ = [
    "close_session",
    "event_index",
    "fork_from_factory",
    "fork_stored",
    "item_index_of",
    "item_position",
    "not_found",
]


def not_found(session_id: str) -> ProtocolError:
    return ProtocolError("not_found", f"no session {session_id!r}")


async def _count(session: Any) -> int:
    """How many items ``session`` stores: its ``statistics()``' ``item_count`` (a count
    in the database, for ``SQLiteSession`` and ``PostgresSession``: a 10,000-item fork
    is not read back), else the length of what it loads."""
    statistics = getattr(session, "statistics", None)
    if statistics is not None and inspect.iscoroutinefunction(statistics):
        count = getattr(await statistics(), "item_count", None)
        if isinstance(count, int):
            return count
    raw = getattr(session, "get_stored_items", None)
    items = await (raw() if raw is not None else session.get_items())
    return len(items)


async def close_session(session: Any) -> None:
    """Close a session object made for the op (``aclose`` when it has one)."""
    aclose = getattr(session, "aclose", None)
    if aclose is not None:
        await aclose()


async def event_index(run: Run | None, run_id: str, seq: int) -> int:
    """The number of items the session held once the run's event ``seq`` had been
    applied: the history the run loaded, plus its items whose ``run.item`` event has a
    seq <= ``seq``.

    Needs the run's result (the history's length: what the run loaded is its
    conversation before its new items), so the run must have ended, and the run's log
    must still hold the events after ``seq`` up to its end (or every ``run.item``
    after the events retention dropped must be after ``seq``).

    Raises:
        ProtocolError: ``invalid_request`` for a live run or a position retention lost.
    """
    result = None if run is None else run.result
    if run is None or result is None:
        raise ProtocolError(
            "invalid_request",
            f"run {run_id!r} has not ended: an event position is resolved once the run"
            " has ended (fork a live run's session at an item index, or at its end)",
        )
    history = len(result.conversation) - len(result.new_items)
    retained: list[int] = []
    dropped_until = 0
    async for event in run.events(1):
        if isinstance(event, EventsDropped):
            dropped_until = event.seq  # the last missing seq
        elif isinstance(event, RunItemEvent):
            retained.append(event.seq)
    if seq < dropped_until:
        raise ProtocolError(
            "invalid_request",
            f"run {run_id!r}'s events up to seq {dropped_until} are no longer retained:"
            f" the position {seq} cannot be resolved; fork at an item index",
        )
    # The run.item events retention dropped are all at or before `seq`.
    lost = len(result.new_items) - len(retained)
    return history + lost + sum(1 for s in retained if s <= seq)


def item_position(run_id: str, seq: int, items: Sequence[tuple[int, int | None]]) -> int:
    """The number of items the run's session held once the run's event ``seq`` had
    been applied, from the run's ``run.item`` events alone: ``items`` is the ``(seq,
    index)`` of every one of them, in seq order (``index``: the item's position in the
    run's conversation, which is its session). The last item at or before ``seq``, and
    everything before it; before the run's first item, the session as the run found
    it (that item's index). Works for a live run as for an ended one, wherever its
    events are stored (a cluster's table, a Temporal host's store).

    Raises:
        ProtocolError: ``invalid_request`` when the run added no item, or its events
            do not say where its items are (written before ``run.item`` carried its
            ``index``).
    """
    if not items:
        raise ProtocolError(
            "invalid_request",
            f"run {run_id!r} added no item to its session: the position {seq} says nothing"
            " about it; fork at an item index",
        )
    if any(index is None for _, index in items):
        raise ProtocolError(
            "invalid_request",
            f"run {run_id!r}'s events do not say where its items are in its session"
            " (written before run.item carried its index): fork at an item index",
        )
    before = [index for s, index in items if s <= seq and index is not None]
    first = items[0][1]
    assert first is not None
    return before[-1] + 1 if before else first


def item_index_of(event: Mapping[str, Any]) -> int | None:
    """A ``run.item`` event's JSON ``index`` (None: missing, or not an int)."""
    index = event.get("index")
    return index if isinstance(index, int) and not isinstance(index, bool) else None


async def fork_stored(
    source: Session, target_id: str, index: int | None, session_id: str, new_session_id: str
) -> int:
    """Fork ``source`` (a session of a store, by its stored id) into ``target_id`` of the
    same store, tree included; returns the number of items the fork holds. Closes
    every session object it made (not ``source``). ``session_id`` and
    ``new_session_id`` are the ids as the client named them (errors name those, never
    the stored ids).

    Raises:
        ProtocolError: ``not_found`` (the source holds no items), ``invalid_request``
            (the new id, or one of its children, holds items).
    """
    if not await _count(source):
        raise not_found(session_id)
    fork: Any = getattr(source, "fork", None)
    try:
        if fork is not None:
            made = await fork(target_id, at=index)
        else:
            made = await fork_session(source, target_id, at=index)
    except SessionExistsError:
        raise ProtocolError(
            "invalid_request",
            f"session {new_session_id!r} (or a child session of its tree) already holds"
            " items: a fork never overwrites",
        ) from None
    except (TypeError, ValueError) as exc:
        raise ProtocolError("invalid_request", str(exc)) from None
    try:
        return await _count(made)
    finally:
        if made is not source:
            await close_session(made)


async def fork_from_factory(
    factory: SessionFactory,
    principal: str,
    session_id: str,
    new_session_id: str,
    index: int | None,
) -> int:
    """Fork the principal's ``session_id`` into ``new_session_id`` in the store of a
    host's session ``factory`` (the new id's stored id is the factory's); returns the
    number of items the fork holds. Closes every session object it made.

    Raises:
        ProtocolError: as :func:`fork_stored`.
    """
    source = factory(principal, session_id)
    try:
        target = factory(principal, new_session_id)
        target_id = target.session_id
        await close_session(target)
        return await fork_stored(source, target_id, index, session_id, new_session_id)
    finally:
        await close_session(source)
