"""Starting, resuming and hosting the server's runs, and what a disconnect does to them.

Each run is a task in the server's nursery (:func:`start_run`; a cluster's takeover:
:func:`resume_run`) with the session it gets: in memory (metered), a factory's (scoped
to its principal), or, with a cluster, the cluster's — claimed cluster-wide first, or,
queued (``enqueue``/``interrupt`` on a busy session), behind an in-process *gate* that
lets the run have the session once it is claimed cluster-wide (:func:`_claim_later`).
The run's bookkeeping (ids, per-principal counters, retention) is the
:class:`~._registry.Registry`'s. A connection that goes away applies its runs'
``on_disconnect`` (:func:`disconnected`), here and, for runs it placed on other nodes,
by a routed cancel.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, cast, final

import attrs
import trio

from .. import Agent, Item, Run, SessionBusyError, serve_run
from .._limits import UsageLimits
from .._session_lock import SessionClaim
from ..sessions import Session
from ._error_codes import ProtocolError
from ._policies import RunStartInfo, call_context_hook
from ._registry import Owner, Registry, RunEntry
from ._requests import RunCancel
from ._sessions import MeteredSession, ScopedSession

if TYPE_CHECKING:
    from .._resume import Resume
    from ._node import TakenOver

__all__ = ["closing", "disconnected", "own_placed", "resume_run", "start_run", "supersede"]

logger = logging.getLogger("trio_agents.hosting")

# How long a resume on this node waits for its own stopped attempt of the same run to
# end (that attempt's repair is bounded by its cleanup_timeout, 5 s by default).
_OLD_ATTEMPT_BOUND = 30.0

_DISCONNECTED = "client disconnected"


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


async def start_run(
    registry: Registry,
    principal: str,
    owner: Owner | None,
    agent_name: str,
    items: tuple[Item, ...],
    *,
    input_bytes: int,
    session_id: str | None,
    on_disconnect: str,
    on_busy: str,
    input_overlap: str = "keep",
    client_node: str | None = None,
    run_id: str | None = None,
    command: int | None = None,
    limits: UsageLimits | None = None,
) -> RunEntry:
    """Start a run in the server's nursery (after the admission checks:
    ``Registry.check_room``, ``Registry.take_start_token``).

    With a cluster, a run with ``on_disconnect="cancel"`` records the node that holds
    its client's connection (this one; ``client_node`` for a run another node placed
    here), so that the run is cancelled once that node is dead. A start another node
    placed here has its id (``run_id``) and its routed ``command``.

    The session's busy policy is the core's ``on_busy``: a busy session with
    ``"reject"`` answers ``session_busy``; ``"interrupt"``/``"enqueue"`` start the
    run ``queued`` behind the session's active run. With a cluster, the session is
    claimed cluster-wide first (``trio_agents.cluster._claims``).

    ``limits`` are the run's (the server's maximum applied: ``_policies.py``); the
    server's ``context`` hook is called first of all, so a hook that raises
    (``internal``) leaves nothing behind: no session claimed, no row, no run.
    """
    assert registry.nursery is not None
    run_id = run_id or f"run_{uuid.uuid4().hex}"
    extra: dict[str, Any] = {}
    if limits is not None:
        extra["limits"] = limits
    if input_overlap != "keep":
        extra["input_overlap"] = input_overlap
    if registry.context_hook is not None:
        info = RunStartInfo(
            run_id=run_id, agent=agent_name, session_id=session_id, input=items, limits=limits
        )
        extra["context"] = await call_context_hook(registry.context_hook, principal, info)
    cluster = registry.cluster
    if cluster is not None:
        if client_node is None and owner is not None and on_disconnect == "cancel":
            client_node = cluster.node_id
        session, behind = await _claim(
            registry,
            principal,
            run_id,
            agent_name,
            items,
            session_id,
            on_busy,
            extra,
            client_node=client_node,
            command=command,
            limits=limits,
        )
        memory = None
    else:
        session, memory = _local_session(registry, principal, session_id)
        behind = None
    entry = RunEntry(
        run_id=run_id,
        principal=principal,
        agent=agent_name,
        session_id=session_id,
        on_disconnect=on_disconnect,
        owner=owner,
        input_bytes=input_bytes,
        memory=memory,
        fence=None if cluster is None else session.fence,
    )
    registry.register(entry)
    await _launch(registry, entry, items, session, on_busy, extra, behind, client_node)
    return entry


async def _claim(
    registry: Registry,
    principal: str,
    run_id: str,
    agent_name: str,
    items: tuple[Item, ...],
    session_id: str | None,
    on_busy: str,
    extra: dict[str, Any],
    *,
    client_node: str | None,
    command: int | None,
    limits: UsageLimits | None,
) -> tuple[Any, str | None]:
    """A cluster's run: its session claimed cluster-wide (``trio_agents.cluster._claims``)
    and its row inserted; returns its cluster session and the run it queues behind
    (None: the session is its own)."""
    cluster = registry.cluster
    assert cluster is not None
    behind = await cluster._claim(
        run_id=run_id,
        principal=principal,
        session_id=session_id,
        agent=agent_name,
        on_busy=on_busy,
        cancel_holder=lambda holder, node: supersede(registry, principal, holder, node),
        items=items,
        client_node=client_node,
        command=command,
        limits=limits,
    )
    session = cluster._session(principal, session_id, run_id)
    extra["before_tool"] = cluster._before_tool(run_id, 1, session.fence)
    return session, behind


def _local_session(
    registry: Registry, principal: str, session_id: str | None
) -> tuple[Session | None, MeteredSession | None]:
    """The session of a run of one process: none, the principal's in-memory one
    (metered, and its holder), or the factory's (scoped to its principal)."""
    if session_id is None:
        return None, None
    if registry.session_factory is None:
        memory = registry.state_of(principal).sessions.acquire(session_id)
        if memory is None:
            raise ProtocolError(
                "limit_exceeded",
                f"in-memory sessions of this principal hold over"
                f" {registry.limits.max_session_bytes_per_principal} bytes in active runs",
            )
        return memory, memory
    return ScopedSession(registry.session_factory(principal, session_id), principal), None


