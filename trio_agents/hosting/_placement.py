"""Where a host's runs live and what of them is made durable: :class:`RunPlacement`.

A :class:`~trio_agents.hosting.LocalHost` runs each run as a task in its nursery (the
run machinery: ``_registry.py``, ``_run_tasks.py``). What that machinery needs to know
about *where* a run lives is asked of one object, the host's placement, at each step of
a run's life, and never "is there a cluster?":

1. :meth:`RunPlacement.place` — before the run's task starts: claim its session (one
   active run per session, wherever runs run), make its durable record, say how the
   run core's own per-process claim applies (:attr:`PlacedRun.on_busy`), and give what
   guards the run (its :class:`Fence`, a ``before_tool`` barrier in
   :attr:`PlacedRun.run_options`).
2. :meth:`RunPlacement.started` — the run exists: attach its durable event log
   (:class:`EventLog`: a subscriber is given an event only once it is persisted).
   :meth:`RunPlacement.not_started` — the run did not start (bad input, session
   busy): undo what ``place`` made.
3. :meth:`RunPlacement.ended` — the run ended here (room freed).
4. :meth:`RunPlacement.cancel_elsewhere` — a client that started runs now running
   elsewhere went away: cancel them there (their ``on_disconnect="cancel"``).

The default, :class:`LocalPlacement`, is one process's: sessions in memory (metered per
principal) or from the host's session factory, nothing durable beyond the session,
nothing elsewhere. A distributed host (the PostgreSQL cluster,
``trio_agents.cluster``; a Temporal worker) gives its own, which claims sessions in the
shared store and persists each run's events; it resumes a run taken over with
:func:`~trio_agents.hosting._run_tasks.launch` and the run core's
:class:`~trio_agents.Resume` in :attr:`PlacedRun.run_options`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, final

import attrs

from .._items import Item
from .._limits import UsageLimits
from .._run import Run
from ..sessions import Session
from ._error_codes import ProtocolError
from ._sessions import MeteredSession, ScopedSession

if TYPE_CHECKING:
    from ._registry import Registry

__all__ = ["EventLog", "Fence", "LocalPlacement", "PlacedRun", "RunPlacement", "RunStart"]


class Fence(Protocol):
    """What ends a process's attempt of a run: once :attr:`closed`, the run's events
    and session writes here are no longer its own (it goes on elsewhere, from what was
    persisted). Events up to :attr:`fence_seq` (None: none more) were persisted before
    it closed and may still be given."""

    @property
    def closed(self) -> bool: ...
    @property
    def fence_seq(self) -> int | None: ...


class EventLog(Protocol):
    """What of a run's events is durable: a host gives a subscriber an event only once
    it is, so no client sees an event a crash could lose."""

    @property
    def persisted_seq(self) -> int: ...

    async def wait_persisted(self, seq: int) -> None:
        """Wait until event ``seq`` is persisted, or never will be by this attempt
        (then :attr:`persisted_seq` stays below it)."""


@attrs.frozen
class RunStart:
    """A run about to start here, as :meth:`RunPlacement.place` is asked to place it.

    Attributes:
        run_id, principal, agent, session_id, input: the run's.
        on_busy: the client's busy policy (``reject``, ``enqueue``, ``interrupt``).
        on_disconnect: the client's (``continue``, ``cancel``).
        owned: whether a client connected to this process owns the run (its
            disconnect applies ``on_disconnect``).
        client_node: the process that holds the client's connection when it is not
            this one (a start another process placed here), else None.
        command: the id of the routed command that placed this start here, if any.
        limits: the run's effective limits.
    """

    run_id: str
    principal: str
    agent: str
    session_id: str | None
    input: tuple[Item, ...]
    on_busy: str
    on_disconnect: str = "continue"
    owned: bool = False
    client_node: str | None = None
    command: int | None = None
    limits: UsageLimits | None = None


@attrs.frozen
class PlacedRun:
    """Where :meth:`RunPlacement.place` put a run.

    Attributes:
        session: the run's session (None: none).
        on_busy: the busy policy the run core applies to ``session`` in this process
            (the client's, or ``enqueue`` behind a holder the placement releases once
            the session is the run's wherever runs run).
        fence: what ends this process's attempt of the run (None: nothing does).
        run_options: options added to the run's :func:`~trio_agents.serve_run` (a
            ``before_tool`` barrier; a resumed run's ``resume``).
        close_session: whether the run's task closes ``session`` when the run ends.
    """

    session: Session | None
    on_busy: str
    fence: Fence | None = None
    run_options: Mapping[str, Any] = attrs.field(factory=dict)
    close_session: bool = False


class RunPlacement(abc.ABC):
    """Where a host's runs hold their sessions and what of them is durable (see the
    module docstring). Subclass it for a host whose runs share a store with other
    processes; :class:`LocalPlacement` is one process's."""

    @abc.abstractmethod
    async def place(self, start: RunStart) -> PlacedRun:
        """Claim the run's session and make its record, before its task starts.

        Raises:
            ProtocolError: ``session_busy`` (``on_busy="reject"`` and the session has
                an active run), ``limit_exceeded``, ``internal`` (the store cannot be
                reached).
        """

    def started(self, start: RunStart, placed: PlacedRun, run: Run) -> EventLog | None:
        """The run exists (its task started): its durable event log, if any. Called
        before the run's first checkpoint after its start returns."""
        return None

    async def not_started(self, start: RunStart, placed: PlacedRun) -> None:
        """The run did not start (its input was refused, its session busy): undo what
        :meth:`place` made. Called in a ``finally``: it must not checkpoint unless it
        undoes something (the local default does nothing)."""
        return None  # one process made nothing that outlives a run that did not start

    def ended(self, run_id: str) -> None:
        """A run of this process ended, or never started (room freed)."""
        return None  # the default has no room to count

    async def cancel_elsewhere(self, principal: str, run_ids: Iterable[str], reason: str) -> None:
        """Cancel runs this process's clients started that run elsewhere now (their
        client went away: ``on_disconnect="cancel"``); runs that ended meanwhile are
        ignored. None do in one process."""
        return None  # one process runs every run its clients started


@final
class LocalPlacement(RunPlacement):
    """One process's placement: a run's session is none, the principal's in-memory one
    (metered, released when the run ends) or the host's factory's (scoped to its
    principal, closed when the run ends); the run core's claim is the only one."""

    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._memory: dict[str, tuple[str, MeteredSession]] = {}

    async def place(self, start: RunStart) -> PlacedRun:
        # No checkpoint: the admission checks just made (room, start token) hold
        # until the run is registered, as they do for a start without a session.
        registry = self._registry
        if start.session_id is None:
            return PlacedRun(None, start.on_busy)
        if registry.session_factory is None:
            memory = registry.state_of(start.principal).sessions.acquire(start.session_id)
            if memory is None:
                raise ProtocolError(
                    "limit_exceeded",
                    f"in-memory sessions of this principal hold over"
                    f" {registry.limits.max_session_bytes_per_principal} bytes in active runs",
                )
            self._memory[start.run_id] = (start.principal, memory)
            return PlacedRun(memory, start.on_busy)
        session = registry.session_factory(start.principal, start.session_id)
        return PlacedRun(ScopedSession(session, start.principal), start.on_busy, close_session=True)

    def ended(self, run_id: str) -> None:
        held = self._memory.pop(run_id, None)
        if held is not None:
            principal, memory = held
            self._registry.state_of(principal).sessions.release(memory)
