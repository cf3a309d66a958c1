"""The :class:`~trio_agents.hosting.RunHost` over Temporal: :class:`TemporalHost`.

Every face (websocket, REST + SSE, A2A, AG-UI, MCP, the web UI) serves runs that live on
Temporal workers through this host, exactly as it serves a :class:`LocalHost`'s:

- **start** records the run (``queued``) in the shared :class:`RunStore`, claims its
  session there (one active run per session, wherever runs run), and starts its workflow
  (workflow id = run id);
- **get / list / events / wait_terminal** read the store, where the attempt running the
  run on a worker writes its events and records as they come (a subscriber follows it
  by polling the store's ``data_version``, a cheap read, every ``poll_interval``);
- **cancel, inject, withdraw, approve, reject** are the workflow's ``steer`` update
  (recorded in the history, then pushed to the attempt), answered with the attempt's real
  answer; a cancel of a root is first a Temporal cancel carrying the reason, so the
  workflow ends CANCELED once the run's repaired result is recorded;
- a watcher per open root waits for its workflow to close and, if no attempt wrote the
  run's terminal record (cancelled before any attempt ran, an attempt that crashed),
  writes it, so no face ever waits on a run Temporal has given up.

The Temporal client is asyncio: it lives on an :class:`~._asyncio_loop.AsyncioLoop` of
the host's own, opened with the host.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, Literal, final

import trio
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.service import RPCError, RPCStatusCode

from .._agent import Agent
from .._events import RunStatus
from .._items import Item
from ..hosting import HostedEvent, HostError, Limits, Origin, RunInfo, StartRequest
from ..hosting._local import check_from_seq, host_errors
from ..hosting._policies import effective_limits, limits_to_wire
from ..hosting._session_fork import fork_from_factory, item_index_of, item_position
from ._activity import SessionFactory
from ._asyncio_loop import AsyncioLoop
from ._push import push_op_here
from ._shared_store import RunStoreError, SharedRunStore
from ._stores import run_store_at
from ._trio_worker import DEFAULT_TASK_QUEUE
from ._types import (
    CANCELLED_BY_TEMPORAL,
    SIGNAL_CANCEL_REASON,
    UPDATE_STEER,
    WORKFLOW_NAME,
    OpAnswer,
    RunOutcome,
    RunRequest,
    SteeringOp,
)

__all__ = ["TemporalHost"]

log = logging.getLogger("trio_agents.temporal")

_HOST_CODES: Final = frozenset(
    {"not_found", "run_closed", "invalid_request", "inbox_full", "limit_exceeded"}
)


# How long a cancel that Temporal already holds waits for the update that brings it to
# the attempt at once (no worker may be there to take the workflow's task up).
_PUSH_BOUND: Final = 5.0

# Once the host has steered a running attempt (a cancel, an inject, a decision), that
# attempt's events follow within milliseconds: the host looks at the store this often
# for this long, instead of every ``poll_interval`` (measured: a face cancel's terminal
# update reached SSE about 30 ms after the push answered with 20 ms polls).
_HURRY_INTERVAL: Final = 0.002
_HURRY_WINDOW: Final = 0.25
# The store failing: look again after this, doubling up to the max.
_STORE_RETRY: Final = 0.1
_STORE_RETRY_MAX: Final = 5.0

# The roots of the runs steered last that the host remembers (a pair of short strings
# each): enough for every run a server steers at once.
_ROOTS_KEPT: Final = 10_000


_UNREACHABLE: Final = frozenset(
    {RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED, RPCStatusCode.CANCELLED}
)


def _rpc_refused(exc: RPCError, run_id: str) -> HostError:
    """What an op gets when Temporal refused its call: ``internal`` while Temporal
    cannot be reached (the op may be retried), ``run_closed`` when the workflow is
    closed (or gone)."""
    if exc.status in _UNREACHABLE:
        return HostError("internal", f"Temporal cannot be reached: {exc.message}")
    return HostError("run_closed", f"run {run_id} is closed")


def _refused(answer: OpAnswer) -> HostError:
    code = answer.code if answer.code in _HOST_CODES else "internal"
    return HostError(code, answer.message or code)  # type: ignore[arg-type]


@final
class TemporalHost:
    """Runs on Temporal workers, served to every face (DESIGN §20; docs/temporal.md).

    Args:
        target: the Temporal frontend, ``"HOST:PORT"``.
        agents: the agents by name: the same app the workers serve (a face reads their
            names and output schemas here; the runs themselves run on the workers).
        store: the store the workers write to: a :class:`RunStore` or a
            :class:`PostgresRunStore` (:func:`shared_storage`), or where it is (a
            ``postgresql://`` URI, else the store's own SQLite file).
        task_queue: the workers' task queue.
        namespace: the Temporal namespace.
        limits: the server's :class:`~trio_agents.hosting.Limits` (runs per principal,
            ``max_run_limits``, the shutdown bound).
        heartbeat_timeout: seconds without a heartbeat after which an attempt is deemed
            lost and retried on another worker.
        run_options: JSON-able ``open_run`` options for every run (``max_turns``, ...).
        poll_interval: seconds between two looks at the store for new events.
        sessions: the workers' session factory (:func:`sqlite_sessions` over the same
            file, :func:`postgres_sessions` over the same database), for
            :meth:`fork_session`; None: forks are refused.

    Serve it like any host: ``await hosting.serve(TemporalHost(...), faces)``.
    """

    def __init__(
        self,
        target: str,
        agents: Mapping[str, Agent],
        *,
        store: SharedRunStore | str | os.PathLike[str],
        task_queue: str = DEFAULT_TASK_QUEUE,
        namespace: str = "default",
        limits: Limits | None = None,
        heartbeat_timeout: float = 2.0,
        run_options: Mapping[str, Any] | None = None,
        poll_interval: float = 0.02,
        sessions: SessionFactory | None = None,
    ) -> None:
        if limits is not None and not isinstance(limits, Limits):
            raise TypeError("limits must be a Limits instance")
        if not (isinstance(poll_interval, int | float) and 0 < poll_interval < math.inf):
            raise ValueError(f"poll_interval must be a positive number, not {poll_interval!r}")
        self._target = target
        self._agents = dict(agents)
        self._store = run_store_at(store) if isinstance(store, str | os.PathLike) else store
        self._task_queue = task_queue
        self._namespace = namespace
        self._limits = limits if limits is not None else Limits()
        self._heartbeat_timeout = heartbeat_timeout
        self._run_options = dict(run_options or {})
        self._poll_interval = poll_interval
        self._sessions = sessions
        self._loop = AsyncioLoop()
        self._client: Client | None = None
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()
        # Set by _hurry(): the poller looks at the store every _HURRY_INTERVAL until then.
        self._hurry_until = -math.inf
        self._hurried = trio.Event()
        self._closing = False
        self._watched: set[str] = set()
        self._owners: dict[object, tuple[str, set[str]]] = {}
        self._tasks: trio.Nursery | None = None
        self._cancel_reasons: dict[str, str] = {}
        self._cancelling: dict[str, int] = {}  # run id -> cancels in flight from here
        # (principal, run id) -> the root of its tree: a run's tree never changes, and a
        # steering op needs it first; the store's read queues behind the host's polls of
        # the store (p50 1.2 ms, p90 9 ms, p99 33 ms at load ~8 on the 2-core machine,
        # issue 38's third round). Runs started here are known at once.
        self._roots: collections.OrderedDict[tuple[str, str], str] = collections.OrderedDict()

    # ----------------------------------------------------------------- settings

    @property
    def agents(self) -> Mapping[str, Agent]:
        """The agents runs may be started with, by name."""
        return self._agents

    @property
    def limits(self) -> Limits:
        """The host's :class:`~trio_agents.hosting.Limits`."""
        return self._limits

    @property
    def store(self) -> SharedRunStore:
        """The shared store of runs this host reads."""
        return self._store

    # ---------------------------------------------------------------- lifecycle

    async def open(self, nursery: trio.Nursery) -> Callable[[], None]:
        """Connect to Temporal (on the host's asyncio loop), open the store, and start
        following it; returns what stops the host's own tasks."""
        if self._nursery is not None:
            raise RuntimeError("a host opens once")
        await trio.to_thread.run_sync(self._loop.start)
        try:
            target, namespace = self._target, self._namespace
            self._client = await self._loop.call(
                lambda: Client.connect(target, namespace=namespace)
            )
            await self._store.__aenter__()
        except BaseException:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._loop.stop)
            raise
        own = trio.CancelScope()
        await nursery.start(self._own_tasks, own)
        self._nursery = nursery
        return own.cancel

    @asynccontextmanager
    async def running(self) -> AsyncIterator[TemporalHost]:
        """Serve the host for the block without faces (its own tasks in a nursery of
        its own), as :meth:`LocalHost.running <trio_agents.hosting.LocalHost.running>`
        does: a program that calls the host's ops itself."""
        async with trio.open_nursery() as nursery:
            stop = await self.open(nursery)
            try:
                yield self
            finally:
                self.begin_shutdown()
                stop()

    async def _own_tasks(
        self, scope: trio.CancelScope, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            with scope:
                async with trio.open_nursery() as tasks:
                    self._tasks = tasks
                    tasks.start_soon(self._poll)
                    # Runs another server started (or this one, before a restart) are
                    # watched too: whichever host sees their workflow close first
                    # writes a missing terminal record.
                    for principal, run_id in await self._store.open_roots():
                        self._watch(principal, run_id)
                    task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self._store.close()
                await trio.to_thread.run_sync(self._loop.stop)

    @property
    def closing(self) -> bool:
        """Whether the shutdown began (no new run starts)."""
        return self._closing

    def begin_shutdown(self) -> float:
        """No new run starts from now on; the shutdown's deadline."""
        self._closing = True
        return trio.current_time() + self._limits.shutdown_timeout

    async def stop_runs(self, deadline: float) -> None:
        """Nothing to stop here: the runs live on the workers and go on without this
        server (a client's ``on_disconnect="cancel"`` runs were cancelled when its
        face disconnected it)."""
        await trio.lowlevel.checkpoint()

    async def wait_runs(self, deadline: float) -> None:
        """Nothing runs here to wait for."""
        await trio.lowlevel.checkpoint()

    def force_stop(self) -> None:
        """Nothing runs here to stop."""

    # --------------------------------------------------------------- following

    async def _poll(self) -> None:
        """Wake the subscribers whenever another process committed to the store. The
        store failing (a database restart, a failover, a pool wait past its timeout)
        is waited out, with a backoff: the server and its streams stay up, and every
        subscriber is woken once it answers again (writes may have been missed)."""
        seen: int | None = None  # None: no version read yet, nothing to compare with
        backoff = 0.0
        while True:
            if backoff:
                await trio.sleep(backoff)
            elif seen is not None:
                hurried = trio.current_time() < self._hurry_until
                with trio.move_on_after(_HURRY_INTERVAL if hurried else self._poll_interval):
                    await self._hurried.wait()
                if self._hurried.is_set():
                    self._hurried = trio.Event()
            try:
                version = await self._store.data_version()
            except RunStoreError as exc:
                if not backoff:
                    log.warning("the run store failed; following it again once it answers: %s", exc)
                backoff = min(max(backoff * 2, _STORE_RETRY), _STORE_RETRY_MAX)
                continue
            missed = backoff > 0
            if missed:
                log.warning("the run store answers again")
                backoff = 0.0
            if seen is not None and (version != seen or missed):
                self._bump()
            seen = version

    def _spawn(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        if self._tasks is None:
            raise HostError("internal", "the host is not being served")
        self._tasks.start_soon(fn, *args)

    def _hurry(self) -> None:
        """The host just steered a running attempt: look at the store often for a while
        (its events follow at once), starting now."""
        self._hurry_until = trio.current_time() + _HURRY_WINDOW
        self._hurried.set()

    def _bump(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _watch(self, principal: str, run_id: str) -> None:
        if run_id not in self._watched:
            self._watched.add(run_id)
            self._spawn(self._watch_run, principal, run_id)

    async def _watch_run(self, principal: str, run_id: str) -> None:
        """Wait for the run's workflow to close; write its terminal record if no
        attempt did."""
        try:
            status, reason = await self._loop.call(lambda: self._closed_as(run_id))
            asked = self._cancel_reasons.pop(run_id, None)
            if status == "cancelled" and reason == CANCELLED_BY_TEMPORAL and asked:
                # Cancelled by this host before any attempt ran: Temporal's cancel does
                # not always carry its reason to the workflow, this host knows it.
                reason = asked
            if await self._store.finish_if_open(principal, run_id, status, reason):
                log.info("run %s: its workflow closed %s with no attempt's record", run_id, status)
                self._bump()
        except Exception:
            log.exception("run %s: watching its workflow failed", run_id)
        finally:
            self._watched.discard(run_id)

    async def _closed_as(self, run_id: str) -> tuple[str, str | None]:
        """(asyncio) The run's final status and reason, once its workflow closed."""
        handle = self._connected().get_workflow_handle(run_id, result_type=RunOutcome)
        try:
            outcome = await handle.result()
        except WorkflowFailureError as exc:
            cause = exc.cause
            if isinstance(cause, CancelledError):
                memo = await (await handle.describe()).memo()
                reason = memo.get("reason") if isinstance(memo, dict) else None
                return "cancelled", reason if isinstance(reason, str) else CANCELLED_BY_TEMPORAL
            if isinstance(cause, ApplicationError) and cause.type == "RunFailed":
                details = cause.details[0] if cause.details else None
                reason = details.get("reason") if isinstance(details, dict) else None
                return "failed", reason or cause.message
            return "failed", f"the run's workflow failed: {cause or exc}"
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return "failed", "the run's workflow is gone"
            raise
        return outcome.status, outcome.reason

    def _connected(self) -> Client:
        if self._client is None:
            raise HostError("internal", "the host is not being served")
        return self._client

    # ---------------------------------------------------------------------- ops

    async def start(self, origin: Origin, request: StartRequest) -> str:
        """Record the run, claim its session, start its workflow; returns its id.

        Raises:
            HostError: ``not_found`` (no such agent), ``invalid_request``,
                ``limit_exceeded``, ``session_busy``, ``internal`` (shutting down,
                Temporal unreachable).
        """
        if self._closing or self._nursery is None:
            raise HostError("internal", "the host is not being served")
        limits = self._admit(request)
        principal = origin.principal
        if await self._store.active_roots(principal) >= self._limits.max_runs_per_principal:
            raise HostError(
                "limit_exceeded",
                f"at most {self._limits.max_runs_per_principal} active runs per principal",
            )
        owner = self._owner(origin)
        run_id = origin.run_id or f"run_{uuid.uuid4().hex}"
        info = RunInfo(
            run_id=run_id,
            agent=request.agent,
            session_id=request.session_id,
            status=RunStatus.QUEUED,
            reason=None,
            seq=0,
        )
        queued = request.session_id is not None and request.on_busy != "reject"
        holder = await self._store.create_run(info, principal, claim_session=not queued)
        if holder is not None:
            raise HostError("session_busy", f"session {request.session_id!r} has an active run")
        self._bump()
        run_request = RunRequest(
            run_id=run_id,
            agent=request.agent,
            input=[item.to_json() for item in request.input],
            session_id=request.session_id,
            principal=principal,
            options={**self._run_options, "input_overlap": request.input_overlap},
            heartbeat_timeout=self._heartbeat_timeout,
            limits=None if limits is None else limits_to_wire(limits),
        )
        if owner is not None and request.on_disconnect == "cancel":
            owner.add(run_id)
        if queued:
            self._spawn(self._start_queued, run_request, request.on_busy)
        else:
            await self._start_workflow(run_request)
            # Its steering ops need not read the store for its root (see _root_of).
            self._remember_root((principal, run_id), run_id)
        return run_id

    def _admit(self, request: StartRequest) -> Any:
        if request.context is not None:
            raise HostError(
                "invalid_request",
                "a run's context is set by the host's context hook, not by the client",
            )
        if request.agent not in self._agents:
            raise HostError("not_found", f"no agent {request.agent!r}")
        if not request.input:
            raise HostError("invalid_request", "a run starts with at least one item")
        asked = None if request.limits is None else limits_to_wire(request.limits)
        with host_errors():  # invalid_request: above the maximum, or not fitting
            return effective_limits(asked, self._limits.max_run_limits)

    def _owner(self, origin: Origin) -> set[str] | None:
        if origin.owner is None:
            return None
        principal, runs = self._owners.setdefault(origin.owner, (origin.principal, set()))
        if principal != origin.principal:
            raise HostError("invalid_request", "an owner belongs to one principal")
        return runs

    async def _start_workflow(self, request: RunRequest) -> None:
        client = self._connected()
        try:
            await self._loop.call(
                lambda: client.start_workflow(
                    WORKFLOW_NAME,
                    request,
                    id=request.run_id,
                    task_queue=self._task_queue,
                    result_type=RunOutcome,
                )
            )
        except Exception as exc:
            with trio.CancelScope(shield=True):
                await self._store.forget_run(request.run_id)
                self._bump()
            log.warning("run %s: starting its workflow failed: %s", request.run_id, exc)
            raise HostError("internal", f"could not start the run on Temporal: {exc}") from None
        self._watch(request.principal, request.run_id)

    async def _start_queued(self, request: RunRequest, on_busy: str) -> None:
        """A run queued behind its session's active run (``enqueue``; ``interrupt``
        cancels that run first): started once the session is its own."""
        session_id = request.session_id
        assert session_id is not None
        interrupted: set[str] = set()
        while True:
            changed = self._changed
            try:
                holder = await self._store.claim_session(
                    request.principal, session_id, request.run_id
                )
            except RunStoreError as exc:
                # Still queued: looked at again once the store answers (_poll's wake-up
                # when it does).
                log.warning("run %s stays queued: %s", request.run_id, exc)
                await changed.wait()
                continue
            if holder is None:
                break
            if on_busy == "interrupt" and holder not in interrupted:
                interrupted.add(holder)
                # (it may have ended meanwhile: the claim is free at the next look)
                with contextlib.suppress(HostError):
                    await self.cancel(request.principal, holder, "interrupted by a new run")
            await changed.wait()
        # A failure is logged; its record is gone, as a start that failed leaves none.
        with contextlib.suppress(HostError):
            await self._start_workflow(request)

    async def get(self, principal: str, run_id: str) -> RunInfo:
        """The run's record (any node of a tree)."""
        info = await self._store.info(principal, run_id)
        if info is None:
            raise HostError("not_found", f"no run {run_id!r}")
        return info

    async def list(self, principal: str, *, all: bool = False) -> list[RunInfo]:
        """The principal's runs, oldest first (every node of every tree with ``all``)."""
        return await self._store.runs_of(principal, nodes=all)

    async def _root_of(self, principal: str, run_id: str) -> str:
        """The root of ``run_id``'s tree (remembered: it never changes).

        Raises:
            HostError: ``not_found``, no such run of this principal.
        """
        key = (principal, run_id)
        root = self._roots.get(key)
        if root is not None:
            self._roots.move_to_end(key)
            return root
        root = await self._store.root_of(principal, run_id)
        if root is None:
            raise HostError("not_found", f"no run {run_id!r}")
        self._remember_root(key, root)
        return root

    def _remember_root(self, key: tuple[str, str], root: str) -> None:
        self._roots[key] = root
        if len(self._roots) > _ROOTS_KEPT:
            self._roots.popitem(last=False)

    async def _steer(self, principal: str, run_id: str, op: SteeringOp) -> OpAnswer:
        """Send ``op`` for ``run_id`` (any node of a tree) to its root's workflow."""
        root = await self._root_of(principal, run_id)
        if root != run_id:
            op.node = run_id
        client = self._connected()
        handle = client.get_workflow_handle(root)
        try:
            answer: OpAnswer = await self._loop.call(
                lambda: handle.execute_update(UPDATE_STEER, op, result_type=OpAnswer)
            )
        except WorkflowUpdateRPCTimeoutOrCancelledError:
            raise HostError(
                "internal", f"Temporal did not answer in time; the op on {run_id} may be recorded"
            ) from None
        except RPCError as exc:
            raise _rpc_refused(exc, run_id) from None
        except WorkflowUpdateFailedError:
            raise HostError("run_closed", f"run {run_id} is closed") from None
        if not answer.ok:
            raise _refused(answer)
        self._hurry()
        return answer

    async def cancel(
        self,
        principal: str,
        run_id: str,
        reason: str | None = None,
        mode: Literal["immediate", "after_turn"] = "immediate",
    ) -> None:
        """Cancel a run (a subtree for a child); returns once the attempt applied it (or
        recorded it for the next attempt)."""
        self._cancelling[run_id] = self._cancelling.get(run_id, 0) + 1
        try:
            await self._cancel(principal, run_id, reason, mode)
        finally:
            left = self._cancelling.pop(run_id) - 1
            if left:
                self._cancelling[run_id] = left

    async def _cancel(
        self,
        principal: str,
        run_id: str,
        reason: str | None,
        mode: Literal["immediate", "after_turn"],
    ) -> None:
        info = await self.get(principal, run_id)
        if info.status.is_terminal:
            raise HostError("run_closed", f"run {run_id} is closed (status {info.status})")
        if info.parent_id is None and mode == "immediate":
            # Temporal's own cancel first, carrying the reason: only a workflow Temporal
            # was asked to cancel ends CANCELED (after the repaired result is recorded).
            handle = self._connected().get_workflow_handle(run_id)
            if reason and run_id in self._watched:
                self._cancel_reasons[run_id] = reason
            try:
                asked = await self._loop.call(lambda: _cancel_workflow(handle, reason))
            except RPCError as exc:
                raise _rpc_refused(exc, run_id) from None
            if asked:
                # Temporal has recorded the cancel (and its reason): bringing it to the
                # attempt is only faster than the heartbeat now (a run that ended
                # meanwhile, or a workflow no worker has taken up yet, ends cancelled all
                # the same). Pushed straight to the attempt's worker when the store knows
                # where it runs; else through the steer update (a workflow task and a
                # local activity: about 35 ms more, measured).
                op = SteeringOp(op="cancel", reason=reason)
                with trio.move_on_after(_PUSH_BOUND):
                    if not await self._push_to_attempt(run_id, op):
                        with contextlib.suppress(HostError):
                            await self._steer(principal, run_id, op)
                return
        await self._steer(principal, run_id, SteeringOp(op="cancel", reason=reason, mode=mode))

    async def _push_to_attempt(self, run_id: str, op: SteeringOp) -> bool:
        """Push ``op`` (recorded by Temporal already) to the attempt that owns the root
        run ``run_id``; whether that attempt applied it."""
        address = await self._store.place_of(run_id)
        if address is None:
            return False
        try:
            answer = await push_op_here(address, run_id, op)
        except (OSError, ValueError):
            return False  # its worker is gone or not answering: the update's way then
        self._hurry()
        return answer.ok and not answer.pending

    async def wait_terminal(self, principal: str, run_id: str) -> RunInfo:
        """Wait until the run's terminal record is written; returns it."""
        while True:
            changed = self._changed
            info = await self.get(principal, run_id)
            if info.status.is_terminal:
                return info
            await changed.wait()

    async def inject(
        self,
        principal: str,
        run_id: str,
        items: tuple[Item, ...],
        when: Literal["next_turn", "now", "when_idle"] = "next_turn",
    ) -> str:
        """Queue items into a live run; the attempt's injection id (while no attempt
        runs, the op is recorded and applied by the next one: its id is then
        ``"pending-<n>"``, which no withdraw takes back)."""
        op = SteeringOp(op="inject", items=[item.to_json() for item in items], when=when)
        answer = await self._steer(principal, run_id, op)
        return answer.injection_id or f"pending-{op.index}"

    async def withdraw(self, principal: str, run_id: str, injection_id: str) -> bool:
        """Withdraw an injection not yet delivered; False when it already was."""
        answer = await self._steer(
            principal, run_id, SteeringOp(op="withdraw", target=injection_id)
        )
        return bool(answer.withdrawn)

    async def approve(
        self,
        principal: str,
        run_id: str,
        call_id: str,
        content: Mapping[str, Any] | None = None,
    ) -> None:
        """Approve a tool call waiting for approval, or answer a question (with
        ``content`` when it asks for some: checked by the attempt's run,
        ``invalid_request`` and nothing decided when it does not fit)."""
        op = SteeringOp(
            op="approve", target=call_id, content=None if content is None else dict(content)
        )
        await self._steer(principal, run_id, op)

    async def reject(
        self, principal: str, run_id: str, call_id: str, message: str | None = None
    ) -> None:
        """Reject a tool call waiting for approval."""
        op = SteeringOp(op="reject", target=call_id, reason=message)
        await self._steer(principal, run_id, op)

    async def cancel_session(
        self,
        principal: str,
        session_id: str,
        reason: str | None = None,
        mode: Literal["immediate", "after_turn"] = "immediate",
    ) -> str:
        """Cancel the session's active run; its id (``no_active_run`` if none)."""
        holder = await self._store.session_holder(principal, session_id)
        if holder is None:
            raise HostError("no_active_run", f"session {session_id!r} has no active run")
        await self.cancel(principal, holder, reason, mode)
        return holder

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
        """Subscribe to a run's events as the store holds them (every event ever
        written: nothing is dropped), following it until the run's terminal update."""
        with host_errors():
            check_from_seq(from_seq, tree)
        root = await self._store.root_of(principal, run_id)
        if root is None:
            raise HostError("not_found", f"no run {run_id!r}")
        follow = self._follow(
            root, run_id, 1 if tree or from_seq is None else from_seq, tree, status_only
        )
        try:
            yield follow
        finally:
            await follow.aclose()  # a subscriber that left early: closed here, not by GC

    async def _follow(
        self, root: str, run_id: str, from_seq: int, tree: bool, status_only: bool
    ) -> AsyncGenerator[HostedEvent]:
        after = 0
        while True:
            changed = self._changed
            wanted = (
                None
                if tree and root == run_id
                else (await self._store.subtree(run_id) if tree else [run_id])
            )
            events, after_scan = await self._store.events_after(root, after, wanted)
            for stored in events:
                event = stored.event
                updated = event.get("type") == "run.updated"
                mine = stored.run_id == run_id
                if (updated or not status_only) and not (mine and stored.seq < from_seq):
                    yield HostedEvent(stored.run_id, stored.seq, event)
                if updated and mine and RunStatus(event["status"]).is_terminal:
                    return  # (also when from_seq is past it: the run has ended)
            if after_scan != after:
                after = after_scan
                continue  # more may be there already
            await changed.wait()

    async def fork_session(
        self,
        principal: str,
        session_id: str,
        new_session_id: str,
        at: int | tuple[str, int] | None = None,
    ) -> int:
        """Fork the principal's session (DESIGN §23) in the workers' session store: the
        new session holds its items up to ``at`` (an item index; an event position
        ``(run_id, seq)`` of a run of that session, live or ended, resolved from the
        run's ``run.item`` events in the store; None: all), rounded down so no tool
        call is split from its result, with its tree's child sessions. Returns the
        number of items the fork holds.

        Raises:
            HostError: ``not_found`` (no such session of this principal; an unknown
                run), ``invalid_request`` (a run of another session, or whose events
                do not say where its items are; the new id holds items; the host has
                no ``sessions``), ``session_busy`` (the new id has an active run).
        """
        factory = self._sessions
        if factory is None:
            raise HostError("invalid_request", "this host was given no sessions to fork")
        if await self._store.session_holder(principal, new_session_id) is not None:
            raise HostError("session_busy", f"session {new_session_id!r} has an active run")
        with host_errors():
            index = (
                await self._event_position(principal, session_id, *at)
                if isinstance(at, tuple)
                else at
            )
            return await fork_from_factory(factory, principal, session_id, new_session_id, index)

    async def _event_position(self, principal: str, session_id: str, run_id: str, seq: int) -> int:
        """The item index an event position stands for, from the run's ``run.item``
        events as its attempts wrote them to the store (see ``item_position``)."""
        info = await self._store.info(principal, run_id)
        root = await self._store.root_of(principal, run_id)
        if info is None or root is None:
            raise HostError("not_found", f"no run {run_id!r}")
        if info.session_id != session_id:
            raise HostError(
                "invalid_request", f"run {run_id!r} did not run in session {session_id!r}"
            )
        items: list[tuple[int, int | None]] = []
        after = 0
        while True:
            events, scanned = await self._store.events_after(root, after, [run_id])
            items += [
                (e.seq, item_index_of(e.event)) for e in events if e.event.get("type") == "run.item"
            ]
            if scanned == after:
                break
            after = scanned
        items.sort()
        return item_position(run_id, seq, items)

    def disconnected(self, owner: object) -> None:
        """The owner went away: cancel its ``on_disconnect="cancel"`` runs (on their
        workers, through their workflows)."""
        record = self._owners.pop(owner, None)
        if record is None or self._nursery is None:
            return
        principal, runs = record
        for run_id in runs:
            self._spawn(self._cancel_quietly, principal, run_id)

    async def _cancel_quietly(self, principal: str, run_id: str) -> None:
        if run_id in self._cancelling:
            # A cancel with its own reason is on its way (an MCP client's cancel, then
            # its stream closing): the first cancel's reason is the run's, as in one
            # process where it is applied at once.
            return
        with contextlib.suppress(HostError):  # it may have ended meanwhile
            await self.cancel(principal, run_id, "client disconnected")


async def _cancel_workflow(handle: Any, reason: str | None) -> bool:
    """(asyncio) Temporal's cancel of a running workflow; False when it is not running
    (a closed one is left as is: Temporal would accept the cancel silently)."""
    if not reason:
        try:
            description = await handle.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        if description.status != WorkflowExecutionStatus.RUNNING:
            return False
        await handle.cancel(reason="")
        return True
    # The reason's signal and the cancel at once (one round trip, not two): each is
    # recorded before the host pushes the cancel to the attempt, so whichever way the
    # cancel reaches the attempt (the push carries the reason; the heartbeat asks the
    # workflow) it has its reason before the attempt's result can be recorded. A closed
    # workflow refuses the signal (NOT_FOUND): no describe first.
    outcomes: list[object] = await asyncio.gather(
        handle.signal(SIGNAL_CANCEL_REASON, reason),
        handle.cancel(reason=reason),
        return_exceptions=True,
    )
    for outcome in outcomes:
        if isinstance(outcome, RPCError) and outcome.status == RPCStatusCode.NOT_FOUND:
            return False
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return True
