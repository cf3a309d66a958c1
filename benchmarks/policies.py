"""P1 and P2, the benchmarks of issue 26 (run policies, DESIGN §18).

- **P1, the streaming guardrail gate.** Its cost per delta: a run on ``ScriptedModel``
  with one no-op ``@output_guardrail(stream=True)``, minus the same run without it, in
  units of one bare checkpoint (target ≤ 0.3) — on the wall clock (``P1.*``) and in
  instructions under callgrind (``PI.*``, the stable figure: see ``instructions.py``).
  And a trip's latency: the guardrail returns tripped -> the loopback server sees the
  model's connection closed, against a plain ``cancel()`` -> closed in the same process
  (target: p99 ≤ 2x the plain cancel's p99).
- **P2, the input guardrail beside the model call.** On a fake clock: a run whose
  guardrail takes 200 ms and whose model takes 300 ms (and 100 ms) lasts
  max(model, guardrail), not the sum (a ``blocking=True`` guardrail shows the sum). On
  the real clock, over loopback HTTP: the guardrail trips while the model streams ->
  the server sees the model's connection closed (target p99 ≤ 1 ms).

``python -m benchmarks.policies`` prints the figures (``--quick``: tiny sizes).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import trio
import trio.testing

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn
from trio_agents.models._openai import OpenAIChatModel

from ._common import Baselines, Figure, percentile

__all__ = [
    "bench_p1",
    "bench_p2",
    "bench_pi",
    "gated_stream",
    "parallel_guardrail_duration",
]

ROOT = Path(__file__).resolve().parent.parent
HOLD_DELTAS = 5
# (small n, large n) deltas for the callgrind children: half of W1's (instructions.py),
# which is plenty (the difference is 1,000 deltas) and halves callgrind's minutes.
PI_SIZES = (100, 1_100)


@ta.output_guardrail(stream=True)
def noop(run: ta.Run, text: str) -> bool:
    """Passes everything (what the gate costs is the gate, not the check)."""
    return False


async def gated_stream(deltas: int, *, gated: bool) -> float:
    """Seconds per streamed delta for one run with one ``events()`` reader (W1), with
    one no-op streaming guardrail if ``gated``."""
    model = ScriptedModel([Turn(text=["x"] * deltas)])
    agent = ta.Agent(name="p1", model=model, output_guardrails=[noop] if gated else [])
    start = time.perf_counter()
    async with ta.open_run(agent, "go") as run:
        async for _ in run.events():
            pass
    assert run.result is not None
    assert run.result.status == "completed", run.result
    return (time.perf_counter() - start) / deltas


# ----------------------------------------------------------------- P1: wall clock


def _hold_model(server_url: str, client: httpx.AsyncClient) -> OpenAIChatModel:
    return OpenAIChatModel(f"hold:{HOLD_DELTAS}", base_url=server_url, client=client, max_retries=0)


async def _one_trip(agent: ta.Agent, marker: str, trips: dict[str, float]) -> None:
    async with ta.open_run(agent, marker) as run:
        pass
    assert run.result is not None
    assert run.result.status == "failed", run.result
    assert marker in trips


async def _one_plain_cancel(agent: ta.Agent, marker: str) -> float:
    """Cancel once ``HOLD_DELTAS`` deltas were seen; the time of the cancel."""
    async with ta.open_run(agent, marker) as run:
        seen = 0
        async for event in run.events():
            if event.type == "response.text.delta":
                seen += 1
                if seen == HOLD_DELTAS:
                    break
        t0 = time.monotonic()
        run.cancel("bench")
    assert run.result is not None
    assert run.result.status == "cancelled", run.result
    return t0


def _p99_figure(
    name: str, values: list[float], note: str, target_ms: float | None, more: dict[str, Any]
) -> Figure:
    p99 = percentile(values, 99)
    return Figure(
        name,
        p99 * 1e3,
        "ms p99",
        target=target_ms,
        note=note,
        extra={
            "n": len(values),
            "p50_ms": round(percentile(values, 50) * 1e3, 4),
            "max_ms": round(max(values) * 1e3, 3) if values else None,
            **more,
        },
    )


async def bench_p1(base: Baselines, *, deltas: int, repeats: int, trips: int) -> list[Figure]:
    """P1 on the wall clock: the gate's cost per delta, and trip -> stream closed."""
    from .latency import LoopbackServer, closes_after

    plain: list[float] = []
    gated: list[float] = []
    for _ in range(repeats):  # interleaved: the machine's load hits both alike
        plain.append(await gated_stream(deltas, gated=False))
        gated.append(await gated_stream(deltas, gated=True))
    cost = min(gated) - min(plain)
    figures = [
        Figure(
            "P1.gate_per_delta",
            cost * 1e6,
            "us",
            target=0.3 * base.checkpoint * 1e6,
            note="one no-op streaming output guardrail: run per delta minus the same run"
            " without it (ScriptedModel, one events() reader; best of the repeats)",
            extra={**base.ratios(cost), "deltas": deltas},
        )
    ]

    trip_marks: dict[str, float] = {}
    current = [""]  # the marker of the run going on (one at a time)

    @ta.output_guardrail(stream=True)
    def cut(run: ta.Run, text: str) -> bool:
        if len(text) < HOLD_DELTAS:  # every "x" the server sends, then it holds
            return False
        trip_marks[current[0]] = time.monotonic()
        return True

    cancel_marks: dict[str, float] = {}
    async with LoopbackServer.running() as server, httpx.AsyncClient() as client:
        model = _hold_model(server.base_url, client)
        tripping = ta.Agent(name="p1", model=model, output_guardrails=[cut])
        cancelled = ta.Agent(name="p1", model=model)
        for i in range(1 + trips):  # the first of each: a warm-up
            current[0] = f"trip-{i}"
            await _one_trip(tripping, current[0], trip_marks)
            cancel_marks[f"cancel-{i}"] = await _one_plain_cancel(cancelled, f"cancel-{i}")
        trip_marks.pop("trip-0")
        cancel_marks.pop("cancel-0")
        trip_closes = await closes_after(server, trip_marks)
        cancel_closes = await closes_after(server, cancel_marks)
    cancel_p99 = percentile(cancel_closes, 99)
    figures.append(
        _p99_figure(
            "P1.cancel_to_closed",
            cancel_closes,
            "plain cancel() mid-stream -> the loopback server sees the connection closed",
            None,
            base.cancel_ratio(cancel_p99),
        )
    )
    trip_p99 = percentile(trip_closes, 99)
    figures.append(
        _p99_figure(
            "P1.trip_to_closed",
            trip_closes,
            "streaming guardrail returns tripped -> the server sees the connection closed",
            2 * cancel_p99 * 1e3,
            {"x_plain_cancel_p99": round(trip_p99 / cancel_p99, 3)},
        )
    )
    return figures


