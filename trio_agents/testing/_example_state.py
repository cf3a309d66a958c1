"""What the harness records while one example runs, and what its jobs wait on.

The harness's readers, its schedule player and its guard all write here
(:class:`ExampleState`); the runner turns it into an
:class:`~trio_agents.testing.Observation` once ``trio.run`` has returned.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio

from .. import Item, Run, RunEvent, RunItemEvent, ToolFinished, ToolResult, ToolStarted
from ._clock import ClockHoldingLimiter
from ._fakes import CallRecord
from ._faults import SessionCall
from ._observation import (
    CancelRecord,
    FreshRun,
    InjectionRecord,
    ModelView,
    NodeRecord,
    SubscriberView,
    TreeObservation,
)
from ._tree import TreeHooks, TreeSetup, height, walk
from ._watch import all_tasks

__all__ = ["ExampleState"]


@attrs.define(eq=False)
class ExampleState:
    """Everything recorded so far of one example (see the module's docstring)."""

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
        tree: TreeSetup,
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
