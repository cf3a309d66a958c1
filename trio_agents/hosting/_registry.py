"""A host's runs and per-principal limits (the runs' tasks themselves are started in
``_run_tasks.py``).

Every check a request makes is O(1) in the number of runs the server remembers: each
principal has counters (active runs, retained bytes, session bytes, a token bucket)
and its own ordered tables, so neither admission nor reaping ever scans the runs of
the whole server. Finished runs are forgotten by one reaper task, oldest first, after
``retain_finished`` — or earlier, oldest first, once a principal's finished runs hold
more than ``max_retained_bytes_per_principal``.

Child runs (DESIGN §17) are not started here: a tree's root is, and its descendants
live inside its tool calls. Their ids are found through their root: a child looked up
the first time is searched for in the principal's active trees only (a run without
children costs one test), then kept in :attr:`Registry.nodes`; when a root ends, every
node of its tree is indexed there (a tree no longer changes), and forgotten with it.
So a finished child stays visible exactly as long as its root does.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, final

import attrs
import trio

from .. import Agent, Run
from .._text_cleaning import clean_text
from ._error_codes import ProtocolError
from ._placement import LocalPlacement
from ._run_info import RunInfo
from ._server_limits import Limits
from ._sessions import MemorySessions, SessionFactory

if TYPE_CHECKING:
    from ._placement import EventLog, Fence, RunPlacement
    from ._policies import ContextHook

__all__ = ["Owner", "PrincipalStatistics", "Registry", "RunEntry", "descendants"]

logger = logging.getLogger("trio_agents.hosting")

RUN_OVERHEAD = 1024
"""Bytes counted per retained run on top of its input and injected items."""


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
    # Runs with on_disconnect="cancel" it started that run in another process now
    # (placed there: this one was full; or taken over after their attempt here
    # stopped), by id: its disconnect cancels them there (RunPlacement.cancel_elsewhere).
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
    # What ends this process's attempt of the run (its placement's): events past it
    # are not this process's to give. None: nothing does (one process).
    fence: Fence | None = None
    first_seq: int = 1  # a resumed run's first event here (earlier ones: a durable log's)
    log: EventLog | None = None  # what of the run's events is durable (its placement's)
    # A child run of a tree started here (§17): the entry of its root, which holds the
    # tree's counters (retention, inject bytes), fence and owner; None for a root.
    root: RunEntry | None = None
    descendants: int = 0  # a root's, once it ended: each is retained with it

    @property
    def bytes(self) -> int:
        """What the run counts against its principal's retained bytes (a root: with
        the runs of its tree)."""
        runs = 1 + self.descendants
        return RUN_OVERHEAD * runs + self.input_bytes + self.injected_bytes

    @property
    def tree(self) -> RunEntry:
        """The entry of the root of the run's tree (itself for a root)."""
        return self if self.root is None else self.root

    def info(self, agent: str | None = None) -> RunInfo:
        """The run's :class:`RunInfo`; ``agent``: the name of its current agent
        (default: the name it was started under)."""
        run = self.run
        assert run is not None
        stats = run.statistics()
        result = run.result
        return RunInfo(
            run_id=self.run_id,
            agent=self.agent if agent is None else agent,
            session_id=self.session_id,
            status=stats.status,
            reason=result.reason if result is not None else None,
            seq=stats.last_seq,
            turn=stats.turn,
            pending_approvals=stats.pending_approvals,
            parent_id=run.parent_id,
            root_id=run.root_id,
            children=tuple(child.id for child in run.children),
            # The current update's detail, as its run.updated event says it (an
            # ancestor's "waiting" while a descendant awaits approval): the record
            # and the stream never disagree.
            detail=run.updated.current.detail,
            usage=run.usage,
        )


