"""Playing a schedule on a run: each :class:`Op` at its virtual time, the absent user
once the schedule is over, and the harness's horizon."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Literal, final

import attrs
import trio

from .. import (
    Item,
    Run,
    RunClosedError,
    RunEvent,
    RunStatus,
    ToolCall,
    ToolResult,
    UnknownCallError,
    coerce_items,
)
from ._example_state import ExampleState
from ._fakes import ToolRecorder
from ._observation import CancelKind, CancelRecord, InjectionRecord, SubscriberView
from ._strategies import Op
from ._tree import first_live, walk

__all__ = ["HORIZON_REASON", "TARGETED", "SchedulePlayer"]

HORIZON_REASON = "harness horizon"
"""The cancel reason :func:`run_schedule` uses when a run outlives its horizon."""

TARGETED = frozenset(
    {"cancel", "cancel_after_turn", "cancel_in_tool", "inject", "withdraw", "approve", "reject"}
)
"""The operation kinds an :attr:`Op.target` applies to (the others act on the root)."""


def _unique_ids(items: Sequence[Item], number: int) -> tuple[Item, ...]:
    """Give the call ids of injected pairs a per-injection suffix."""
    out: list[Item] = []
    for item in items:
        if isinstance(item, ToolCall | ToolResult):
            item = attrs.evolve(item, call_id=f"{item.call_id}-{number}")
        out.append(item)
    return tuple(out)


@final
@attrs.define(eq=False)
class SchedulePlayer:
    """Applies the operations of one example to its run tree and records what they did
    in :attr:`state`: the schedule (:meth:`play`, :meth:`apply` and one method per
    kind of operation), the subscribers it starts (:meth:`subscriber`), the absent user
    (:meth:`drain`) and the horizon (:meth:`horizon_guard`)."""

    state: ExampleState
    ops: tuple[Op, ...]
    recorder: ToolRecorder | None
    horizon: float

    # -- the harness's subscribers and guard

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
