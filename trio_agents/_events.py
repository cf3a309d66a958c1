"""Run events and statuses.

Every event of a run has ``type``, ``seq`` (strictly increasing from 1 within the run),
``run_id`` and ``to_json()``. The event types:

==========================  =====================================================
``run.updated``             :class:`RunUpdated` — the run's status changed
``response.text.delta``     :class:`ResponseTextDelta` — streamed assistant text
``run.item``                :class:`RunItemEvent` — an item entered the conversation
``tool.started``            :class:`ToolStarted`
``tool.progress``           :class:`ToolProgress` — from ``ctx.progress(...)``
``tool.finished``           :class:`ToolFinished`
``inbox.injected``          :class:`InboxInjected` — an injection was accepted
``inbox.delivered``         :class:`InboxDelivered` — injected items entered a turn
``events.dropped``          :class:`EventsDropped` — a slow subscriber missed events
==========================  =====================================================
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, ClassVar, TypeAlias, cast

import attrs

from ._items import Item

__all__ = [
    "EventsDropped",
    "InboxDelivered",
    "InboxInjected",
    "ResponseTextDelta",
    "RunEvent",
    "RunItemEvent",
    "RunStatus",
    "RunUpdated",
    "ToolFinished",
    "ToolProgress",
    "ToolStarted",
]


class RunStatus(enum.StrEnum):
    """The status of a run. A ``str`` enum: ``status == "cancelled"`` holds.

    ``queued → running ⇄ awaiting_approval → completed | failed | cancelled``
    """

    QUEUED = "queued"
    RUNNING = "running"
    AWAITING_APPROVAL = "awaiting_approval"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """True for ``completed``, ``failed`` and ``cancelled``."""
        return self in _TERMINAL

    def __str__(self) -> str:
        return self.value


_TERMINAL = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


def _json_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_value(v) for v in value]
    if hasattr(value, "to_json"):
        return value.to_json()
    return value


class _EventBase:
    """Shared ``to_json`` for the event classes (attrs classes with a ``type`` ClassVar)."""

    type: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        """Return the event as a JSON-compatible dict, ``type`` first."""
        data: dict[str, Any] = {"type": self.type}
        for field in attrs.fields(cast(Any, type(self))):
            data[field.name] = _json_value(getattr(self, field.name))
        return data


@attrs.frozen
class RunUpdated(_EventBase):
    """The run's status changed (``run.updated``).

    ``at`` is wall-clock UNIX time; ``turn`` counts model calls started; ``reason`` is
    set for ``failed`` and ``cancelled``; ``detail`` carries status-specific data (for
    ``awaiting_approval``, ``detail["pending"]`` lists the call ids).
    """

    type: ClassVar[str] = "run.updated"
    run_id: str
    seq: int
    status: RunStatus
    reason: str | None
    turn: int
    at: float
    detail: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ResponseTextDelta(_EventBase):
    """A fragment of assistant text as it streams (``response.text.delta``)."""

    type: ClassVar[str] = "response.text.delta"
    run_id: str
    seq: int
    turn: int
    text: str


@attrs.frozen
class RunItemEvent(_EventBase):
    """An item entered the conversation (``run.item``)."""

    type: ClassVar[str] = "run.item"
    run_id: str
    seq: int
    turn: int
    item: Item


@attrs.frozen
class ToolStarted(_EventBase):
    """A tool call started running (``tool.started``)."""

    type: ClassVar[str] = "tool.started"
    run_id: str
    seq: int
    call_id: str
    name: str
    arguments: str


@attrs.frozen
class ToolProgress(_EventBase):
    """A running tool reported progress with ``ctx.progress(message, **data)``."""

    type: ClassVar[str] = "tool.progress"
    run_id: str
    seq: int
    call_id: str
    name: str
    message: str
    data: Mapping[str, Any] = attrs.field(factory=dict)


@attrs.frozen
class ToolFinished(_EventBase):
    """A tool call ended (``tool.finished``); ``status`` is its result's status."""

    type: ClassVar[str] = "tool.finished"
    run_id: str
    seq: int
    call_id: str
    name: str
    status: str
    output: str


@attrs.frozen
class InboxInjected(_EventBase):
    """An injection was accepted into the inbox (``inbox.injected``)."""

    type: ClassVar[str] = "inbox.injected"
    run_id: str
    seq: int
    injection_id: str
    when: str
    items: tuple[Item, ...]


@attrs.frozen
class InboxDelivered(_EventBase):
    """Injected items entered the conversation for a turn (``inbox.delivered``)."""

    type: ClassVar[str] = "inbox.delivered"
    run_id: str
    seq: int
    injection_id: str
    turn: int


@attrs.frozen
class EventsDropped(_EventBase):
    """A subscriber fell behind the run's event retention and missed events.

    ``seq`` is the last missing seq; the missing range is
    ``first_missing_seq .. first_missing_seq + count - 1``.
    """

    type: ClassVar[str] = "events.dropped"
    run_id: str
    seq: int
    first_missing_seq: int
    count: int


RunEvent: TypeAlias = (
    RunUpdated
    | ResponseTextDelta
    | RunItemEvent
    | ToolStarted
    | ToolProgress
    | ToolFinished
    | InboxInjected
    | InboxDelivered
    | EventsDropped
)
"""Any event of a run."""
