"""The run timeline: spans derived from a run tree's event log (DESIGN §23).

:func:`timeline` is a pure function of events — a run's own, or a whole tree's as
``run.events(tree=True)`` or a host serves them — never a second record kept beside the
log: ``run.timeline()``, ``GET /runs/{id}/timeline`` and the web UI all call it.

What each span is made of (every time is an event's ``at``):

- **run** — a run of the tree: from its first event (``queued``) to its terminal
  update; its status is the run's. A child run's parent span is the tool call it runs
  in (``run.child`` names the call).
- **tool** — a tool call: ``tool.started`` to ``tool.finished``, with its result's
  status (``ok``, ``error``, ``cancelled``).
- **model** — a model call (turn ``n``): from the moment the run sent it — its
  ``model.request`` event with ``record_requests=True``; else the last event the run
  emitted before the call began (the previous step's end: the call is built and sent
  right then) — to the ``run.item`` of its response, whose ``usage`` gives the tokens,
  the cost and which model answered.

A span the events leave open is closed by its run's terminal update (with the run's
status when it was cut by a cancel or a failure), so the timeline of a finished tree
has every span closed; only a live run has open spans (``end`` None, status
``running``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeAlias

import attrs

from ._events import (
    EventsDropped,
    InboxDelivered,
    InboxInjected,
    ModelRequestEvent,
    ResponseTextDelta,
    RunChild,
    RunEvent,
    RunHandoff,
    RunItemEvent,
    RunUpdated,
    ToolFinished,
    ToolStarted,
    event_from_json,
)
from ._items import AssistantMessage, ToolCall
from ._model import Usage

__all__ = ["Span", "SpanKind", "Timeline", "timeline"]

SpanKind: TypeAlias = Literal["run", "model", "tool"]


@attrs.frozen(kw_only=True)
class Span:
    """One span of a :class:`Timeline`.

    Attributes:
        kind: ``"run"``, ``"model"`` or ``"tool"``.
        id: unique in the timeline: a run's id; ``"<run id>:model:<turn>"``;
            ``"<run id>:tool:<call id>"``.
        parent_id: the span it is part of: a model or tool call's run; a child run's
            tool call (its run, when that call is not in the events); None at the root.
        run_id: the run it belongs to (a run span's own id).
        name: the agent (run), the model (model call; ``"model"`` when unknown), the
            tool (tool call).
        start: UNIX time it started (None only when its start is not in the events).
        end: UNIX time it ended; None while it is running.
        status: a run's status; a tool call's result status (``ok``, ``error``,
            ``cancelled``); a model call's ``completed``, ``incomplete`` (cut, e.g. by
            ``length``), ``interrupted`` (a ``when="now"`` injection), or its run's
            ``cancelled`` / ``failed``; ``running`` while open.
        usage: tokens and cost: a model call's request's; a run's own (the sum of its
            model calls'); None on tool spans and where no usage was reported.
        model: which model answered a model call (``Usage.model``, else the name the
            ``model.request`` event recorded); None when unknown.
        turn: the model call's turn (model spans only).
        call_id: the tool call's id (tool spans), or the parent's call a child run runs
            in (child run spans).
    """

    kind: SpanKind
    id: str
    parent_id: str | None
    run_id: str
    name: str
    start: float | None
    end: float | None
    status: str
    usage: Usage | None = None
    model: str | None = None
    turn: int | None = None
    call_id: str | None = None

    @property
    def duration(self) -> float | None:
        """``end - start`` in seconds; None while open or when the start is unknown."""
        if self.start is None or self.end is None:
            return None
        return self.end - self.start

    def to_json(self) -> dict[str, Any]:
        """Return the span as a JSON-compatible dict (``usage`` as
        :meth:`Usage.to_json <trio_agents.Usage.to_json>` writes it, or null)."""
        return {
            "kind": self.kind,
            "id": self.id,
            "parent_id": self.parent_id,
            "run_id": self.run_id,
            "name": self.name,
            "start": self.start,
            "end": self.end,
            "status": self.status,
            "usage": None if self.usage is None else self.usage.to_json(),
            "model": self.model,
            "turn": self.turn,
            "call_id": self.call_id,
        }


@attrs.frozen(kw_only=True)
class Timeline:
    """The spans of a run tree (see :func:`timeline`).

    Attributes:
        root_id: the tree's root run (the run of the events that is no other's
            child); None for no events.
        spans: every span, runs first in the order they appear, then each run's model
            and tool calls by start.
        usage: the sum of every model call's usage in the tree; None when none reported.
    """

    root_id: str | None
    spans: tuple[Span, ...]
    usage: Usage | None

    def span(self, span_id: str) -> Span:
        """The span with ``span_id`` (``KeyError`` if none)."""
        for span in self.spans:
            if span.id == span_id:
                return span
        raise KeyError(span_id)

    def children(self, span_id: str | None) -> tuple[Span, ...]:
        """The spans whose parent is ``span_id`` (None: the root spans)."""
        return tuple(span for span in self.spans if span.parent_id == span_id)

    def to_json(self) -> dict[str, Any]:
        """``{"root_id", "usage", "spans": [...]}``, what ``GET /runs/{id}/timeline``
        answers."""
        return {
            "root_id": self.root_id,
            "usage": None if self.usage is None else self.usage.to_json(),
            "spans": [span.to_json() for span in self.spans],
        }


def timeline(
    events: Iterable[RunEvent | Mapping[str, Any]], *, names: Mapping[str, str] | None = None
) -> Timeline:
    """The :class:`Timeline` of the runs whose events are given (see the module docs).

    ``events`` are :class:`RunEvent` objects or their ``to_json()`` dicts, of one run or
    of a tree, in any order (each run's are ordered by seq here); ``events.dropped``
    markers are skipped (what retention lost is missing from the spans, never made up).
    ``names`` gives agent names by run id for runs whose events do not name their agent
    (a root run's: its children are named by the parent's ``run.child`` events).

    Raises:
        ValueError: an event dict that is no run event.
    """
    by_run: dict[str, list[RunEvent]] = {}
    for raw in events:
        event = event_from_json(raw) if isinstance(raw, Mapping) else raw
        if isinstance(event, EventsDropped):
            continue
        by_run.setdefault(event.run_id, []).append(event)
    children: dict[str, RunChild] = {}  # child run id -> the parent's first run.child
    ended: dict[str, RunChild] = {}  # child run id -> its terminal run.child
    for run_events in by_run.values():
        run_events.sort(key=lambda e: e.seq)
        for event in run_events:
            if isinstance(event, RunChild):
                target = ended if event.status.is_terminal else children
                target.setdefault(event.child_id, event)
    run_spans: list[Span] = []
    call_spans: list[Span] = []
    for run_id, run_events in by_run.items():
        run = _RunSpans(run_id, names.get(run_id) if names else None)
        for event in run_events:
            run.take(event)
        run_span, spans = run.spans(children.get(run_id), ended.get(run_id))
        run_spans.append(run_span)
        call_spans.extend(spans)
    known = {span.id for span in call_spans}
    run_spans = [_placed(span, known) for span in run_spans]
    roots = [span.id for span in run_spans if span.parent_id is None]
    total: Usage | None = None
    for span in call_spans:
        if span.kind == "model" and span.usage is not None:
            total = span.usage if total is None else total + span.usage
    call_spans.sort(key=lambda s: (s.run_id, s.start if s.start is not None else 0.0))
    return Timeline(
        root_id=roots[0] if roots else None, spans=(*run_spans, *call_spans), usage=total
    )


def _placed(span: Span, known: set[str]) -> Span:
    """A child run's span under its call's span, or under its parent run when the
    call's events are not there."""
    if span.parent_id is None or span.call_id is None:
        return span
    call = f"{span.parent_id}:tool:{span.call_id}"
    return attrs.evolve(span, parent_id=call) if call in known else span


@attrs.define
class _Call:
    """A model call being read (what becomes its span)."""

    turn: int
    start: float | None
    end: float | None = None
    model: str | None = None
    usage: Usage | None = None
    answered: bool = False  # a response item was committed
    incomplete: bool = False  # the response was an incomplete message


@attrs.define
class _Tool:
    call_id: str
    name: str
    start: float
    end: float | None = None
    status: str = "running"


class _RunSpans:
    """One run's events, read in seq order, and the spans they make."""

    def __init__(self, run_id: str, name: str | None) -> None:
        self.run_id = run_id
        self.name = name
        self.start: float | None = None
        self.end: float | None = None
        self.status = "running"
        self.turn = 0  # the run's turn when the event being read was emitted
        self.mark: float | None = None  # `at` of the last event before the current step
        self.calls: dict[int, _Call] = {}
        self.tools: dict[str, _Tool] = {}
        self.delivering = False  # reading the items of an injection (not a response)

    def take(self, event: RunEvent) -> None:
        at = event.at or None  # 0.0: an event from before events had a time
        if self.start is None:
            self.start = at
        turn = _turn_of(event, self.turn)
        if turn > self.turn:
            # Turns self.turn+1 .. turn began since the last event: their calls started
            # then (at this event's time if it is the model.request that marks it).
            begun = at if isinstance(event, ModelRequestEvent) else self.mark
            for n in range(self.turn + 1, turn + 1):
                self.calls.setdefault(n, _Call(n, begun))
            self.turn = turn
        self._read(event, at)
        if not _unmarked(event):
            self.mark = at

    def _read(self, event: RunEvent, at: float | None) -> None:
        if isinstance(event, RunUpdated):
            self.status = event.status.value
            if event.status.is_terminal:
                self.end = at
        elif isinstance(event, RunHandoff):
            if self.name is None:
                self.name = event.from_agent
        elif isinstance(event, ModelRequestEvent):
            self.calls.setdefault(event.turn, _Call(event.turn, at)).model = event.model
        elif isinstance(event, ToolStarted) and at is not None:
            self.tools.setdefault(event.call_id, _Tool(event.call_id, event.name, at))
        elif isinstance(event, ToolFinished):
            tool = self.tools.get(event.call_id)
            if tool is not None:
                tool.end, tool.status = at, event.status
        elif isinstance(event, RunItemEvent):
            self._item(event, at)
        if isinstance(event, InboxDelivered):
            self.delivering = True
        elif not isinstance(event, RunItemEvent):
            self.delivering = False

    def _item(self, event: RunItemEvent, at: float | None) -> None:
        """A response's items end its call (and the first carries its usage); an
        injection's items (right after its ``inbox.delivered``) and results do not."""
        item = event.item
        call = self.calls.get(event.turn)
        if call is None or self.delivering or not isinstance(item, AssistantMessage | ToolCall):
            return
        call.answered = True
        call.end = at
        if isinstance(item, AssistantMessage) and item.status == "incomplete":
            call.incomplete = True
        if event.usage is not None:
            call.usage = event.usage if call.usage is None else call.usage + event.usage

    def spans(self, started: RunChild | None, ended: RunChild | None) -> tuple[Span, list[Span]]:
        """The run's span and its calls' spans (open ones closed by its end)."""
        end = self.end
        if end is None and ended is not None:
            end = ended.at or None  # its own terminal update was not in the events
        status = self.status if self.end is not None or ended is None else ended.status.value
        terminal = end is not None
        spans = [self._model_span(call, end, status) for call in self.calls.values()]
        for tool in self.tools.values():
            closed = tool.end is not None or not terminal
            spans.append(
                Span(
                    kind="tool",
                    id=f"{self.run_id}:tool:{tool.call_id}",
                    parent_id=self.run_id,
                    run_id=self.run_id,
                    name=tool.name,
                    start=tool.start,
                    end=tool.end if closed else end,
                    status=tool.status if closed else _cut(status),
                    call_id=tool.call_id,
                )
            )
        usage: Usage | None = None
        for span in spans:
            if span.usage is not None:
                usage = span.usage if usage is None else usage + span.usage
        start = self.start
        if started is not None and started.at and (start is None or started.at < start):
            start = started.at
        run_span = Span(
            kind="run",
            id=self.run_id,
            parent_id=None if started is None else started.run_id,
            run_id=self.run_id,
            name=self.name or (started.agent if started is not None else self.run_id),
            start=start,
            end=end,
            status=status,
            usage=usage,
            call_id=None if started is None else started.call_id,
        )
        return run_span, spans

    def _model_span(self, call: _Call, run_end: float | None, run_status: str) -> Span:
        later = any(n > call.turn for n in self.calls)
        end = call.end
        if later and not call.answered:
            # Cut before it produced anything, and the run went on (an interruption):
            # it ended when the next call began.
            end = self.calls[call.turn + 1].start
        if end is None:
            end = run_end
        if end is None:
            status = "running"
        elif call.answered and not call.incomplete:
            status = "completed"
        elif later:
            status = "interrupted"
        elif run_status in ("cancelled", "failed"):
            status = run_status
        else:
            status = "incomplete"
        model = call.model
        if call.usage is not None and call.usage.model is not None:
            model = call.usage.model
        return Span(
            kind="model",
            id=f"{self.run_id}:model:{call.turn}",
            parent_id=self.run_id,
            run_id=self.run_id,
            name=model or "model",
            start=call.start,
            end=end,
            status=status,
            usage=call.usage,
            model=model,
            turn=call.turn,
        )


def _turn_of(event: RunEvent, current: int) -> int:
    """The run's turn when ``event`` was emitted: the events that carry one say it
    (``inbox.delivered``'s is the turn it delivers to, not yet begun); the others
    happen within the current one."""
    if isinstance(event, RunUpdated | ResponseTextDelta | RunItemEvent | ModelRequestEvent):
        return max(event.turn, current)
    return current


def _unmarked(event: RunEvent) -> bool:
    """Events that may come in the middle of a step (an injection accepted, a rate
    limit's wait shown while the call is being opened): not where a step ended."""
    if isinstance(event, InboxInjected):
        return True
    return isinstance(event, RunUpdated) and "throttled" in event.detail


def _cut(run_status: str) -> str:
    """The status of a tool call the run's end cut (no ``tool.finished``)."""
    return run_status if run_status in ("cancelled", "failed") else "cancelled"