# ------------------------------------------------------------ PI: instructions


# The children's workloads: the model alone, the run without and with the no-op
# guardrail, that run with its stream loop stripped (_stripped_stream_loop), and the floor.
PI_MODES = ("model", "plain", "gate", "gate_stripped", "gate_floor")


@contextlib.contextmanager
def _stripped_stream_loop() -> Iterator[None]:
    """Ablation for ``PI.w1_gated_stripped_per_delta`` (a child process only): the run's
    stream loop (``_turns._stream``) reduced to the gated floor writer's work per delta
    (``core._bare_gated_writer``): the guardrail called with the text so far, then the
    log's append. No surrogate joiner, no gate object, no partial text, no meter, no
    tool calls: what is left over the floor is what a run costs by where it runs (its
    task's coroutine frames, its log and cursor, its heap), not what it checks."""
    from trio_agents import _turns
    from trio_agents.models import TextDelta

    check = noop.fn

    async def stripped(state: Any, model: Any, request: Any, turn: int, *_: Any) -> None:
        append_text = state.log.append_text
        handle = state.handle
        checked = ""
        async with model.stream(request) as stream:
            async for event in stream:
                if type(event) is TextDelta:
                    whole = checked + event.text
                    if check(handle, whole) is False:
                        checked = whole
                        append_text(turn, event.text)

    original = _turns._stream
    _turns._stream = stripped  # type: ignore[assignment]  # an ablation, in a child only
    try:
        yield
    finally:
        _turns._stream = original


