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
``run.child``               :class:`RunChild` — a child run started or ended (§17)
``run.handoff``             :class:`RunHandoff` — the run continues with another agent
``model.request``           :class:`ModelRequestEvent` — a model request, as sent (only
                            with the run option ``record_requests=True``)
==========================  =====================================================

Every event carries ``at``, the wall-clock UNIX time it was emitted (DESIGN §23): what
:func:`~trio_agents.timeline` builds its spans from. An event decoded from JSON that
has none (written by an older version) gets ``0.0``: a time that is not known, never
the time of the decoding. (Except on :class:`RunUpdated`, where it always was, ``at``
takes no part in comparing events: an event is its run and seq.)
"""

from __future__ import annotations

import enum
import time
import types
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self, TypeAlias, Union, cast, get_args, get_origin

import attrs

from ._items import Item, item_from_json
from ._model import ModelRequest, Usage, usage_from_json
from ._text_cleaning import clean_text, clean_value

__all__ = [
    "EventsDropped",
    "InboxDelivered",
    "InboxInjected",
    "ModelRequestEvent",
    "ResponseTextDelta",
    "RunChild",
    "RunEvent",
    "RunHandoff",
    "RunItemEvent",
    "RunStatus",
    "RunUpdated",
    "ToolFinished",
    "ToolProgress",
    "ToolStarted",
    "event_from_json",
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


# The converters of the event fields that carry a user's text as given (a cancel
# reason, a guardrail's info, ``ctx.progress`` payloads, agent names, a status's
# detail): the one place that text enters an event, as ``_items._text`` is for items.
# Fields filled from items (a call's name and arguments, a result's output) are clean
# already. A lone surrogate let through would cut every face's stream of the run at
# that event, and make every answer holding it fail, for as long as the run is kept.


def _clean_str(value: Any) -> Any:
    if type(value) is str and value.isascii():
        return value  # clean already: one call, not clean_text's three
    return clean_text(value) if isinstance(value, str) else value


def _clean_mapping(value: Any) -> Any:
    return clean_value(value) if value else value


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
    """Shared ``to_json`` / ``from_json`` for the event classes (attrs classes with a
    ``type`` ClassVar). Both are driven by the attrs fields, so an event class written
    once is encoded and decoded without a hand-written mirror."""

    # No instance dict: each event is only its attrs slots.
    __slots__ = ()

    type: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        """Return the event as a JSON-compatible dict, ``type`` first."""
        data: dict[str, Any] = {"type": self.type}
        for field in attrs.fields(cast(Any, type(self))):
            data[field.name] = _json_value(getattr(self, field.name))
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """Rebuild the event from its :meth:`to_json` form.

        Raises:
            ValueError: ``data`` is not this event type, or a field is missing or has
                the wrong type.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"an event must be a JSON object, not {type(data).__name__}")
        if data.get("type") != cls.type:
            raise ValueError(f"not a {cls.type} event: type {data.get('type')!r}")
        values: dict[str, Any] = {}
        for name, decode, required in _decoders(cls):
            if name not in data:
                if required:
                    raise ValueError(f"malformed {cls.type} event: {name!r} is missing")
                if name == "at":
                    # An event from before events had a time: unknown, not "now".
                    values["at"] = 0.0
                continue
            try:
                values[name] = decode(data[name])
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                raise ValueError(f"malformed {cls.type} event: {name}: {exc}") from None
        return cast(Self, cast(Any, cls)(**values))


# ------------------------------------------------------------- decoding, by type

_Decoder: TypeAlias = Callable[[Any], Any]


def _decode_str(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _decode_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"expected an integer, got {type(value).__name__}")
    return value


def _decode_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


def _decode_mapping(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return dict(value)


def _decoder_for(tp: Any) -> _Decoder:
    """The JSON decoder of one field type (the types events use; others are a bug)."""
    if tp is str:
        return _decode_str
    if tp is int:
        return _decode_int
    if tp is float:
        return _decode_float
    if tp is RunStatus:
        return RunStatus
    if tp == Item:  # the union of the item classes: items carry their own "type"
        return item_from_json
    if tp is Usage:
        return usage_from_json
    if tp is ModelRequest:
        return ModelRequest.from_json
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType) and type(None) in args:
        (inner,) = [a for a in args if a is not type(None)]
        decode_inner = _decoder_for(inner)
        return lambda value: None if value is None else decode_inner(value)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        decode_element = _decoder_for(args[0])

        def decode_tuple(value: Any) -> tuple[Any, ...]:
            if not isinstance(value, list | tuple):
                raise TypeError(f"expected an array, got {type(value).__name__}")
            return tuple(decode_element(v) for v in value)

        return decode_tuple
    if origin is Mapping or tp is Mapping:
        return _decode_mapping
    raise TypeError(f"no JSON decoder for field type {tp!r}")  # pragma: no cover


_DECODERS: dict[type, tuple[tuple[str, _Decoder, bool], ...]] = {}


def _decoders(cls: type) -> tuple[tuple[str, _Decoder, bool], ...]:
    """``(name, decoder, required)`` per attrs field of ``cls``, built once."""
    found = _DECODERS.get(cls)
    if found is None:
        fields = attrs.fields(attrs.resolve_types(cast(Any, cls), globals()))
        found = tuple((f.name, _decoder_for(f.type), f.default is attrs.NOTHING) for f in fields)
        _DECODERS[cls] = found
    return found


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
    reason: str | None = attrs.field(converter=_clean_str)
    turn: int
    at: float
    detail: Mapping[str, Any] = attrs.field(factory=dict, converter=_clean_mapping)


@attrs.frozen
class ResponseTextDelta(_EventBase):
    """A fragment of assistant text as it streams (``response.text.delta``)."""

    type: ClassVar[str] = "response.text.delta"
    run_id: str
    seq: int
    turn: int
    text: str
    at: float = attrs.field(factory=time.time, eq=False)


