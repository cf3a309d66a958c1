"""Objects per in-flight run (issue 18, W3): ``python -m benchmarks.objects [N] [PHASE]``.

Starts ``N`` B3-shaped runs (``benchmarks/concurrency.py``: one tool call, then the
answer), waits until every one is blocked in ``PHASE``, and counts what they hold:
GC-tracked objects (``gc.get_objects()``) by type, and Python memory
(``tracemalloc``), both per run. The phases (issue 43: B3's 10,000 runs go through
them in step, so its peak is the dearest one):

- ``tool`` (the default): in its tool call;
- ``model``: mid-stream in its first model call (the request, the stream, the
  response so far);
- ``model2``: mid-stream in its second model call, after the tool's result.

With ``--lines`` it also prints the top allocation sites (tracemalloc by line).
Deterministic up to the allocator; no timing. Prints one JSON object.
"""

from __future__ import annotations

import collections
import gc
import json
import linecache
import sys
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, final

import trio
import trio.testing

import trio_agents as ta
from trio_agents.models import ModelEvent, ModelRequest

from ._models import ToolThenAnswer

__all__ = ["PHASES", "objects_per_run"]

PHASES = ("tool", "model", "model2")


@ta.function_tool
async def blocked_add(a: int, b: int) -> int:
    """Add two integers once released."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    await trio.lowlevel.checkpoint()
    return a + b


@final
class _StuckStream(AbstractAsyncContextManager[AsyncIterator[ModelEvent]]):
    """Gives ``inner``'s events and blocks for good before its event ``at``."""

    def __init__(self, inner: AbstractAsyncContextManager[AsyncIterator[ModelEvent]], at: int):
        self._inner = inner
        self._at = at
        self._given = 0

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        self._events = await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._inner.__aexit__(*exc_info)

    def __aiter__(self) -> _StuckStream:
        return self

    async def __anext__(self) -> ModelEvent:
        if self._given == self._at:
            await trio.sleep_forever()
        self._given += 1
        return await self._events.__anext__()


@final
class _StuckModel:
    """:class:`ToolThenAnswer` whose first (``model``) or second (``model2``) stream
    blocks after its first event (a tool call, or the answer's text)."""

    def __init__(self, phase: str) -> None:
        self._inner = ToolThenAnswer("add", {"a": 1, "b": 2})
        self._phase = phase

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        second = isinstance(request.items[-1], ta.ToolResult)
        stuck = (self._phase == "model2") == second
        return _StuckStream(self._inner.stream(request), 1 if stuck else -1)


def _agent(phase: str) -> ta.Agent:
    if phase == "tool":
        model: Any = ToolThenAnswer("blocked_add", {"a": 1, "b": 2})
        return ta.Agent(name="b3", model=model, tools=[blocked_add])
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    return ta.Agent(name="b3", model=_StuckModel(phase), tools=[add])


def _lines(
    snapshot: tracemalloc.Snapshot, base: tracemalloc.Snapshot, n: int, top: int
) -> list[str]:
    """The top allocation sites still held, per run: bytes, blocks, file:line, code."""
    out = []
    for stat in snapshot.compare_to(base, "lineno")[:top]:
        frame = stat.traceback[0]
        where = frame.filename.split("site-packages/")[-1]
        code = linecache.getline(frame.filename, frame.lineno).strip()[:80]
        out.append(
            f"{stat.size_diff / n:7.1f} B {stat.count_diff / n:5.2f} {where}:{frame.lineno}  {code}"
        )
    return out


async def objects_per_run(
    n: int = 1000, *, top: int = 15, phase: str = "tool", lines: int = 0
) -> dict[str, Any]:
    """What ``n`` runs blocked in ``phase`` hold, per run (see the module docstring);
    ``lines``: how many allocation sites to list (0: none)."""
    agent = _agent(phase)

    async def runs(count: int) -> None:
        async with trio.open_nursery() as nursery:
            for i in range(count):
                nursery.start_soon(ta.run, agent, f"run {i}")
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()

    await runs(min(n, 50))  # warm-up: imports, caches
    gc.collect()
    before = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    first = tracemalloc.take_snapshot() if lines else None
    counted: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(ta.run, agent, f"run {i}")
        await trio.testing.wait_all_tasks_blocked()
        current, _ = tracemalloc.get_traced_memory()
        snapshot = tracemalloc.take_snapshot() if lines else None
        gc.collect()
        after = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        grown = after - before
        counted = {
            "n": n,
            "phase": phase,
            "gc_objects_per_run": round(sum(grown.values()) / n, 2),
            "tracemalloc_kb_per_run": round((current - base) / 1024 / n, 2),
            "by_type": {k: round(v / n, 2) for k, v in grown.most_common(top)},
        }
        if snapshot is not None and first is not None:
            counted["lines"] = _lines(snapshot, first, n, lines)
        nursery.cancel_scope.cancel()
    tracemalloc.stop()
    return counted


def _main(argv: list[str]) -> dict[str, Any]:
    lines = 40 if "--lines" in argv else 0
    args = [a for a in argv if a != "--lines"]
    n = int(args[0]) if args else 1000
    phase = args[1] if len(args) > 1 else "tool"
    return trio.run(lambda: objects_per_run(n, phase=phase, lines=lines))


if __name__ == "__main__":
    print(json.dumps(_main(sys.argv[1:]), indent=1))