async def _launch(
    registry: Registry,
    entry: RunEntry,
    items: tuple[Item, ...],
    session: Any,
    on_busy: str,
    extra: dict[str, Any],
    behind: str | None,
    client_node: str | None,
) -> None:
    """Start the run's task (the entry is registered); a run that does not start is
    forgotten (and, in a cluster, its row and claim too)."""
    assert registry.nursery is not None
    cluster = registry.cluster
    gate: SessionClaim | None = None
    policy = on_busy  # the client's, for the cluster-wide claim
    if cluster is not None:
        # The core's claim is per node: claimed cluster-wide already, or queued
        # behind a gate that lets go once the session is claimed cluster-wide.
        on_busy = "reject"
        if behind is not None:
            gate, on_busy = _gate(entry, session), "enqueue"
    try:
        agent = registry.agents[entry.agent]
        entry.run = await registry.nursery.start(
            _run_task, registry, entry, agent, items, session, on_busy, extra
        )
    except SessionBusyError:
        raise ProtocolError(
            "session_busy", f"session {entry.session_id!r} has an active run"
        ) from None
    except (TypeError, ValueError) as exc:  # the input is not a valid conversation
        raise ProtocolError("invalid_request", str(exc)) from None
    finally:
        if entry.run is None:
            if gate is not None:
                gate.release()
            registry.end(entry, retain=False)
            if cluster is not None:
                await cluster._forget(entry.run_id)
    if cluster is not None:
        entry.log = cluster._track(entry.run, entry.run_id, 1, 1, entry.fence, client_node)
    if gate is not None:
        registry.nursery.start_soon(_claim_later, registry, entry, gate, policy, behind, None)


