"""OpenTelemetry spans from the run hooks, per the GenAI semantic conventions.

One span per run (``invoke_agent <agent>``), per model call (``chat <model>``) and per
tool call (``execute_tool <tool>``); model and tool spans are children of their run's
span.

The hooks of one run are called from different Trio tasks (the model-stream task, one
task per tool call, the run's own task for the repair), and a Trio task starts with a
*copy* of its parent's ``contextvars`` context. So the spans are never found through
the ambient context: each run's spans are kept in a record keyed by the :class:`Run`
(model spans by turn, tool spans by call id), and every span is started with its parent
context passed explicitly.

The ambient context is still *set*, for the user's code: a start hook attaches its
span in the task it is called from (the model-stream task for ``on_model_start``, and
for ``on_tool_start`` the tool call's own task, or the model-stream task when the call
is alone in its turn), so spans that the model's HTTP client or
the tool function open — in a worker thread too, since ``trio.to_thread.run_sync``
copies the calling task's context — get the right parent. The end hook detaches only
when it runs in that same task; an end called by the repair runs in another task,
whose attaching task is already gone along with its context.

Balance: every start hook opens exactly one span, and the core calls exactly one end
hook for each start on every path. A model call that ends ``cancelled`` or ``failed``
learns its reason only at ``on_run_end``: its span is ended there, with the end time it
had. ``on_run_end`` also ends anything still open (it cannot be, unless the repair's
deadline cut an end hook short), so a run never leaves a span open. None of these hooks
awaits anything, so no cancellation can interrupt one halfway.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import trio
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider

from .._hooks import RunHooks
from .._items import ToolCall, ToolResult
from .._model import ModelRequest, Usage

if TYPE_CHECKING:
    from .._result import RunResult
    from .._run import Run

__all__ = ["OpenTelemetryHooks"]

_SCOPE: Final = "trio_agents"
# gen_ai.* attribute names (OpenTelemetry semantic conventions for generative AI).
OPERATION: Final = "gen_ai.operation.name"
PROVIDER: Final = "gen_ai.provider.name"
AGENT_NAME: Final = "gen_ai.agent.name"
CONVERSATION_ID: Final = "gen_ai.conversation.id"
REQUEST_MODEL: Final = "gen_ai.request.model"
FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
RESPONSE_MODEL: Final = "gen_ai.response.model"
INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
CACHE_READ_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
CACHE_WRITE_TOKENS: Final = "gen_ai.usage.cache_creation.input_tokens"
TOOL_NAME: Final = "gen_ai.tool.name"
TOOL_CALL_ID: Final = "gen_ai.tool.call.id"
TOOL_TYPE: Final = "gen_ai.tool.type"
TOOL_DESCRIPTION: Final = "gen_ai.tool.description"
ERROR_TYPE: Final = "error.type"
# Ours, for what the conventions have no name for.
RUN_ID: Final = "trio_agents.run.id"
RUN_STATUS: Final = "trio_agents.run.status"
RUN_REASON: Final = "trio_agents.run.reason"
RUN_TURNS: Final = "trio_agents.run.turns"
TURN: Final = "trio_agents.turn"
MODEL_OUTCOME: Final = "trio_agents.model.outcome"
TOOL_STATUS: Final = "trio_agents.tool.status"
COST: Final = "trio_agents.usage.cost"

# Model settings copied to gen_ai.request.* attributes when they are plain numbers.
_SETTINGS: Final = ("temperature", "top_p", "max_tokens", "seed", "frequency_penalty")
_MAX_DESCRIPTION: Final = 500


@final
@attrs.define(eq=False, slots=True)
class _Open:
    """A started span, and the ambient-context attachment its start hook made."""

    span: Span
    token: object
    task: trio.lowlevel.Task

    def detach(self) -> None:
        # A contextvars token can only be reset in the context (= Trio task) that
        # made it; from another task the attaching task is gone already.
        if trio.lowlevel.current_task() is self.task:
            otel_context.detach(self.token)  # type: ignore[arg-type]


@final
@attrs.define(eq=False, slots=True)
class _RunSpans:
    """The spans of one run."""

    span: Span
    context: otel_context.Context
    # on_run_start's attachment: in the run's own task, which for run() and an awaited
    # serve_run is the caller's task, so on_run_end must undo it there.
    attached: _Open
    models: dict[int, _Open] = attrs.field(factory=dict)
    tools: dict[str, _Open] = attrs.field(factory=dict)
    # Model spans that ended cancelled/failed, with their end time (ns): their reason
    # comes with the result, so on_run_end ends them.
    unfinished: list[tuple[Span, str, int]] = attrs.field(factory=list)


def _model_name(run: Run) -> str | None:
    name = getattr(run.agent.model, "model", None)
    return name if isinstance(name, str) and name else None


def _provider_name(run: Run) -> str | None:
    name = getattr(run.agent.model, "_provider", None)
    return name if isinstance(name, str) and name and name != "model" else None


def _short(text: str) -> str:
    return text if len(text) <= _MAX_DESCRIPTION else text[: _MAX_DESCRIPTION - 3] + "..."


def _error_type(result: RunResult) -> str:
    """A low-cardinality ``error.type`` for a run that did not complete."""
    if result.status == "cancelled":
        return "cancelled"
    if result.reason in ("max_turns", "cleanup timed out"):
        return result.reason.replace(" ", "_")
    error = result.error
    if error is not None:
        cls = type(error)
        return f"{cls.__module__}.{cls.__qualname__}"
    return "_OTHER"


def _set_error(span: Span, error_type: str, description: str | None) -> None:
    span.set_attribute(ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, _short(description or error_type)))


@final
class OpenTelemetryHooks(RunHooks):
    """Run hooks that emit OpenTelemetry spans (pass as ``hooks=`` to a run).

    Spans, named and attributed per the OpenTelemetry semantic conventions for
    generative AI:

    - ``invoke_agent <agent name>`` per run — ``gen_ai.agent.name``,
      ``gen_ai.conversation.id`` (the session id), ``gen_ai.request.model`` where the
      model names one, ``gen_ai.usage.input_tokens`` / ``output_tokens`` (when the
      model reported usage; ``gen_ai.usage.cache_read.input_tokens`` /
      ``cache_creation.input_tokens`` and ``trio_agents.usage.cost``, USD as a decimal
      string, when known), ``gen_ai.response.finish_reasons``; its parent is the
      caller's current span when the run started.
    - ``chat <model>`` per model call, a child of the run's span — that call's own
      usage as on the run's span (:attr:`Run.turn_usage <trio_agents.Run.turn_usage>`,
      read when it ends) and ``gen_ai.response.model``, the model that answered when
      the usage names it (``Usage.model``: behind a ``FallbackModel``, the member
      that served the call).
    - ``execute_tool <tool name>`` per tool call, a child of the run's span —
      ``gen_ai.tool.name``, ``gen_ai.tool.call.id``. Spans the tool function opens
      (in a worker thread too) are its children.

    Every span is ended on every path. A cancelled run, model call or tool call ends
    with ``error.type="cancelled"`` and status ``ERROR`` whose description is the
    cancel reason; a failed one with the error's type (``"max_turns"`` for that limit).
    Message contents are never recorded.

    One instance may serve any number of concurrent runs.

    Args:
        tracer_provider: where the spans go; None for the global tracer provider
            (``opentelemetry.trace.set_tracer_provider``).
    """

    def __init__(self, tracer_provider: TracerProvider | None = None) -> None:
        from .. import __version__

        self._tracer = trace.get_tracer(_SCOPE, __version__, tracer_provider=tracer_provider)
        # Keyed by the Run object (ids may repeat across runs; objects cannot while alive).
        self._runs: dict[object, _RunSpans] = {}

    def __repr__(self) -> str:
        return f"<OpenTelemetryHooks open_runs={len(self._runs)}>"

    # ------------------------------------------------------------------ the run

    async def on_run_start(self, run: Run) -> None:
        """Open the run's span, a child of the caller's current span."""
        attributes: dict[str, Any] = {
            OPERATION: "invoke_agent",
            AGENT_NAME: run.agent.name,
            RUN_ID: run.id,
        }
        model = _model_name(run)
        if model is not None:
            attributes[REQUEST_MODEL] = model
        provider = _provider_name(run)
        if provider is not None:
            attributes[PROVIDER] = provider
        if run.session is not None:
            attributes[CONVERSATION_ID] = run.session.session_id
        span = self._tracer.start_span(
            f"invoke_agent {run.agent.name}", kind=SpanKind.INTERNAL, attributes=attributes
        )
        context = trace.set_span_in_context(span)
        # The model-stream task (and the tool tasks it spawns) see the run's span.
        token = otel_context.attach(context)
        attached = _Open(span, token, trio.lowlevel.current_task())
        self._runs[run] = _RunSpans(span, context, attached)

    async def on_run_end(self, run: Run, result: RunResult) -> None:
        """End the run's span with the result's status, usage and finish reason."""
        record = self._runs.pop(run, None)
        if record is None:
            return
        try:
            self._end_run(record, result)
        finally:
            # Give the caller back the context it had, even if a span processor raised
            # above: resetting the run's token restores the value from before
            # on_run_start, whatever the model and tool hooks attached (and could not
            # detach) in this task since. on_run_end runs in the run's task (the repair
            # calls it there), so this never misses for run() or an awaited serve_run.
            record.attached.detach()

    def _end_run(self, record: _RunSpans, result: RunResult) -> None:
        for span, outcome, end_time in record.unfinished:
            self._end_unfinished_model(span, outcome, end_time, result)
        now = time.time_ns()
        leftovers = [*record.models.values(), *record.tools.values()]
        for open_span in leftovers:  # only if the repair's deadline cut an end hook short
            _set_error(open_span.span, "cancelled", f"ended with the run: {result.reason}")
            open_span.span.end(end_time=now)
        span = record.span
        span.set_attribute(RUN_STATUS, str(result.status))
        span.set_attribute(RUN_TURNS, result.turns)
        _set_usage(span, result.usage)
        if result.finish_reason is not None:
            span.set_attribute(FINISH_REASONS, (result.finish_reason,))
        # A parked run (park_after) has not failed: its calls await approval still,
        # from a run resumed later; its span says so (status, reason), not an error.
        if result.status != "completed" and not result.parked:
            if result.reason is not None:
                span.set_attribute(RUN_REASON, _short(result.reason))
            _set_error(span, _error_type(result), result.reason)
        span.end()

    # -------------------------------------------------------------- model calls

    async def on_model_start(self, run: Run, turn: int, request: ModelRequest) -> None:
        """Open a ``chat`` span for the model call of ``turn``."""
        record = self._runs.get(run)
        if record is None:
            return
        model = _model_name(run)
        attributes: dict[str, Any] = {
            OPERATION: "chat",
            AGENT_NAME: run.agent.name,
            RUN_ID: run.id,
            TURN: turn,
        }
        if model is not None:
            attributes[REQUEST_MODEL] = model
        provider = _provider_name(run)
        if provider is not None:
            attributes[PROVIDER] = provider
        attributes.update(_request_settings(request.settings))
        span = self._tracer.start_span(
            f"chat {model}" if model else "chat",
            context=record.context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        token = otel_context.attach(trace.set_span_in_context(span, record.context))
        record.models[turn] = _Open(span, token, trio.lowlevel.current_task())

    async def on_model_end(self, run: Run, turn: int, outcome: str) -> None:
        """End the ``chat`` span (a cancelled or failed one waits for its reason)."""
        record = self._runs.get(run)
        if record is None:
            return
        open_span = record.models.pop(turn, None)
        if open_span is None:
            return
        open_span.detach()
        span = open_span.span
        span.set_attribute(MODEL_OUTCOME, outcome)
        # This call's own usage (turns run one at a time: the run's turn_usage is the
        # call this hook ends), and the model that answered it (a FallbackModel's).
        usage = run.turn_usage
        _set_usage(span, usage)
        if usage is not None and usage.model is not None:
            span.set_attribute(RESPONSE_MODEL, usage.model)
        if outcome in ("cancelled", "failed"):
            record.unfinished.append((span, outcome, time.time_ns()))
            return
        span.end()

    def _end_unfinished_model(
        self, span: Span, outcome: str, end_time: int, result: RunResult
    ) -> None:
        if outcome == "cancelled":
            _set_error(span, "cancelled", result.reason)
        else:
            _set_error(span, _error_type(result), result.reason)
        span.end(end_time=end_time)

    # --------------------------------------------------------------- tool calls

    async def on_tool_start(self, run: Run, call: ToolCall) -> None:
        """Open an ``execute_tool`` span; the tool function runs inside it."""
        record = self._runs.get(run)
        if record is None:
            return
        attributes: dict[str, Any] = {
            OPERATION: "execute_tool",
            TOOL_NAME: call.name,
            TOOL_CALL_ID: call.call_id,
            TOOL_TYPE: "function",
            RUN_ID: run.id,
        }
        tool = run.agent.get_tool(call.name)
        if tool is not None and tool.description:
            attributes[TOOL_DESCRIPTION] = _short(tool.description)
        span = self._tracer.start_span(
            f"execute_tool {call.name}",
            context=record.context,
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        # This hook runs in the tool call's own task, right before the tool is called:
        # the function (and a sync one's worker thread) sees this span as current.
        token = otel_context.attach(trace.set_span_in_context(span, record.context))
        record.tools[call.call_id] = _Open(span, token, trio.lowlevel.current_task())

    async def on_tool_end(self, run: Run, call: ToolCall, result: ToolResult) -> None:
        """End the ``execute_tool`` span with the result's status."""
        record = self._runs.get(run)
        if record is None:
            return
        open_span = record.tools.pop(call.call_id, None)
        if open_span is None:
            return
        open_span.detach()
        span = open_span.span
        span.set_attribute(TOOL_STATUS, result.status)
        if result.status == "cancelled":
            _set_error(span, "cancelled", result.output or "cancelled")
        elif result.status == "error":
            _set_error(span, "tool_error", result.output)
        span.end()


def _set_usage(span: Span, usage: Usage | None) -> None:
    """The usage attributes: none at all when no usage was reported (not zeros)."""
    if usage is None:
        return
    span.set_attribute(INPUT_TOKENS, usage.input_tokens)
    span.set_attribute(OUTPUT_TOKENS, usage.output_tokens)
    if usage.cache_read_tokens is not None:
        span.set_attribute(CACHE_READ_TOKENS, usage.cache_read_tokens)
    if usage.cache_write_tokens is not None:
        span.set_attribute(CACHE_WRITE_TOKENS, usage.cache_write_tokens)
    if usage.cost is not None:
        # A decimal string: exact (a float attribute would round the Decimal).
        span.set_attribute(COST, str(usage.cost))


def _request_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in _SETTINGS:
        value = settings.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            found[f"gen_ai.request.{name}"] = value
    return found
