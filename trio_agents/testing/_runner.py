"""Run one schedule against one script, on a ``MockClock``, and record everything."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias, final

import attrs
import trio
import trio.testing

from .. import (
    Agent,
    InjectWhen,
    Item,
    Model,
    ModelRequest,
    Run,
    RunClosedError,
    RunEvent,
    RunItemEvent,
    RunResult,
    RunStatus,
    RunUpdated,
    SessionBusyError,
    ToolCall,
    ToolFinished,
    ToolResult,
    ToolStarted,
    UnknownCallError,
    coerce_items,
    open_run,
)
from ..models import ScriptedModel, Turn
from ..sessions import MemorySession, Session
from ._clock import ClockHoldingLimiter
from ._fakes import CallRecord, ToolRecorder
from ._faults import (
    Faults,
    HookCall,
    HookFault,
    SessionCall,
    StreamRecord,
    WatchedHooks,
    WatchedModel,
    WatchedSession,
)
from ._strategies import Op
from ._tree import TreeHooks, first_live, height, walk
from ._watch import (
    ThreadWatch,
    all_tasks,
    install_audit_hook,
    leaked_processes,
    marked_environment,
    process_tree,
    spawn_count,
)

__all__ = [
    "FRESH_INPUT",
    "CancelRecord",
    "FreshRun",
    "InjectionRecord",
    "ModelView",
    "NodeRecord",
    "Observation",
    "SubscriberView",
    "TreeObservation",
    "run_schedule",
    "run_tree_schedule",
]

CancelKind: TypeAlias = Literal["immediate", "after_turn", "outer", "horizon"]

HORIZON_REASON = "harness horizon"
"""The cancel reason :func:`run_schedule` uses when a run outlives its horizon."""

SETTLE = 1000.0
"""Virtual seconds the runner waits, once the run's block is left, for ``wait()`` and
the readers to end (a run that keeps its promises needs none of it)."""

_run_numbers = itertools.count(1)


@final
@attrs.frozen
class CancelRecord:
    """A cancellation the harness applied.

    Attributes:
        kind: ``"immediate"``, ``"after_turn"``, ``"outer"`` (the caller's scope) or
            ``"horizon"`` (the run outlived the harness's horizon).
        reason: the reason passed (``"parent cancelled"`` for ``outer``).
        at: Trio time of the cancel.
        seq: the run's last event seq just before the cancel.
        status: the run's status just before the cancel.
        live: whether the run had no result yet.
    """

    kind: CancelKind
    reason: str
    at: float
    seq: int
    status: RunStatus
    live: bool


@final
@attrs.frozen
class InjectionRecord:
    """An accepted injection.

    Attributes:
        id: the injection id ``inject`` returned.
        when: its ``when=`` mode.
        items: the items, as the run converted them.
        at: Trio time of the call.
        withdrawn: whether a later ``withdraw`` returned True for it.
        withdraw_failed_at_seq: the last seq before a ``withdraw`` that returned False.
    """

    id: str
    when: InjectWhen
    items: tuple[Item, ...]
    at: float
    withdrawn: bool = False
    withdraw_failed_at_seq: int | None = None


@final
@attrs.frozen
class SubscriberView:
    """What one subscriber saw.

    Attributes:
        kind: ``"events"`` (``run.events()``) or ``"status"`` (``run.updated``).
        events: what it received, in order.
        complete: whether its loop ended by itself (not cut off by a cancellation).
    """

    kind: Literal["events", "status"]
    events: tuple[RunEvent, ...]
    complete: bool


FRESH_INPUT = "fresh run input"
"""The input of the run started on the session after the example's (:class:`FreshRun`)."""


@final
@attrs.frozen
class FreshRun:
    """The run :func:`run_schedule` starts on the session once the example's run is
    over (a plain agent answering ``"fresh run"``), to see that the session was
    released and what loading it gives.

    Attributes:
        outcome: ``"completed"`` (or another terminal status), ``"busy"``
            (``SessionBusyError``: the session was never released), ``"hung"`` (no
            terminal update) or ``"error: ..."`` (an exception).
        request: the items its first model request carried (None: no request).
        stored_before: what the session held before it.
        stored_after: what the session held after it.
        rewritable: whether the session has ``replace_items``, so a run can write a
            load repair back (otherwise the rows are repaired again at every load).
    """

    outcome: str
    request: tuple[Item, ...] | None
    stored_before: tuple[Item, ...]
    stored_after: tuple[Item, ...]
    rewritable: bool = False


@final
@attrs.frozen(eq=False)
class Observation:
    """Everything :func:`run_schedule` saw of one example; input to ``check_run``.

    Attributes:
        run_id: the run's id.
        outcome: the :class:`~trio_agents.RunResult`, or None if the run never ended
            (see :attr:`result`).
        events: every event of the run, in order.
        event_times: the Trio time at which each event was appended.
        script: the script the :class:`ScriptedModel` played.
        schedule: the operations, sorted by time.
        applied: ``(time, description)`` of each operation, as applied.
        requests: every request the model received.
        open_streams: model streams still open after the run.
        cancels: the cancellations applied, in order.
        injections: the accepted injections, in order.
        subscribers: what each subscriber saw.
        op_errors: unexpected exceptions raised by operations.
        leaked_tasks: names of tasks still alive after the run ended.
        leaked_processes: ``(pid, cmdline)`` of processes of the run still alive.
        tool_calls: the fake tools' records (empty without a recorder).
        threads_stopped: False if a worker thread of the run still ran
            ``thread_grace`` seconds (real time) after the run ended.
        run_options: the options passed to ``open_run``.
        input_items: the run's input, as items.
        run_error: an exception that escaped ``open_run`` (other than the caller's
            own cancellation), as ``"Type: message"``.
        ended: whether ``"wait"`` (``run.wait()``), ``"updated"``, ``"events"`` (a
            ``run.updated`` and a ``run.events()`` reader started with the run) and
            ``"late_events"`` (a ``run.events()`` started after the end) ended.
        faults: the faults injected.
        streams: what each model stream did.
        hook_calls: every hook call, in order.
        session_calls: every call of the session, in order (empty without one).
        stored: what the session held right after the run (None without one).
        fresh_run: the run started on the session afterwards (None without one).
        leaked_threads: worker threads of the run still running afterwards.
        cleanup_timeout: the run's ``cleanup_timeout``.
        tree: the whole run tree (:func:`run_tree_schedule`; None for
            :func:`run_schedule`). The other fields are then the root run's own
            (its model, hooks and fake tool calls; the cancels and injections the
            schedule applied to it).
        ignored_cancels: ``(call id, description)`` of each worker thread that ran
            past its clock hold and returned after its call was cancelled without ever
            reading ``ctx.cancelled`` (found whatever ``thread_grace`` is).
    """

    run_id: str
    outcome: RunResult | None
    events: tuple[RunEvent, ...]
    event_times: tuple[float, ...]
    script: tuple[Turn, ...]
    schedule: tuple[Op, ...]
    applied: tuple[tuple[float, str], ...]
    requests: tuple[ModelRequest, ...]
    open_streams: int
    cancels: tuple[CancelRecord, ...]
    injections: tuple[InjectionRecord, ...]
    subscribers: tuple[SubscriberView, ...]
    op_errors: tuple[str, ...]
    leaked_tasks: tuple[str, ...]
    leaked_processes: tuple[tuple[int, str], ...]
    tool_calls: tuple[CallRecord, ...]
    threads_stopped: bool
    run_options: Mapping[str, Any]
    input_items: tuple[Item, ...] = ()
    run_error: str | None = None
    ended: Mapping[str, bool] = attrs.Factory(dict)
    faults: Faults = attrs.Factory(Faults)
    streams: tuple[StreamRecord, ...] = ()
    hook_calls: tuple[HookCall, ...] = ()
    session_calls: tuple[SessionCall, ...] = ()
    stored: tuple[Item, ...] | None = None
    fresh_run: FreshRun | None = None
    leaked_threads: tuple[str, ...] = ()
    cleanup_timeout: float = 5.0
    ignored_cancels: tuple[tuple[str, str], ...] = ()
    tree: TreeObservation | None = None

    @property
    def result(self) -> RunResult:
        """The run's result; raises ``AssertionError`` if the run never produced one
        (check :attr:`outcome` first, or read the checker's report)."""
        if self.outcome is None:
            raise AssertionError(
                f"run {self.run_id} never reached a terminal update"
                + (f" ({self.run_error})" if self.run_error else "")
            )
        return self.outcome

    def describe(self) -> str:
        """The example, readably: script, schedule, faults and outcome."""
        lines = ["script:"]
        lines += [f"  {index + 1}. {turn!r}" for index, turn in enumerate(self.script)]
        lines.append("schedule:" if self.schedule else "schedule: (none)")
        lines += [f"  {op.describe()}" for op in self.schedule]
        if self.faults:
            lines.append("faults:")
            lines += [f"  {text}" for text in self.faults.describe()]
        lines.append("applied:" if self.applied else "applied: (nothing)")
        lines += [f"  t={at:g}: {text}" for at, text in self.applied]
        if self.outcome is None:
            lines.append("outcome: no terminal update")
        else:
            lines.append(
                f"outcome: {self.outcome.status.value}"
                + (f" ({self.outcome.reason})" if self.outcome.reason else "")
                + f" after {self.outcome.turns} turn(s)"
            )
        if self.run_error:
            lines.append(f"open_run raised: {self.run_error}")
        if self.tree is not None:
            lines += self.tree.describe()
        return "\n".join(lines)


# ------------------------------------------------------------------ the runner


def _unique_ids(items: Sequence[Item], number: int) -> tuple[Item, ...]:
    """Give the call ids of injected pairs a per-injection suffix."""
    out: list[Item] = []
    for item in items:
        if isinstance(item, ToolCall | ToolResult):
            item = attrs.evolve(item, call_id=f"{item.call_id}-{number}")
        out.append(item)
    return tuple(out)


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_cancelled(e) for e in exc.exceptions)
    return False


def _fatal(exc: BaseException) -> bool:
    """KeyboardInterrupt and friends: the user stopped the test, not the run."""
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return any(_fatal(e) for e in exc.exceptions)
    return False


def _summary(exc: BaseException) -> str:
    leaves: list[BaseException] = [exc]
    while len(leaves) == 1 and isinstance(leaves[0], BaseExceptionGroup):
        leaves = list(leaves[0].exceptions)
    text = "; ".join(f"{type(e).__name__}: {e}" for e in leaves[:3])
    return text if len(text) <= 300 else text[:297] + "..."


@attrs.define(eq=False)
class _State:
    run: Run | None = None
    events: list[RunEvent] = attrs.Factory(list)
    times: list[float] = attrs.Factory(list)
    applied: list[tuple[float, str]] = attrs.Factory(list)
    cancels: list[CancelRecord] = attrs.Factory(list)
    injections: list[InjectionRecord] = attrs.Factory(list)
    subscribers: list[SubscriberView] = attrs.Factory(list)
    op_errors: list[str] = attrs.Factory(list)
    leaked_tasks: list[str] = attrs.Factory(list)
    leaked_threads: list[str] = attrs.Factory(list)
    run_error: str | None = None
    ended: dict[str, bool] = attrs.Factory(
        lambda: dict.fromkeys(("wait", "updated", "events", "late_events"), False)
    )
    readers: int = 0
    readers_done: trio.Event = attrs.Factory(trio.Event)
    running_tools: set[str] = attrs.Factory(set)
    changed: trio.Event = attrs.Factory(trio.Event)
    stored: tuple[Item, ...] | None = None
    fresh_run: FreshRun | None = None
    limiter: ClockHoldingLimiter | None = None
    session_calls: tuple[SessionCall, ...] = ()
    # Run trees: what the schedule did to each run below the root, and the tree's
    # merged stream with the time each event was seen.
    node_cancels: dict[str, list[CancelRecord]] = attrs.Factory(dict)
    node_injections: dict[str, list[InjectionRecord]] = attrs.Factory(dict)
    tree_events: list[RunEvent] = attrs.Factory(list)
    tree_times: list[float] = attrs.Factory(list)
    tree_running: set[tuple[str, str]] = attrs.Factory(set)
    tree_complete: bool = False
    outlived: list[str] = attrs.Factory(list)

    def cancels_of(self, run: Run) -> list[CancelRecord]:
        """Where the cancels applied to ``run`` (or from above it) are recorded."""
        if run is self.run:
            return self.cancels
        return self.node_cancels.setdefault(run.id, [])

    def injections_of(self, run: Run) -> list[InjectionRecord]:
        """Where the injections accepted by ``run`` are recorded."""
        if run is self.run:
            return self.injections
        return self.node_injections.setdefault(run.id, [])

    def tree_saw(self, event: RunEvent) -> None:
        self.tree_events.append(event)
        self.tree_times.append(trio.current_time())
        if isinstance(event, ToolStarted):
            self.tree_running.add((event.run_id, event.call_id))
        elif isinstance(event, ToolFinished):
            self.tree_running.discard((event.run_id, event.call_id))
        self.changed.set()
        self.changed = trio.Event()

    def tools_running_in(self, root: Run, agent: str) -> bool:
        """Whether a tool call runs in a live run of ``agent``."""
        for run_id, _call_id in self.tree_running:
            node = root if run_id == root.id else root.find(run_id)
            if node is not None and node.result is None and node.agent.name == agent:
                return True
        return False

    def outlived_calls(self, root: Run, event: ToolFinished | RunItemEvent) -> None:
        """A call of a run ended (its ``tool.finished`` or its result): no run
        started in it may still be live, and no task of one may be alive."""
        if isinstance(event, RunItemEvent):
            if not isinstance(event.item, ToolResult):
                return
            call_id = event.item.call_id
        else:
            call_id = event.call_id
        parent = root if event.run_id == root.id else root.find(event.run_id)
        if parent is None:
            return
        children = [c for c in parent.children if c.call_id == call_id]
        if not children:
            return
        alive = [task.name for task in all_tasks()]
        for child in children:
            for node, _depth in walk(child):
                where = f"call {call_id!r} of run {parent.id} ended ({event.type})"
                if node.result is None:
                    self.outlived.append(f"{where} while run {node.id} below it had no result")
                prefix = f"{node.id}:"
                for name in alive:
                    if name.startswith(prefix):
                        self.outlived.append(f"{where} while task {name!r} of run {node.id} lived")

    def tree_observation(
        self,
        root: Run,
        tree: _TreeSetup,
        hooks: TreeHooks,
        tool_calls: Sequence[CallRecord],
    ) -> TreeObservation:
        nodes: list[NodeRecord] = []
        for node, depth in walk(root):
            pairs = [
                (e, t)
                for e, t in zip(self.tree_events, self.tree_times, strict=True)
                if e.run_id == node.id
            ]
            watched = hooks.per_run.get(node.id)
            nodes.append(
                NodeRecord(
                    run_id=node.id,
                    agent=node.agent.name,
                    parent_id=node.parent_id,
                    call_id=node.call_id,
                    depth=depth,
                    height=height(node),
                    outcome=node.result,
                    events=tuple(e for e, _ in pairs),
                    event_times=tuple(t for _, t in pairs),
                    cancels=tuple(self.cancels_of(node)),
                    injections=tuple(self.injections_of(node)),
                    hook_calls=tuple(watched.calls) if watched is not None else (),
                    tool_calls=tuple(c for c in tool_calls if c.run_id == node.id),
                )
            )
        models = tuple(
            ModelView(name, tuple(m.requests), tuple(m.streams), m.open_streams)
            for name, m in tree.models.items()
        )
        return TreeObservation(
            nodes=tuple(nodes),
            events=tuple(self.tree_events),
            event_times=tuple(self.tree_times),
            complete=self.tree_complete,
            outlived=tuple(self.outlived),
            models=models,
            tool_calls=tuple(tool_calls),
        )

    def let_go(self) -> None:
        """The run abandoned (or no longer waits for) its threads: let the clock move."""
        if self.limiter is not None:
            self.limiter.let_go()

    def reader_started(self) -> None:
        self.readers += 1

    def reader_ended(self) -> None:
        self.readers -= 1
        if self.readers == 0:
            self.readers_done.set()

    def saw(self, event: RunEvent) -> None:
        self.events.append(event)
        self.times.append(trio.current_time())
        if isinstance(event, ToolStarted):
            self.running_tools.add(event.call_id)
        elif isinstance(event, ToolFinished):
            self.running_tools.discard(event.call_id)
        self.changed.set()
        self.changed = trio.Event()


def _make_session(session: bool | Callable[[], Session], faults: Faults) -> WatchedSession | None:
    if session is False and faults.session is None:
        return None
    inner = session() if callable(session) else MemorySession("lifecycle")
    return WatchedSession(inner, faults.session)


async def _fresh_run(session: WatchedSession, horizon: float) -> FreshRun:
    """Start a plain run on the (healed) session: it must start and load cleanly."""
    session.heal()
    before = tuple(await session.inner.get_items())
    model = ScriptedModel([], default="fresh run")
    outcome = "hung"
    with trio.move_on_after(horizon):
        try:
            result = await _run_to_end(Agent(name="fresh", model=model), session)
        except SessionBusyError:
            outcome = "busy"
        except Exception as exc:
            outcome = f"error: {_summary(exc)}"
        else:
            outcome = result.status.value
    requests = model.requests
    after = tuple(await session.inner.get_items())
    request = requests[0].items if requests else None
    return FreshRun(outcome, request, before, after, rewritable=session.rewritable)


async def _run_to_end(agent: Agent, session: Session) -> RunResult:
    async with open_run(agent, FRESH_INPUT, session=session) as run:
        pass
    return await run.wait()


def run_schedule(
    agent_factory: Callable[[Model], Agent],
    script: Sequence[Turn | str],
    schedule: Sequence[Op] = (),
    *,
    recorder: ToolRecorder | None = None,
    input: str | Item | Sequence[Item] = "go",
    run_options: Mapping[str, Any] | None = None,
    default_turn: Turn | str | None = "the end",
    horizon: float = 100_000.0,
    check_processes: bool | None = None,
    faults: Faults | None = None,
    session: bool | Callable[[], Session] = False,
    thread_hold: float | None = 1.0,
    thread_grace: float = 5.0,
) -> Observation:
    """Run one example and return what happened: a sync function calling ``trio.run``.

    A :class:`ScriptedModel` plays ``script`` (then ``default_turn`` forever);
    ``agent_factory`` builds the agent around it (watched by the harness, which also
    applies the model ``faults``). The run starts at Trio time 0 on a
    ``trio.testing.MockClock(autojump_threshold=0)``, so sleeps cost nothing and the
    example replays exactly. Operations at time 0 are applied before the run's first
    step; the ``i``-th operation otherwise happens at ``op.at + (i + 1) / 1024``.

    Once the schedule is over the harness answers for the absent user: it releases
    the :func:`blocking_tool` calls (``recorder``) and approves every call that waits
    for approval, now or later, so no run waits forever; and if the run is still going
    at ``horizon`` it is cancelled with reason ``"harness horizon"``. A run that never
    ends (it broke) is given up on, :data:`SETTLE` virtual seconds later.

    ``run_options`` go to :func:`~trio_agents.open_run` (``hooks``, ``max_turns``,
    ``cleanup_timeout``, ...); hooks (yours, or hook faults) are wrapped, to check
    they stay balanced. ``session`` (True: a fresh ``MemorySession``; or a factory) gives the run
    a session, as does a session fault; afterwards the harness checks what it stores
    and starts another run on it. ``check_processes`` (default: only if the run spawned
    a process) scans ``/proc`` afterwards for processes that inherited the run's marker.

    Worker threads (sync tools) hold the clock still while they work, for at most
    ``thread_hold`` real seconds each (None: as long as they run); a thread that runs
    longer is treated as taking arbitrarily long, so a cancel can reach the run while
    it runs. Once the run is over, its threads get ``thread_grace`` real seconds to end
    before they count as leaked.

    Do not call it from inside ``trio.run`` (use a sync test), and not from two threads
    at once (the process marker is an environment variable).
    """
    faults = faults or Faults()
    scripted = ScriptedModel(list(script), default=default_turn)
    model = WatchedModel(scripted, faults.model)
    agent = agent_factory(model)
    return _run_example(
        agent,
        model,
        None,
        schedule,
        recorder=recorder,
        input=input,
        run_options=run_options,
        horizon=horizon,
        check_processes=check_processes,
        faults=faults,
        session=session,
        thread_hold=thread_hold,
        thread_grace=thread_grace,
    )


def _run_example(
    agent: Agent,
    model: WatchedModel,
    tree: _TreeSetup | None,
    schedule: Sequence[Op],
    *,
    recorder: ToolRecorder | None,
    input: str | Item | Sequence[Item],
    run_options: Mapping[str, Any] | None,
    horizon: float,
    check_processes: bool | None,
    faults: Faults,
    session: bool | Callable[[], Session],
    thread_hold: float | None,
    thread_grace: float,
) -> Observation:
    """One example of :func:`run_schedule` or :func:`run_tree_schedule` (``tree``)."""
    install_audit_hook()
    spawns_before = spawn_count()
    tree_before = process_tree(depth=1)  # this process's children before the run
    if recorder is not None:
        recorder.reset()
    options = dict(run_options or {})
    watched_session = _make_session(session, faults)
    if watched_session is not None and "session" in options:
        raise TypeError("pass the session as session=..., not in run_options")
    cleanup_timeout = float(options.get("cleanup_timeout", 5.0))
    stored = None if watched_session is None else watched_session.inner.get_items
    hooks: WatchedHooks | TreeHooks = WatchedHooks(options.get("hooks"), faults.hooks, stored)
    if tree is not None:
        hooks = TreeHooks(options.get("hooks"), tree.hook_faults, stored)
    run_id = f"lifecycle-{next(_run_numbers)}"
    ops = tuple(sorted(schedule, key=lambda op: op.at))
    input_items = tuple(coerce_items(input))
    example = _Example(
        agent=agent,
        model=model,
        tree=tree,
        ops=ops,
        recorder=recorder,
        input=input,
        input_items=input_items,
        options=options,
        cleanup_timeout=cleanup_timeout,
        horizon=horizon,
        faults=faults,
        watched_session=watched_session,
        hooks=hooks,
        run_id=run_id,
        thread_hold=thread_hold,
        thread_grace=thread_grace,
    )
    with marked_environment(example.run_id):
        trio.run(example.main, clock=trio.testing.MockClock(autojump_threshold=0))
    if check_processes is None:
        check_processes = spawn_count() != spawns_before
    processes = leaked_processes(example.run_id, tree_before) if check_processes else []
    return example.observation(processes)


@final
@attrs.define(eq=False)
class _Example:
    """One example being run: what it was given, and the jobs of the harness around
    the run, one method each.

    The harness's readers (:meth:`timestamper`, :meth:`status_watcher`,
    :meth:`tree_watcher`, :meth:`subscriber`), its guard (:meth:`horizon_guard`), the
    schedule (:meth:`play`, :meth:`apply` and one method per kind of operation), the
    absent user (:meth:`drain`), and the end (:meth:`settle`, :meth:`observation`).
    What they record goes in :attr:`state`.
    """

    agent: Agent
    model: WatchedModel
    tree: _TreeSetup | None
    ops: tuple[Op, ...]
    recorder: ToolRecorder | None
    input: str | Item | Sequence[Item]
    input_items: tuple[Item, ...]
    options: dict[str, Any]
    cleanup_timeout: float
    horizon: float
    faults: Faults
    watched_session: WatchedSession | None
    hooks: WatchedHooks | TreeHooks
    run_id: str
    thread_hold: float | None
    thread_grace: float
    state: _State = attrs.Factory(_State)

    # -- the run, and what follows it

    async def main(self) -> None:
        state = self.state
        baseline = {id(task) for task in all_tasks()}
        threads = ThreadWatch(self._limiter())
        async with trio.open_nursery() as harness:
            with trio.CancelScope() as outer:
                try:
                    async with open_run(
                        self.agent, self.input, run_id=self.run_id, **self._run_kwargs()
                    ) as run:
                        state.run = run
                        harness.start_soon(self.timestamper, run, name="harness:timestamper")
                        harness.start_soon(self.status_watcher, run, name="harness:status")
                        harness.start_soon(self.horizon_guard, run, name="harness:horizon")
                        if self.tree is not None:
                            harness.start_soon(self.tree_watcher, run, name="harness:tree")
                        await self.play(run, outer, harness)
                except BaseException as exc:
                    if _fatal(exc) or state.run is None:
                        raise  # the test was stopped, or the run could not even start
                    if not (outer.cancel_called and _only_cancelled(exc)):
                        state.run_error = _summary(exc)
                        state.changed.set()
            if self.recorder is not None:
                # The schedule may have been cut short (an outer cancel, a crash) before
                # drain() ran: the absent user still lets waiting fake tools go.
                self.recorder.release()
            await self.settle(state.run, harness)
        current = trio.lowlevel.current_task()
        state.leaked_tasks.extend(
            task.name for task in all_tasks() if id(task) not in baseline and task is not current
        )
        if self.watched_session is not None:
            state.session_calls = tuple(self.watched_session.calls)
            state.stored = tuple(await self.watched_session.inner.get_items())
            state.fresh_run = await _fresh_run(self.watched_session, SETTLE)
        state.let_go()
        state.leaked_threads.extend(await threads.settle(self.thread_grace))

    def _limiter(self) -> ClockHoldingLimiter:
        """The run's thread limiter, wrapped so worker threads hold the clock still."""
        options = self.options
        inner = options.get("thread_limiter") or trio.to_thread.current_default_thread_limiter()
        self.state.limiter = ClockHoldingLimiter(inner, hold_limit=self.thread_hold)
        return self.state.limiter

    def _run_kwargs(self) -> dict[str, Any]:
        """``open_run``'s options: the caller's, with the harness's limiter, hooks and
        session."""
        assert self.state.limiter is not None
        run_kwargs: dict[str, Any] = {**self.options, "thread_limiter": self.state.limiter}
        tree = self.tree
        if (
            self.options.get("hooks") is not None
            or self.faults.hooks
            or (tree and tree.hook_faults)
        ):
            # Only then: a run without hooks must keep being tested as one.
            run_kwargs["hooks"] = self.hooks
        if self.watched_session is not None:
            run_kwargs["session"] = self.watched_session
        return run_kwargs

    async def settle(self, run: Run | None, harness: trio.Nursery) -> None:
        """Give ``wait()`` and the readers a (virtual) bound to end, then stop them."""
        state = self.state
        assert run is not None
        with trio.move_on_after(SETTLE):
            await run.wait()
            state.ended["wait"] = True
        with trio.move_on_after(SETTLE):
            if state.readers:
                await state.readers_done.wait()
        if state.ended["wait"]:
            with trio.move_on_after(SETTLE):
                late = [event.seq async for event in run.events()]
                state.ended["late_events"] = late == [event.seq for event in state.events]
        harness.cancel_scope.cancel()

    def observation(self, processes: Sequence[tuple[int, str]]) -> Observation:
        """Everything recorded, once ``trio.run`` has returned."""
        state, hooks, scripted = self.state, self.hooks, self.model.scripted
        assert state.run is not None
        hook_calls = tuple(hooks.calls) if isinstance(hooks, WatchedHooks) else ()
        tool_calls = self.recorder.calls if self.recorder is not None else ()
        tree_view = None
        if self.tree is not None:
            assert isinstance(hooks, TreeHooks)
            root_hooks = hooks.per_run.get(state.run.id)
            hook_calls = tuple(root_hooks.calls) if root_hooks is not None else ()
            tree_view = state.tree_observation(state.run, self.tree, hooks, tool_calls)
            tool_calls = tuple(c for c in tool_calls if c.run_id == state.run.id)
        return Observation(
            run_id=self.run_id,
            outcome=state.run.result,
            events=tuple(state.events),
            event_times=tuple(state.times),
            script=scripted.turns,
            schedule=self.ops,
            applied=tuple(state.applied),
            requests=tuple(scripted.requests),
            open_streams=scripted.open_streams,
            cancels=tuple(state.cancels),
            injections=tuple(state.injections),
            subscribers=tuple(state.subscribers),
            op_errors=tuple(state.op_errors),
            leaked_tasks=tuple(state.leaked_tasks),
            leaked_processes=tuple(processes),
            tool_calls=tool_calls,
            threads_stopped=not state.leaked_threads,
            run_options=self.options,
            input_items=self.input_items,
            run_error=state.run_error,
            ended=dict(state.ended),
            faults=self.faults,
            streams=tuple(self.model.streams),
            hook_calls=hook_calls,
            session_calls=state.session_calls,
            stored=state.stored,
            fresh_run=state.fresh_run,
            leaked_threads=tuple(state.leaked_threads),
            cleanup_timeout=self.cleanup_timeout,
            tree=tree_view,
            ignored_cancels=tuple(state.limiter.ignored_cancels) if state.limiter else (),
        )

    # -- the harness's readers and guard

    async def timestamper(self, run: Run) -> None:
        state = self.state
        state.reader_started()
        async for event in run.events():
            state.saw(event)
            if isinstance(event, RunUpdated) and event.status.is_terminal:
                state.let_go()
        state.ended["events"] = True
        state.reader_ended()

    async def status_watcher(self, run: Run) -> None:
        state = self.state
        state.reader_started()
        async for _update in run.updated:
            pass
        state.ended["updated"] = True
        state.reader_ended()

    async def tree_watcher(self, run: Run) -> None:
        """Read ``events(tree=True)``: every event of the tree, with its time; and
        when a call that started a child ends, no task of that child may be alive."""
        state = self.state
        state.reader_started()
        async for event in run.events(tree=True):
            state.tree_saw(event)
            if isinstance(event, ToolFinished | RunItemEvent):
                state.outlived_calls(run, event)
        state.tree_complete = True
        state.reader_ended()

    async def subscriber(self, run: Run, kind: Literal["events", "status"]) -> None:
        state = self.state
        state.reader_started()
        seen: list[RunEvent] = []
        try:
            cursor = run.events() if kind == "events" else run.updated
            async for event in cursor:
                seen.append(event)
        finally:
            state.subscribers.append(SubscriberView(kind, tuple(seen), complete=False))
        state.subscribers[-1] = attrs.evolve(state.subscribers[-1], complete=True)
        state.reader_ended()

    async def horizon_guard(self, run: Run) -> None:
        with trio.move_on_after(self.horizon):
            await run.wait()
            return
        self.record_cancel(run, "horizon", HORIZON_REASON)
        run.cancel(HORIZON_REASON)

    def record_cancel(self, run: Run, kind: CancelKind, reason: str) -> None:
        state = self.state
        stats = run.statistics()
        now = trio.current_time()
        record = CancelRecord(kind, reason, now, stats.last_seq, run.status, run.result is None)
        state.cancels_of(run).append(record)
        if kind != "after_turn":
            state.let_go()
            # The subtree's live runs are cancelled with it: "parent cancelled".
            for node, _depth in walk(run):
                if node is not run and node.result is None:
                    below = CancelRecord(
                        "outer",
                        "parent cancelled",
                        now,
                        node.statistics().last_seq,
                        node.status,
                        live=True,
                    )
                    state.cancels_of(node).append(below)

    # -- the schedule, and the absent user after it

    async def play(self, run: Run, outer: trio.CancelScope, harness: trio.Nursery) -> None:
        start = trio.current_time()
        for index, op in enumerate(self.ops):
            if op.at > 0:
                await trio.sleep_until(start + op.at + (index + 1) / 1024)
            if op.kind == "cancel_in_tool":  # waits on its own: the other ops go on
                harness.start_soon(self.cancel_in_tool, index, op, run, outer, harness)
            else:
                self.apply(index, op, run, outer, harness)
        harness.start_soon(self.drain, run, name="harness:drain")

    async def drain(self, run: Run) -> None:
        """The user is gone: release blocking tools, approve whatever waits."""
        if self.recorder is not None:
            self.recorder.release()
        async for update in run.updated:
            if update.status is RunStatus.AWAITING_APPROVAL:
                for call_id in run.statistics().pending_approvals:
                    run.approve(call_id)
                for waiting in update.detail.get("waiting", ()):
                    node = run.find(waiting["run_id"])
                    with contextlib.suppress(UnknownCallError, RunClosedError):
                        if node is not None:
                            node.approve(waiting["call_id"])

    async def cancel_in_tool(
        self, index: int, op: Op, run: Run, outer: trio.CancelScope, harness: trio.Nursery
    ) -> None:
        state = self.state
        while True:
            await self._until_a_tool_runs(run, op.target)
            running = set(state.running_tools if op.target is None else state.tree_running)
            await trio.sleep((index + 1) / 1024)
            # Land in a call that is still running (one that ended at once, like an
            # unknown tool's, does not count), or give up once the run is over.
            now_running = state.running_tools if op.target is None else state.tree_running
            if running & now_running or not running:
                break
        self.apply(index, op, run, outer, harness)

    async def _until_a_tool_runs(self, run: Run, target: str | None) -> None:
        state = self.state
        while run.result is None and state.run_error is None:
            if target is None and state.running_tools:
                return
            if target is not None and state.tools_running_in(run, target):
                return
            await state.changed.wait()

    def apply(
        self, index: int, op: Op, root: Run, outer: trio.CancelScope, nursery: trio.Nursery
    ) -> None:
        """Apply one operation (to the run it targets) and record what it did."""
        state = self.state
        now = trio.current_time()
        note = op.describe().split(": ", 1)[1]
        run = root
        if op.target is not None and op.kind in TARGETED:
            found = first_live(root, op.target)
            if found is None:
                state.applied.append((now, f"{note} (no live run of {op.target!r}: nothing done)"))
                return
            run = found
            if run is not root:
                note += f" (run {run.id})"
        try:
            if op.kind in ("cancel", "cancel_after_turn", "cancel_in_tool"):
                note = self._cancel(op, run, root, note)
            elif op.kind == "outer_cancel":
                self.record_cancel(root, "outer", "parent cancelled")
                outer.cancel()
            elif op.kind == "inject":
                note = self._inject(index, op, run, now, note)
            elif op.kind == "withdraw":
                note = self._withdraw(run, note)
            elif op.kind in ("approve", "reject"):
                note = self._decide(op, run, note)
            elif op.kind == "subscribe":
                nursery.start_soon(self.subscriber, root, "events")
            elif op.kind == "status_subscribe":
                nursery.start_soon(self.subscriber, root, "status")
            elif op.kind == "release":
                if self.recorder is not None:
                    self.recorder.release()
            else:  # pragma: no cover - OpKind is closed
                raise ValueError(f"unknown op kind {op.kind!r}")
        except Exception as exc:
            state.op_errors.append(f"{op.describe()} raised {type(exc).__name__}: {exc}")
            note += f" -> raised {type(exc).__name__}"
        state.applied.append((now, note))

    def _cancel(self, op: Op, run: Run, root: Run, note: str) -> str:
        mode: Literal["immediate", "after_turn"] = (
            "after_turn" if op.kind == "cancel_after_turn" else "immediate"
        )
        if op.kind == "cancel_in_tool":
            running = (
                self.state.running_tools
                if run is root
                else {c for r, c in self.state.tree_running if r == run.id}
            )
            note += f" (tools running: {sorted(running) or 'none'})"
        self.record_cancel(run, mode, op.reason)
        run.cancel(op.reason, mode=mode)
        return note

    def _inject(self, index: int, op: Op, run: Run, now: float, note: str) -> str:
        items = _unique_ids(op.items, index)
        try:
            injection_id = run.inject(items, when=op.when)
        except RunClosedError:
            return note + " -> RunClosedError"
        converted = tuple(coerce_items(items))
        self.state.injections_of(run).append(InjectionRecord(injection_id, op.when, converted, now))
        return note + f" -> {injection_id}"

    def _withdraw(self, run: Run, note: str) -> str:
        injections = self.state.injections_of(run)
        live = [i for i, inj in enumerate(injections) if not inj.withdrawn]
        if not live:
            return note + " (nothing to withdraw)"
        position = live[-1]
        injection = injections[position]
        last_seq = run.statistics().last_seq
        if run.withdraw(injection.id):
            injections[position] = attrs.evolve(injection, withdrawn=True)
            return note + f" {injection.id} -> True"
        injections[position] = attrs.evolve(injection, withdraw_failed_at_seq=last_seq)
        return note + f" {injection.id} -> False"

    def _decide(self, op: Op, run: Run, note: str) -> str:
        """Approve or reject the first call that waits for approval."""
        pending = run.statistics().pending_approvals
        if not pending:
            return note + " (nothing pending)"
        if op.kind == "approve":
            run.approve(pending[0])
        else:
            run.reject(pending[0], message=op.reason)
        return note + f" {pending[0]}"


# ------------------------------------------------------------------ run trees

TARGETED = frozenset(
    {"cancel", "cancel_after_turn", "cancel_in_tool", "inject", "withdraw", "approve", "reject"}
)
"""The operation kinds an :attr:`Op.target` applies to (the others act on the root)."""


@final
@attrs.frozen(eq=False)
class NodeRecord:
    """One run of a tree, as :func:`run_tree_schedule` (or
    :func:`~trio_agents.testing.check_tree`) saw it.

    Attributes:
        run_id: the run's id.
        agent: the name of the agent it works as at the end (after any handoff).
        parent_id: its parent's id (None at the root).
        call_id: the parent's tool call it ran in (None at the root).
        depth: 0 at the root, 1 for its children, ...
        height: how many levels of runs were below it (0: none).
        outcome: its result (None: it never ended).
        events: its own events, in order.
        event_times: when each was seen (empty from ``check_tree``).
        cancels: the cancels the schedule applied to it, and (kind ``"outer"``) those
            applied to an ancestor while it was live.
        injections: the injections it accepted (``Op.target``).
        hook_calls: its hook calls.
        tool_calls: its fake tool calls.
    """

    run_id: str
    agent: str
    parent_id: str | None
    call_id: str | None
    depth: int
    height: int
    outcome: RunResult | None
    events: tuple[RunEvent, ...]
    event_times: tuple[float, ...] = ()
    cancels: tuple[CancelRecord, ...] = ()
    injections: tuple[InjectionRecord, ...] = ()
    hook_calls: tuple[HookCall, ...] = ()
    tool_calls: tuple[CallRecord, ...] = ()


@final
@attrs.frozen(eq=False)
class ModelView:
    """What one agent's watched model of a tree example did (all its runs together).

    Attributes:
        agent: the agent's name.
        requests: every request, in order.
        streams: every stream.
        open_streams: streams still open after the example.
    """

    agent: str
    requests: tuple[ModelRequest, ...]
    streams: tuple[StreamRecord, ...]
    open_streams: int


@final
@attrs.frozen(eq=False)
class TreeObservation:
    """A whole run tree, for the tree invariants of the checker.

    Attributes:
        nodes: every run, root first, in pre-order (children in start order).
        events: the merged stream (``events(tree=True)``), in order.
        event_times: when each event was seen (empty from ``check_tree``).
        complete: whether the ``events(tree=True)`` reader ended by itself.
        outlived: runs and tasks found live when the call that started them ended.
        models: each watched agent model.
        tool_calls: every fake tool call of the tree.
    """

    nodes: tuple[NodeRecord, ...]
    events: tuple[RunEvent, ...]
    event_times: tuple[float, ...] = ()
    complete: bool = True
    outlived: tuple[str, ...] = ()
    models: tuple[ModelView, ...] = ()
    tool_calls: tuple[CallRecord, ...] = ()

    def describe(self) -> list[str]:
        """The tree's runs, one line each."""
        lines = ["tree:"]
        for node in self.nodes:
            outcome = node.outcome
            status = "no result" if outcome is None else outcome.status.value
            if outcome is not None and outcome.reason:
                status += f" ({outcome.reason})"
            call = f" in call {node.call_id}" if node.call_id else ""
            lines.append(f"  {'  ' * node.depth}{node.agent} {node.run_id}{call}: {status}")
        return lines


@attrs.frozen
class _TreeSetup:
    models: Mapping[str, WatchedModel]
    hook_faults: Mapping[str, tuple[HookFault, ...]]


def run_tree_schedule(
    tree: Callable[[Mapping[str, Model]], Agent],
    scripts: Mapping[str, Sequence[Turn | str]],
    schedule: Sequence[Op] = (),
    *,
    faults: Mapping[str, Faults] | None = None,
    recorder: ToolRecorder | None = None,
    input: str | Item | Sequence[Item] = "go",
    run_options: Mapping[str, Any] | None = None,
    default_turn: Turn | str | None = "the end",
    horizon: float = 100_000.0,
    check_processes: bool | None = None,
    session: bool | Callable[[], Session] = False,
    thread_hold: float | None = 1.0,
    thread_grace: float = 5.0,
) -> Observation:
    """Run one example of a *tree* of agents (DESIGN §17) and return what happened.

    ``scripts`` gives each agent (by name) its script: the harness makes one watched
    :class:`ScriptedModel` per agent (every run of that agent plays from it, in call
    order, then ``default_turn``) and calls ``tree(models)`` (agent name → model) to
    build the root agent — typically an agent whose tools include other agents'
    :meth:`~trio_agents.Agent.as_tool`. The root agent's name must be a key of
    ``scripts``.

    ``faults`` gives each agent's :class:`Faults`: its model faults (counted over all
    the calls of its model) and hook faults (counted per run; every run of the tree
    shares the root's hooks, split per run by the harness); the session fault is the
    root's. An :class:`Op` with a ``target`` acts on the first live run of that
    agent. Everything else is as in :func:`run_schedule`; the absent user also
    approves every call waiting below the root. The :class:`Observation` is the
    root's, with :attr:`Observation.tree` holding every run of the tree;
    :func:`~trio_agents.testing.check_run` checks the tree invariants as well.
    """
    per_agent = dict(faults or {})
    models = {
        name: WatchedModel(
            ScriptedModel(list(script), default=default_turn),
            per_agent.get(name, Faults()).model,
        )
        for name, script in scripts.items()
    }
    agent = tree(dict(models))
    if agent.name not in models:
        raise ValueError(
            f"the root agent {agent.name!r} has no script (scripts are given for {sorted(models)})"
        )
    root_faults = per_agent.get(agent.name, Faults())
    setup = _TreeSetup(
        models=models,
        hook_faults={name: f.hooks for name, f in per_agent.items() if f.hooks},
    )
    return _run_example(
        agent,
        models[agent.name],
        setup,
        schedule,
        recorder=recorder,
        input=input,
        run_options=run_options,
        horizon=horizon,
        check_processes=check_processes,
        faults=root_faults,
        session=session,
        thread_hold=thread_hold,
        thread_grace=thread_grace,
    )
