"""OpenTelemetryHooks: spans per run, model call and tool call, balanced on every path.

Spans go to the OpenTelemetry SDK's ``InMemorySpanExporter``; a span processor also
counts starts, so a span left open (started, never ended) is seen, not just missed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import Span as SDKSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import trio_agents as ta
from tests.support.core_runs import GateTool
from tests.support.core_schedules import ScheduleCase, schedule_cases
from tests.support.helpers import lifecycle_settings
from trio_agents.testing import (
    ScriptedModel,
    Turn,
)
from trio_agents.tracing import OpenTelemetryHooks


class OpenSpans(SpanProcessor):
    """Remembers every started span until it ends."""

    def __init__(self) -> None:
        self.open: dict[int, str] = {}
        self.lock = threading.Lock()

    def on_start(self, span: SDKSpan, parent_context: Context | None = None) -> None:
        with self.lock:
            self.open[span.context.span_id] = span.name

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        with self.lock:
            self.open.pop(span.context.span_id)


class Traces:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.opened = OpenSpans()
        self.provider = TracerProvider()
        self.provider.add_span_processor(self.opened)
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.hooks = OpenTelemetryHooks(tracer_provider=self.provider)
        self.tracer = self.provider.get_tracer("tests")

    def spans(self) -> tuple[ReadableSpan, ...]:
        return self.exporter.get_finished_spans()

    def one(self, name: str) -> ReadableSpan:
        found = [s for s in self.spans() if s.name == name]
        assert len(found) == 1, [s.name for s in self.spans()]
        return found[0]

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans() if s.name.startswith(prefix)]

    def check_tree(self) -> ReadableSpan:
        """No span open; exactly one run span; every other span of ours is its child."""
        assert self.opened.open == {}, self.opened.open
        runs = self.named("invoke_agent ")
        assert len(runs) == 1, [s.name for s in self.spans()]
        run = runs[0]
        assert run.context is not None
        for span in self.named("chat") + self.named("execute_tool "):
            assert span.parent is not None, span.name
            assert span.parent.span_id == run.context.span_id, span.name
            assert span.context is not None
            assert span.context.trace_id == run.context.trace_id
        return run


@pytest.fixture
def traces() -> Iterator[Traces]:
    t = Traces()
    yield t
    t.provider.shutdown()


def make_agent(model: ta.Model, tools: Sequence[ta.Tool] = (), **kw: Any) -> ta.Agent:
    return ta.Agent(name="tracer", instructions="", model=model, tools=list(tools), **kw)


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def attrs_of(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


# ------------------------------------------------------------------------ completion


async def test_completed_run(traces: Traces, autojump_clock: trio.testing.MockClock) -> None:
    from trio_agents.models import Usage

    model = ScriptedModel([Turn("Hello there.", usage=Usage(12, 3))])
    with traces.tracer.start_as_current_span("caller") as caller:
        result = await ta.run(make_agent(model), "hi", hooks=traces.hooks)
    assert result.status == "completed"
    run = traces.check_tree()
    assert run.name == "invoke_agent tracer"
    assert run.parent is not None
    assert run.parent.span_id == caller.get_span_context().span_id  # the caller's span
    attributes = attrs_of(run)
    assert attributes["gen_ai.operation.name"] == "invoke_agent"
    assert attributes["gen_ai.agent.name"] == "tracer"
    assert attributes["gen_ai.usage.input_tokens"] == 12
    assert attributes["gen_ai.usage.output_tokens"] == 3
    assert "trio_agents.usage.cost" not in attributes  # not priced
    assert "gen_ai.usage.cache_read.input_tokens" not in attributes
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes["trio_agents.run.id"] == result.run_id
    assert "error.type" not in attributes
    assert run.status.status_code is StatusCode.UNSET
    chat = traces.one("chat")
    assert attrs_of(chat)["gen_ai.operation.name"] == "chat"
    assert attrs_of(chat)["trio_agents.model.outcome"] == "completed"
    assert chat.status.status_code is StatusCode.UNSET
    assert repr(traces.hooks) == "<OpenTelemetryHooks open_runs=0>"


async def test_the_run_span_carries_the_cost_and_cache_figures(
    traces: Traces, autojump_clock: trio.testing.MockClock
) -> None:
    from decimal import Decimal

    from trio_agents.models import Usage

    usage = Usage(12, 3, cache_read_tokens=10, cache_write_tokens=2, cost=Decimal("0.0000123"))
    model = ScriptedModel([Turn("Hello there.", usage=usage)])
    await ta.run(make_agent(model), "hi", hooks=traces.hooks)
    attributes = attrs_of(traces.check_tree())
    assert attributes["trio_agents.usage.cost"] == "0.0000123"
    assert attributes["gen_ai.usage.cache_read.input_tokens"] == 10
    assert attributes["gen_ai.usage.cache_creation.input_tokens"] == 2


class _Named:
    """A model with a ``model`` name, as the HTTP providers have."""

    def __init__(self, name: str, inner: ScriptedModel) -> None:
        self.model = name
        self._inner = inner

    def stream(self, request: ta.ModelRequest) -> Any:
        return self._inner.stream(request)


async def test_each_chat_span_carries_its_own_calls_usage_cost_and_answering_model(
    traces: Traces, autojump_clock: trio.testing.MockClock
) -> None:
    """Behind a FallbackModel, turn 1 is answered by the backup (the primary is busy),
    turn 2 by the primary: each chat span has that call's own usage, exact cost and
    the model that answered; the run span has the exact sum and names no model."""
    from decimal import Decimal

    from trio_agents.models import FallbackModel, Usage

    first = Usage(40, 8, cache_read_tokens=30, cost=Decimal("0.0000123"))
    second = Usage(60, 5, cache_write_tokens=12, cost=Decimal("0.0000071"))
    busy = ta.ModelError("overloaded", status_code=529, retryable=True)
    primary = _Named("primary-model", ScriptedModel([Turn(fail=busy), Turn("3", usage=second)]))
    backup = _Named(
        "backup-model",
        ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 2})], usage=first)]),
    )
    agent = make_agent(FallbackModel(primary, backup), [add])
    result = await ta.run(agent, "1 + 2?", hooks=traces.hooks)
    assert result.status == "completed", result.reason
    run = attrs_of(traces.check_tree())
    chats = sorted(traces.named("chat"), key=lambda span: attrs_of(span)["trio_agents.turn"])
    one, two = (attrs_of(span) for span in chats)
    assert {k: v for k, v in one.items() if "usage" in k or "response.model" in k} == {
        "gen_ai.usage.input_tokens": 40,
        "gen_ai.usage.output_tokens": 8,
        "gen_ai.usage.cache_read.input_tokens": 30,
        "trio_agents.usage.cost": "0.0000123",
        "gen_ai.response.model": "backup-model",
    }
    assert {k: v for k, v in two.items() if "usage" in k or "response.model" in k} == {
        "gen_ai.usage.input_tokens": 60,
        "gen_ai.usage.output_tokens": 5,
        "gen_ai.usage.cache_creation.input_tokens": 12,
        "trio_agents.usage.cost": "0.0000071",
        "gen_ai.response.model": "primary-model",
    }
    assert run["trio_agents.usage.cost"] == "0.0000194"
    assert run["gen_ai.usage.input_tokens"] == 100
    assert "gen_ai.response.model" not in run


async def test_a_chat_span_cut_before_its_usage_has_no_usage_attributes(
    traces: Traces, autojump_clock: trio.testing.MockClock
) -> None:
    """Turn 1 reported usage; turn 2 is cancelled mid-stream before reporting any: its
    span carries none (not turn 1's, not zeros)."""
    from decimal import Decimal

    from trio_agents.models import Usage

    priced = Usage(5, 1, cost=Decimal("0.001"))
    model = ScriptedModel(
        [Turn(tool_calls=[("add", {"a": 1, "b": 2})], usage=priced), Turn(["a", "b"], delay=1)]
    )
    async with ta.open_run(make_agent(model, [add]), "go", hooks=traces.hooks) as run:
        await trio.sleep(1.5)  # turn 2 streamed "a" (at 1 s), not yet its usage
        assert run.turn == 2
        assert run.turn_usage is None
        assert run.usage == priced  # the run's own so far: turn 1's
        run.cancel("enough")
    traces.check_tree()
    chats = sorted(traces.named("chat"), key=lambda span: attrs_of(span)["trio_agents.turn"])
    assert attrs_of(chats[0])["trio_agents.usage.cost"] == "0.001"
    cut = attrs_of(chats[1])
    assert cut["trio_agents.model.outcome"] == "cancelled"
    assert not [k for k in cut if "usage" in k]


async def test_no_usage_means_no_usage_attributes(
    traces: Traces, autojump_clock: trio.testing.MockClock
) -> None:
    from trio_agents.models import Finish, TextDelta

    class NoUsage:
        def stream(self, request: ta.ModelRequest) -> Any:
            from contextlib import asynccontextmanager

            @asynccontextmanager
            async def opened() -> Any:
                async def events() -> Any:
                    yield TextDelta("hi")
                    yield Finish("stop")

                yield events()

            return opened()

    result = await ta.run(make_agent(NoUsage()), "hi", hooks=traces.hooks)
    assert result.usage is None
    attributes = attrs_of(traces.check_tree())
    assert "gen_ai.usage.input_tokens" not in attributes
    assert "gen_ai.usage.output_tokens" not in attributes


async def test_request_model_and_provider_from_a_real_provider(traces: Traces) -> None:
    import httpx

    from trio_agents.models import OpenAIChatModel

    body = (
        'data: {"choices":[{"index":0,"delta":{"content":"hey"}}]}\n\n'
        'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}\n\n'
        "data: [DONE]\n\n"
    )

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        model = OpenAIChatModel("gpt-test", base_url="http://model.invalid/v1", client=client)
        agent = make_agent(model, model_settings={"temperature": 0.25})
        result = await ta.run(agent, "hi", hooks=traces.hooks)
    assert result.status == "completed", result.reason
    run = traces.check_tree()
    assert attrs_of(run)["gen_ai.request.model"] == "gpt-test"
    assert attrs_of(run)["gen_ai.provider.name"] == "openai"
    chat = traces.one("chat gpt-test")
    assert attrs_of(chat)["gen_ai.request.model"] == "gpt-test"
    assert attrs_of(chat)["gen_ai.request.temperature"] == 0.25
    assert chat.kind is trace.SpanKind.CLIENT


async def test_session_id_is_the_conversation_id(
    traces: Traces, autojump_clock: trio.testing.MockClock
) -> None:
    from trio_agents.sessions import MemorySession

    session = MemorySession(session_id="conv-7")
    await ta.run(make_agent(ScriptedModel(["ok"])), "hi", session=session, hooks=traces.hooks)
    assert attrs_of(traces.check_tree())["gen_ai.conversation.id"] == "conv-7"


# ----------------------------------------------------------------------------- tools


async def test_tool_spans_and_the_spans_tools_open(traces: Traces) -> None:
    tracer = traces.tracer

    @ta.function_tool
    async def fetch(url: str) -> str:
        """Fetch a URL."""
        with tracer.start_as_current_span("inside async tool"):
            await trio.lowlevel.checkpoint()
        return "page"

    @ta.function_tool
    def crunch(n: int) -> int:
        """Crunch a number in a worker thread."""
        with tracer.start_as_current_span("inside thread tool"):
            return n * 2

    model = ScriptedModel(
        [Turn(tool_calls=[("fetch", {"url": "x"}), ("crunch", {"n": 2}), ("add", {"a": 1})]), "ok"]
    )
    result = await ta.run(make_agent(model, [fetch, crunch, add]), "go", hooks=traces.hooks)
    assert result.status == "completed"
    run = traces.check_tree()
    assert len(traces.named("chat")) == 2
    for name, call_id in [("fetch", "call_1_0"), ("crunch", "call_1_1"), ("add", "call_1_2")]:
        span = traces.one(f"execute_tool {name}")
        attributes = attrs_of(span)
        assert attributes["gen_ai.operation.name"] == "execute_tool"
        assert attributes["gen_ai.tool.name"] == name
        assert attributes["gen_ai.tool.call.id"] == call_id
        assert attributes["gen_ai.tool.type"] == "function"
    # add was called without b: an error result the model reads, and an error span.
    bad = traces.one("execute_tool add")
    assert attrs_of(bad)["error.type"] == "tool_error"
    assert bad.status.status_code is StatusCode.ERROR
    assert "invalid arguments" in (bad.status.description or "")
    assert attrs_of(traces.one("execute_tool fetch"))["gen_ai.tool.description"] == "Fetch a URL."
    # Spans a tool opens are children of its execute_tool span, in a thread too.
    for inner, outer in [("inside async tool", "fetch"), ("inside thread tool", "crunch")]:
        child, parent = traces.one(inner), traces.one(f"execute_tool {outer}")
        assert child.parent is not None
        assert parent.context is not None
        assert child.parent.span_id == parent.context.span_id
    assert run.status.status_code is StatusCode.UNSET


async def test_tool_timeout(traces: Traces, autojump_clock: trio.testing.MockClock) -> None:
    @ta.function_tool(timeout=1)
    async def slow() -> str:
        """Too slow."""
        await trio.sleep(10)
        return "late"

    model = ScriptedModel([Turn(tool_calls=[("slow", {})]), "ok"])
    result = await ta.run(make_agent(model, [slow]), "go", hooks=traces.hooks)
    assert result.status == "completed"
    traces.check_tree()
    span = traces.one("execute_tool slow")
    assert attrs_of(span)["error.type"] == "tool_error"
    assert span.status.description == "timed out after 1 s"


# ---------------------------------------------------------------------- cancellation


async def test_cancelled_mid_tool(traces: Traces) -> None:
    block = GateTool("block")  # never released
    model = ScriptedModel([Turn(tool_calls=[("block", {})])])
    async with ta.open_run(make_agent(model, [block.tool]), "go", hooks=traces.hooks) as run:
        await block.entered.wait()
        run.cancel("user pressed stop")
    assert run.result is not None
    assert run.result.status == "cancelled"
    root = traces.check_tree()
    assert attrs_of(root)["error.type"] == "cancelled"
    assert attrs_of(root)["trio_agents.run.status"] == "cancelled"
    assert root.status.status_code is StatusCode.ERROR
    assert root.status.description == "user pressed stop"
    tool = traces.one("execute_tool block")
    assert attrs_of(tool)["error.type"] == "cancelled"
    assert attrs_of(tool)["trio_agents.tool.status"] == "cancelled"
    assert tool.status.description == "cancelled: user pressed stop"


async def test_cancelled_mid_stream_keeps_the_reason_and_end_time(
    traces: Traces, autojump_clock: trio.testing.MockClock
) -> None:
    model = ScriptedModel([Turn(["a", "b", "c"], delay=1)])
    async with ta.open_run(make_agent(model), "go", hooks=traces.hooks) as run:
        await trio.sleep(1.5)
        run.cancel("enough")
    traces.check_tree()
    chat = traces.one("chat")
    assert attrs_of(chat)["error.type"] == "cancelled"
    assert attrs_of(chat)["trio_agents.model.outcome"] == "cancelled"
    assert chat.status.description == "enough"
    root = traces.one("invoke_agent tracer")
    assert chat.end_time is not None
    assert root.end_time is not None
    assert chat.end_time <= root.end_time


async def test_outer_cancel(traces: Traces) -> None:
    entered = trio.Event()

    @ta.function_tool
    def stubborn(ctx: ta.ToolContext) -> str:
        """A thread tool that waits to be told."""
        trio.from_thread.run_sync(entered.set)
        ctx.cancelled.wait(30)
        return "done"

    model = ScriptedModel([Turn(tool_calls=[("stubborn", {})])])
    with trio.CancelScope() as outer:
        async with ta.open_run(make_agent(model, [stubborn]), "go", hooks=traces.hooks) as run:
            await entered.wait()
            outer.cancel()
    assert outer.cancelled_caught
    assert run.result is not None
    assert run.result.reason == "parent cancelled"
    root = traces.check_tree()
    assert root.status.description == "parent cancelled"
    assert attrs_of(traces.one("execute_tool stubborn"))["error.type"] == "cancelled"


async def test_cancel_before_start_opens_no_span(traces: Traces) -> None:
    async with ta.open_run(make_agent(ScriptedModel(["x"])), "go", hooks=traces.hooks) as run:
        run.cancel("never mind")
    assert run.result is not None
    assert run.result.status == "cancelled"
    assert traces.opened.open == {}
    assert traces.named("chat") == []


# -------------------------------------------------------------------------- failures


async def test_failed_model(traces: Traces, autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(["partial "], fail="upstream exploded", fail_after=1)])
    result = await ta.run(make_agent(model), "go", hooks=traces.hooks)
    assert result.status == "failed"
    root = traces.check_tree()
    assert attrs_of(root)["error.type"] == "trio_agents._exceptions.ModelError"
    assert "upstream exploded" in (root.status.description or "")
    chat = traces.one("chat")
    assert attrs_of(chat)["trio_agents.model.outcome"] == "failed"
    assert attrs_of(chat)["error.type"] == "trio_agents._exceptions.ModelError"
    assert chat.status.status_code is StatusCode.ERROR


