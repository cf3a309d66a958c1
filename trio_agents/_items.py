"""Conversation items: the four kinds of thing a conversation is made of.

Items are frozen attrs classes that round-trip through JSON
(``Item.from_json(item.to_json()) == item``). Each has a keyword-only ``rejected_by``
(None, or the name of the guardrail that kept it from the model, DESIGN §18): a marked
item stays in the conversation and the session but is never sent to a model. Where users hand items in (run input,
``inject``), plain dicts are accepted too and converted by :func:`coerce_items`:
``{"role": "user", "content": "..."}`` and OpenAI-Responses-style ``function_call`` /
``function_call_output`` dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeAlias

import attrs

from ._text_cleaning import clean_text

__all__ = [
    "AssistantMessage",
    "ConversationChecker",
    "Item",
    "ToolCall",
    "ToolResult",
    "UserMessage",
    "coerce_items",
    "conversation_problems",
    "item_from_json",
    "sendable",
]

MessageStatus: TypeAlias = Literal["completed", "incomplete"]
ToolResultStatus: TypeAlias = Literal["ok", "error", "cancelled"]

_MESSAGE_STATUSES = ("completed", "incomplete")
_RESULT_STATUSES = ("ok", "error", "cancelled")


def _text(value: str) -> str:
    """The converter of every str field: the one place text enters the conversation.

    Whatever made the item (a model's stream, a tool's output, the run's input, an
    injection, an approval's message, a session's stored row), its text leaves here in
    a form every model API and session accepts (:func:`~trio_agents._text_cleaning.clean_text`):
    a lone surrogate would make every later request of the conversation fail to encode.
    A value that is not a str is left for the field's validator to refuse.
    """
    if type(value) is str and value.isascii():
        # Clean already (ASCII has no surrogate): every item's text passes here, and
        # this is one call where clean_text's path is three.
        return value
    return clean_text(value) if isinstance(value, str) else value


def _str_field(name: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        # type() first: a plain str (every item's text) is checked with no call.
        if type(value) is not str and not isinstance(value, str):
            raise TypeError(f"{name} must be a str, not {type(value).__name__}")

    return check


def _nonempty_str_field(name: str) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if type(value) is not str and not isinstance(value, str):
            raise TypeError(f"{name} must be a str, not {type(value).__name__}")
        if not value:
            raise ValueError(f"{name} must not be empty")

    return check


def _check_rejected_by(_instance: object, _attribute: object, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise TypeError(f"rejected_by must be None or a non-empty str, not {value!r}")


def _rejected_by_field() -> Any:
    """The ``rejected_by`` field every item has (keyword-only, so positional
    construction is unchanged): the name of the guardrail that kept the item from the
    model (DESIGN §18). Such an item stays in the conversation and the session (what
    the user saw is never thrown away) but is never sent to a model again."""
    return attrs.field(default=None, kw_only=True, converter=_text, validator=_check_rejected_by)


def _choice_field(name: str, choices: tuple[str, ...]) -> Any:
    def check(_instance: object, _attribute: object, value: object) -> None:
        if value not in choices:
            raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")

    return check


@attrs.frozen
class UserMessage:
    """A message from the user.

    ``rejected_by`` (keyword-only) names the guardrail that kept it from the model: it
    stays in the conversation, never to be sent again (see the module docs).
    """

    content: str = attrs.field(converter=_text, validator=_str_field("UserMessage.content"))
    rejected_by: str | None = _rejected_by_field()

    role: ClassVar[str] = "user"

    def to_json(self) -> dict[str, Any]:
        """Return the item as a JSON-compatible dict."""
        return _marked({"type": "message", "role": "user", "content": self.content}, self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UserMessage:
        """Build the item from :meth:`to_json` output (or a ``{"role": "user"}`` dict)."""
        item = item_from_json(data)
        if not isinstance(item, cls):
            raise ValueError(f"expected a user message, got {type(item).__name__}")
        return item


@attrs.frozen
class AssistantMessage:
    """Text the model produced.

    ``status="incomplete"`` marks text whose stream was interrupted (by a cancel, a
    failure or a ``when="now"`` injection): the words the user already saw are kept.
    ``rejected_by`` (keyword-only) names the guardrail that kept it from the model.
    """

    content: str = attrs.field(converter=_text, validator=_str_field("AssistantMessage.content"))
    status: MessageStatus = attrs.field(
        default="completed", validator=_choice_field("AssistantMessage.status", _MESSAGE_STATUSES)
    )
    rejected_by: str | None = _rejected_by_field()

    role: ClassVar[str] = "assistant"

    def to_json(self) -> dict[str, Any]:
        """Return the item as a JSON-compatible dict."""
        data = {
            "type": "message",
            "role": "assistant",
            "content": self.content,
            "status": self.status,
        }
        return _marked(data, self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AssistantMessage:
        """Build the item from :meth:`to_json` output."""
        item = item_from_json(data)
        if not isinstance(item, cls):
            raise ValueError(f"expected an assistant message, got {type(item).__name__}")
        return item


@attrs.frozen
class ToolCall:
    """The model asked for a tool to be called.

    ``arguments`` is the raw JSON string the model produced; it is validated when the
    call runs, and invalid arguments become an error :class:`ToolResult`.
    ``rejected_by`` (keyword-only): as for messages; a call and its result are marked,
    and left out of model input, together.
    """

    call_id: str = attrs.field(converter=_text, validator=_nonempty_str_field("ToolCall.call_id"))
    name: str = attrs.field(converter=_text, validator=_nonempty_str_field("ToolCall.name"))
    arguments: str = attrs.field(
        default="{}", converter=_text, validator=_str_field("ToolCall.arguments")
    )
    rejected_by: str | None = _rejected_by_field()

    def to_json(self) -> dict[str, Any]:
        """Return the item as a JSON-compatible dict (OpenAI Responses ``function_call``)."""
        data = {
            "type": "function_call",
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
        }
        return _marked(data, self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolCall:
        """Build the item from :meth:`to_json` output."""
        item = item_from_json(data)
        if not isinstance(item, cls):
            raise ValueError(f"expected a function_call, got {type(item).__name__}")
        return item


@attrs.frozen
class ToolResult:
    """The result of a :class:`ToolCall`, matched by ``call_id``.

    ``status`` is ``"ok"``, ``"error"`` (the output says what went wrong, for the model
    to read) or ``"cancelled"`` (the run was cancelled while the call was open).
    ``rejected_by`` (keyword-only): as for its call.
    """

    call_id: str = attrs.field(converter=_text, validator=_nonempty_str_field("ToolResult.call_id"))
    output: str = attrs.field(converter=_text, validator=_str_field("ToolResult.output"))
    status: ToolResultStatus = attrs.field(
        default="ok", validator=_choice_field("ToolResult.status", _RESULT_STATUSES)
    )
    rejected_by: str | None = _rejected_by_field()

    def to_json(self) -> dict[str, Any]:
        """Return the item as a JSON-compatible dict (``function_call_output``)."""
        data = {
            "type": "function_call_output",
            "call_id": self.call_id,
            "output": self.output,
            "status": self.status,
        }
        return _marked(data, self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolResult:
        """Build the item from :meth:`to_json` output."""
        item = item_from_json(data)
        if not isinstance(item, cls):
            raise ValueError(f"expected a function_call_output, got {type(item).__name__}")
        return item


Item: TypeAlias = UserMessage | AssistantMessage | ToolCall | ToolResult
"""Any conversation item."""

_ITEM_TYPES = (UserMessage, AssistantMessage, ToolCall, ToolResult)


def _marked(data: dict[str, Any], item: Item) -> dict[str, Any]:
    """``data`` with the item's ``rejected_by``, when it has one: an unmarked item's
    JSON is what it always was."""
    if item.rejected_by is not None:
        data["rejected_by"] = item.rejected_by
    return data


def sendable(items: Sequence[Item]) -> tuple[Item, ...]:
    """``items`` without those a guardrail rejected (``rejected_by`` set): what a model
    may be sent of a conversation (DESIGN §18).

    A call and its result go together: marking one side (a load repair answers a marked
    call it found open with an unmarked result) leaves out both, so what is left of a
    valid conversation is valid."""
    pairs = {
        item.call_id
        for item in items
        if item.rejected_by is not None and isinstance(item, ToolCall | ToolResult)
    }
    return tuple(
        item
        for item in items
        if item.rejected_by is None
        and not (pairs and isinstance(item, ToolCall | ToolResult) and item.call_id in pairs)
    )


def _text_content(value: object, where: str) -> str:
    """Accept a str, or a list of OpenAI-style text parts, and return the text."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts: list[str] = []
        for i, part in enumerate(value):
            if isinstance(part, str):
                parts.append(part)
            elif (
                isinstance(part, Mapping)
                and part.get("type") in ("text", "input_text", "output_text")
                and isinstance(part.get("text"), str)
            ):
                parts.append(part["text"])
            else:
                raise ValueError(f"{where}[{i}] is not a text part")
        return "".join(parts)
    raise TypeError(f"{where} must be a str or a list of text parts, not {type(value).__name__}")


