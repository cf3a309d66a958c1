"""Where a cancel's time goes (issue 43): ``python -m benchmarks.cancel_path [N] [KIND]``.

For ``N`` runs of B4's shape (``OpenAIChatModel`` streaming from the loopback server
subprocess, a ``MemorySession``; ``KIND`` is ``mid_stream``, the default, or
``thread``), each cancelled mid-stream, it prints one JSON object with:

- ``phases_us``: the p50 of the time from ``cancel()`` (taken in the worker thread for
  ``thread``) to each phase: the run's scope left and the model stream unwound
  (``unwound``: Trio's cancel delivery, then httpx/httpcore unwinding their generators
  and closing the socket, then the stream's ``__aexit__``), the repair started and
  done, and the terminal update seen by another task;
- ``task_steps``: the task steps between ``cancel()`` and the terminal update seen
  (Trio's scheduler passes), and ``run_steps``, those of the run's own task;
- ``calls``: the calls (Python and C) on the same path, per cancel, by the library
  on whose behalf they run (``trio_agents`` — the run core —, ``trio_agents.models``,
  ``httpx`` with httpcore and h11, or ``scheduler``: Trio's run loop with none of
  them on the stack), each split by the code called (see :class:`_Calls`).

Calls and task steps are counts (the machine's load does not move them); the phase
times are the wall clock of this machine state.
"""

from __future__ import annotations

import collections
import json
import sys
import time
from typing import Any

import httpx
import trio

import trio_agents as ta
from trio_agents import _run
from trio_agents.models._openai import OpenAIChatModel
from trio_agents.sessions import MemorySession

from . import latency
from ._common import percentile

__all__ = ["cancel_path"]

_LIBRARIES = (
    ("/trio_agents/models/", "trio_agents.models"),
    ("/trio_agents/", "trio_agents"),
    ("/httpx/", "httpx"),
    ("/httpcore/", "httpx"),
    ("/h11/", "httpx"),
    ("/benchmarks/", "benchmark"),
)
_TRIO = ("/trio/", "/outcome/")


def _library(file: str) -> str | None:
    for part, name in _LIBRARIES:
        if part in file:
            return name
    return None


class _Calls:
    """A ``sys.setprofile`` hook counting every call (Python and C) by the library on
    whose behalf it runs — the innermost frame of ours, httpx/httpcore or the benchmark
    on the stack, or ``scheduler`` when there is none (Trio's run loop) — and by the
    kind of code called: that library's own, ``trio`` (and ``outcome``), ``abc``
    (``ABCMeta.__subclasscheck__``: Trio's exceptions have an ``ABCMeta`` metaclass,
    and a ``Cancelled`` met by a frame's handler calls it) or ``cpython`` (builtins and
    the standard library)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            callee = frame.f_code.co_filename
            name = frame.f_code.co_name
        elif event == "c_call":
            callee, name = "<builtin>", getattr(arg, "__name__", "")
        else:
            return
        if "subclasscheck" in name:
            kind = "abc"
        elif any(part in callee for part in _TRIO):
            kind = "trio"
        else:
            kind = _library(callee) or "cpython"
        owner = None
        walk = frame
        while walk is not None and owner is None:
            if walk.f_code.co_name == "unrolled_run":
                owner = "scheduler"  # Trio's run loop, below every task's frames
            else:
                owner = _library(walk.f_code.co_filename)
            walk = walk.f_back
        owner = owner or "scheduler"
        self.counts[owner, "own" if kind == owner else kind] += 1


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.on = False
        self.steps = 0
        self.run_steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.on:
            self.steps += 1
            if task.name.endswith("._serve"):
                self.run_steps += 1


async def cancel_path(n: int = 200, kind: str = "mid_stream") -> dict[str, Any]:
    marks: dict[str, float] = {}
    clock = time.perf_counter
    # The two seams timed, patched for this measurement only (restored below).
    module = vars(_run)
    verdict, repair = _run.Run._verdict, module["repair"]

    def timed_verdict(self: _run.Run, *args: Any) -> Any:
        marks["unwound"] = clock()
        return verdict(self, *args)

    async def timed_repair(*args: Any) -> Any:
        marks["repair_started"] = clock()
        result = await repair(*args)
        marks["repaired"] = clock()
        return result

    steps = _Steps()
    profile: _Calls | None = None
    phases: dict[str, list[float]] = collections.defaultdict(list)
    counts: dict[str, list[int]] = collections.defaultdict(list)

    def cancel_from_thread(run: ta.Run) -> float:
        t0 = clock()
        run.cancel("bench")
        return t0

    async def one(agent: ta.Agent, marker: str, keep: bool) -> None:
        async with ta.open_run(agent, marker, session=MemorySession()) as run:
            await latency._reach(run, "mid_stream")
            statuses = aiter(run.updated)
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    async for update in statuses:
                        if update.status.is_terminal:
                            marks["seen"] = clock()
                            steps.on = False
                            if profile is not None:
                                sys.setprofile(None)

                nursery.start_soon(watch)
                await trio.lowlevel.checkpoint()
                steps.steps = steps.run_steps = 0
                steps.on = True
                if profile is not None:
                    sys.setprofile(profile)
                if kind == "thread":
                    t0 = await trio.to_thread.run_sync(cancel_from_thread, run)
                else:
                    t0 = clock()
                    run.cancel("bench")
        if keep:
            for phase in ("unwound", "repair_started", "repaired", "seen"):
                phases[phase].append((marks[phase] - t0) * 1e6)
            counts["task_steps"].append(steps.steps)
            counts["run_steps"].append(steps.run_steps)

    _run.Run._verdict = timed_verdict  # type: ignore[method-assign,assignment]
    module["repair"] = timed_repair
    trio.lowlevel.add_instrument(steps)
    try:
        async with latency.LoopbackServer.running() as server, httpx.AsyncClient() as client:
            model = OpenAIChatModel(
                f"hold:{latency.HOLD_DELTAS}",
                base_url=server.base_url,
                client=client,
                max_retries=0,
            )
            agent = ta.Agent(name="cancel_path", model=model)
            for i in range(20 + n):
                await one(agent, f"c{i}", i >= 20)
            profile = _Calls()
            profiled = max(10, n // 4)
            for i in range(profiled):
                await one(agent, f"p{i}", False)
    finally:
        trio.lowlevel.remove_instrument(steps)
        _run.Run._verdict = verdict  # type: ignore[method-assign]
        module["repair"] = repair
    assert profile is not None
    by_owner: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for (owner, code), calls in sorted(profile.counts.items()):
        by_owner[owner][code] = round(calls / profiled, 1)

    def total(values: list[int]) -> float:
        return round(sum(values) / len(values), 2)

    return {
        "n": n,
        "kind": kind,
        "phases_us": {k: round(percentile(v, 50), 1) for k, v in phases.items()},
        "seen_p99_us": round(percentile(phases["seen"], 99), 1),
        "task_steps": total(counts["task_steps"]),
        "run_steps": total(counts["run_steps"]),
        "calls": by_owner,
        "calls_total": round(sum(profile.counts.values()) / profiled, 1),
    }


if __name__ == "__main__":
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    which = sys.argv[2] if len(sys.argv) > 2 else "mid_stream"
    print(json.dumps(trio.run(cancel_path, runs, which)))