async def test_max_turns(traces: Traces, autojump_clock: trio.testing.MockClock) -> None:
    loop = Turn(tool_calls=[("add", {"a": 1, "b": 1})])
    model = ScriptedModel([], default=loop)
    result = await ta.run(make_agent(model, [add], max_turns=2), "go", hooks=traces.hooks)
    assert result.reason == "max_turns"
    root = traces.check_tree()
    assert attrs_of(root)["error.type"] == "max_turns"
    assert len(traces.named("chat")) == 2
    assert len(traces.named("execute_tool add")) == 2


class FaultyTracing(ta.RunHooks):
    """OpenTelemetryHooks whose tool-start hook fails after opening its span."""

    def __init__(self, inner: OpenTelemetryHooks) -> None:
        self.inner = inner

    async def on_run_start(self, run: ta.Run) -> None:
        await self.inner.on_run_start(run)

    async def on_run_end(self, run: ta.Run, result: ta.RunResult) -> None:
        await self.inner.on_run_end(run, result)

    async def on_model_start(self, run: ta.Run, turn: int, request: ta.ModelRequest) -> None:
        await self.inner.on_model_start(run, turn, request)

    async def on_model_end(self, run: ta.Run, turn: int, outcome: str) -> None:
        await self.inner.on_model_end(run, turn, outcome)

    async def on_tool_start(self, run: ta.Run, call: ta.ToolCall) -> None:
        await self.inner.on_tool_start(run, call)
        raise RuntimeError("hook bug")

    async def on_tool_end(self, run: ta.Run, call: ta.ToolCall, result: ta.ToolResult) -> None:
        await self.inner.on_tool_end(run, call, result)


