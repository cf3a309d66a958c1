"""A Temporal worker whose activities run trio_agents runs in one long-lived Trio thread.

The SDK's worker is asyncio. Its activities here are async and hand each attempt to a
single Trio loop in a dedicated thread of the worker process (``token.run_sync_soon``
to start it, ``loop.call_soon_threadsafe`` to hand the outcome back): measured 3.5-6x
better than a ``trio.run`` per attempt in the thread pool, and it avoids the SDK's
cancel of a thread activity, which raises ``CancelledError`` asynchronously *inside*
the thread (in Trio's internals). The attempts share that loop with the worker's own
machinery (the listener of pushed ops, sessions).

The activity heartbeats for liveness only (a lost worker is found by its heartbeat
timeout and its attempt retried elsewhere). A cancel from Temporal reaches the activity
through its heartbeat; the activity then asks the workflow for the cancel's reason
(``"workflow cancelled"`` when it has none), calls ``run.cancel(reason)`` in the Trio
thread, waits for the run's terminal update and *returns* the repaired outcome (an
activity that raised would lose it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from datetime import timedelta
from functools import partial
from typing import Any, Final, TypeVar, final

import trio
from temporalio import activity
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from .._agent import Agent
from ._activity import Attempt, AttemptError, AttemptFenced, SessionFactory, run_attempt
from ._asyncio_loop import AsyncioLoop
from ._push import not_here, push_op, serve_ops
from ._shared_store import RunStoreError, SharedRunStore
from ._types import (
    ACTIVITY_ATTEMPT,
    ACTIVITY_PUSH,
    CANCELLED_BY_TEMPORAL,
    UPDATE_ATTEMPT_STARTED,
    UPDATE_CALL_STARTED,
    AttemptStarted,
    CallStarted,
    Catchup,
    OpAnswer,
    RunOutcome,
    RunRequest,
    SteeringOp,
)
from ._workflow import RunWorkflow

__all__ = ["DEFAULT_TASK_QUEUE", "TemporalWorker", "replayer", "run_worker", "serve_worker"]

DEFAULT_TASK_QUEUE: Final = "trio-agents"
_T = TypeVar("_T")
# The run's workflow is this library's own code, not the user's, and deterministic by
# construction (plain data, no clock, no I/O: _workflow.py's docstring); Temporal's
# sandbox, which guards user workflow code, cost about 3.5 ms of Python per steering op
# here (its per-activation import and builtins overrides around two activations, and
# their payload conversions: issue 38's third round), so it runs unsandboxed. Replaying
# histories checks its determinism, as for any workflow.
_RUNNER: Final = UnsandboxedWorkflowRunner()
_STICKY_TIMEOUT: Final = timedelta(seconds=1)
# A push to another worker's attempt: connect, apply, answer (the workflow gives its
# local activity 10 s).
_PUSH_BOUND: Final = 5.0
log = logging.getLogger("trio_agents.temporal")
# How long a tool call waits for the store to record that it starts (the store failing).
_RECORD_CALL_PATIENCE: Final = 30.0
# How long a cancelled attempt waits for its workflow to say the cancel's reason (a
# host signals it before Temporal's cancel; under load, or after a server restart, the
# workflow's task that answers the query can take seconds, and the reason is the run's).
_REASON_QUERY_TIMEOUT = timedelta(seconds=10)
# How long a parked attempt stays to answer late pushes (longer than a push can take).
_PARKED_KEPT = 60.0


def replayer() -> Replayer:
    """A ``temporalio`` ``Replayer`` of the run workflow (:class:`RunWorkflow`) as the
    workers run it (their workflow runner): ``await replayer().replay_workflow(history)``
    replays a recorded history (``WorkflowHistory.from_json(run_id, text)`` over what
    ``temporal workflow show -w RUN_ID --output json`` prints) against this version's
    workflow code, and raises on a non-determinism error. Run it on the histories of
    open runs before upgrading workers (docs/temporal.md, "Upgrading workers")."""
    return Replayer(workflows=[RunWorkflow], workflow_runner=_RUNNER)


class _TrioThread:
    """One Trio loop in a dedicated thread, hosting every attempt of this worker."""

    def __init__(self, host: str) -> None:
        self._host = host
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="trio-agents-attempts")
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._stop: trio.CancelScope | None = None
        self._error: BaseException | None = None
        self.stopping = False
        self.address = ""
        # Read from the Trio thread (the listener), written from the asyncio thread
        # around each attempt: plain dict operations, atomic under the GIL.
        self.attempts: dict[str, Attempt] = {}

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # reported to start(); the thread must not die loud
            self._error = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        with trio.CancelScope() as self._stop:
            async with trio.open_nursery() as nursery:
                self.address = await nursery.start(serve_ops, self.attempts.get, self._host)
                self._token = trio.lowlevel.current_trio_token()
                self._nursery = nursery
                self._ready.set()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()
        if self._token is None:
            raise RuntimeError("the worker's Trio thread did not start") from self._error

    def stop(self) -> None:
        """Cancel every attempt still running (reason ``"parent cancelled"``) and join."""
        self.stopping = True
        for attempt in list(self.attempts.values()):
            attempt.handover = True
        if self._token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):  # it ended on its own
                self._token.run_sync_soon(self._stop.cancel)
        self._thread.join()

    def spawn(self, fn: Callable[[], Awaitable[_T]]) -> asyncio.Future[_T]:
        """Run ``fn()`` in the Trio thread; an asyncio future of its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()

        def settle(outcome: Callable[[], None]) -> None:
            # A closed asyncio loop raises RuntimeError: nobody waits any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(outcome)

        def fail(exc: BaseException) -> None:
            if not future.done():
                future.set_exception(_plain(exc))

        def succeed(value: _T) -> None:
            if not future.done():
                future.set_result(value)

        async def task() -> None:
            try:
                value = await fn()
            except BaseException as exc:
                settle(partial(fail, exc))
                if not isinstance(exc, Exception):
                    raise
            else:
                settle(partial(succeed, value))

        assert self._token is not None
        assert self._nursery is not None
        nursery = self._nursery
        self._token.run_sync_soon(nursery.start_soon, task)
        return future

    def call_soon(self, fn: Callable[[], None]) -> None:
        assert self._token is not None
        self._token.run_sync_soon(fn)