def _gate(entry: RunEntry, session: Any) -> SessionClaim:
    """Hold the run's session in this process until it is claimed cluster-wide (the
    cluster session's claim is per run: the gate holds it at once, and the run queues
    behind it; the order among runs is the cluster-wide queue's)."""
    gate = SessionClaim(session.lock_key, session.session_id, _Gate(entry))
    gate.claim_now("enqueue")
    return gate


async def _claim_later(
    registry: Registry,
    entry: RunEntry,
    gate: SessionClaim,
    on_busy: str,
    interrupted: str | None,
    then: Callable[[], Awaitable[None]] | None,
) -> None:
    """A queued run of a cluster: claim its session cluster-wide once its holder
    ends (``then()`` first thing after), then let the run have it."""
    cluster = registry.cluster
    assert cluster is not None
    claimed = False
    try:
        await gate.wait()
        claimed = await cluster._claim_queued(
            run_id=entry.run_id,
            principal=entry.principal,
            session_id=entry.session_id,
            on_busy=on_busy,
            waiting=lambda: not entry.done.is_set() and not entry.fence.closed,
            cancel_holder=lambda holder, node: supersede(registry, entry.principal, holder, node),
            interrupted=interrupted,
        )
        if claimed and then is not None:
            await _then_claimed(entry, then)
    finally:
        if not claimed and entry.run is not None and not entry.done.is_set():
            entry.run.cancel("this node stopped")  # it never gets the session here
        gate.release()


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


async def resume_run(
    registry: Registry,
    claimed: TakenOver,
    resume: Resume,
    then: Callable[[Run], None] | None = None,
) -> RunEntry:
    """Continue a run this node took over (a cluster's takeover); ``then(run)`` is
    called the moment the run exists, before it can call its model or end (its
    re-injections, an acked cancel)."""
    assert registry.nursery is not None
    assert registry.cluster is not None
    cluster = registry.cluster
    # The limits it was started with (persisted with its row), counted afresh by this
    # attempt; its context from the hook again (a context never leaves its process),
    # first of all: a hook that raises leaves nothing behind (the takeover fails it).
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
    session = cluster._session(claimed.principal, claimed.session_id, claimed.run_id)
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
    old = registry.runs.get(entry.run_id)
    if old is not None:  # a run this node ran before (it had lost its lease)
        if old.run is not None and old.run.result is None:
            # Its stopped attempt still holds the session in this process until its
            # (bounded) repair ends: resuming before would find the session busy.
            with trio.move_on_after(_OLD_ATTEMPT_BOUND):
                await old.run.wait()
        registry.drop(old)
    registry.register(entry)
    gate: SessionClaim | None = None
    then_claimed: Callable[[], Awaitable[None]] | None = None
    if claimed.queued:
        # It was still queued for its session: queued again here; its input goes
        # into the session once the session is its own.
        gate = _gate(entry, session)
        inputs = claimed.input

        async def then_claimed() -> None:
            if inputs:
                await session.add_input(inputs)

    elif claimed.input:
        # The earlier attempt died before its input reached the session (the run's own
        # record says so: ``Claimed.input``), whatever else the session holds.
        await session.add_input(claimed.input)
    extra: dict[str, Any] = {
        "resume": resume,
        "before_tool": cluster._before_tool(entry.run_id, resume.attempt, session.fence),
        "_then": then,
    }
    extra.update(policies)
    on_busy = "reject" if gate is None else "enqueue"
    try:
        entry.run = await registry.nursery.start(
            _run_task, registry, entry, registry.agents[claimed.agent], (), session, on_busy, extra
        )
    finally:
        if entry.run is None:
            if gate is not None:
                gate.release()
            registry.end(entry, retain=False)
    entry.log = cluster._track(
        entry.run,
        entry.run_id,
        resume.attempt,
        resume.next_seq,
        session.fence,
        None if claimed.client_gone else claimed.client_node,
    )
    if gate is not None:
        registry.nursery.start_soon(
            _claim_later, registry, entry, gate, "enqueue", None, then_claimed
        )
    return entry


