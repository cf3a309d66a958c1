"""Run trees in the harness (DESIGN §17 "Harness"): hooks per run, the tree's nodes.

A tree example gives every agent its own watched :class:`ScriptedModel` and the root
run one hooks object, which every child run inherits (:class:`TreeSetup`).
:class:`TreeHooks` splits the hook calls by run, so each run's hooks are checked as
its own (a hook fault applies to the runs of the agents it is given for, each counting
its own calls).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, final

import attrs

from .. import Item, RunEvent, RunHooks, ToolCall, ToolResult
from ..models import ModelRequest
from ._faults import HookFault, WatchedHooks, WatchedModel

if TYPE_CHECKING:
    from .. import Run, RunResult

__all__ = ["TreeHooks", "TreeSetup", "first_live", "height", "tree_events", "walk"]


@final
@attrs.frozen
class TreeSetup:
    """What a tree example is given beyond a single run's: each agent's watched model
    (agent name → model) and each agent's hook faults (only agents that have some)."""

    models: Mapping[str, WatchedModel]
    hook_faults: Mapping[str, tuple[HookFault, ...]]


def walk(root: Run) -> Iterator[tuple[Run, int]]:
    """Every run of the tree below and including ``root`` with its depth, in pre-order
    (each run's children in start order): the order ``Op.target`` picks from."""
    pending: list[tuple[Run, int]] = [(root, 0)]
    while pending:
        node, depth = pending.pop()
        yield node, depth
        pending.extend((child, depth + 1) for child in reversed(node.children))


@final
class TreeHooks(RunHooks):
    """One :class:`WatchedHooks` per run of the tree (the user's hooks, if any, called
    for every run), made at the run's first hook call with the hook faults of the
    agent it runs as (``faults``: agent name → faults)."""

    def __init__(
        self,
        inner: RunHooks | None,
        faults: Mapping[str, Sequence[HookFault]],
        stored: Callable[[], Awaitable[Sequence[Item]]] | None = None,
    ) -> None:
        self.inner = inner
        self.faults = faults
        self.per_run: dict[str, WatchedHooks] = {}
        self._stored = stored

    def of(self, run: Run) -> WatchedHooks:
        """The watcher of ``run``'s hook calls."""
        watched = self.per_run.get(run.id)
        if watched is None:
            # Only the root's session is the harness's: a probe for it alone.
            stored = self._stored if run.parent is None else None
            faults = self.faults.get(run.agent.name, ())
            watched = self.per_run[run.id] = WatchedHooks(self.inner, faults, stored=stored)
        return watched

    async def on_run_start(self, run: Run) -> None:
        await self.of(run).on_run_start(run)

    async def on_run_end(self, run: Run, result: RunResult) -> None:
        await self.of(run).on_run_end(run, result)

    async def on_model_start(self, run: Run, turn: int, request: ModelRequest) -> None:
        await self.of(run).on_model_start(run, turn, request)

    async def on_model_end(self, run: Run, turn: int, outcome: str) -> None:
        await self.of(run).on_model_end(run, turn, outcome)

    async def on_tool_start(self, run: Run, call: ToolCall) -> None:
        await self.of(run).on_tool_start(run, call)

    async def on_tool_end(self, run: Run, call: ToolCall, result: ToolResult) -> None:
        await self.of(run).on_tool_end(run, call, result)


def tree_events(root: Run) -> list[RunEvent]:
    """What ``root.events(tree=True)`` would replay now: the tree's events in the
    order they happened (the root's own log when it never started a child)."""
    # The run's own feed and log: a run has no public way to replay the tree
    # synchronously.
    feed = root._feed
    if feed is None:
        return root._log.retained()
    return [
        event
        for event in (feed.get(position) for position in range(feed.first, feed.end))
        if feed.below(event.run_id, root.id)
    ]


def first_live(root: Run, agent: str) -> Run | None:
    """The first run of the tree (pre-order, children in start order) working as
    ``agent`` that has no result yet: what an :class:`Op` with ``target`` acts on."""
    for node, _depth in walk(root):
        if node.agent.name == agent and node.result is None:
            return node
    return None


def height(run: Run) -> int:
    """How many levels of runs are below ``run`` (0 for a run without children)."""
    return max((1 + height(child) for child in run.children), default=0)
