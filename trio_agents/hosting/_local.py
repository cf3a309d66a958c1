"""The run host of one process: :class:`LocalHost`.

It owns the run registry (runs by id, per-principal counters, limits and retention:
``_registry.py``), the runs' tasks and sessions (``_run_tasks.py``, ``_sessions.py``)
and the ops, and gives every face the same calls over them (:class:`RunHost`).

Two ways to have one:

- Standalone: ``host = LocalHost(agents, sessions=..., limits=..., run_options=...,
  context=...)`` (the configuration :class:`~trio_agents.control.ControlServer` takes,
  minus the websocket's own ``auth`` and ``allowed_origins``), then ``async with
  host.running(): ...`` or ``await nursery.start(host.serve)``: the host needs a nursery
  for its runs and the reaper that forgets finished ones. Leaving the block (or
  cancelling ``serve``) cancels every run with reason ``"server shutdown"`` and waits
  for them, bounded by ``limits.shutdown_timeout``.
- Shared with a websocket server: ``ControlServer(...).host`` is the server's own host
  (same registry: a run started over HTTP is visible over the websocket and back),
  served by :meth:`ControlServer.serve` — do not ``serve`` it again.

Owners: a face that wants ``on_disconnect`` passes ``Origin(owner=token)`` to
:meth:`start` (any hashable object standing for the client connection or stream) and
calls :meth:`disconnected(token) <disconnected>` once that client is gone. The host
keeps one small record per live owner, forgotten by ``disconnected``.

Errors: every refusal is a :class:`HostError` with a §10 code; a face maps the code to
its wire. A run of another principal is ``not_found`` on every method.

A node of a cluster has a host of its own, ``trio_agents.cluster``'s ``ClusterHost``,
which wraps this one (placement, routing, durable records, the persisted event log);
``ControlServer(cluster=...).host`` is that one. The run machinery both are built over
(the registry, the run tasks, the policies, the sessions) lives here, in the hosting
layer, below the cluster and the faces (docs/architecture.md).

Changes to the interface: ``events``' ``from_seq`` may be None (from the oldest event
retained, without an ``events.dropped`` marker: what ``run.subscribe`` without
``from_seq`` does).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Literal, NoReturn, cast, final

import attrs
import trio

from .._agent import Agent
from .._events import EventsDropped, RunEvent, RunUpdated
from .._exception_groups import first_leaf, only_cancelled
from .._exceptions import InboxFullError, RunClosedError, UnknownCallError
from .._inbox import InjectionId
from .._items import Item
from .._limits import UsageLimits
from .._run import Run
from .._serving import serving
from ._error_codes import ProtocolError
from ._host import HostedEvent, HostError, Origin, StartRequest
from ._placement import EventLog
from ._policies import ContextHook, effective_limits, limits_to_wire
from ._registry import Owner, PrincipalStatistics, Registry, RunEntry
from ._run_info import RunInfo
from ._run_tasks import disconnected as _disconnected
from ._run_tasks import start_run
from ._server_limits import Limits
from ._session_fork import event_index, fork_from_factory
from ._sessions import SessionFactory, items_bytes, sqlite_sessions

__all__ = ["HostStatistics", "LocalHost", "host_errors"]

logger = logging.getLogger("trio_agents.hosting")

_SHUTDOWN = "server shutdown"


@attrs.frozen
class HostStatistics:
    """A snapshot of a host, from :meth:`LocalHost.statistics`.

    Attributes:
        active_runs: runs not yet finished.
        retained_runs: finished runs still visible (``retain_finished``).
    """

    active_runs: int
    retained_runs: int


@contextmanager
def host_errors() -> Iterator[None]:
    """The registry's refusals (``ProtocolError``) as the host's (:class:`HostError`)."""
    try:
        yield
    except ProtocolError as exc:
        code = exc.code
        if code == "invalid_json" or code == "unknown_op":  # wire-only: no op raises them
            raise HostError("invalid_request", exc.message) from None
        raise HostError(code, exc.message) from None


@final
@attrs.define(eq=False)
class _Owner:
    """What the registry needs of a run's owner (``_registry.Owner``), one per
    live owner token a face passed in :class:`Origin`."""

    principal: str
    owned: set[RunEntry] = attrs.field(factory=set)
    placed: set[str] = attrs.field(factory=set)


@final
class _Events:
    """The iterator :meth:`LocalHost.events` yields: the run's events (its subtree's,
    ``tree``) as :class:`HostedEvent`, ending after the terminal update.

    A plain subscription reads the run's log in batches (every event that is ready at
    one wake-up, one checkpoint per batch: a model's network read often carries many
    deltas), then hands them out one by one without a schedule point.

    On a node of a cluster, an event is given only once persisted (a client never sees
    an event a crash of this node could lose, and a terminal status only once the
    session is released cluster-wide), and the iteration ends where this node's
    attempt of the run stops (lease lost, hand-over): then :attr:`moved` is set and
    :attr:`next_seq` says where the run's persisted log continues.
    """

    def __init__(
        self,
        entry: RunEntry,
        *,
        from_seq: int | None,
        tree: bool,
        status_only: bool,
        logs: Callable[[str], EventLog | None] | None = None,
    ) -> None:
        run = entry.run
        assert run is not None
        self._entry = entry
        self._status_only = status_only
        self._batches: AsyncIterator[list[RunEvent]] | None = None
        self._cursor: AsyncIterator[RunEvent] | None = None
        if tree:
            self._cursor = run.events(tree=True)
        else:
            self._batches = run.events(from_seq).batches()
        self._ready: deque[RunEvent] = deque()
        self._fence = entry.tree.fence
        self._log = entry.log  # None for a child run, and in one process
        # The durable log of any run of the tree, by id (a child run's too: its
        # events are persisted under its own id), while it is written.
        self._logs = logs
        self._ended = False
        self.moved = False
        self.next_seq = from_seq  # after the last event given of the run itself

    def __aiter__(self) -> _Events:
        return self

    async def _next_event(self) -> RunEvent | None:
        if self._ready:
            return self._ready.popleft()
        try:
            if self._batches is not None:
                self._ready.extend(await self._batches.__anext__())
                return self._ready.popleft()
            assert self._cursor is not None
            return await self._cursor.__anext__()
        except StopAsyncIteration:
            return None

    async def __anext__(self) -> HostedEvent:
        while not self._ended:
            event = await self._next_event()
            if event is None:
                self._ended = True
                break
            if not await self._ours(event):
                self._ended = self.moved = True
                break
            if self._status_only and not isinstance(event, RunUpdated | EventsDropped):
                continue
            if event.run_id == self._entry.run_id:
                self.next_seq = event.seq + 1
            return HostedEvent(event.run_id, event.seq, event.to_json())
        raise StopAsyncIteration

    async def _ours(self, event: RunEvent) -> bool:
        """Whether ``event`` is this node's to give (always, without a cluster)."""
        own = event.run_id == self._entry.run_id
        fence = self._fence
        if (
            fence is not None
            and fence.closed
            and (not own or fence.fence_seq is None or event.seq > fence.fence_seq)
        ):
            return False  # not this node's: the run goes on elsewhere
        log = self._log if own else None
        if log is None and self._logs is not None:
            log = self._logs(event.run_id)
        if log is not None and log.persisted_seq < event.seq:
            await log.wait_persisted(event.seq)
            if log.persisted_seq < event.seq:
                return False  # this attempt stopped writing: the run goes on elsewhere
        return True