def _require(data: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in data:
        raise ValueError(f"{where} is missing the {key!r} field")
    return data[key]


def item_from_json(data: Mapping[str, Any]) -> Item:
    """Convert one dict (our ``to_json`` format, or the OpenAI-style shapes) to an item.

    Raises:
        TypeError: ``data`` is not a mapping, or a field has the wrong type.
        ValueError: a field is missing or has a bad value.
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"an item must be a dict or an item object, not {type(data).__name__}")
    kind = data.get("type", "message" if "role" in data else None)
    rejected_by = data.get("rejected_by")
    if kind == "message":
        role = _require(data, "role", "a message")
        content = _text_content(_require(data, "content", "a message"), "content")
        if role == "user":
            return UserMessage(content, rejected_by=rejected_by)
        if role == "assistant":
            status = data.get("status", "completed")
            return AssistantMessage(content, status, rejected_by=rejected_by)
        raise ValueError(f"message role must be 'user' or 'assistant', got {role!r}")
    if kind == "function_call":
        arguments = data.get("arguments", "{}")
        if isinstance(arguments, Mapping):
            raise TypeError("function_call arguments must be the raw JSON string, not a dict")
        return ToolCall(
            _require(data, "call_id", "a function_call"),
            _require(data, "name", "a function_call"),
            arguments,
            rejected_by=rejected_by,
        )
    if kind == "function_call_output":
        return ToolResult(
            _require(data, "call_id", "a function_call_output"),
            _require(data, "output", "a function_call_output"),
            data.get("status", "ok"),
            rejected_by=rejected_by,
        )
    if kind is None:
        raise ValueError("an item dict needs a 'type' or a 'role' field")
    raise ValueError(f"unknown item type {kind!r}")


def coerce_items(value: str | Item | Mapping[str, Any] | Iterable[Any]) -> list[Item]:
    """Convert user-supplied input to a list of items, validating all of it first.

    A str becomes one :class:`UserMessage`; an item or dict becomes one item; any other
    iterable is converted element by element (str elements are user messages). Errors
    name the offending index.
    """
    if isinstance(value, str):
        return [UserMessage(value)]
    if isinstance(value, _ITEM_TYPES):
        return [value]
    if isinstance(value, Mapping):
        return [item_from_json(value)]
    if isinstance(value, bytes | bytearray) or not isinstance(value, Iterable):
        raise TypeError(
            "input must be a str, an item, a dict, or a list of items/dicts;"
            f" got {type(value).__name__}"
        )
    items: list[Item] = []
    for index, element in enumerate(value):
        try:
            if isinstance(element, _ITEM_TYPES):
                items.append(element)
            elif isinstance(element, str):
                items.append(UserMessage(element))
            else:
                items.append(item_from_json(element))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"item {index}: {exc}") from None
    return items


def conversation_problems(items: Sequence[Item], *, allow_open_calls: bool = False) -> list[str]:
    """Return what breaks the validity invariant in ``items`` (empty when valid).

    The invariant: call ids are unique; every :class:`ToolResult` answers an earlier
    :class:`ToolCall`, once; every call is answered before the next message (so before
    the next model turn). ``allow_open_calls`` accepts calls still open at the end.
    """
    checker = ConversationChecker()
    problems = checker.feed(items)
    if not allow_open_calls:
        problems.extend(checker.open_problems())
    return problems


# What ConversationChecker has met of a call id (bits).
_CALLED = 1
_ANSWERED = 2


class ConversationChecker:
    """The validity invariant, checked incrementally: :meth:`feed` takes the items
    appended since the last call, so checking a growing conversation before every model
    request costs what was added, not the whole conversation again."""

    __slots__ = ("_count", "_ids", "_open")

    def __init__(self) -> None:
        # Every call id met, with what was met of it: _CALLED (a call), _ANSWERED (a
        # result), or both. One dict, made at the first call or result, not two sets
        # made with each checker: one checker per run in flight, and an empty set is
        # 216 bytes (W3 memory).
        self._ids: dict[str, int] | None = None
        self._open: dict[str, int] = {}  # open call id -> its index
        self._count = 0

    def feed(self, items: Sequence[Item]) -> list[str]:
        """Check ``items`` as the continuation of everything fed so far."""
        problems: list[str] = []
        open_calls = self._open
        start = self._count
        self._count += len(items)
        for index, item in enumerate(items, start):
            kind = type(item)
            if kind is ToolCall:
                assert isinstance(item, ToolCall)
                ids = self._ids
                if ids is None:
                    ids = self._ids = {}
                met = ids.get(item.call_id, 0)
                if met & _CALLED:
                    problems.append(f"item {index}: duplicate call id {item.call_id!r}")
                ids[item.call_id] = met | _CALLED
                open_calls[item.call_id] = index
            elif kind is ToolResult:
                assert isinstance(item, ToolResult)
                ids = self._ids
                if ids is None:
                    ids = self._ids = {}
                met = ids.get(item.call_id, 0)
                if met & _ANSWERED:
                    problems.append(f"item {index}: second result for call {item.call_id!r}")
                elif item.call_id not in open_calls:
                    problems.append(f"item {index}: result for unknown call {item.call_id!r}")
                else:
                    del open_calls[item.call_id]
                ids[item.call_id] = met | _ANSWERED
            elif open_calls:
                for call_id, at in open_calls.items():
                    problems.append(
                        f"item {at}: call {call_id!r} has no result before item {index}"
                    )
                open_calls.clear()
        return problems

    @property
    def checked(self) -> int:
        """How many items were fed so far."""
        return self._count

    def open_problems(self) -> list[str]:
        """The calls still without a result (a problem unless more items follow)."""
        return [f"item {at}: call {call_id!r} has no result" for call_id, at in self._open.items()]
