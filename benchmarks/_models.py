"""A stateless in-process model for the benchmarks: one model (and one agent) can serve
any number of concurrent runs, so a run's memory is not mixed up with a script's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import final

import trio

from trio_agents import ToolCall, ToolResult
from trio_agents.models import Finish, ModelEvent, ModelRequest, TextDelta, ToolCallDone, Usage

__all__ = ["CallsThenAnswer", "EventStream", "ToolThenAnswer"]


@final
class EventStream(AbstractAsyncContextManager[AsyncIterator[ModelEvent]]):
    """Gives ``events`` in order, a checkpoint per event (and one on entering), as a
    provider reading a socket would have."""

    def __init__(self, events: Sequence[ModelEvent]) -> None:
        self._events = list(events)
        self._position = 0

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        return None

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> ModelEvent:
        await trio.lowlevel.checkpoint()
        if self._position >= len(self._events):
            raise StopAsyncIteration
        event = self._events[self._position]
        self._position += 1
        return event


@final
class ToolThenAnswer:
    """First call: a call to ``tool`` with ``arguments``; once the conversation ends with a
    tool result: the answer (that result's output). Stateless."""

    def __init__(self, tool: str, arguments: dict[str, object]) -> None:
        self._tool = tool
        self._arguments = json.dumps(arguments)

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        last = request.items[-1] if request.items else None
        usage = Usage(input_tokens=10, output_tokens=2)
        if isinstance(last, ToolResult):
            return EventStream([TextDelta(last.output), usage, Finish("stop")])
        call = ToolCall(f"call_{len(request.items)}", self._tool, self._arguments)
        return EventStream([ToolCallDone(call), usage, Finish("tool_calls")])


@final
class CallsThenAnswer:
    """First call: one turn of ``len(calls)`` parallel tool calls (``(tool, arguments)``
    each); once the conversation ends with a tool result: the answer ``answer``.
    Stateless, like :class:`ToolThenAnswer`, so one agent serves every tree of a
    benchmark (the run trees of B8 and the fan-out)."""

    def __init__(self, calls: Sequence[tuple[str, Mapping[str, object]]], answer: str) -> None:
        self._calls = [(tool, json.dumps(arguments)) for tool, arguments in calls]
        self._answer = answer

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        last = request.items[-1] if request.items else None
        usage = Usage(input_tokens=10, output_tokens=2)
        if isinstance(last, ToolResult):
            return EventStream([TextDelta(self._answer), usage, Finish("stop")])
        turn = len(request.items)
        events: list[ModelEvent] = [
            ToolCallDone(ToolCall(f"call_{turn}_{i}", tool, arguments))
            for i, (tool, arguments) in enumerate(self._calls)
        ]
        return EventStream([*events, usage, Finish("tool_calls")])