class _TrioHere(_TrioThread):
    """The attempts of an embedded worker (:func:`serve_worker`): tasks of the Trio
    program that runs the worker, in its own nursery; no thread of their own."""

    def __init__(self, nursery: trio.Nursery, host: str) -> None:
        super().__init__(host)
        self._token = trio.lowlevel.current_trio_token()
        self._nursery = nursery

    def start(self) -> None:
        return None  # the program's loop runs already

    def stop(self) -> None:
        """Cancel every attempt still running (called from the worker's asyncio
        thread when it shuts down)."""
        self.stopping = True
        for attempt in list(self.attempts.values()):
            attempt.handover = True
        assert self._nursery is not None
        with contextlib.suppress(trio.RunFinishedError):
            self.call_soon(self._nursery.cancel_scope.cancel)


def _plain(exc: BaseException) -> BaseException:
    """An exception asyncio may carry: a Trio cancellation becomes a plain error."""
    if isinstance(exc, Exception):
        return exc
    return RuntimeError(f"the attempt was stopped: {exc!r}")


async def _in_loop(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, _T]) -> _T:
    """Await ``coro`` on the asyncio loop from the Trio thread (no thread per call)."""
    future: concurrent.futures.Future[_T] = asyncio.run_coroutine_threadsafe(coro, loop)
    done = trio.Event()
    token = trio.lowlevel.current_trio_token()
    future.add_done_callback(lambda _: token.run_sync_soon(done.set))
    try:
        await done.wait()
    except BaseException:
        future.cancel()
        raise
    return future.result()


