"""Tracing a run tree (DESIGN §17): a child's ``invoke_agent`` span is a child of the
parent's ``execute_tool`` span, for ``as_tool`` and ``ctx.open_run`` children alike,
and every span of a cancelled tree is ended."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn
from trio_agents.tracing import OpenTelemetryHooks

pytestmark = pytest.mark.trio


def _tracing() -> tuple[OpenTelemetryHooks, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return OpenTelemetryHooks(provider), exporter


def _parent_of(span: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan:
    assert span.parent is not None
    (parent,) = [
        s for s in spans if s.context is not None and s.context.span_id == span.parent.span_id
    ]
    return parent


async def test_child_invoke_agent_span_under_the_parents_execute_tool() -> None:
    hooks, exporter = _tracing()
    kid = ta.Agent(name="kid", model=ScriptedModel(["kid answer"]))

    @ta.function_tool
    async def delegate(ctx: ta.ToolContext) -> str:
        """Delegate by hand."""
        async with ctx.open_run(ta.Agent(name="manual", model=ScriptedModel(["m"])), "q") as c:
            pass
        assert c.result is not None
        return str(c.result.final_output)

    root = ta.Agent(
        name="root",
        model=ScriptedModel([Turn(tool_calls=[("kid", {"input": "x"}), ("delegate", {})]), "done"]),
        tools=[kid.as_tool(), delegate],
    )
    result = await ta.run(root, "go", hooks=hooks)
    assert result.status == "completed"
    spans = list(exporter.get_finished_spans())
    for child_name, tool_name in (("kid", "kid"), ("manual", "delegate")):
        (child_span,) = [s for s in spans if s.name == f"invoke_agent {child_name}"]
        parent = _parent_of(child_span, spans)
        assert parent.name == f"execute_tool {tool_name}"
        assert _parent_of(parent, spans).name == "invoke_agent root"


async def test_every_span_of_a_cancelled_tree_ends(autojump_clock: Any) -> None:
    hooks, exporter = _tracing()

    @ta.function_tool
    async def sleep_hour() -> str:
        """Sleep."""
        await trio.sleep(3600)
        return "woke"

    leaf = ta.Agent(
        name="leaf",
        model=ScriptedModel([], default=Turn(tool_calls=[("sleep_hour", {})])),
        tools=[sleep_hour],
    )
    root = ta.Agent(
        name="root",
        model=ScriptedModel(
            [Turn(tool_calls=[("leaf", {"input": "a"}), ("leaf", {"input": "b"})])]
        ),
        tools=[leaf.as_tool()],
    )
    async with ta.open_run(root, "go", hooks=hooks) as run:
        await trio.sleep(5)
        run.cancel("stop")
    spans = list(exporter.get_finished_spans())
    names = sorted(s.name for s in spans)
    assert names.count("invoke_agent leaf") == 2
    assert names.count("execute_tool sleep_hour") == 2
    assert repr(hooks) == "<OpenTelemetryHooks open_runs=0>"  # nothing left open
    for span in spans:
        assert span.end_time is not None
