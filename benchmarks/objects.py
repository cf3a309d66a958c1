"""Objects per in-flight run (issue 18, W3): ``python -m benchmarks.objects [N]``.

Starts ``N`` B3-shaped runs (``benchmarks/concurrency.py``: the tool sleeps), waits
until every one is blocked in its tool, and counts what they hold: GC-tracked objects
(``gc.get_objects()``) by type, and Python memory (``tracemalloc``), both per run.
Deterministic up to the allocator; no timing. Prints one JSON object.
"""

from __future__ import annotations

import collections
import gc
import json
import sys
import tracemalloc
from typing import Any

import trio
import trio.testing

import trio_agents as ta

from ._models import ToolThenAnswer

__all__ = ["objects_per_run"]


@ta.function_tool
async def blocked_add(a: int, b: int) -> int:
    """Add two integers once released."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


async def objects_per_run(n: int = 1000, *, top: int = 15) -> dict[str, Any]:
    agent = ta.Agent(
        name="b3", model=ToolThenAnswer("blocked_add", {"a": 1, "b": 2}), tools=[blocked_add]
    )

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
    counted: dict[str, Any] = {}
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(ta.run, agent, f"run {i}")
        await trio.testing.wait_all_tasks_blocked()
        current, _ = tracemalloc.get_traced_memory()
        gc.collect()
        after = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        grown = after - before
        counted = {
            "n": n,
            "gc_objects_per_run": round(sum(grown.values()) / n, 2),
            "tracemalloc_kb_per_run": round((current - base) / 1024 / n, 2),
            "by_type": {k: round(v / n, 2) for k, v in grown.most_common(top)},
        }
        nursery.cancel_scope.cancel()
    tracemalloc.stop()
    return counted


if __name__ == "__main__":
    print(json.dumps(trio.run(objects_per_run, int(sys.argv[1]) if len(sys.argv) > 1 else 1000)))