async def test_hook_fault(traces: Traces, autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])
    hooks = FaultyTracing(traces.hooks)
    result = await ta.run(make_agent(model, [add]), "go", hooks=hooks)
    assert result.status == "failed"
    root = traces.check_tree()
    assert "hook bug" in (root.status.description or "")
    assert attrs_of(root)["error.type"] == "builtins.RuntimeError"
    assert attrs_of(traces.one("execute_tool add"))["error.type"] == "cancelled"


async def test_concurrent_runs_share_one_instance(
    traces: Traces, autojump_clock: trio.testing.MockClock
) -> None:
    model = ScriptedModel([], default=Turn("done", delay=1))
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(lambda: ta.run(make_agent(model), "go", hooks=traces.hooks))
    assert traces.opened.open == {}
    runs = traces.named("invoke_agent ")
    chats = traces.named("chat")
    assert len(runs) == len(chats) == 5
    parents = sorted(c.parent.span_id for c in chats if c.parent is not None)
    assert parents == sorted(r.context.span_id for r in runs if r.context is not None)


# ---------------------------------------------------------------- harness schedules


@lifecycle_settings(weight=0.5)
@given(case=schedule_cases())
def test_spans_balanced_and_parented_under_any_schedule(case: ScheduleCase) -> None:
    traces = Traces()
    try:
        observation = case.run(traces.hooks)
        result = observation.result
        if traces.named("invoke_agent "):
            root = traces.check_tree()
            assert attrs_of(root)["trio_agents.run.status"] == result.status.value
            assert ("error.type" in attrs_of(root)) == (result.status != "completed")
        else:  # stopped before it began: no span at all
            assert traces.spans() == ()
            assert traces.opened.open == {}
        assert len(traces.named("chat")) <= result.turns
        tool_spans = traces.named("execute_tool ")
        started = [e for e in observation.events if isinstance(e, ta.ToolStarted)]
        assert len(tool_spans) == len(started)
    finally:
        traces.provider.shutdown()