@final
class _Activities:
    """The worker's activities, bound to its agents, sessions and Trio thread."""

    def __init__(
        self,
        agents: Mapping[str, Agent],
        sessions: SessionFactory | None,
        trio_thread: _TrioThread,
        store: SharedRunStore | None,
    ) -> None:
        self._agents = agents
        self._sessions = sessions
        self._trio = trio_thread
        self._store = store

    @activity.defn(name=ACTIVITY_PUSH)
    async def push(self, address: str, run_id: str, op: SteeringOp) -> OpAnswer:
        """An update's local activity: push a recorded op to the attempt's worker."""
        try:
            if address == self._trio.address:
                return await self._apply_here(run_id, op)
            # Bounded below the activity's own timeout: a frozen worker's kernel still
            # accepts the connection, and an activity that timed out would fail the
            # update (the client told the run is closed) instead of answering pending.
            return await asyncio.wait_for(push_op(address, run_id, op), _PUSH_BOUND)
        except (OSError, ValueError) as exc:  # TimeoutError is an OSError
            # The attempt's worker is gone, frozen or garbled: the op stays recorded, and
            # the workflow waits for where the run goes next (an attempt's catch-up
            # applies it there).
            return OpAnswer(
                ok=True,
                pending=True,
                message=f"recorded; the attempt is unreachable ({exc!r})",
            )

    async def _apply_here(self, run_id: str, op: SteeringOp) -> OpAnswer:
        """The push to an attempt of this worker process, handed to its Trio thread
        without the loopback connection: the usual case when the server dispatches
        activities eagerly (the attempt's activity goes to the worker that scheduled it,
        which keeps the run's workflow tasks: sticky). Answers as :func:`serve_ops`
        does."""
        attempt = self._trio.attempts.get(run_id)
        if attempt is None:
            return not_here()
        try:
            return await self._trio.spawn(partial(attempt.apply, op))
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            # Where the listener would close the connection without an answer (the op
            # failed there, or the worker's Trio thread is stopping): the op stays
            # recorded, for the next attempt.
            raise ConnectionError(f"the attempt did not answer: {exc!r}") from exc

    @activity.defn(name=ACTIVITY_ATTEMPT)
    async def attempt(self, request: RunRequest) -> RunOutcome:
        """One attempt of the run: announce it, run it in the Trio thread, return its
        terminal outcome (also when cancelled: the repaired result)."""
        info = activity.info()
        workflow = activity.client().get_workflow_handle(request.run_id)
        attempt = Attempt(request.run_id)
        self._trio.attempts[request.run_id] = attempt
        # Heartbeats start at once: announcing the attempt may wait for a workflow task
        # (a dead worker's sticky queue times out first), and an attempt that did not
        # beat meanwhile would be deemed lost.
        beat = asyncio.ensure_future(_heartbeat(request.heartbeat_timeout / 3))
        try:
            catchup = await _announce(
                workflow, AttemptStarted(attempt=info.attempt, address=self._trio.address)
            )
            # The run's own count (a parked run's next attempt is a new activity).
            number = catchup.attempt or info.attempt
            future = self._start(request, attempt, number, catchup, workflow)
            self._catch_up(attempt, catchup, resumed=_resumes(request, number))
            return await self._wait(future, attempt, workflow)
        finally:
            beat.cancel()
            if attempt.parked:
                # An op pushed before the workflow learns of the park still finds it
                # (and answers "pending": the next attempt applies it), not "no
                # attempt of the run here", which would be recorded as its answer.
                forgetting = self._trio.spawn(partial(_forget_later, self._trio.attempts, attempt))
                # Nobody awaits it: its end (a worker's shutdown cancels it) is read here.
                forgetting.add_done_callback(lambda f: f.cancelled() or f.exception())
            elif self._trio.attempts.get(request.run_id) is attempt:
                del self._trio.attempts[request.run_id]

    def _catch_up(self, attempt: Attempt, catchup: Catchup, *, resumed: bool) -> None:
        """Apply the ops the history holds that no attempt applied, in order: a cancel
        at once (before the run's first model call), an inject once the run exists. A
        resumed attempt's approvals and rejections are in its ``Resume`` instead
        (``run_attempt``'s ``decided``): applied when each call asks again."""
        for op in catchup.ops:
            if resumed and op.op in ("approve", "reject") and op.node is None:
                continue
            if op.op == "cancel" and op.node is None and op.mode != "after_turn":
                self._trio.call_soon(partial(attempt.cancel, op.reason or "cancelled"))
            else:
                self._trio.spawn(partial(attempt.apply, op))

    def _start(
        self,
        request: RunRequest,
        attempt: Attempt,
        number: int,
        catchup: Catchup,
        workflow: WorkflowHandle[Any, Any],
    ) -> asyncio.Future[RunOutcome]:
        loop = asyncio.get_running_loop()

        store = self._store

        async def barrier(call_id: str, last_seq: int) -> None:
            # Recorded durably before the tool runs: a later attempt never runs this call
            # again (unless its tool is idempotent). In the shared store when there is
            # one (fenced like the attempt's events: one transaction, no workflow task);
            # else in the workflow's history.
            if store is not None:
                if not await _record_call(store, request.run_id, number, call_id):
                    raise AttemptFenced(f"a later attempt of run {request.run_id} took it over")
                return
            await _in_loop(
                loop,
                workflow.execute_update(UPDATE_CALL_STARTED, CallStarted(call_id, last_seq)),
            )

        async def body() -> RunOutcome:
            return await run_attempt(
                request,
                attempt=attempt,
                number=number,
                agents=self._agents,
                sessions=self._sessions,
                barrier=barrier,
                started_calls=catchup.started_calls,
                next_seq=catchup.next_seq,
                decided=catchup.ops,
                store=store,
                address=self._trio.address or None,
            )

        return self._trio.spawn(body)

    async def _wait(
        self,
        future: asyncio.Future[RunOutcome],
        attempt: Attempt,
        workflow: WorkflowHandle[Any, Any],
    ) -> RunOutcome:
        """Wait for the attempt's outcome; a cancel from Temporal (delivered through the
        heartbeat, once) cancels the run with its reason and waits for the repair."""
        cancelled = False
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                if future.done():
                    continue
                if cancelled:
                    if self._trio.stopping:
                        # Cancelled again while the worker's loops go away: the run may
                        # never settle here now; stop waiting (Temporal retries it).
                        raise
                    continue
                cancelled = True
                if _given_up():
                    # Temporal gave up on this attempt (its heartbeats timed out, as while
                    # the server was away) and runs the run in a new one: this is no
                    # cancel of the run, and its end here is not the run's.
                    attempt.handover = True
                    reason = "the attempt was given up; the run goes on in a new attempt"
                else:
                    reason = await _cancel_reason(workflow)
                if self._trio.stopping or _shutting_down():
                    attempt.handover = True  # (read in the Trio thread: a plain flag)
                self._trio.call_soon(partial(attempt.cancel, reason))
            except Exception:
                break  # the attempt raised: _result says whether it is retried
        return _result(future, self._trio.stopping or _shutting_down() or _given_up())


