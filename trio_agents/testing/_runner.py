"""Run one schedule against one script, on a ``MockClock``, and record everything."""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeAlias, final

import attrs
import trio
import trio.testing

from .._agent import Agent
from .._entry import open_run
from .._events import RunEvent, RunStatus
from .._exceptions import RunClosedError
from .._items import Item, ToolCall, ToolResult, coerce_items
from .._model import Model, ModelRequest
from .._result import RunResult
from .._run import InjectWhen, Run
from ..models._scripted import ScriptedModel, Turn
from ._clock import ClockHoldingLimiter
from ._fakes import CallRecord, ToolRecorder
from ._strategies import Op

__all__ = [
    "CancelRecord",
    "InjectionRecord",
    "Observation",
    "SubscriberView",
    "run_schedule",
]

CancelKind: TypeAlias = Literal["immediate", "after_turn", "outer", "horizon"]

MARKER_ENV = "TRIO_AGENTS_TESTING_RUN"
"""Set in the environment while a run executes: its child processes inherit it."""

HORIZON_REASON = "harness horizon"
"""The cancel reason :func:`run_schedule` uses when a run outlives its horizon."""

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


@final
@attrs.frozen(eq=False)
class Observation:
    """Everything :func:`run_schedule` saw of one example; input to ``check_run``.

    Attributes:
        run_id: the run's id.
        result: the :class:`~trio_agents.RunResult`.
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
        threads_stopped: False if a thread-tool call was still running 2 s (real
            time) after the run ended.
        run_options: the options passed to ``open_run``.
    """

    run_id: str
    result: RunResult
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

    def describe(self) -> str:
        """The example, readably: script, schedule and outcome."""
        lines = ["script:"]
        lines += [f"  {index + 1}. {turn!r}" for index, turn in enumerate(self.script)]
        lines.append("schedule:" if self.schedule else "schedule: (none)")
        lines += [f"  {op.describe()}" for op in self.schedule]
        lines.append("applied:" if self.applied else "applied: (nothing)")
        lines += [f"  t={at:g}: {text}" for at, text in self.applied]
        lines.append(
            f"outcome: {self.result.status.value}"
            + (f" ({self.result.reason})" if self.result.reason else "")
            + f" after {self.result.turns} turn(s)"
        )
        return "\n".join(lines)


# ------------------------------------------------------------------ processes

_spawns = 0
_hook_installed = False


def _audit(event: str, _args: tuple[object, ...]) -> None:
    global _spawns
    if event in ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.system", "os.exec"):
        _spawns += 1


def _install_audit_hook() -> None:
    global _hook_installed
    if not _hook_installed:
        sys.addaudithook(_audit)
        _hook_installed = True


@contextlib.contextmanager
def _marked_environment(run_id: str) -> Iterator[None]:
    previous = os.environ.get(MARKER_ENV)
    os.environ[MARKER_ENV] = run_id
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(MARKER_ENV, None)
        else:
            os.environ[MARKER_ENV] = previous


def _marked_processes(run_id: str) -> list[tuple[int, str]]:
    """Live processes whose environment carries the run's marker (Linux /proc)."""
    needle = f"{MARKER_ENV}={run_id}".encode()
    found: list[tuple[int, str]] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            if needle not in environ.split(b"\0"):
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append((int(entry), cmdline))
    return found


def _leaked_processes(run_id: str) -> list[tuple[int, str]]:
    """Marked processes still alive; killed ones get up to 1 s (real) to disappear."""
    deadline = time.monotonic() + 1.0
    while True:
        found = _marked_processes(run_id)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


# ------------------------------------------------------------------ tasks


def _all_tasks() -> list[trio.lowlevel.Task]:
    tasks: list[trio.lowlevel.Task] = []

    def walk(task: trio.lowlevel.Task) -> None:
        tasks.append(task)
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child)

    root = trio.lowlevel.current_root_task()
    assert root is not None
    walk(root)
    return tasks


# ------------------------------------------------------------------ the runner