async def test_spans_the_model_opens_are_children_of_its_chat_span(
    traces: Traces, autojump_clock: trio.testing.MockClock
) -> None:
    from contextlib import asynccontextmanager

    from trio_agents.models import Finish, TextDelta

    tracer = traces.tracer

    class InstrumentedModel:
        """Opens a span in its stream, as an HTTP client instrumentation would."""

        def stream(self, request: ta.ModelRequest) -> Any:
            @asynccontextmanager
            async def opened() -> Any:
                with tracer.start_as_current_span("POST /chat/completions"):

                    async def events() -> Any:
                        yield TextDelta("hi")
                        yield Finish("stop")

                    yield events()

            return opened()

    await ta.run(make_agent(InstrumentedModel()), "go", hooks=traces.hooks)
    traces.check_tree()
    http, chat = traces.one("POST /chat/completions"), traces.one("chat")
    assert http.parent is not None
    assert chat.context is not None
    assert http.parent.span_id == chat.context.span_id


# ------------------------------------------------------- the caller's context is kept


def _current_span_id() -> int:
    return trace.get_current_span().get_span_context().span_id


async def _run_direct(agent: ta.Agent, hooks: ta.RunHooks) -> ta.RunResult:
    return await ta.run(agent, "go", hooks=hooks)


