"""T1: the cost of tracing — B1- and B2-shaped runs with and without ``OpenTelemetryHooks``.

The traced runs use the OpenTelemetry SDK with a ``SimpleSpanProcessor`` into an
``InMemorySpanExporter`` (cleared between runs), so the figure is the hooks plus the
SDK's span bookkeeping, without an exporter's I/O. Untraced and traced repeats
alternate, so a machine that slows down mid-way slows both.
"""

from __future__ import annotations

import time
from typing import Any

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn

from ._common import Baselines, Figure, median
from .core import add

__all__ = ["bench_t1"]


def _hooks() -> tuple[ta.RunHooks, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from trio_agents.tracing import OpenTelemetryHooks

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OpenTelemetryHooks(tracer_provider=provider), exporter


async def _tool_turns(runs: int, hooks: ta.RunHooks | None, exporter: Any) -> float:
    """Seconds per B2-shaped run: a tool call to ``add``, then the answer."""
    total = 0.0
    for _ in range(runs):
        model = ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])
        agent = ta.Agent(name="t1", model=model, tools=[add])
        start = time.perf_counter()
        result = await ta.run(agent, "1 + 2?", hooks=hooks)
        total += time.perf_counter() - start
        assert result.final_output == "3", result
        if exporter is not None:
            assert len(exporter.get_finished_spans()) == 4  # run, 2 chats, 1 tool
            exporter.clear()
    return total / runs


async def _stream(deltas: int, hooks: ta.RunHooks | None, exporter: Any) -> float:
    """Seconds per delta of a B1-shaped run (one turn streaming ``deltas`` deltas)."""
    model = ScriptedModel([Turn(text=["x"] * deltas)])
    agent = ta.Agent(name="t1", model=model)
    start = time.perf_counter()
    result = await ta.run(agent, "go", hooks=hooks)
    elapsed = time.perf_counter() - start
    assert result.ok, result
    if exporter is not None:
        exporter.clear()
    return elapsed / deltas


async def bench_t1(base: Baselines, *, runs: int, deltas: int, repeats: int) -> list[Figure]:
    hooks, exporter = _hooks()
    plain_turn: list[float] = []
    traced_turn: list[float] = []
    plain_delta: list[float] = []
    traced_delta: list[float] = []
    for _ in range(repeats):
        plain_turn.append(await _tool_turns(runs, None, None))
        traced_turn.append(await _tool_turns(runs, hooks, exporter))
        plain_delta.append(await _stream(deltas, None, None))
        traced_delta.append(await _stream(deltas, hooks, exporter))
    turn, turn_traced = median(plain_turn), median(traced_turn)
    delta, delta_traced = median(plain_delta), median(traced_delta)
    return [
        Figure(
            "T1.tool_turn_traced_per_run",
            turn_traced * 1e3,
            "ms",
            note=f"B2 shape with OpenTelemetryHooks (SDK, in-memory exporter), {runs} runs",
            extra={
                "untraced_ms": round(turn * 1e3, 4),
                "overhead_ms": round((turn_traced - turn) * 1e3, 4),
                "ratio": round(turn_traced / turn, 3),
                **base.ratios(turn_traced - turn),
            },
        ),
        Figure(
            "T1.stream_traced_per_delta",
            delta_traced * 1e6,
            "us",
            note=f"B1 shape (one run, {deltas} deltas, no subscriber) with OpenTelemetryHooks",
            extra={
                "untraced_us": round(delta * 1e6, 4),
                "ratio": round(delta_traced / delta, 3),
            },
        ),
    ]