def _unique_ids(items: Sequence[Item], number: int) -> tuple[Item, ...]:
    """Give the call ids of injected pairs a per-injection suffix."""
    out: list[Item] = []
    for item in items:
        if isinstance(item, ToolCall | ToolResult):
            item = attrs.evolve(item, call_id=f"{item.call_id}-{number}")
        out.append(item)
    return tuple(out)


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
    threads_stopped: bool = True


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
) -> Observation:
    """Run one example and return what happened: a sync function calling ``trio.run``.

    A :class:`ScriptedModel` plays ``script`` (then ``default_turn`` forever);
    ``agent_factory`` builds the agent around it. The run starts at Trio time 0 on a
    ``trio.testing.MockClock(autojump_threshold=0)``, so sleeps cost nothing and the
    example replays exactly. Operations at time 0 are applied before the run's first
    step; the ``i``-th operation otherwise happens at ``op.at + (i + 1) / 1024``.

    Once the schedule is over the harness answers for the absent user: it releases
    the :func:`blocking_tool` calls (``recorder``) and approves every call that waits
    for approval, now or later, so no run waits forever; and if the run is still going
    at ``horizon`` it is cancelled with reason ``"harness horizon"``.

    ``run_options`` go to :func:`~trio_agents.open_run` (``hooks``, ``max_turns``,
    ``session``, ...). ``check_processes`` (default: only if the run spawned a process)
    scans ``/proc`` afterwards for processes that inherited the run's marker.

    Do not call it from inside ``trio.run`` (use a sync test), and not from two threads
    at once (the process marker is an environment variable).
    """
    _install_audit_hook()
    spawns_before = _spawns
    model = ScriptedModel(list(script), default=default_turn)
    agent = agent_factory(model)
    if recorder is not None:
        recorder.reset()
    options = dict(run_options or {})
    run_id = f"lifecycle-{next(_run_numbers)}"
    ops = tuple(sorted(schedule, key=lambda op: op.at))
    state = _State()

    def record_cancel(run: Run, kind: CancelKind, reason: str) -> None:
        stats = run.statistics()
        state.cancels.append(
            CancelRecord(
                kind, reason, trio.current_time(), stats.last_seq, run.status, run.result is None
            )
        )

    async def timestamper(run: Run) -> None:
        async for event in run.events():
            state.events.append(event)
            state.times.append(trio.current_time())

    async def horizon_guard(run: Run) -> None:
        with trio.move_on_after(horizon):
            await run.wait()
            return
        record_cancel(run, "horizon", HORIZON_REASON)
        run.cancel(HORIZON_REASON)

    async def events_subscriber(run: Run) -> None:
        seen: list[RunEvent] = []
        try:
            async for event in run.events():
                seen.append(event)
        finally:
            state.subscribers.append(SubscriberView("events", tuple(seen), complete=False))
        state.subscribers[-1] = attrs.evolve(state.subscribers[-1], complete=True)

    async def status_subscriber(run: Run) -> None:
        seen: list[RunEvent] = []
        try:
            async for update in run.updated:
                seen.append(update)
        finally:
            state.subscribers.append(SubscriberView("status", tuple(seen), complete=False))
        state.subscribers[-1] = attrs.evolve(state.subscribers[-1], complete=True)

    async def drain(run: Run) -> None:
        """The user is gone: release blocking tools, approve whatever waits."""
        if recorder is not None:
            recorder.release()
        async for update in run.updated:
            if update.status is RunStatus.AWAITING_APPROVAL:
                for call_id in run.statistics().pending_approvals:
                    run.approve(call_id)

    def apply(index: int, op: Op, run: Run, outer: trio.CancelScope, nursery: trio.Nursery) -> None:
        now = trio.current_time()
        note = op.describe().split(": ", 1)[1]
        try:
            if op.kind in ("cancel", "cancel_after_turn"):
                mode: Literal["immediate", "after_turn"] = (
                    "immediate" if op.kind == "cancel" else "after_turn"
                )
                record_cancel(run, mode, op.reason)
                run.cancel(op.reason, mode=mode)
            elif op.kind == "outer_cancel":
                record_cancel(run, "outer", "parent cancelled")
                outer.cancel()
            elif op.kind == "inject":
                items = _unique_ids(op.items, index)
                try:
                    injection_id = run.inject(items, when=op.when)
                except RunClosedError:
                    note += " -> RunClosedError"
                else:
                    converted = tuple(coerce_items(items))
                    state.injections.append(InjectionRecord(injection_id, op.when, converted, now))
                    note += f" -> {injection_id}"
            elif op.kind == "withdraw":
                live = [i for i, inj in enumerate(state.injections) if not inj.withdrawn]
                if live:
                    position = live[-1]
                    injection = state.injections[position]
                    last_seq = run.statistics().last_seq
                    if run.withdraw(injection.id):
                        state.injections[position] = attrs.evolve(injection, withdrawn=True)
                        note += f" {injection.id} -> True"
                    else:
                        state.injections[position] = attrs.evolve(
                            injection, withdraw_failed_at_seq=last_seq
                        )
                        note += f" {injection.id} -> False"
                else:
                    note += " (nothing to withdraw)"
            elif op.kind in ("approve", "reject"):
                pending = run.statistics().pending_approvals
                if pending:
                    if op.kind == "approve":
                        run.approve(pending[0])
                    else:
                        run.reject(pending[0], message=op.reason)
                    note += f" {pending[0]}"
                else:
                    note += " (nothing pending)"
            elif op.kind == "subscribe":
                nursery.start_soon(events_subscriber, run)
            elif op.kind == "status_subscribe":
                nursery.start_soon(status_subscriber, run)
            elif op.kind == "release":
                if recorder is not None:
                    recorder.release()
            else:  # pragma: no cover - OpKind is closed
                raise ValueError(f"unknown op kind {op.kind!r}")
        except Exception as exc:
            state.op_errors.append(f"{op.describe()} raised {type(exc).__name__}: {exc}")
            note += f" -> raised {type(exc).__name__}"
        state.applied.append((now, note))

    async def main() -> None:
        baseline = {id(task) for task in _all_tasks()}
        start = trio.current_time()
        limiter = options.get("thread_limiter") or trio.to_thread.current_default_thread_limiter()
        run_kwargs = {**options, "thread_limiter": ClockHoldingLimiter(limiter)}
        async with trio.open_nursery() as harness:
            with trio.CancelScope() as outer:
                async with (
                    open_run(agent, input, run_id=run_id, **run_kwargs) as run,
                    trio.open_nursery() as ops_nursery,
                ):
                    state.run = run
                    harness.start_soon(timestamper, run, name="harness:timestamper")
                    harness.start_soon(horizon_guard, run, name="harness:horizon")
                    for index, op in enumerate(ops):
                        if op.at > 0:
                            await trio.sleep_until(start + op.at + (index + 1) / 1024)
                        apply(index, op, run, outer, ops_nursery)
                    ops_nursery.start_soon(drain, run, name="harness:drain")
            assert state.run is not None
            await state.run.wait()
        current = trio.lowlevel.current_task()
        state.leaked_tasks.extend(
            task.name for task in _all_tasks() if id(task) not in baseline and task is not current
        )
        if recorder is not None and any(
            c.kind == "thread" and c.state == "running" for c in recorder.calls
        ):
            state.threads_stopped = await trio.to_thread.run_sync(recorder.wait_for_threads, 2.0)

    with _marked_environment(run_id):
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    if check_processes is None:
        check_processes = _spawns != spawns_before
    leaked_processes = _leaked_processes(run_id) if check_processes else []
    assert state.run is not None
    assert state.run.result is not None
    return Observation(
        run_id=run_id,
        result=state.run.result,
        events=tuple(state.events),
        event_times=tuple(state.times),
        script=model.turns,
        schedule=ops,
        applied=tuple(state.applied),
        requests=tuple(model.requests),
        open_streams=model.open_streams,
        cancels=tuple(state.cancels),
        injections=tuple(state.injections),
        subscribers=tuple(state.subscribers),
        op_errors=tuple(state.op_errors),
        leaked_tasks=tuple(state.leaked_tasks),
        leaked_processes=tuple(leaked_processes),
        tool_calls=recorder.calls if recorder is not None else (),
        threads_stopped=state.threads_stopped,
        run_options=options,
    )
