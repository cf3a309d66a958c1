"""The control server's runs and per-principal limits.

Every check a request makes is O(1) in the number of runs the server remembers: each
principal has counters (active runs, retained bytes, session bytes, a token bucket)
and its own ordered tables, so neither admission nor reaping ever scans the runs of
the whole server. Finished runs are forgotten by one reaper task, oldest first, after
``retain_finished`` — or earlier, oldest first, once a principal's finished runs hold
more than ``max_retained_bytes_per_principal``.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast, final

import attrs
import trio

from .. import Agent, Item, Run, SessionBusyError, serve_run
from .._session_lock import SessionClaim
from ..sessions import Session
from ._protocol import Limits, ProtocolError, RunInfo
from ._sessions import MemorySessions, MeteredSession, ScopedSession, SessionFactory

if TYPE_CHECKING:
    from .._resume import Resume
    from ..cluster._cluster import PostgresCluster
    from ..cluster._takeover import Claimed

__all__ = ["Owner", "PrincipalStatistics", "Registry", "RunEntry"]

logger = logging.getLogger("trio_agents.control")

RUN_OVERHEAD = 1024
"""Bytes counted per retained run on top of its input and injected items."""

# How long a resume on this node waits for its own stopped attempt of the same run to
# end (that attempt's repair is bounded by its cleanup_timeout, 5 s by default).
_OLD_ATTEMPT_BOUND = 30.0


@attrs.frozen
class PrincipalStatistics:
    """What one principal holds on a server, from
    :meth:`ControlServer.principal_statistics`.

    Attributes:
        active_runs: runs not yet finished.
        retained_runs: finished runs still visible.
        retained_bytes: what those count against ``max_retained_bytes_per_principal``.
        sessions: in-memory sessions (``sessions=None``).
        session_bytes: their size against ``max_session_bytes_per_principal``.
        sessions_evicted: idle in-memory sessions evicted so far to stay under it.
    """

    active_runs: int
    retained_runs: int
    retained_bytes: int
    sessions: int
    session_bytes: int
    sessions_evicted: int


class Owner(Protocol):
    """The connection that started a run (what a disconnect does to it)."""

    principal: str
    owned: set[RunEntry]
    # Runs with on_disconnect="cancel" it started on other nodes of a cluster (placed
    # there: this node was full), by id.
    placed: set[str]


@final
@attrs.define(eq=False)
class RunEntry:
    """A run the server remembers, active or finished."""

    run_id: str
    principal: str
    agent: str
    session_id: str | None
    on_disconnect: str
    owner: Owner | None
    input_bytes: int
    injected_bytes: int = 0
    run: Run | None = None
    done: trio.Event = attrs.field(factory=trio.Event)
    host_scope: trio.CancelScope = attrs.field(factory=lambda: trio.CancelScope(shield=True))
    memory: MeteredSession | None = None
    fence: Any = None  # a cluster's Fence: events past it are not this node's to send
    first_seq: int = 1  # a resumed run's first event here (earlier ones: the cluster's log)
    log: Any = None  # a cluster's RunLog: what of the run's events is persisted

    @property
    def bytes(self) -> int:
        """What the run counts against its principal's retained bytes."""
        return RUN_OVERHEAD + self.input_bytes + self.injected_bytes

    def info(self) -> RunInfo:
        assert self.run is not None
        stats = self.run.statistics()
        result = self.run.result
        return RunInfo(
            run_id=self.run_id,
            agent=self.agent,
            session_id=self.session_id,
            status=stats.status,
            reason=result.reason if result is not None else None,
            seq=stats.last_seq,
            turn=stats.turn,
            pending_approvals=stats.pending_approvals,
        )


@final
@attrs.define(eq=False)
class _Principal:
    sessions: MemorySessions
    tokens: float
    refilled: float
    runs: dict[str, RunEntry] = attrs.field(factory=dict)  # visible, oldest first
    active: set[RunEntry] = attrs.field(factory=set)
    finished: OrderedDict[str, RunEntry] = attrs.field(factory=OrderedDict)
    retained_bytes: int = 0


@final
@attrs.define
class _Started:
    """A task status that records the run on its entry the moment it exists, so the
    entry never depends on when the starter resumes."""

    entry: RunEntry
    inner: trio.TaskStatus[Run]
    then: Callable[[Run], None] | None = None

    def started(self, run: Run) -> None:
        self.entry.run = run
        if self.then is not None:
            self.then(run)  # before the run's first checkpoint: before any model call
        self.inner.started(run)