class LocalHost:
    """The runs of one process, for every face (see the module docstring).

    Args:
        agents: the agents runs may be started with, by name.
        sessions: None (in memory, metered per principal), a path (one SQLite file:
            :func:`~trio_agents.control.sqlite_sessions`) or a factory
            ``(principal, session_id) -> Session``.
        limits: the :class:`~trio_agents.control.Limits` (default ``Limits()``): runs
            per principal, start rate, retention, inject bytes, ``max_run_limits``,
            ``shutdown_timeout``, ...
        run_options: options passed to every :func:`~trio_agents.serve_run`.
        context: the hook that supplies each run's ``context``, called as
            ``context(principal, info)`` (see :class:`~trio_agents.control.ControlServer`).
    """

    def __init__(
        self,
        agents: Mapping[str, Agent],
        *,
        sessions: str | os.PathLike[str] | SessionFactory | None = None,
        limits: Limits | None = None,
        run_options: Mapping[str, Any] | None = None,
        context: ContextHook | None = None,
    ) -> None:
        if context is not None and not callable(context):
            raise TypeError("context must be a callable (principal, info) -> context")
        for name in ("context", "limits"):
            if run_options is not None and name in run_options:
                raise TypeError(
                    f"run_options cannot hold {name!r}: use context=... for contexts and"
                    " Limits(max_run_limits=...) for limits"
                )
        if run_options is not None and run_options.get("park_after") is not None:
            # A parked run ends its attempt with its calls open, for a later attempt to
            # resume: this host (and the cluster's) never starts one, so the run would
            # wait forever for a decision nothing could apply (docs/control.md).
            raise ValueError(
                "run_options cannot hold 'park_after': a parked run is resumed only by a"
                " host that starts its next attempt (the TemporalHost)"
            )
        for name, agent in agents.items():
            if not isinstance(name, str) or not isinstance(agent, Agent):
                raise TypeError("agents must map names (str) to Agent objects")
        limits = limits if limits is not None else Limits()
        if not isinstance(limits, Limits):
            raise TypeError("limits must be a Limits instance")
        session_factory: SessionFactory | None
        if sessions is None:
            session_factory = None
        elif isinstance(sessions, str | os.PathLike):
            session_factory = sqlite_sessions(sessions)
        elif callable(sessions):
            session_factory = sessions
        else:
            raise TypeError("sessions must be None, a path or a callable")
        self._registry = Registry(dict(agents), limits, session_factory, dict(run_options or {}))
        self._registry.context_hook = context
        self._owners: dict[object, _Owner] = {}
        self._stopping_entries: dict[RunEntry, None] = {}

    # ------------------------------------------------------------------ serving

    @property
    def agents(self) -> Mapping[str, Agent]:
        """The agents runs may be started with, by name."""
        return self._registry.agents

    @property
    def limits(self) -> Limits:
        """The host's :class:`~trio_agents.control.Limits`."""
        return self._registry.limits

    def statistics(self) -> HostStatistics:
        """Counts of the host's runs, for monitoring."""
        registry = self._registry
        return HostStatistics(
            active_runs=registry.active_count,
            retained_runs=len(registry.runs) - registry.active_count,
        )

    def principal_statistics(self, principal: str) -> PrincipalStatistics:
        """What one principal holds: runs, retained bytes, in-memory sessions."""
        return self._registry.principal_statistics(principal)

    async def serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """Host runs until cancelled: ``await nursery.start(host.serve)``.

        Cancelling it shuts the host down, shielded and bounded by
        ``limits.shutdown_timeout``: no new run starts, every run is cancelled with
        reason ``"server shutdown"`` (their repair persists their sessions) and waited
        for; then the cancellation is re-raised.
        """
        if self._registry.nursery is not None:
            raise RuntimeError("this host is already being served")
        try:
            async with trio.open_nursery() as nursery:
                stop = await self._open(nursery)
                task_status.started()
                try:
                    await trio.sleep_forever()
                finally:
                    with trio.CancelScope(shield=True):
                        deadline = self._begin_shutdown()
                        await self._stop_runs(deadline)
                        await self._wait_runs(deadline)
                        self._force()
                    stop()
        except BaseExceptionGroup as group:
            if only_cancelled(group):
                raise first_leaf(group) from None
            raise
        raise AssertionError("unreachable")  # pragma: no cover

    @asynccontextmanager
    async def running(self) -> AsyncIterator[LocalHost]:
        """Serve the host for the duration of the block (see :meth:`serve`); an
        exception in the block propagates after the shutdown."""

        async def start(nursery: trio.Nursery) -> LocalHost:
            await nursery.start(self.serve)
            return self

        async with serving(start) as host:
            yield host

    # The steps of serving, also what a server that serves the host calls (a
    # ControlServer interleaves its connections' shutdown with them).

    async def _open(self, nursery: trio.Nursery) -> Callable[[], None]:
        """Host runs in ``nursery`` and start the reaper; returns what stops the host's
        own tasks (after the shutdown)."""
        await trio.lowlevel.checkpoint()
        if self._registry.nursery is not None:
            raise RuntimeError("this host is already being served")
        self._registry.nursery = nursery
        reaper_scope = trio.CancelScope()
        nursery.start_soon(self._reaper, reaper_scope)
        return reaper_scope.cancel

    async def _reaper(self, scope: trio.CancelScope) -> None:
        with scope:
            await self._registry.reaper()

    @property
    def _closing(self) -> bool:
        return self._registry.closing

    def _begin_shutdown(self) -> float:
        """No new run starts from now; returns the shutdown's deadline."""
        registry = self._registry
        registry.closing = True
        self._stopping_entries.update(dict.fromkeys(registry.runs.values()))
        return trio.current_time() + registry.limits.shutdown_timeout

    def _entries(self) -> list[RunEntry]:
        """Every run the host had when the shutdown began, and any resumed since (a
        cluster's scan in flight): none may outlive the shutdown."""
        self._stopping_entries.update(dict.fromkeys(self._registry.runs.values()))
        return list(self._stopping_entries)

    async def _cancel_runs(self) -> None:
        for entry in self._entries():
            if entry.run is not None and not entry.done.is_set():
                entry.run.cancel(_SHUTDOWN)

    async def _stop_runs(self, deadline: float) -> None:
        """Stop every run (a cluster's host hands them over instead)."""
        await self._cancel_runs()

    async def _wait_runs(self, deadline: float) -> None:
        with trio.move_on_at(deadline):
            for entry in self._entries():
                await entry.done.wait()

    def _force(self) -> None:
        """Past the bound: force whatever is left."""
        for entry in self._entries():
            entry.host_scope.cancel()

    # The public lifecycle (RunHost's: what hosting.serve calls). Over the private steps
    # above, which a cluster's host overrides (_open, _stop_runs).

    async def open(self, nursery: trio.Nursery) -> Callable[[], None]:
        """Host runs in ``nursery`` (see :meth:`RunHost.open`)."""
        return await self._open(nursery)

    @property
    def closing(self) -> bool:
        """Whether the shutdown began (see :meth:`RunHost.closing`)."""
        return self._closing

    def begin_shutdown(self) -> float:
        """No new run starts from now; returns the shutdown's deadline."""
        return self._begin_shutdown()

    async def stop_runs(self, deadline: float) -> None:
        """Stop every run (see :meth:`RunHost.stop_runs`)."""
        await self._stop_runs(deadline)

    async def wait_runs(self, deadline: float) -> None:
        """Wait until ``deadline`` at most for the stopped runs to finish."""
        await self._wait_runs(deadline)

    def force_stop(self) -> None:
        """Past the deadline: cancel whatever run is left."""
        self._force()

    # ---------------------------------------------------------------------- ops

    async def start(self, origin: Origin, request: StartRequest) -> str:
        """Start a run (after the admission checks: the agent exists, the limits fit
        the host's maximum, the principal has room and a start token); returns its id
        once it exists (it may still be ``queued`` behind its session's active run).

        Raises:
            HostError: ``not_found`` (no such agent), ``invalid_request``,
                ``limit_exceeded``, ``session_busy``, ``internal`` (the context hook
                raised, or the host is shutting down).
        """
        with host_errors():
            limits = self._admit(origin, request)
            entry = await self._start_here(origin, request, limits, self._owner(origin))
        return entry.run_id

    def _admit(self, origin: Origin, request: StartRequest) -> UsageLimits | None:
        """The admission checks of a start; returns the run's effective limits."""
        registry = self._registry
        if registry.nursery is None:
            raise ProtocolError("internal", "the host is not being served")
        if request.context is not None:
            raise ProtocolError(
                "invalid_request",
                "a run's context is set by the host's context hook, not by the client",
            )
        if request.agent not in registry.agents:
            raise ProtocolError("not_found", f"no agent {request.agent!r}")
        asked = None if request.limits is None else limits_to_wire(request.limits)
        limits = effective_limits(asked, registry.limits.max_run_limits)
        registry.check_room(origin.principal)
        registry.take_start_token(origin.principal)
        return limits

    async def _start_here(
        self,
        origin: Origin,
        request: StartRequest,
        limits: UsageLimits | None,
        owner: Owner | None,
    ) -> RunEntry:
        return await start_run(
            self._registry,
            origin.principal,
            owner,
            request.agent,
            request.input,
            input_bytes=items_bytes(request.input),
            session_id=request.session_id,
            on_disconnect=request.on_disconnect if owner is not None else "continue",
            on_busy=request.on_busy,
            input_overlap=request.input_overlap,
            client_node=origin.node,
            run_id=origin.run_id,
            command=origin.command,
            limits=limits,
        )

    def _owner(self, origin: Origin) -> _Owner | None:
        """The record of ``origin``'s owner (made on its first start)."""
        if origin.owner is None:
            return None
        record = self._owners.get(origin.owner)
        if record is None:
            record = self._owners[origin.owner] = _Owner(origin.principal)
        elif record.principal != origin.principal:
            raise ProtocolError("invalid_request", "an owner belongs to one principal")
        return record

    def _owned_by(self, owner: object) -> _Owner | None:
        """What the host keeps for a live owner (None before its first start)."""
        return self._owners.get(owner)

    def _entry(self, principal: str, run_id: str) -> RunEntry:
        return self._registry.lookup(principal, run_id)

    async def get(self, principal: str, run_id: str) -> RunInfo:
        """The run's :class:`~trio_agents.control.RunInfo` (any node of a tree)."""
        await trio.lowlevel.checkpoint()
        with host_errors():
            return self._registry.info(self._entry(principal, run_id))

    async def list(self, principal: str, *, all: bool = False) -> list[RunInfo]:
        """The principal's visible runs, oldest first: roots, or (``all``) each root
        followed by every node of its tree."""
        await trio.lowlevel.checkpoint()
        registry = self._registry
        return [registry.info(entry) for entry in registry.runs_of(principal, nodes=all)]

    async def cancel(
        self,
        principal: str,
        run_id: str,
        reason: str | None = None,
        mode: Literal["immediate", "after_turn"] = "immediate",
    ) -> None:
        """Cancel a run (``run_closed`` once it is terminal); returns once the cancel
        is applied."""
        await trio.lowlevel.checkpoint()
        with host_errors():
            live(self._entry(principal, run_id)).cancel(reason, mode=mode)

    async def wait_terminal(self, principal: str, run_id: str) -> RunInfo:
        """Wait until the run's terminal update was emitted; returns its RunInfo."""
        with host_errors():
            entry = self._entry(principal, run_id)
        assert entry.run is not None
        await entry.run.wait()
        return self._registry.info(entry)

    async def inject(
        self,
        principal: str,
        run_id: str,
        items: tuple[Item, ...],
        when: Literal["next_turn", "now", "when_idle"] = "next_turn",
    ) -> str:
        """Queue items into a live run; returns the injection id (``inbox_full``,
        ``limit_exceeded`` past ``max_inject_bytes_per_run``, ``run_closed``)."""
        await trio.lowlevel.checkpoint()
        with host_errors():
            return str(inject_here(self._registry, self._entry(principal, run_id), items, when))

    async def withdraw(self, principal: str, run_id: str, injection_id: str) -> bool:
        """Withdraw an injection not yet delivered; False when it already was."""
        await trio.lowlevel.checkpoint()
        with host_errors():
            return live(self._entry(principal, run_id)).withdraw(injection_id)

    async def approve(
        self,
        principal: str,
        run_id: str,
        call_id: str,
        content: Mapping[str, Any] | None = None,
    ) -> None:
        """Approve a tool call waiting for approval, or answer a question with
        ``content`` (``not_found``: no such call; ``invalid_request``: content that
        does not fit, nothing decided)."""
        await trio.lowlevel.checkpoint()
        with host_errors():
            entry = self._entry(principal, run_id)
            decide_here(entry, call_id, approved=True, message=None, content=content)

    async def reject(
        self, principal: str, run_id: str, call_id: str, message: str | None = None
    ) -> None:
        """Reject a tool call waiting for approval; the model reads ``message``."""
        await trio.lowlevel.checkpoint()
        with host_errors():
            decide_here(self._entry(principal, run_id), call_id, approved=False, message=message)

    async def cancel_session(
        self,
        principal: str,
        session_id: str,
        reason: str | None = None,
        mode: Literal["immediate", "after_turn"] = "immediate",
    ) -> str:
        """Cancel the session's active run; returns its id (``no_active_run`` if none)."""
        await trio.lowlevel.checkpoint()
        entry = self._registry.session_holder(principal, session_id)
        if entry is None or entry.run is None or entry.run.status.is_terminal:
            raise HostError("no_active_run", f"session {session_id!r} has no active run")
        entry.run.cancel(reason, mode=mode)
        return entry.run_id

    async def fork_session(
        self,
        principal: str,
        session_id: str,
        new_session_id: str,
        at: int | tuple[str, int] | None = None,
    ) -> int:
        """Fork the principal's session (DESIGN §23): ``new_session_id`` holds its
        items up to ``at`` (an item index, or an event position ``(run_id, seq)`` of a
        run of that session this host remembers and that has ended; None: all of
        them), rounded down so that no tool call is split from its result, with the
        child sessions of its tree whose call is kept. Returns the number of items the
        fork holds. The session may have an active run (the fork is a snapshot).

        The host's sessions: in memory (metered, no child sessions), or its factory's,
        forked in their store (``factory(principal, new_session_id)``'s stored id; a
        factory must give every session of a principal in one store, as
        :func:`~trio_agents.hosting.sqlite_sessions` does).

        Raises:
            HostError: ``not_found`` (no such session of this principal, or it holds no
                items; an unknown run), ``invalid_request`` (a bad position, the new id
                holds items), ``session_busy`` (the new id has an active run),
                ``limit_exceeded`` (in-memory bytes).
        """
        await trio.lowlevel.checkpoint()
        with host_errors():
            registry = self._registry
            if registry.session_holder(principal, new_session_id) is not None:
                raise ProtocolError("session_busy", f"session {new_session_id!r} has an active run")
            index = await self._fork_index(principal, session_id, at)
            factory = registry.session_factory
            if factory is None:
                sessions = registry.state_of(principal).sessions
                return await sessions.fork(session_id, new_session_id, index)
            return await fork_from_factory(factory, principal, session_id, new_session_id, index)

    async def _fork_index(
        self, principal: str, session_id: str, at: int | tuple[str, int] | None
    ) -> int | None:
        """``at`` as an item index: an event position resolved from the run, which must
        be one of this principal's runs in that session."""
        if not isinstance(at, tuple):
            return at
        run_id, seq = at
        entry = self._registry.find(principal, run_id, nodes=False)
        if entry is None:
            raise ProtocolError("not_found", f"no run {run_id!r}")
        if entry.session_id != session_id:
            raise ProtocolError(
                "invalid_request", f"run {run_id!r} did not run in session {session_id!r}"
            )
        return await event_index(entry.run, run_id, seq)

    @asynccontextmanager
    async def events(
        self,
        principal: str,
        run_id: str,
        *,
        from_seq: int | None = 1,
        tree: bool = False,
        status_only: bool = False,
    ) -> AsyncIterator[AsyncIterator[HostedEvent]]:
        """Subscribe to a run's events: ``async with host.events(p, id) as events:
        async for event in events: ...``.

        From ``from_seq`` (inclusive; an ``events.dropped`` event stands for what
        retention lost; None: from the oldest event retained, without one), or, with
        ``tree``, the run's whole subtree merged in the order the events happened,
        from the oldest the tree retains (``from_seq`` must then be None, 0 or 1:
        positions in a merged stream are not seqs). ``status_only``: only
        ``run.updated`` and ``events.dropped``. The iteration ends after the run's
        terminal update. Safe to leave early: the subscription holds only a position.
        """
        await trio.lowlevel.checkpoint()
        with host_errors():
            check_from_seq(from_seq, tree)
            entry = self._entry(principal, run_id)
        yield self._events_here(entry, from_seq, tree=tree, status_only=status_only)

    def _events_here(
        self, entry: RunEntry, from_seq: int | None, *, tree: bool, status_only: bool
    ) -> _Events:
        return _Events(
            entry,
            from_seq=None if tree else from_seq,
            tree=tree,
            status_only=status_only,
            logs=self._event_logs(),
        )

    def _event_logs(self) -> Callable[[str], EventLog | None] | None:
        """Where a distributed host finds what of a run's events is persisted (its
        durable log, by run id); None in one process."""
        return None

    def disconnected(self, owner: object) -> None:
        """The owner went away: apply the ``on_disconnect`` of the runs it started
        (``"cancel"``: cancelled with reason ``"client disconnected"``)."""
        record = self._owners.pop(owner, None)
        if record is not None:
            _disconnected(self._registry, record)


