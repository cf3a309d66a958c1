"""What the runners record of one example: :class:`Observation` (what
:func:`~trio_agents.testing.run_schedule` returns and
:func:`~trio_agents.testing.check_run` reads) and the records it is made of; for a
run tree, :class:`TreeObservation` and one :class:`NodeRecord` per run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeAlias, final

import attrs

from .. import InjectWhen, Item, ModelRequest, RunEvent, RunResult, RunStatus
from ..models import Turn
from ._fakes import CallRecord
from ._faults import Faults, HookCall, SessionCall, StreamRecord
from ._strategies import Op

__all__ = [
    "FRESH_INPUT",
    "CancelKind",
    "CancelRecord",
    "FreshRun",
    "InjectionRecord",
    "ModelView",
    "NodeRecord",
    "Observation",
    "SubscriberView",
    "TreeObservation",
]

CancelKind: TypeAlias = Literal["immediate", "after_turn", "outer", "horizon"]


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


# ------------------------------------------------------------------ run trees


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