@final
@attrs.define(eq=False)
class _Gate:
    """The in-process holder of a cluster session while a queued run of this node waits
    for the session cluster-wide: the run queues behind it (the core's claim), so it
    stays ``queued`` — and cancellable — until the gate lets go."""

    entry: RunEntry

    @property
    def id(self) -> str:
        return self.entry.run_id

    def cancel(self, reason: str | None = None) -> None:
        if self.entry.run is not None:
            self.entry.run.cancel(reason)


@final
class Registry:
    """Runs by id, per-principal counters and limits, and the runs' host nursery."""

    def __init__(
        self,
        agents: Mapping[str, Agent],
        limits: Limits,
        session_factory: SessionFactory | None,
        run_options: Mapping[str, Any],
    ) -> None:
        self.agents = agents
        self.limits = limits
        self.session_factory = session_factory
        self.run_options = run_options
        self.cluster: PostgresCluster | None = None
        self.runs: dict[str, RunEntry] = {}
        self.active_count = 0
        self.closing = False
        self.nursery: trio.Nursery | None = None
        self._principals: dict[str, _Principal] = {}
        # (finished at, principal, run id): ids only, so a run forgotten early (retained
        # bytes) is not kept alive here until its time comes.
        self._finished: deque[tuple[float, str, str]] = deque()
        self._finished_wakeup = trio.Event()

    def _principal(self, principal: str) -> _Principal:
        state = self._principals.get(principal)
        if state is None:
            state = self._principals[principal] = _Principal(
                sessions=MemorySessions(self.limits.max_session_bytes_per_principal),
                tokens=float(self.limits.start_burst),
                refilled=trio.current_time(),
            )
        return state

    # ------------------------------------------------------------------- lookups

    def lookup(self, principal: str, run_id: str) -> RunEntry:
        """The run ``run_id`` of ``principal``; another principal's is not found."""
        entry = self.runs.get(run_id)
        if entry is None or entry.principal != principal or entry.run is None:
            raise ProtocolError("not_found", f"no run {run_id!r}")
        return entry

    def runs_of(self, principal: str) -> list[RunEntry]:
        """Every visible run of ``principal``, oldest first."""
        state = self._principals.get(principal)
        if state is None:
            return []
        return [e for e in state.runs.values() if e.run is not None]

    def session_holder(self, principal: str, session_id: str) -> RunEntry | None:
        """The principal's run that holds ``session_id`` (its active run), if any.

        Looks only at the principal's active runs (at most ``max_runs_per_principal``).
        """
        state = self._principals.get(principal)
        for entry in state.active if state is not None else ():
            run = entry.run
            if entry.session_id == session_id and run is not None and run.holds_session:
                return entry
        return None

    def principal_statistics(self, principal: str) -> PrincipalStatistics:
        state = self._principal(principal)
        return PrincipalStatistics(
            active_runs=len(state.active),
            retained_runs=len(state.finished),
            retained_bytes=state.retained_bytes,
            sessions=len(state.sessions),
            session_bytes=state.sessions.bytes,
            sessions_evicted=state.sessions.evicted,
        )

    # ---------------------------------------------------------------- admission

    def check_room(self, principal: str) -> None:
        """``run.start``: the principal may have another active run (O(1)).

        Raises:
            ProtocolError: ``limit_exceeded``, or ``internal`` while shutting down.
        """
        if self.closing:
            raise ProtocolError("internal", "the server is shutting down")
        if len(self._principal(principal).active) >= self.limits.max_runs_per_principal:
            raise ProtocolError(
                "limit_exceeded",
                f"at most {self.limits.max_runs_per_principal} active runs per principal",
            )

    def take_start_token(self, principal: str) -> None:
        """The ``run.start`` rate limit: a token bucket per principal (O(1))."""
        state = self._principal(principal)
        now = trio.current_time()
        rate, burst = self.limits.start_rate, float(self.limits.start_burst)
        state.tokens = min(burst, state.tokens + (now - state.refilled) * rate)
        state.refilled = now
        if state.tokens < 1.0:
            raise ProtocolError(
                "limit_exceeded", f"too many run.start requests (at most {rate:g} per second)"
            )
        state.tokens -= 1.0

    def check_inject(self, entry: RunEntry, size: int) -> None:
        """``run.inject`` of ``size`` bytes fits the run's lifetime inject limit."""
        limit = self.limits.max_inject_bytes_per_run
        if entry.injected_bytes + size > limit:
            raise ProtocolError(
                "limit_exceeded",
                f"at most {limit} bytes may be injected into one run"
                f" ({entry.injected_bytes} so far, this one {size})",
            )

    # --------------------------------------------------------------------- runs

    async def start_run(
        self,
        principal: str,
        owner: Owner | None,
        agent_name: str,
        items: tuple[Item, ...],
        *,
        input_bytes: int,
        session_id: str | None,
        on_disconnect: str,
        on_busy: str,
    ) -> RunEntry:
        """Start a run in the server's nursery (call :meth:`admit` first).

        The session's busy policy is the core's ``on_busy``: a busy session with
        ``"reject"`` answers ``session_busy``; ``"interrupt"``/``"enqueue"`` start the
        run ``queued`` behind the session's active run. With a cluster, the session is
        claimed cluster-wide first (``trio_agents.cluster._claims``).
        """
        assert self.nursery is not None
        state = self._principal(principal)
        memory: MeteredSession | None = None
        session: Session | None = None
        run_id = f"run_{uuid.uuid4().hex}"
        extra: dict[str, Any] = {}
        fence: Any = None
        cluster = self.cluster
        behind: str | None = None
        if cluster is not None:
            behind = await cluster.claim(
                run_id=run_id,
                principal=principal,
                session_id=session_id,
                agent=agent_name,
                on_busy=on_busy,
                cancel_holder=lambda holder, node: self.supersede(principal, holder, node),
                items=items,
            )
            cluster_session = cluster.session(principal, session_id, run_id)
            session, fence = cluster_session, cluster_session.fence
            extra["before_tool"] = cluster.before_tool(run_id, 1, fence)
        elif session_id is not None:
            if self.session_factory is None:
                memory = state.sessions.acquire(session_id)
                if memory is None:
                    raise ProtocolError(
                        "limit_exceeded",
                        f"in-memory sessions of this principal hold over"
                        f" {self.limits.max_session_bytes_per_principal} bytes in active runs",
                    )
                session = memory
            else:
                session = ScopedSession(self.session_factory(principal, session_id), principal)
        entry = RunEntry(
            run_id=run_id,
            principal=principal,
            agent=agent_name,
            session_id=session_id,
            on_disconnect=on_disconnect,
            owner=owner,
            input_bytes=input_bytes,
            memory=memory,
            fence=fence,
        )
        self._register(entry, state)
        gate: SessionClaim | None = None
        if cluster is not None:
            # The core's claim is per node: claimed cluster-wide already, or queued
            # behind a gate that lets go once the session is claimed cluster-wide.
            on_busy = "reject"
            if behind is not None:
                gate, on_busy = self._gate(entry, session), "enqueue"
        try:
            entry.run = await self.nursery.start(
                self._run_task, entry, self.agents[agent_name], items, session, on_busy, extra
            )
        except SessionBusyError:
            raise ProtocolError(
                "session_busy", f"session {session_id!r} has an active run"
            ) from None
        except (TypeError, ValueError) as exc:  # the input is not a valid conversation
            raise ProtocolError("invalid_request", str(exc)) from None
        finally:
            if entry.run is None:
                if gate is not None:
                    gate.release()
                self._end(entry, retain=False)
                if cluster is not None:
                    await cluster.forget(run_id)
        if cluster is not None:
            entry.log = cluster.track(entry.run, run_id, 1, 1, fence)
        if gate is not None:
            self.nursery.start_soon(self._claim_later, entry, gate, on_busy, behind, None)
        return entry

    def _gate(self, entry: RunEntry, session: Any) -> SessionClaim:
        """Hold the run's session in this process until it is claimed cluster-wide."""
        gate = SessionClaim(session.lock_key, session.session_id, _Gate(entry))
        gate.claim_now("enqueue")  # behind a run of this node that holds it, if any
        return gate

    async def _claim_later(
        self,
        entry: RunEntry,
        gate: SessionClaim,
        on_busy: str,
        interrupted: str | None,
        then: Callable[[], Awaitable[None]] | None,
    ) -> None:
        """A queued run of a cluster: claim its session cluster-wide once its holder
        ends (``then()`` first thing after), then let the run have it."""
        cluster = self.cluster
        assert cluster is not None
        claimed = False
        try:
            await gate.wait()
            claimed = await cluster.claim_queued(
                run_id=entry.run_id,
                principal=entry.principal,
                session_id=entry.session_id,
                on_busy=on_busy,
                waiting=lambda: not entry.done.is_set() and not entry.fence.closed,
                cancel_holder=lambda holder, node: self.supersede(entry.principal, holder, node),
                interrupted=interrupted,
            )
            if claimed and then is not None:
                await then()
        finally:
            if not claimed and entry.run is not None and not entry.done.is_set():
                entry.run.cancel("this node stopped")  # it never gets the session here
            gate.release()

    def _register(self, entry: RunEntry, state: _Principal) -> None:
        self.runs[entry.run_id] = entry
        state.runs[entry.run_id] = entry
        state.active.add(entry)
        self.active_count += 1
        if entry.owner is not None:
            entry.owner.owned.add(entry)

    async def resume_run(
        self, claimed: Claimed, resume: Resume, then: Callable[[Run], None] | None = None
    ) -> RunEntry:
        """Continue a run this node took over (a cluster's takeover); ``then(run)`` is
        called the moment the run exists, before it can call its model or end (its
        re-injections, an acked cancel)."""
        assert self.nursery is not None
        assert self.cluster is not None
        cluster = self.cluster
        state = self._principal(claimed.principal)
        session = cluster.session(claimed.principal, claimed.session_id, claimed.run_id)
        session.attempt = resume.attempt  # its writes are fenced on this attempt
        entry = RunEntry(
            run_id=claimed.run_id,
            principal=claimed.principal,
            agent=claimed.agent,
            session_id=claimed.session_id,
            on_disconnect="continue",
            owner=None,
            input_bytes=0,
            fence=session.fence,
            first_seq=resume.next_seq,
        )
        old = self.runs.get(entry.run_id)
        if old is not None:  # a run this node ran before (it had lost its lease)
            if old.run is not None and old.run.result is None:
                # Its stopped attempt still holds the session in this process until its
                # (bounded) repair ends: resuming before would find the session busy.
                with trio.move_on_after(_OLD_ATTEMPT_BOUND):
                    await old.run.wait()
            self.runs.pop(entry.run_id)
            state.runs.pop(entry.run_id, None)
            if state.finished.pop(entry.run_id, None) is not None:
                state.retained_bytes -= old.bytes
        self._register(entry, state)
        gate: SessionClaim | None = None
        then_claimed: Callable[[], Awaitable[None]] | None = None
        if claimed.queued:
            # It was still queued for its session: queued again here; its input goes
            # into the session once the session is its own.
            gate = self._gate(entry, session)
            inputs = claimed.input

            async def then_claimed() -> None:
                if inputs:
                    await session.add_items(inputs)

        elif claimed.input:
            # The earlier attempt died before its input reached the session.
            stored = await session.get_items()
            if not stored:
                await session.add_items(claimed.input)
        extra = {
            "resume": resume,
            "before_tool": cluster.before_tool(entry.run_id, resume.attempt, session.fence),
            "_then": then,
        }
        on_busy = "reject" if gate is None else "enqueue"
        try:
            entry.run = await self.nursery.start(
                self._run_task, entry, self.agents[claimed.agent], (), session, on_busy, extra
            )
        finally:
            if entry.run is None:
                if gate is not None:
                    gate.release()
                self._end(entry, retain=False)
        entry.log = cluster.track(
            entry.run, entry.run_id, resume.attempt, resume.next_seq, session.fence
        )
        if gate is not None:
            self.nursery.start_soon(self._claim_later, entry, gate, "enqueue", None, then_claimed)
        return entry

    async def supersede(self, principal: str, run_id: str, node: str | None) -> None:
        """``on_busy="interrupt"`` in a cluster: cancel the session's holder, wherever
        it runs (reason ``"superseded"``); errors are ignored (it may have ended)."""
        entry = self.runs.get(run_id)
        if entry is not None and entry.run is not None:
            entry.run.cancel("superseded")
            return
        assert self.cluster is not None
        request = {"id": 0, "op": "run.cancel", "run_id": run_id, "reason": "superseded"}
        with contextlib.suppress(ProtocolError):
            await self.cluster.route(principal, request, run_id)

    async def _run_task(
        self,
        entry: RunEntry,
        agent: Agent,
        items: tuple[Item, ...],
        session: Session | None,
        on_busy: str,
        extra: dict[str, Any],
        *,
        task_status: trio.TaskStatus[Run],
    ) -> None:
        extra = dict(extra)
        then = extra.pop("_then", None)
        try:
            # Shielded: only run.cancel(reason) stops a run (shutdown uses "server
            # shutdown"); the scope is cancelled only to force a run past the bound.
            with entry.host_scope:
                await serve_run(
                    agent,
                    items,
                    session=session,
                    run_id=entry.run_id,
                    task_status=cast(trio.TaskStatus[Run], _Started(entry, task_status, then)),
                    on_busy=on_busy,
                    **self.run_options,
                    **extra,
                )
        finally:
            if entry.run is not None:
                self._end(entry, retain=True)
            aclose = getattr(session, "aclose", None)
            owned = self.session_factory is not None or self.cluster is not None
            if owned and aclose is not None:
                with trio.move_on_after(5.0, shield=True):
                    try:
                        await aclose()
                    except Exception:
                        logger.exception("closing the session of %s failed", entry.run_id)

    def _end(self, entry: RunEntry, *, retain: bool) -> None:
        """A run ended (``retain``) or never started; idempotent."""
        if entry.done.is_set():
            return
        entry.done.set()
        state = self._principal(entry.principal)
        state.active.discard(entry)
        self.active_count -= 1
        if entry.owner is not None:
            entry.owner.owned.discard(entry)
        if entry.memory is not None:
            state.sessions.release(entry.memory)
        if not retain:
            self.runs.pop(entry.run_id, None)
            state.runs.pop(entry.run_id, None)
            return
        self._finished.append((trio.current_time(), entry.principal, entry.run_id))
        self._finished_wakeup.set()
        state.finished[entry.run_id] = entry
        state.retained_bytes += entry.bytes
        while state.retained_bytes > self.limits.max_retained_bytes_per_principal:
            _, oldest = state.finished.popitem(last=False)
            self._forget(oldest, state)

    def _forget(self, entry: RunEntry, state: _Principal) -> None:
        """Forget a finished run (already taken out of ``state.finished``)."""
        if self.runs.get(entry.run_id) is entry:
            del self.runs[entry.run_id]
        state.runs.pop(entry.run_id, None)
        state.retained_bytes -= entry.bytes

    async def reaper(self) -> None:
        """Forget finished runs ``retain_finished`` after their end, oldest first."""
        retain = self.limits.retain_finished
        while True:
            if not self._finished:
                self._finished_wakeup = trio.Event()
                await self._finished_wakeup.wait()
                continue
            finished_at, principal, run_id = self._finished[0]
            await trio.sleep_until(finished_at + retain)
            self._finished.popleft()
            state = self._principal(principal)
            entry = state.finished.pop(run_id, None)
            if entry is not None:
                self._forget(entry, state)

    async def own_placed(self, owner: Owner, run_id: str) -> None:
        """``owner`` started ``run_id`` with ``on_disconnect="cancel"`` on another node
        (a cluster placed it there): its disconnect cancels it there too.

        The ids of placed runs that have finished are dropped once there are more than
        twice the principal's active-run limit (one query), so a long-lived connection
        does not remember every run it ever placed.
        """
        assert self.cluster is not None
        owner.placed.add(run_id)
        if len(owner.placed) > 2 * self.limits.max_runs_per_principal:
            with contextlib.suppress(ProtocolError):  # the database is down: next time
                unfinished = await self.cluster.unfinished(owner.principal, owner.placed)
                owner.placed.intersection_update(unfinished | {run_id})

    def disconnected(self, owner: Owner) -> None:
        """The connection ``owner`` is gone: apply the ``on_disconnect`` of the runs it
        started (here, and placed on other nodes: a routed cancel)."""
        for entry in list(owner.owned):
            entry.owner = None
            if entry.on_disconnect == "cancel" and entry.run is not None:
                entry.run.cancel("client disconnected")
        placed, owner.placed = owner.placed, set()
        if placed and self.nursery is not None:
            self.nursery.start_soon(self._cancel_placed, owner.principal, placed)

    async def _cancel_placed(self, principal: str, run_ids: Iterable[str]) -> None:
        """Route ``"client disconnected"`` cancels to the owners of ``run_ids`` (a run
        that has finished meanwhile answers ``run_closed``: ignored)."""
        assert self.cluster is not None
        for run_id in run_ids:
            request = {
                "id": 0,
                "op": "run.cancel",
                "run_id": run_id,
                "reason": "client disconnected",
                "mode": "immediate",
            }
            try:
                await self.cluster.route(principal, request, run_id)
            except ProtocolError as exc:
                if exc.code not in ("run_closed", "not_found"):
                    logger.warning("could not cancel placed run %s: %s", run_id, exc.message)
