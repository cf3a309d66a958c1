"""Human-readable output: events as lines (streamed text inline), runs as a table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TextIO

from .._events import (
    EventsDropped,
    InboxDelivered,
    InboxInjected,
    ResponseTextDelta,
    RunChild,
    RunEvent,
    RunHandoff,
    RunItemEvent,
    RunUpdated,
    ToolFinished,
    ToolProgress,
    ToolStarted,
)
from .._items import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from ..control import RunInfo

__all__ = ["Printer", "describe_item", "event_line", "json_line", "run_table"]


def json_line(data: Any) -> str:
    """One line of JSON (for ``--json``): compact, unicode kept."""
    return json.dumps(data, ensure_ascii=False, default=repr)


def describe_item(item: Item) -> str:
    """A conversation item in one line."""
    if isinstance(item, UserMessage):
        return f"user: {item.content}"
    if isinstance(item, AssistantMessage):
        suffix = " [incomplete]" if item.status == "incomplete" else ""
        return f"assistant{suffix}: {item.content}"
    if isinstance(item, ToolCall):
        return f"tool call {item.call_id}: {item.name}({item.arguments})"
    assert isinstance(item, ToolResult)
    return f"tool result {item.call_id} [{item.status}]: {item.output}"


def event_line(event: RunEvent) -> str | None:
    """One event as a line; None for the events the printer shows otherwise
    (text deltas are streamed inline, ``run.item`` repeats what was streamed)."""
    if isinstance(event, RunUpdated):
        extra = f" — {event.reason}" if event.reason else ""
        pending = event.detail.get("pending")
        if pending:
            extra += f" pending={list(pending)}"
        waiting = event.detail.get("waiting")
        if waiting:
            extra += f" waiting below={[w.get('call_id') for w in waiting]}"
        return f"[run.updated] {event.status.value} (turn {event.turn}){extra}"
    if isinstance(event, ToolStarted):
        return f"[tool.started] {event.call_id} {event.name}({event.arguments})"
    if isinstance(event, ToolProgress):
        return f"[tool.progress] {event.name}: {event.message}"
    if isinstance(event, ToolFinished):
        return f"[tool.finished] {event.name} -> {event.status}: {event.output}"
    if isinstance(event, InboxInjected):
        return f"[inbox.injected] {event.injection_id} when={event.when}"
    if isinstance(event, InboxDelivered):
        return f"[inbox.delivered] {event.injection_id} into turn {event.turn}"
    if isinstance(event, EventsDropped):
        return f"[events.dropped] {event.count} events from seq {event.first_missing_seq}"
    if isinstance(event, RunChild):
        return f"[run.child] {event.child_id} ({event.agent}) {event.status.value}"
    if isinstance(event, RunHandoff):
        return f"[run.handoff] {event.from_agent} -> {event.to_agent}"
    assert isinstance(event, ResponseTextDelta | RunItemEvent)
    return None


class Printer:
    """Writes event lines, and streamed text inline after ``assistant>``."""

    def __init__(self, out: TextIO, indent: str = "") -> None:
        self.out = out
        self.indent = indent
        self._in_text = False

    def line(self, text: str) -> None:
        """Write one line (ending streamed text first)."""
        if self._in_text:
            self.out.write("\n")
            self._in_text = False
        self.out.write(f"{self.indent}{text}\n" if text else "\n")
        self.out.flush()

    def heading(self, text: str) -> None:
        """Write one line without the indent."""
        self.end()
        self.out.write(f"{text}\n")
        self.out.flush()

    def text(self, fragment: str) -> None:
        """Write streamed assistant text."""
        if not self._in_text:
            self.out.write(f"{self.indent}assistant> ")
            self._in_text = True
        self.out.write(fragment)
        self.out.flush()

    def event(self, event: RunEvent) -> None:
        """Write one event."""
        if isinstance(event, ResponseTextDelta):
            self.text(event.text)
            return
        line = event_line(event)
        if line is not None:
            self.line(line)

    def end(self) -> None:
        """End streamed text, if any, with a newline."""
        if self._in_text:
            self.out.write("\n")
            self.out.flush()
            self._in_text = False


def run_table(runs: Sequence[RunInfo]) -> list[str]:
    """Runs as the lines of an aligned table (a header first)."""
    header = ("RUN", "AGENT", "SESSION", "STATUS", "TURN", "SEQ", "REASON")
    rows = [header] + [
        (
            info.run_id,
            info.agent,
            info.session_id or "-",
            info.status.value
            + (f" ({', '.join(info.pending_approvals)})" if info.pending_approvals else ""),
            str(info.turn),
            str(info.seq),
            info.reason or "",
        )
        for info in runs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    return [
        "  ".join(
            [*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]
        ).rstrip()
        for row in rows
    ]