@attrs.frozen
class RunItemEvent(_EventBase):
    """An item entered the conversation (``run.item``).

    ``usage`` is the usage (tokens, cost, the model that served it) of the model
    request whose response the item is, on the first item that response committed (its
    text, or its first tool call when it has none): so each request's usage is in the
    log once. None on every other item, and where the model reported no usage.

    ``index`` is the item's position in the run's conversation (the history it loaded,
    then its items in commit order): its position in the run's session, which is what
    lets a host resolve a fork at an event position ``(run_id, seq)`` (DESIGN §23) from
    the events alone. None in events written before it existed.
    """

    type: ClassVar[str] = "run.item"
    run_id: str
    seq: int
    turn: int
    item: Item
    # The usage of the model request that produced the item: set on the first item
    # a response commits (its text, else its first call; DESIGN §23), None on the others.
    usage: Usage | None = None
    at: float = attrs.field(factory=time.time, eq=False)
    index: int | None = None


@attrs.frozen
class ToolStarted(_EventBase):
    """A tool call started running (``tool.started``)."""

    type: ClassVar[str] = "tool.started"
    run_id: str
    seq: int
    call_id: str
    name: str
    arguments: str
    at: float = attrs.field(factory=time.time, eq=False)


@attrs.frozen
class ToolProgress(_EventBase):
    """A running tool reported progress with ``ctx.progress(message, **data)``."""

    type: ClassVar[str] = "tool.progress"
    run_id: str
    seq: int
    call_id: str
    name: str
    message: str = attrs.field(converter=_clean_str)
    data: Mapping[str, Any] = attrs.field(factory=dict, converter=_clean_mapping)
    at: float = attrs.field(factory=time.time, eq=False)


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
    at: float = attrs.field(factory=time.time, eq=False)


@attrs.frozen
class InboxInjected(_EventBase):
    """An injection was accepted into the inbox (``inbox.injected``)."""

    type: ClassVar[str] = "inbox.injected"
    run_id: str
    seq: int
    injection_id: str
    when: str
    items: tuple[Item, ...]
    at: float = attrs.field(factory=time.time, eq=False)


@attrs.frozen
class InboxDelivered(_EventBase):
    """Injected items entered the conversation for a turn (``inbox.delivered``)."""

    type: ClassVar[str] = "inbox.delivered"
    run_id: str
    seq: int
    injection_id: str
    turn: int
    at: float = attrs.field(factory=time.time, eq=False)


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
    at: float = attrs.field(factory=time.time, eq=False)


@attrs.frozen
class RunChild(_EventBase):
    """A child run of this run started (``status`` ``"queued"``) or ended (its terminal
    status) — ``run.child``, in the parent's log.

    ``call_id`` is the parent's tool call the child runs in; ``agent`` the child's agent
    name.
    """

    type: ClassVar[str] = "run.child"
    run_id: str
    seq: int
    child_id: str
    agent: str = attrs.field(converter=_clean_str)
    call_id: str
    status: RunStatus
    at: float = attrs.field(factory=time.time, eq=False)


@attrs.frozen
class RunHandoff(_EventBase):
    """The run handed its conversation from one agent to another (``run.handoff``):
    the model called ``transfer_to_<to_agent>``, and the next turns are ``to_agent``'s."""

    type: ClassVar[str] = "run.handoff"
    run_id: str
    seq: int
    from_agent: str = attrs.field(converter=_clean_str)
    to_agent: str = attrs.field(converter=_clean_str)
    at: float = attrs.field(factory=time.time, eq=False)


@attrs.frozen
class ModelRequestEvent(_EventBase):
    """A model request of the run, as sent (``model.request``): emitted only with the run
    option ``record_requests=True``, just before the request goes to the model, so its
    ``at`` is when the call started (DESIGN §23).

    Attributes:
        turn: the model call it is (``RunUpdated.turn`` counts them).
        model: which model it was sent to: the model's ``model`` attribute (its name at
            the provider) when it has one, else its class name.
        request: the :class:`~trio_agents.models.ModelRequest`, or None when it was not
            recorded: its JSON is over the run's ``record_requests_max_bytes``, or it
            has a setting that is no JSON value (``omitted`` says which).
        size: the size in bytes of the request's JSON (UTF-8), recorded or not; 0 when
            it could not be encoded.
        omitted: None when ``request`` holds the request; else why it does not
            (``"too large"``, ``"not JSON: ..."``).
    """

    type: ClassVar[str] = "model.request"
    run_id: str
    seq: int
    turn: int
    model: str = attrs.field(converter=_clean_str)
    request: ModelRequest | None
    size: int
    omitted: str | None = None
    at: float = attrs.field(factory=time.time, eq=False)


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
    | RunChild
    | RunHandoff
    | ModelRequestEvent
)
"""Any event of a run."""


EVENT_TYPES: Mapping[str, type[_EventBase]] = {
    cls.type: cls for cls in cast(tuple[type[_EventBase], ...], get_args(RunEvent))
}
"""Every event class by its ``type``: the one registry (built from :data:`RunEvent`)."""


def event_from_json(data: Mapping[str, Any]) -> RunEvent:
    """Rebuild a run event from its ``to_json()`` form (what control ``event`` frames
    carry), dispatching on ``type`` through :data:`EVENT_TYPES`.

    Raises:
        ValueError: unknown event type or malformed fields.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"an event must be a JSON object, not {type(data).__name__}")
    cls = EVENT_TYPES.get(data.get("type"))  # type: ignore[arg-type]
    if cls is None:
        raise ValueError(f"unknown event type {data.get('type')!r}")
    return cast(RunEvent, cls.from_json(data))