def check_from_seq(from_seq: int | None, tree: bool) -> None:
    """``events``' ``from_seq``: None or an int >= 0 (at most 1 with ``tree``)."""
    if from_seq is None:
        return
    if isinstance(from_seq, bool) or not isinstance(from_seq, int) or from_seq < 0:
        raise ProtocolError("invalid_request", "from_seq must be an integer >= 0")
    if tree and from_seq > 1:
        raise ProtocolError(
            "invalid_request",
            "from_seq must be 0 or absent with tree (a tree subscription replays from"
            " the oldest event the tree retains; seqs are per run)",
        )


def live(entry: RunEntry) -> Run:
    """The run of ``entry``, which must not have ended (``run_closed``)."""
    run = entry.run
    assert run is not None
    if run.status.is_terminal:
        raise ProtocolError("run_closed", f"run {entry.run_id} is closed (status {run.status})")
    return run


def inject_here(
    registry: Registry, entry: RunEntry, items: tuple[Item, ...], when: str
) -> InjectionId:
    """Inject into a run of this process, counted against its tree's inject bytes."""
    run = live(entry)
    size = items_bytes(items)
    registry.check_inject(entry.tree, size)  # a tree is retained, and counted, as one
    try:
        injection_id = run.inject(items, when=cast(Any, when))
    except RunClosedError:
        raise ProtocolError("run_closed", f"run {entry.run_id} is closed") from None
    except InboxFullError as exc:
        raise ProtocolError("inbox_full", str(exc)) from None
    except (TypeError, ValueError) as exc:
        raise ProtocolError("invalid_request", str(exc)) from None
    entry.tree.injected_bytes += size
    return injection_id


def decide_here(
    entry: RunEntry,
    call_id: str,
    *,
    approved: bool,
    message: str | None,
    content: Mapping[str, Any] | None = None,
) -> None:
    """Approve or reject a call (or a question) of a run of this process."""
    run = live(entry)
    try:
        if approved:
            run.approve(call_id, content=content)
        else:
            run.reject(call_id, message=message)
    except RunClosedError:
        raise ProtocolError("run_closed", f"run {entry.run_id} is closed") from None
    except UnknownCallError as exc:
        raise ProtocolError("not_found", str(exc)) from None
    except (TypeError, ValueError) as exc:  # content refused: nothing decided
        raise ProtocolError("invalid_request", str(exc)) from None
