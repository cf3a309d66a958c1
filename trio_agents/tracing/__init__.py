"""Tracing: OpenTelemetry spans for runs, model calls and tool calls.

Needs the ``otel`` extra (``pip install 'trio-agents[otel]'``: ``opentelemetry-api``;
bring your own SDK and exporter). Pass :class:`OpenTelemetryHooks` as a run's
``hooks=``::

    hooks = OpenTelemetryHooks()          # the global tracer provider
    result = await trio_agents.run(agent, "hi", hooks=hooks)

See ``docs/tracing.md``.
"""

try:
    import opentelemetry.trace as _trace
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "trio_agents.tracing needs OpenTelemetry: pip install 'trio-agents[otel]'"
    ) from exc

from ._otel import OpenTelemetryHooks as OpenTelemetryHooks

del _trace

__all__ = ["OpenTelemetryHooks"]