async def _forget_later(attempts: dict[str, Attempt], attempt: Attempt) -> None:
    """Forget a parked attempt once its workflow surely knows of the park (it pushes
    nothing more to it), unless a later attempt of the run took its place here."""
    await trio.sleep(_PARKED_KEPT)
    if attempts.get(attempt.run_id) is attempt:
        del attempts[attempt.run_id]


def _resumes(request: RunRequest, number: int) -> bool:
    """Whether attempt ``number`` resumes the run from its session (``run_attempt``)."""
    return number > 1 and request.session_id is not None


def _given_up() -> bool:
    """Whether the SDK cancelled this activity because Temporal no longer runs this
    attempt (its heartbeat timed out, or the server does not know it any more)."""
    details = activity.cancellation_details()
    return details is not None and (details.timed_out or details.not_found)


def _shutting_down() -> bool:
    """Whether the SDK cancelled this activity because its worker shuts down."""
    details = activity.cancellation_details()
    return details is not None and details.worker_shutdown


def _result(future: asyncio.Future[RunOutcome], stopping: bool) -> RunOutcome:
    exc = future.exception()
    if exc is None and stopping:
        # The worker shuts down (SIGTERM): the run was stopped with reason "worker
        # shutdown" and its repair persisted; the attempt fails retryably, so the run
        # goes on at once on another worker, resumed from its session.
        raise ApplicationError(
            "the worker shut down; the run goes on on another worker", type="WorkerShutdown"
        )
    if exc is None:
        return future.result()
    if isinstance(exc, AttemptError):
        raise ApplicationError(str(exc), type="AttemptError", non_retryable=True) from exc
    if isinstance(exc, AttemptFenced):
        # Temporal already moved on from this attempt: its completion is not the run's.
        raise ApplicationError(str(exc), type="AttemptFenced", non_retryable=True) from exc
    if stopping:
        # The worker is shutting down: the attempt is retried on another worker.
        raise ApplicationError("the worker shut down", type="WorkerShutdown") from exc
    raise ApplicationError(
        f"{type(exc).__name__}: {exc}", type="AttemptCrashed", non_retryable=True
    ) from exc