async def _run_in_block(agent: ta.Agent, hooks: ta.RunHooks) -> ta.RunResult:
    async with ta.open_run(agent, "go", hooks=hooks) as run:
        pass
    assert run.result is not None
    return run.result


async def _serve_awaited(agent: ta.Agent, hooks: ta.RunHooks) -> ta.RunResult:
    return await ta.serve_run(agent, "go", hooks=hooks)


async def _serve_started(agent: ta.Agent, hooks: ta.RunHooks) -> ta.RunResult:
    from functools import partial

    async with trio.open_nursery() as nursery:
        run: ta.Run = await nursery.start(partial(ta.serve_run, agent, "go", hooks=hooks))
    assert run.result is not None
    return run.result


ENTRIES = {
    "run": _run_direct,
    "open_run": _run_in_block,
    "serve_run": _serve_awaited,
    "nursery.start(serve_run)": _serve_started,
}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("with_caller_span", [False, True])
async def test_the_callers_current_span_is_unchanged_after_a_run(
    traces: Traces, autojump_clock: trio.testing.MockClock, entry: str, with_caller_span: bool
) -> None:
    """§13: a run's span is never left as the caller's current span, so the next run in
    the same task is not parented to the finished one."""
    from opentelemetry import context as otel_context

    def agent() -> ta.Agent:
        # A tool call alone in its turn runs in the model-stream task: for run() and an
        # awaited serve_run, that is the caller's own task.
        model = ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])
        return make_agent(model, [add])

    token = None
    if with_caller_span:
        # attach, not `with`: a `with` block's own detach would hide a leak.
        caller = traces.tracer.start_span("caller")
        token = otel_context.attach(trace.set_span_in_context(caller))
    before = _current_span_id()
    first = await ENTRIES[entry](agent(), traces.hooks)
    assert _current_span_id() == before
    second = await ENTRIES[entry](agent(), traces.hooks)
    assert _current_span_id() == before
    assert first.status == second.status == "completed"
    roots = [s for s in traces.named("invoke_agent ") if attrs_of(s)]
    hooked = [s for s in roots if s.name == "invoke_agent tracer"]
    assert len(hooked) >= 2
    for root in hooked:
        parent = root.parent.span_id if root.parent is not None else 0
        assert parent == before, "a run's span is parented to another run's"
    if token is not None:
        otel_context.detach(token)