async def supersede(registry: Registry, principal: str, run_id: str, node: str | None) -> None:
    """``on_busy="interrupt"`` in a cluster: cancel the session's holder, wherever
    it runs (reason ``"superseded"``); errors are ignored (it may have ended)."""
    entry = registry.runs.get(run_id)
    if entry is not None and entry.run is not None:
        entry.run.cancel("superseded")
        return
    assert registry.cluster is not None
    with contextlib.suppress(ProtocolError):
        await registry.cluster._route(
            principal, RunCancel(run_id=run_id, reason="superseded"), run_id
        )


async def _run_task(
    registry: Registry,
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
                **{**registry.run_options, **extra},
            )
    finally:
        if entry.run is not None:
            registry.end(entry, retain=True)
        aclose = getattr(session, "aclose", None)
        owned = registry.session_factory is not None or registry.cluster is not None
        if owned and aclose is not None:
            with trio.move_on_after(5.0, shield=True):
                try:
                    await aclose()
                except Exception:
                    logger.exception("closing the session of %s failed", entry.run_id)


async def own_placed(registry: Registry, owner: Owner, run_id: str) -> None:
    """``owner`` started ``run_id`` with ``on_disconnect="cancel"`` on another node
    (a cluster placed it there): its disconnect cancels it there too.

    The ids of placed runs that have finished are dropped once there are more than
    twice the principal's active-run limit (one query), so a long-lived connection
    does not remember every run it ever placed.
    """
    assert registry.cluster is not None
    owner.placed.add(run_id)
    if len(owner.placed) > 2 * registry.limits.max_runs_per_principal:
        with contextlib.suppress(ProtocolError):  # the database is down: next time
            unfinished = await registry.cluster._unfinished(owner.principal, owner.placed)
            owner.placed.intersection_update(unfinished | {run_id})


def disconnected(registry: Registry, owner: Owner) -> None:
    """The connection ``owner`` is gone: apply the ``on_disconnect`` of the runs it
    started (here, and placed on other nodes: a routed cancel)."""
    for entry in list(owner.owned):
        entry.owner = None
        if entry.on_disconnect == "cancel" and entry.run is not None:
            entry.run.cancel(_DISCONNECTED)
    placed, owner.placed = owner.placed, set()
    if placed and registry.nursery is not None:
        registry.nursery.start_soon(_cancel_placed, registry, owner.principal, placed)


async def closing(registry: Registry, owners: Iterable[Owner]) -> None:
    """A cluster node that stops hands its runs over, but it also closes its
    connections: the runs they started with ``on_disconnect="cancel"`` are cancelled
    (reason ``"client disconnected"``) as their disconnect would — durably for this
    node's runs (the node that takes one over ends it cancelled), routed for the runs
    placed on other nodes. Call it before the hand-over; bound it."""
    cluster = registry.cluster
    assert cluster is not None

    async def cancel_durably(entry: RunEntry) -> None:
        assert entry.run is not None
        entry.run.cancel(_DISCONNECTED)
        with contextlib.suppress(ProtocolError):
            await cluster._record_cancel(entry.run_id, _DISCONNECTED, "immediate")

    async with trio.open_nursery() as nursery:
        for owner in owners:
            for entry in list(owner.owned):
                if entry.on_disconnect == "cancel" and entry.run is not None:
                    entry.on_disconnect = "continue"  # done: its disconnect adds nothing
                    nursery.start_soon(cancel_durably, entry)
            placed, owner.placed = owner.placed, set()
            if placed:
                nursery.start_soon(_cancel_placed, registry, owner.principal, placed)


async def _cancel_placed(registry: Registry, principal: str, run_ids: Iterable[str]) -> None:
    """Route ``"client disconnected"`` cancels to the owners of ``run_ids`` (a run
    that has finished meanwhile answers ``run_closed``: ignored)."""
    assert registry.cluster is not None
    for run_id in run_ids:
        request = RunCancel(run_id=run_id, reason=_DISCONNECTED)
        try:
            await registry.cluster._route(principal, request, run_id)
        except ProtocolError as exc:
            if exc.code not in ("run_closed", "not_found"):
                logger.warning("could not cancel placed run %s: %s", run_id, exc.message)