async def _announce(workflow: WorkflowHandle[Any, Any], started: AttemptStarted) -> Catchup:
    """The ``attempt_started`` update, again while its RPC times out (a workflow task
    stuck on a dead worker's sticky queue): the heartbeat keeps the attempt alive."""
    while True:
        try:
            catchup: Catchup = await workflow.execute_update(
                UPDATE_ATTEMPT_STARTED, started, result_type=Catchup
            )
        except WorkflowUpdateRPCTimeoutOrCancelledError as exc:
            task = asyncio.current_task()
            if isinstance(exc.__cause__, asyncio.CancelledError) or (
                task is not None and task.cancelling()
            ):
                # The activity itself is cancelled (a cancel of the run while it
                # announces, or its worker shuts down): said as a cancel, which the
                # workflow records as the run's (nothing ran in this attempt); the
                # client's own error type would fail the workflow instead.
                raise asyncio.CancelledError("cancelled while announcing") from exc
            continue
        except RPCError as exc:
            # Under load the server aborts an update whose workflow task timed out
            # ("workflow update was aborted"): announced again, after a breath.
            if "aborted" not in exc.message:
                raise
            await asyncio.sleep(0.1)
            continue
        return catchup


async def _heartbeat(every: float) -> None:
    while True:
        activity.heartbeat()
        await asyncio.sleep(every)


async def _cancel_reason(workflow: WorkflowHandle[Any, Any]) -> str:
    """The reason a cancel from Temporal carries (``handle.cancel(reason=...)``), read
    from the workflow; ``"workflow cancelled"`` when it has none (the CLI, the UI)."""
    if _shutting_down():
        return "worker shutdown"
    try:
        status = await workflow.query("status", rpc_timeout=_REASON_QUERY_TIMEOUT)
    except Exception:  # no answer in time: the cancel goes on without its reason
        return CANCELLED_BY_TEMPORAL
    reason = status.get("cancel_reason") if isinstance(status, dict) else None
    return reason if isinstance(reason, str) and reason else CANCELLED_BY_TEMPORAL


@final
class TemporalWorker:
    """A worker of trio_agents runs on a Temporal task queue.

    Args:
        client: a connected ``temporalio.client.Client``.
        agents: the agents by name (what a run's ``agent`` names).
        sessions: ``factory(principal, session_id) -> Session``; every worker must reach
            the same store (:func:`sqlite_sessions` over a file on one shared disk, or a
            ``PostgresSession`` factory).
        task_queue: the task queue to poll.
        host: the interface on which this worker takes ops pushed to its attempts; other
            workers must reach it (loopback is right when they share one machine).
        store: the shared store (a :class:`RunStore` or a :class:`PostgresRunStore`:
            :func:`shared_storage`) where attempts write their runs' events and records (what a :class:`TemporalHost` serves to every face); None: events
            are not kept beyond the attempt.
        max_concurrent_activities: attempts (and pushes) this worker runs at once.

    ``async with worker.running():`` polls until the block ends; :meth:`run` until
    cancelled.
    """

    def __init__(
        self,
        client: Client,
        agents: Mapping[str, Agent],
        *,
        sessions: SessionFactory | None = None,
        task_queue: str = DEFAULT_TASK_QUEUE,
        host: str = "127.0.0.1",
        max_concurrent_activities: int = 200,
        store: SharedRunStore | None = None,
        _attempts_here: _TrioHere | None = None,
    ) -> None:
        self._client = client
        self._trio = _attempts_here or _TrioThread(host)
        self._activities = _Activities(dict(agents), sessions, self._trio, store)
        self._task_queue = task_queue
        self._max = max_concurrent_activities

    async def run(self) -> None:
        """Start the Trio thread, poll the task queue until cancelled, then stop."""
        self._trio.start()
        try:
            worker = Worker(
                self._client,
                task_queue=self._task_queue,
                workflows=[RunWorkflow],
                activities=[self._activities.attempt, self._activities.push],
                max_concurrent_activities=self._max,
                workflow_runner=_RUNNER,
                # A run's next workflow task (an update, the attempt's result) waits this
                # long for a dead worker's sticky queue before any worker takes it.
                sticky_queue_schedule_to_start_timeout=_STICKY_TIMEOUT,
            )
            await worker.run()
        except GeneratorExit:
            # Closed, not cancelled: the asyncio loop went away with this still running
            # (its stop bound passed, under load) and the coroutine is being collected,
            # so it may not await any more: stop the Trio side here.
            self._trio.stop()
            raise
        except BaseException:
            await asyncio.get_running_loop().run_in_executor(None, self._trio.stop)
            raise
        await asyncio.get_running_loop().run_in_executor(None, self._trio.stop)