class _Wrapping(ta.RunHooks):
    """Delegates to OpenTelemetryHooks; ``fault`` names the hook that misbehaves after
    delegating: ``"raise"`` raises, ``"block"`` blocks until cancelled."""

    def __init__(self, inner: OpenTelemetryHooks, hook: str, fault: str) -> None:
        self.inner, self.hook, self.fault = inner, hook, fault

    async def _after(self, name: str) -> None:
        if name != self.hook:
            return
        if self.fault == "raise":
            raise RuntimeError(f"{name} bug")
        await trio.sleep_forever()

    async def on_run_start(self, run: ta.Run) -> None:
        await self.inner.on_run_start(run)
        await self._after("on_run_start")

    async def on_run_end(self, run: ta.Run, result: ta.RunResult) -> None:
        await self.inner.on_run_end(run, result)

    async def on_model_start(self, run: ta.Run, turn: int, request: ta.ModelRequest) -> None:
        await self.inner.on_model_start(run, turn, request)
        await self._after("on_model_start")

    async def on_model_end(self, run: ta.Run, turn: int, outcome: str) -> None:
        await self.inner.on_model_end(run, turn, outcome)
        await self._after("on_model_end")

    async def on_tool_start(self, run: ta.Run, call: ta.ToolCall) -> None:
        await self.inner.on_tool_start(run, call)
        await self._after("on_tool_start")

    async def on_tool_end(self, run: ta.Run, call: ta.ToolCall, result: ta.ToolResult) -> None:
        await self.inner.on_tool_end(run, call, result)
        await self._after("on_tool_end")