async def _workload(mode: str, n: int) -> None:
    from . import core

    drain: Callable[[int], Awaitable[float]]
    if mode == "model":
        drain = core.model_stream_cost
    elif mode == "gate_floor":
        drain = functools.partial(core.floor_stream_cost, check=noop.fn)
    else:
        drain = functools.partial(gated_stream, gated=mode != "plain")
    with _stripped_stream_loop() if mode == "gate_stripped" else contextlib.nullcontext():
        await drain(50)  # warm-up, the same in both children
        await drain(n)


def _total(mode: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out}",
                sys.executable,
                "-m",
                "benchmarks.policies",
                "--child",
                mode,
                str(n),
            ],
            cwd=ROOT,
            capture_output=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},  # as instructions.py
        )
        for line in out.read_text().splitlines():
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no instruction total in callgrind's output for {mode}")


def bench_pi(*, quick: bool = False, sizes: Sequence[int] = PI_SIZES) -> list[Figure]:
    """P1's cost per delta in instructions (callgrind), in units of one checkpoint."""
    from .instructions import callgrind_available, count

    if not callgrind_available():
        return [Figure("PI.unavailable", float("nan"), "", note="valgrind is not installed")]
    small, large = (sizes[0] // 10 or 1, sizes[1] // 10) if quick else tuple(sizes)
    with ThreadPoolExecutor(max_workers=2) as pool:
        totals = {
            (mode, n): pool.submit(_total, mode, n) for mode in PI_MODES for n in (small, large)
        }
        checkpoint = pool.submit(count, "checkpoint", (100, 1_100) if quick else None)
        per = {
            mode: (totals[mode, large].result() - totals[mode, small].result()) / (large - small)
            for mode in PI_MODES
        }
        ckpt = checkpoint.result()

    def figure(name: str, value: float, note: str, target: float | None = None) -> Figure:
        return Figure(
            f"PI.{name}",
            value,
            "instr",
            target=None if target is None else target * ckpt,
            note=note,
            extra={"x_checkpoint": round(value / ckpt, 3)},
        )

    cost = per["gate"] - per["plain"]
    gate = figure(
        "gate_per_delta",
        cost,
        "one no-op streaming output guardrail: run per delta minus the same run"
        " without it (ScriptedModel, one events() reader)",
        0.3,
    )
    gate.extra.update(
        plain_per_delta=round(per["plain"]),
        gated_per_delta=round(per["gate"]),
        checkpoint=round(ckpt),
    )
    model = per["model"]
    return [
        gate,
        figure(
            "w1_gated_per_delta",
            per["gate"] - model,
            "W1 with one no-op streaming guardrail (a plain function): run with one"
            " events() reader, minus the model's own cost",
            1.0,
        ),
        figure(
            "w1_gated_floor_per_delta",
            per["gate_floor"] - model,
            "its floor, no run: the bare writer calling the guardrail with the text so far"
            " per delta beside the bare per-event reader (core.floor_stream_cost with check)",
        ),
        figure(
            "w1_gated_stripped_per_delta",
            per["gate_stripped"] - model,
            "the run with its stream loop stripped to the floor writer's work (the"
            " guardrail call, then the log's append): what a run costs by where it runs",
        ),
    ]


# ------------------------------------------------------------------------ P2


async def parallel_guardrail_duration(
    model_s: float, guardrail_s: float, *, blocking: bool = False
) -> float:
    """Seconds (Trio's clock) one run lasts whose model streams for ``model_s`` and
    whose input guardrail takes ``guardrail_s`` (and passes)."""

    @ta.input_guardrail(blocking=blocking)
    async def slow(run: ta.Run, items: Any) -> bool:
        await trio.sleep(guardrail_s)
        return False

    model = ScriptedModel([Turn(text=["answer"], delay=model_s)])
    agent = ta.Agent(name="p2", model=model, input_guardrails=[slow])
    start = trio.current_time()
    result = await ta.run(agent, "go")
    assert result.status == "completed", result
    return trio.current_time() - start


def _fake_clock_durations() -> dict[str, float]:
    """P2's durations on a fake clock (its own ``trio.run``, virtual time)."""
    cases = {
        "model_300ms_guardrail_200ms": (0.3, 0.2, False),
        "model_100ms_guardrail_200ms": (0.1, 0.2, False),
        "blocking_model_300ms_guardrail_200ms": (0.3, 0.2, True),
    }

    async def main() -> dict[str, float]:
        return {
            name: await parallel_guardrail_duration(model_s, guard_s, blocking=blocking)
            for name, (model_s, guard_s, blocking) in cases.items()
        }

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


async def bench_p2(base: Baselines, *, trips: int) -> list[Figure]:
    """P2: the run's duration on a fake clock; trip -> model stream closed on the real
    clock over loopback HTTP."""
    from .latency import LoopbackServer, bare_stream_cancel, closes_after

    durations = await trio.to_thread.run_sync(_fake_clock_durations)
    figures = []
    for name, expected, model_ms in (
        ("model_300ms_guardrail_200ms", 300, 300),
        ("model_100ms_guardrail_200ms", 200, 100),
    ):
        value = durations[name] * 1e3
        figures.append(
            Figure(
                f"P2.duration_{name}",
                value,
                "ms (fake clock)",
                target=float(expected),
                note=f"a run whose model takes {model_ms} ms and whose input guardrail takes"
                f" 200 ms lasts max(model, guardrail) = {expected} ms, not the sum",
                extra={"model_time_added_ms": round(value - expected, 3)},
            )
        )
    figures.append(
        Figure(
            "P2.duration_blocking_model_300ms_guardrail_200ms",
            durations["blocking_model_300ms_guardrail_200ms"] * 1e3,
            "ms (fake clock)",
            note="the same with blocking=True (the guardrail before the model call): the sum",
        )
    )

    marks: dict[str, float] = {}
    streaming: dict[str, trio.Event] = {}
    current = [""]  # the marker of the run going on (one at a time)

    @ta.input_guardrail
    async def refuse(run: ta.Run, items: Any) -> bool:
        marker = current[0]
        await streaming[marker].wait()  # the model's response is streaming
        marks[marker] = time.monotonic()
        return True

    async with LoopbackServer.running() as server, httpx.AsyncClient() as client:
        agent = ta.Agent(
            name="p2", model=_hold_model(server.base_url, client), input_guardrails=[refuse]
        )
        bare: dict[str, float] = {}
        for i in range(1 + trips):  # the first: a warm-up
            marker = current[0] = f"refuse-{i}"
            streaming[marker] = trio.Event()
            async with ta.open_run(agent, marker) as run:
                async for event in run.events():
                    if event.type == "response.text.delta":
                        streaming[marker].set()
            assert run.result is not None
            assert run.result.status == "failed", run.result
            # The floor, interleaved: the same response cancelled at its first delta by
            # a raw httpx reader, nothing of ours (the trip comes at the first delta).
            bare[f"bare-{i}"] = await bare_stream_cancel(server, client, f"bare-{i}", after=1)
        marks.pop("refuse-0")
        bare.pop("bare-0")
        closes = await closes_after(server, marks)
        floor = await closes_after(server, bare)
    figures.append(
        _p99_figure(
            "P2.trip_to_closed",
            closes,
            "input guardrail returns tripped while the model streams -> the loopback"
            " server sees the model's connection closed",
            1.0,
            {
                **base.cancel_ratio(percentile(closes, 99)),
                "x_bare_httpx_p99": round(percentile(closes, 99) / percentile(floor, 99), 3),
            },
        )
    )
    figures.append(
        _p99_figure(
            "P2.bare_httpx_cancel_to_closed",
            floor,
            "P2's floor, interleaved with its trips: a raw httpx stream of the same response"
            " cancelled at its first delta -> the server sees the connection closed",
            None,
            base.cancel_ratio(percentile(floor, 99)),
        )
    )
    return figures


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        trio.run(_workload, sys.argv[2], int(sys.argv[3]))
        return
    quick = "--quick" in sys.argv

    async def collect() -> list[Figure]:
        from ._common import measure_baselines

        base = await measure_baselines(n=500 if quick else 20_000, repeats=1 if quick else 5)
        figures = await bench_p1(
            base, deltas=50 if quick else 2000, repeats=1 if quick else 5, trips=3 if quick else 500
        )
        figures += await bench_p2(base, trips=3 if quick else 500)
        return figures

    figures = trio.run(collect)
    if "--instructions" in sys.argv:
        figures += bench_pi(quick=quick)
    for figure in figures:
        print(json.dumps(figure.to_json()))


if __name__ == "__main__":
    main()
