"""Where a node's runs live: :class:`ClusterPlacement`, the cluster's
:class:`~trio_agents.hosting._placement.RunPlacement`.

The host's run machinery (``hosting/_run_tasks.py``) asks it to place each run: the
run's session is claimed cluster-wide first (``_claims.py``: one active run per
session across the cluster) and its row inserted; a run queued (``enqueue``/
``interrupt`` on a busy session) waits behind an in-process *gate* that lets the run
have the session once it is claimed cluster-wide (:meth:`ClusterPlacement._claim_later`).
Each run's events and session writes are persisted by the node's writer (its
:class:`~._eventlog.RunLog`, fenced by a :class:`~._eventlog.Fence`), and each tool call
is recorded before its tool runs (the ``before_tool`` barrier).

What only a node of a cluster does with its runs lives here too: resuming a run taken
over (:meth:`ClusterPlacement.resume`), the disconnect of a client whose runs were
placed on other nodes (:meth:`ClusterPlacement.own_placed`,
:meth:`ClusterPlacement.cancel_elsewhere`), superseding a session's holder wherever it
runs, and closing the connections of a node that stops (:meth:`ClusterPlacement.closing`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, final

import attrs
import trio

from .._resume import Resume
from .._run import Run
from .._session_lock import SessionClaim
from ..hosting._error_codes import ProtocolError
from ..hosting._placement import EventLog, PlacedRun, RunPlacement, RunStart
from ..hosting._policies import RunStartInfo, call_context_hook
from ..hosting._registry import Owner, Registry, RunEntry
from ..hosting._requests import RunCancel
from ..hosting._run_tasks import DISCONNECTED, launch
from ._eventlog import Fence
from ._session import ClusterSession

if TYPE_CHECKING:
    from ._cluster_node import ClusterNode
    from ._takeover import Claimed

__all__ = ["ClusterPlacement"]

logger = logging.getLogger("trio_agents.cluster")

# How long a resume on this node waits for its own stopped attempt of the same run to
# end (that attempt's repair is bounded by its cleanup_timeout, 5 s by default).
_OLD_ATTEMPT_BOUND = 30.0


@final
@attrs.define(eq=False)
class _Gate:
    """The in-process holder of a cluster session while a queued run of this node waits
    for the session cluster-wide: the run queues behind it (the core's claim), so it
    stays ``queued`` — and cancellable — until the gate lets go."""

    registry: Registry
    run_id: str

    @property
    def id(self) -> str:
        return self.run_id

    def cancel(self, reason: str | None = None) -> None:
        entry = self.registry.runs.get(self.run_id)
        if entry is not None and entry.run is not None:
            entry.run.cancel(reason)


@final
@attrs.define(eq=False)
class _Queued:
    """A placed run that waits for its session cluster-wide (behind its gate)."""

    gate: SessionClaim
    on_busy: str  # the client's, for the cluster-wide claim
    client_node: str | None


def _gate(registry: Registry, run_id: str, session: ClusterSession) -> SessionClaim:
    """Hold the run's session in this process until it is claimed cluster-wide (the
    cluster session's claim is per run: the gate holds it at once, and the run queues
    behind it; the order among runs is the cluster-wide queue's)."""
    gate = SessionClaim(session.lock_key, session.session_id, _Gate(registry, run_id))
    gate.claim_now("enqueue")
    return gate


@final
class ClusterPlacement(RunPlacement):
    """The runs of one node of a cluster (see the module docstring)."""

    def __init__(self, node: ClusterNode, registry: Registry) -> None:
        self._node = node
        self.registry = registry
        self._queued: dict[str, _Queued] = {}
        self._clients: dict[str, str | None] = {}

    # ------------------------------------------------------------ RunPlacement

    async def place(self, start: RunStart) -> PlacedRun:
        """Insert the run's row, claiming its session cluster-wide; a run queued behind
        the session's holder waits behind a gate here until it is claimed. A run with
        ``on_disconnect="cancel"`` records the node that holds its client's connection
        (this one; ``client_node`` for a run another node placed here), so that the
        run is cancelled once that node is dead."""
        node = self._node
        client_node = start.client_node
        if client_node is None and start.owned and start.on_disconnect == "cancel":
            client_node = node.node_id
        registry = self.registry
        behind = await node.claim(
            run_id=start.run_id,
            principal=start.principal,
            session_id=start.session_id,
            agent=start.agent,
            on_busy=start.on_busy,
            cancel_holder=lambda holder, node: self.supersede(start.principal, holder, node),
            items=start.input,
            client_node=client_node,
            command=start.command,
            limits=start.limits,
        )
        session = node.session(start.principal, start.session_id, start.run_id)
        self._clients[start.run_id] = client_node
        # The core's claim is per node: claimed cluster-wide already, or queued
        # behind a gate that lets go once the session is claimed cluster-wide.
        on_busy = "reject"
        if behind is not None:
            gate = _gate(registry, start.run_id, session)
            self._queued[start.run_id] = _Queued(gate, start.on_busy, client_node)
            on_busy = "enqueue"
        before_tool = node.before_tool(start.run_id, 1, session.fence)
        return PlacedRun(
            session,
            on_busy,
            fence=session.fence,
            run_options={"before_tool": before_tool},
            close_session=True,
        )

    def started(self, start: RunStart, placed: PlacedRun, run: Run) -> EventLog:
        client_node = self._clients.pop(start.run_id, None)
        log = self._node.track(run, start.run_id, 1, 1, _fence(placed), client_node)
        queued = self._queued.pop(start.run_id, None)
        if queued is not None:
            entry = self.registry.runs[start.run_id]
            self._start_soon(self._claim_later, entry, queued.gate, queued.on_busy, None, None)
        return log

    async def not_started(self, start: RunStart, placed: PlacedRun) -> None:
        self._clients.pop(start.run_id, None)
        queued = self._queued.pop(start.run_id, None)
        if queued is not None:
            queued.gate.release()
        await self._node.forget(start.run_id)

    def ended(self, run_id: str) -> None:
        self._node.room_freed()

    async def cancel_elsewhere(self, principal: str, run_ids: Iterable[str], reason: str) -> None:
        """Route ``reason`` cancels to the owners of ``run_ids`` (a run that has
        finished meanwhile answers ``run_closed``: ignored)."""
        for run_id in run_ids:
            try:
                await self._node.route(principal, RunCancel(run_id=run_id, reason=reason), run_id)
            except ProtocolError as exc:
                if exc.code not in ("run_closed", "not_found"):
                    logger.warning("could not cancel placed run %s: %s", run_id, exc.message)

    # ------------------------------------------------------- only a cluster's

    def _start_soon(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        nursery = self.registry.nursery
        assert nursery is not None
        nursery.start_soon(fn, *args)

    async def supersede(self, principal: str, run_id: str, node: str | None) -> None:
        """``on_busy="interrupt"`` in a cluster: cancel the session's holder, wherever
        it runs (reason ``"superseded"``); errors are ignored (it may have ended)."""
        entry = self.registry.runs.get(run_id)
        if entry is not None and entry.run is not None:
            entry.run.cancel("superseded")
            return
        with contextlib.suppress(ProtocolError):
            await self._node.route(principal, RunCancel(run_id=run_id, reason="superseded"), run_id)

    async def own_placed(self, owner: Owner, run_id: str) -> None:
        """``owner`` started ``run_id`` with ``on_disconnect="cancel"`` on another node
        (placed there): its disconnect cancels it there too.

        The ids of placed runs that have finished are dropped once there are more than
        twice the principal's active-run limit (one query), so a long-lived connection
        does not remember every run it ever placed.
        """
        owner.placed.add(run_id)
        if len(owner.placed) > 2 * self.registry.limits.max_runs_per_principal:
            with contextlib.suppress(ProtocolError):  # the database is down: next time
                unfinished = await self._node.unfinished(owner.principal, owner.placed)
                owner.placed.intersection_update(unfinished | {run_id})

    async def closing(self, owners: Iterable[Owner]) -> None:
        """A node that stops hands its runs over, but it also closes its connections:
        the runs they started with ``on_disconnect="cancel"`` are cancelled (reason
        ``"client disconnected"``) as their disconnect would — durably for this node's
        runs (the node that takes one over ends it cancelled), routed for the runs
        placed on other nodes. Call it before the hand-over; bound it."""
        node = self._node

        async def cancel_durably(entry: RunEntry) -> None:
            assert entry.run is not None
            entry.run.cancel(DISCONNECTED)
            with contextlib.suppress(ProtocolError):
                await node.record_cancel(entry.run_id, DISCONNECTED, "immediate")

        async with trio.open_nursery() as nursery:
            for owner in owners:
                for entry in list(owner.owned):
                    if entry.on_disconnect == "cancel" and entry.run is not None:
                        entry.on_disconnect = "continue"  # done: its disconnect adds nothing
                        nursery.start_soon(cancel_durably, entry)
                placed, owner.placed = owner.placed, set()
                if placed:
                    nursery.start_soon(self.cancel_elsewhere, owner.principal, placed, DISCONNECTED)

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
        claimed = False
        fence = entry.fence
        assert fence is not None
        try:
            await gate.wait()
            claimed = await self._node.claim_queued(
                run_id=entry.run_id,
                principal=entry.principal,
                session_id=entry.session_id,
                on_busy=on_busy,
                waiting=lambda: not entry.done.is_set() and not fence.closed,
                cancel_holder=lambda holder, node: self.supersede(entry.principal, holder, node),
                interrupted=interrupted,
            )
            if claimed and then is not None:
                await _then_claimed(entry, then)
        finally:
            if not claimed and entry.run is not None and not entry.done.is_set():
                entry.run.cancel("this node stopped")  # it never gets the session here
            gate.release()

    async def resume(
        self, claimed: Claimed, resume: Resume, then: Callable[[Run], None] | None = None
    ) -> RunEntry:
        """Continue a run this node took over; ``then(run)`` is called the moment the
        run exists, before it can call its model or end (its re-injections, an acked
        cancel)."""
        registry = self.registry
        node = self._node
        policies = await _policies(registry, claimed)  # first of all: see there
        session = node.session(claimed.principal, claimed.session_id, claimed.run_id)
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
        await _drop_old_attempt(registry, entry.run_id)
        registry.register(entry)
        gate: SessionClaim | None = None
        then_claimed: Callable[[], Awaitable[None]] | None = None
        if claimed.queued:
            # It was still queued for its session: queued again here; its input goes
            # into the session once the session is its own.
            gate = _gate(registry, entry.run_id, session)
            inputs = claimed.input

            async def then_claimed() -> None:
                if inputs:
                    await session.add_input(inputs)

        elif claimed.input:
            # The earlier attempt died before its input reached the session (the run's own
            # record says so: ``Claimed.input``), whatever else the session holds.
            await session.add_input(claimed.input)
        placed = PlacedRun(
            session,
            "reject" if gate is None else "enqueue",
            fence=session.fence,
            run_options={
                "resume": resume,
                "before_tool": node.before_tool(entry.run_id, resume.attempt, session.fence),
            },
            close_session=True,
        )
        try:
            run = await launch(registry, entry, (), placed, policies, then)
        except BaseException:
            if gate is not None:
                gate.release()
            raise
        entry.log = node.track(
            run,
            entry.run_id,
            resume.attempt,
            resume.next_seq,
            session.fence,
            None if claimed.client_gone else claimed.client_node,
        )
        if gate is not None:
            self._start_soon(self._claim_later, entry, gate, "enqueue", None, then_claimed)
        return entry


async def _policies(registry: Registry, claimed: Claimed) -> dict[str, Any]:
    """A resumed run's limits and context: the limits it was started with (persisted
    with its row), counted afresh by this attempt; its context from the hook again (a
    context never leaves its process), first of all: a hook that raises leaves nothing
    behind (the takeover fails the run)."""
    policies: dict[str, Any] = {}
    if claimed.limits is not None:
        policies["limits"] = claimed.limits
    if registry.context_hook is not None:
        info = RunStartInfo(
            run_id=claimed.run_id,
            agent=claimed.agent,
            session_id=claimed.session_id,
            input=(),
            limits=claimed.limits,
            resumed=True,
        )
        policies["context"] = await call_context_hook(
            registry.context_hook, claimed.principal, info
        )
    return policies


def _fence(placed: PlacedRun) -> Fence:
    """The cluster's fence of a run this placement placed."""
    fence = placed.fence
    assert isinstance(fence, Fence)
    return fence


async def _drop_old_attempt(registry: Registry, run_id: str) -> None:
    """Forget this node's earlier attempt of a run it resumes (it had lost its lease)."""
    old = registry.runs.get(run_id)
    if old is None:
        return
    if old.run is not None and old.run.result is None:
        # Its stopped attempt still holds the session in this process until its
        # (bounded) repair ends: resuming before would find the session busy.
        with trio.move_on_after(_OLD_ATTEMPT_BOUND):
            await old.run.wait()
    registry.drop(old)


async def _then_claimed(entry: RunEntry, then: Callable[[], Awaitable[None]]) -> None:
    """``then()`` of a queued run that got its session (a takeover writes its input).
    The run can end first — cancelled as its session frees, its session closed with
    it —: then there is nothing to write. Whatever ``then()`` raises stops the run,
    never the server (it runs in the server's nursery)."""
    run = entry.run
    if entry.done.is_set() or (run is not None and run.result is not None):
        await trio.lowlevel.checkpoint()
        return
    try:
        await then()
    except Exception as exc:
        if run is not None and run.result is None:
            logger.warning("run %s: its session could not be prepared", entry.run_id, exc_info=True)
            run.cancel(f"session error: {exc}")