@pytest.mark.parametrize(
    "hook",
    ["on_run_start", "on_model_start", "on_model_end", "on_tool_start", "on_tool_end"],
)
@pytest.mark.parametrize("fault", ["raise", "block"])
async def test_a_faulty_hook_leaves_the_callers_context_and_no_open_span(
    traces: Traces, autojump_clock: trio.testing.MockClock, hook: str, fault: str
) -> None:
    model = ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])
    hooks = _Wrapping(traces.hooks, hook, fault)
    before = _current_span_id()
    with trio.move_on_after(60) as outer:  # a blocked start hook: the caller gives up
        result = await ta.run(make_agent(model, [add]), "go", hooks=hooks, cleanup_timeout=1)
    assert _current_span_id() == before
    traces.check_tree()
    if fault == "raise":
        assert not outer.cancelled_caught
        assert result.status == "failed"
        assert f"{hook} bug" in (result.reason or "")


async def test_a_cancelled_run_leaves_the_callers_context(
    traces: Traces, autojump_clock: trio.testing.MockClock
) -> None:
    """A tool alone in its turn runs in the caller's task under run(); cancelled, its
    end hook runs in the repair's own task and cannot detach there."""
    block = GateTool("block")  # never released

    @ta.function_tool
    def in_thread() -> str:
        """Opens a span in its worker thread and leaves it current there."""
        from opentelemetry import context as otel_context

        span = traces.tracer.start_span("thread work")
        otel_context.attach(trace.set_span_in_context(span))
        span.end()
        return "ok"

    model = ScriptedModel(
        [Turn(tool_calls=[("in_thread", {})]), Turn(tool_calls=[("block", {})]), "never"]
    )
    before = _current_span_id()
    with trio.CancelScope() as outer:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(block.entered.wait)
            agent = make_agent(model, [block.tool, in_thread])
            nursery.start_soon(partial_run, agent, traces.hooks, block.entered, outer)
    assert outer.cancelled_caught
    assert _current_span_id() == before
    root = traces.check_tree()
    assert root.status.description == "parent cancelled"
    thread = traces.one("thread work")
    tool = traces.one("execute_tool in_thread")
    assert thread.parent is not None
    assert tool.context is not None
    assert thread.parent.span_id == tool.context.span_id