async def run_worker(
    target: str,
    agents: Mapping[str, Agent],
    *,
    sessions: SessionFactory | None = None,
    task_queue: str = DEFAULT_TASK_QUEUE,
    namespace: str = "default",
    host: str = "127.0.0.1",
    store: SharedRunStore | None = None,
) -> None:
    """Connect to the Temporal frontend at ``target`` (``"HOST:PORT"``) and run a
    :class:`TemporalWorker` until cancelled (asyncio)."""
    client = await Client.connect(target, namespace=namespace)
    worker = TemporalWorker(
        client, agents, sessions=sessions, task_queue=task_queue, host=host, store=store
    )
    await worker.run()


async def serve_worker(
    target: str,
    agents: Mapping[str, Agent],
    *,
    sessions: SessionFactory | None = None,
    store: SharedRunStore | None = None,
    task_queue: str = DEFAULT_TASK_QUEUE,
    namespace: str = "default",
    host: str = "127.0.0.1",
    max_concurrent_activities: int = 200,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a Temporal worker inside this Trio program until cancelled (Trio).

    Its attempts run as tasks of this program's own loop (beside its other tasks: a
    server that is also a worker, a test whose tools share its events); only the
    worker's Temporal side (polling, workflows) runs on an asyncio loop in a thread of
    its own. ``task_status.started()`` once it polls. Cancelling it stops the worker:
    its running attempts are cancelled (Temporal retries them elsewhere).
    """
    loop = AsyncioLoop("trio-agents-worker")
    async with trio.open_nursery() as attempts:
        here = _TrioHere(attempts, host)
        here.address = await attempts.start(serve_ops, here.attempts.get, host)
        await trio.to_thread.run_sync(loop.start)
        try:
            client = await loop.call(lambda: Client.connect(target, namespace=namespace))
            worker = TemporalWorker(
                client,
                agents,
                sessions=sessions,
                task_queue=task_queue,
                max_concurrent_activities=max_concurrent_activities,
                store=store,
                _attempts_here=here,
            )
            task_status.started()
            await loop.call(worker.run)
        finally:
            here.stopping = True
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(loop.stop)
            attempts.cancel_scope.cancel()


async def _record_call(store: SharedRunStore, root_id: str, attempt: int, call_id: str) -> bool:
    """``store.record_call``, tried again while the store fails (a database restart, a
    failover), for up to :data:`_RECORD_CALL_PATIENCE` seconds: a blip must not fail the
    tool call. Safe to repeat: a call id is recorded once (a retry after a commit whose
    answer was lost records nothing more). Then the store's error is raised."""
    deadline = trio.current_time() + _RECORD_CALL_PATIENCE
    pause = 0.05
    while True:
        try:
            return await store.record_call(root_id, attempt, call_id)
        except RunStoreError as exc:
            if trio.current_time() + pause > deadline:
                raise
            log.warning(
                "recording call %s of run %s failed, trying again: %s", call_id, root_id, exc
            )
        await trio.sleep(pause)
        pause = min(pause * 2, 2.0)