def descendants(run: Run) -> list[Run]:
    """Every descendant of ``run``, depth first, each after its parent, siblings in
    start order (nothing to walk for a run without children)."""
    found: list[Run] = []
    pending = list(reversed(run.children))
    while pending:
        node = pending.pop()
        found.append(node)
        pending.extend(reversed(node.children))
    return found


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
        # Where the runs hold their sessions and what of them is durable: one
        # process's by default; a distributed host installs its own.
        self.placement: RunPlacement = LocalPlacement(self)
        # ControlServer(context=...): each run's context (_policies.py).
        self.context_hook: ContextHook | None = None
        self.runs: dict[str, RunEntry] = {}
        self.active_count = 0
        self.closing = False
        self.nursery: trio.Nursery | None = None
        self._principals: dict[str, _Principal] = {}
        # (finished at, principal, run id): ids only, so a run forgotten early (retained
        # bytes) is not kept alive here until its time comes.
        self._finished: deque[tuple[float, str, str]] = deque()
        self._finished_wakeup = trio.Event()
        # The child runs of this server's trees looked up so far, and every node of
        # each finished tree (see the module docstring), by run id.
        self.nodes: dict[str, RunEntry] = {}
        # id(agent) -> the name it is served under: a run's current agent by name.
        self._names = {id(agent): name for name, agent in reversed(list(agents.items()))}

    def state_of(self, principal: str) -> _Principal:
        """The principal's counters and tables (created on first use)."""
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
        """The run ``run_id`` of ``principal`` (a root or any node of one of its
        trees); another principal's is not found."""
        entry = self.find(principal, run_id)
        if entry is None:
            raise ProtocolError("not_found", f"no run {run_id!r}")
        return entry

    def find(self, principal: str, run_id: str, *, nodes: bool = True) -> RunEntry | None:
        """:meth:`lookup`, None for a run that is not found (``nodes=False``: a root
        only)."""
        entry = self.runs.get(run_id)
        if entry is None and nodes:
            entry = self.nodes.get(run_id) or self._search(principal, run_id)
        if entry is None or entry.principal != principal or entry.run is None:
            return None
        return entry

    def _search(self, principal: str, run_id: str) -> RunEntry | None:
        """A child not looked up before, in the principal's active trees (at most
        ``max_runs_per_principal`` roots; a root without children costs one test)."""
        state = self._principals.get(principal)
        for root in state.active if state is not None else ():
            run = root.run
            if run is None or not run.children:
                continue
            child = run.find(run_id)
            if child is not None:
                return self._node(root, child)
        return None

    def _node(self, root: RunEntry, child: Run) -> RunEntry:
        """The entry of ``child``, a descendant of ``root``'s run (made once)."""
        entry = self.nodes.get(child.id)
        if entry is None:
            entry = self.nodes[child.id] = RunEntry(
                run_id=child.id,
                principal=root.principal,
                agent=self.agent_name(child),
                session_id=None,  # its conversation is kept under its parent's (§17)
                on_disconnect="continue",
                owner=None,
                input_bytes=0,
                run=child,
                root=root,
            )
        return entry

    def nodes_of(self, root: RunEntry) -> list[RunEntry]:
        """``root`` and every node of its tree (see :func:`descendants`)."""
        assert root.run is not None
        return [root, *(self._node(root, child) for child in descendants(root.run))]

    def _unindex(self, root: RunEntry) -> None:
        """Forget the nodes of ``root``'s tree (the root is forgotten)."""
        if root.run is None or not root.run.children:
            return
        for child in descendants(root.run):
            entry = self.nodes.get(child.id)
            if entry is not None and entry.root is root:
                del self.nodes[child.id]

    def agent_name(self, run: Run) -> str:
        """The name of ``run``'s current agent: the one it is served under here, else
        the agent's own name (a handoff target or a child's agent not served here)."""
        # Either name is the user's text as given (Agent(name=...), the key it is served
        # under: a handoff to it goes through no face's check): cleaned as it enters the
        # run record, as the events clean it (a lone surrogate in it would fail every
        # answer listing the run).
        served = self._names.get(id(run.agent))
        return clean_text(served if served is not None else run.agent.name)

    def info(self, entry: RunEntry) -> RunInfo:
        """What ``run.get`` reports about ``entry``'s run."""
        assert entry.run is not None
        current = entry.run.agent
        if entry.root is None and self.agents.get(entry.agent) is current:
            return entry.info()  # not handed off: the name it was started under
        return entry.info(self.agent_name(entry.run))

    def runs_of(self, principal: str, *, nodes: bool = False) -> list[RunEntry]:
        """Every visible run of ``principal`` started here, oldest first (``nodes``:
        each followed by the nodes of its tree)."""
        state = self._principals.get(principal)
        if state is None:
            return []
        roots = [e for e in state.runs.values() if e.run is not None]
        if not nodes:
            return roots
        return [node for root in roots for node in self.nodes_of(root)]

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
        state = self.state_of(principal)
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
        if len(self.state_of(principal).active) >= self.limits.max_runs_per_principal:
            raise ProtocolError(
                "limit_exceeded",
                f"at most {self.limits.max_runs_per_principal} active runs per principal",
            )

    def take_start_token(self, principal: str) -> None:
        """The ``run.start`` rate limit: a token bucket per principal (O(1))."""
        state = self.state_of(principal)
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

    def register(self, entry: RunEntry) -> None:
        """A run starts (active): visible by id and counted for its principal."""
        state = self.state_of(entry.principal)
        self.runs[entry.run_id] = entry
        state.runs[entry.run_id] = entry
        state.active.add(entry)
        self.active_count += 1
        if entry.owner is not None:
            entry.owner.owned.add(entry)

    def drop(self, entry: RunEntry) -> None:
        """Forget at once an earlier attempt of a run this node resumes."""
        self._unindex(entry)
        state = self.state_of(entry.principal)
        self.runs.pop(entry.run_id, None)
        state.runs.pop(entry.run_id, None)
        if state.finished.pop(entry.run_id, None) is not None:
            state.retained_bytes -= entry.bytes

    def end(self, entry: RunEntry, *, retain: bool) -> None:
        """A run ended (``retain``) or never started; idempotent."""
        if entry.done.is_set():
            return
        entry.done.set()
        state = self.state_of(entry.principal)
        state.active.discard(entry)
        self.active_count -= 1
        self.placement.ended(entry.run_id)
        if entry.owner is not None:
            entry.owner.owned.discard(entry)
            fence = entry.fence
            if entry.on_disconnect == "cancel" and fence is not None and fence.closed:
                # Only this node's attempt ended (lease lost, hand-over): the run goes
                # on elsewhere, and the client's disconnect must still cancel it there.
                entry.owner.placed.add(entry.run_id)
        if not retain:
            self._unindex(entry)
            self.runs.pop(entry.run_id, None)
            state.runs.pop(entry.run_id, None)
            return
        if entry.run is not None and entry.run.children:
            # The tree is final: every node is found by id from now, and retained.
            entry.descendants = len(self.nodes_of(entry)) - 1
        self._finished.append((trio.current_time(), entry.principal, entry.run_id))
        self._finished_wakeup.set()
        state.finished[entry.run_id] = entry
        state.retained_bytes += entry.bytes
        while state.retained_bytes > self.limits.max_retained_bytes_per_principal:
            _, oldest = state.finished.popitem(last=False)
            self._forget(oldest, state)

    def _forget(self, entry: RunEntry, state: _Principal) -> None:
        """Forget a finished run (already taken out of ``state.finished``)."""
        self._unindex(entry)
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
            state = self.state_of(principal)
            entry = state.finished.pop(run_id, None)
            if entry is not None:
                self._forget(entry, state)