async def partial_run(
    agent: ta.Agent, hooks: ta.RunHooks, entered: trio.Event, outer: trio.CancelScope
) -> None:
    async def cancel_when_entered() -> None:
        await entered.wait()
        outer.cancel()

    before = _current_span_id()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_when_entered)
        try:
            await ta.run(agent, "go", hooks=hooks)
        finally:
            # This task is the run's own: its context must be as it was.
            assert _current_span_id() == before


async def test_a_run_started_from_a_thread_tool_is_a_child_of_its_call(
    traces: Traces, autojump_clock: trio.testing.MockClock
) -> None:
    """A sync tool (in a worker thread) that runs another agent through
    ``trio.from_thread.run``: the inner run's span is a child of the calling tool's
    span, and the thread's context is as it was once the inner run is done."""
    seen: list[int] = []

    @ta.function_tool
    def delegate() -> str:
        """Asks another agent."""
        before = _current_span_id()
        inner = make_agent(ScriptedModel(["inner answer"]))
        inner = attrs.evolve(inner, name="inner")
        result = trio.from_thread.run(_run_direct, inner, traces.hooks)
        seen.extend([before, _current_span_id()])
        return str(result.final_output)

    model = ScriptedModel([Turn(tool_calls=[("delegate", {})]), "done"])
    result = await ta.run(make_agent(model, [delegate]), "go", hooks=traces.hooks)
    assert result.status == "completed"
    assert traces.opened.open == {}
    outer, inner = traces.one("invoke_agent tracer"), traces.one("invoke_agent inner")
    tool = traces.one("execute_tool delegate")
    assert tool.context is not None
    assert inner.parent is not None
    assert inner.parent.span_id == tool.context.span_id
    assert seen == [tool.context.span_id, tool.context.span_id]
    assert outer.context is not None
    assert _current_span_id() == 0


class _Exploding(SpanProcessor):
    """A span processor that raises when a span named ``name`` starts or ends."""

    def __init__(self, name: str, on: str) -> None:
        self.name, self.on = name, on

    def on_start(self, span: SDKSpan, parent_context: Context | None = None) -> None:
        if self.on == "start" and span.name == self.name:
            raise RuntimeError("processor bug")

    def on_end(self, span: ReadableSpan) -> None:
        if self.on == "end" and span.name == self.name:
            raise RuntimeError("processor bug")


@pytest.mark.parametrize("name", ["invoke_agent tracer", "chat", "execute_tool add"])
@pytest.mark.parametrize("on", ["start", "end"])
async def test_a_raising_span_processor_leaves_the_callers_context(
    traces: Traces, autojump_clock: trio.testing.MockClock, name: str, on: str
) -> None:
    traces.provider.add_span_processor(_Exploding(name, on))
    model = ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])
    before = _current_span_id()
    result = await ta.run(make_agent(model, [add]), "go", hooks=traces.hooks)
    assert _current_span_id() == before
    assert result.status in ("completed", "failed")
