"""Run one schedule against one script, on a ``MockClock``, and record everything.

:func:`run_schedule` plays one agent's run; :func:`run_example` is the example both
it and :func:`~trio_agents.testing.run_tree_schedule` run: the run, the harness's
readers, the schedule (``_schedule_player.py``), and what follows the run.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import attrs
import trio
import trio.testing

from .. import (
    Agent,
    Item,
    Model,
    Run,
    RunItemEvent,
    RunResult,
    RunUpdated,
    SessionBusyError,
    ToolFinished,
    coerce_items,
    open_run,
)
from ..models import ScriptedModel, Turn
from ..sessions import MemorySession, Session
from ._clock import ClockHoldingLimiter
from ._example_state import ExampleState
from ._fakes import ToolRecorder
from ._faults import Faults, WatchedHooks, WatchedModel, WatchedSession
from ._observation import FRESH_INPUT, FreshRun, Observation
from ._schedule_player import SchedulePlayer
from ._strategies import Op
from ._tree import TreeHooks, TreeSetup
from ._watch import (
    ThreadWatch,
    all_tasks,
    install_audit_hook,
    leaked_processes,
    marked_environment,
    process_tree,
    spawn_count,
)

__all__ = ["SETTLE", "run_example", "run_schedule"]

SETTLE = 1000.0
"""Virtual seconds the runner waits, once the run's block is left, for ``wait()`` and
the readers to end (a run that keeps its promises needs none of it)."""

_run_numbers = itertools.count(1)


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
    return run_example(
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


def run_example(
    agent: Agent,
    model: WatchedModel,
    tree: TreeSetup | None,
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
    :meth:`tree_watcher`), the schedule, its subscribers, the absent user and the
    horizon (:attr:`player`, a :class:`SchedulePlayer`), and the end (:meth:`settle`,
    :meth:`observation`). What they record goes in :attr:`state`.
    """

    agent: Agent
    model: WatchedModel
    tree: TreeSetup | None
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
    state: ExampleState = attrs.Factory(ExampleState)
    player: SchedulePlayer = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.player = SchedulePlayer(self.state, self.ops, self.recorder, self.horizon)

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
                        harness.start_soon(self.player.horizon_guard, run, name="harness:horizon")
                        if self.tree is not None:
                            harness.start_soon(self.tree_watcher, run, name="harness:tree")
                        await self.player.play(run, outer, harness)
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

    # -- the harness's readers

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
