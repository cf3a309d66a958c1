"""Request frames of the wire format, version 1: one typed attrs class per op, and
:func:`parse_request`, which validates a frame (every field, every type) into one.

Shared by the wire faces: the websocket channel parses its frames with it, and the
REST face checks its bodies with the same rules (one set of field rules and messages
on every face), so it lives below both, in the hosting layer."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Final, Literal, TypeAlias, cast, final, get_args

import attrs

from .._items import Item, coerce_items
from ._error_codes import ProtocolError
from ._policies import limits_from_wire
from ._server_limits import MAX_ID_LENGTH, MAX_NAME_LENGTH, MAX_REASON_LENGTH

__all__ = [
    "OPS",
    "Request",
    "RequestId",
    "RunApprove",
    "RunCancel",
    "RunGet",
    "RunInject",
    "RunReject",
    "RunStart",
    "RunSubscribe",
    "RunUnsubscribe",
    "RunWithdraw",
    "RunsList",
    "SessionCancel",
    "SessionFork",
    "parse_request",
    "validate_request",
]


# ---------------------------------------------------------------- field validators

_Validator: TypeAlias = Callable[[str, Any], Any]


def _string(max_length: int) -> _Validator:
    def check(name: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string")
        if not value:
            raise ValueError(f"{name} must not be empty")
        if len(value) > max_length:
            raise ValueError(f"{name} is longer than {max_length} characters")
        return value

    return check


def _optional(check: _Validator) -> _Validator:
    def optional(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)

    return optional


def _choice(*choices: str | None) -> _Validator:
    def check(name: str, value: Any) -> Any:
        if value not in choices or (value is not None and not isinstance(value, str)):
            shown = ", ".join("null" if c is None else repr(c) for c in choices)
            raise ValueError(f"{name} must be one of {shown}")
        return value

    return check


def _message_text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{name} must be a string")
    if len(value) > MAX_REASON_LENGTH:
        raise ValueError(f"{name} is longer than {MAX_REASON_LENGTH} characters")
    return value


def _seq(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0 or null")
    return value


def _items(name: str, value: Any) -> tuple[Item, ...]:
    if not isinstance(value, str | list | dict):
        raise ValueError(f"{name} must be a string, an item object or a list of items")
    try:
        items = tuple(coerce_items(value))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: {exc}") from None
    except RecursionError:
        raise ValueError(f"{name}: nested too deeply") from None
    if not items:
        raise ValueError(f"{name} must hold at least one item")
    return items


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false")
    return value


def _json_object(name: str, value: Any) -> dict[str, Any]:
    # Its checks against a question's schema are the run's (Run.approve).
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a JSON object")
    return value


def _spec(check: _Validator) -> dict[str, _Validator]:
    """attrs field metadata: the wire validator of one request field."""
    return {"check": check}


_NAME = _spec(_string(MAX_NAME_LENGTH))
_OPTIONAL_TEXT = _spec(_optional(_message_text))
_CANCEL_MODE = _spec(_choice("immediate", "after_turn"))

RequestId: TypeAlias = str | int


# One typed request class per op. Each field's wire validator is in its metadata; a
# field without a default is required; ``null`` is accepted only where the field is
# optional (its validator says so). ``id`` is the client's request id, which only its
# face's answer echoes: 0 for an op a host builds itself (a cluster routes these very
# values between its nodes, ``cluster/_routing.py``).


@final
@attrs.frozen(kw_only=True)
class RunStart:
    """``run.start``: start ``agent`` on ``input``."""

    op: ClassVar[str] = "run.start"
    id: RequestId = 0
    agent: str = attrs.field(metadata=_NAME)
    input: tuple[Item, ...] = attrs.field(metadata=_spec(_items))
    session_id: str | None = attrs.field(
        default=None, metadata=_spec(_optional(_string(MAX_NAME_LENGTH)))
    )
    on_disconnect: Literal["continue", "cancel"] = attrs.field(
        default="continue", metadata=_spec(_choice("continue", "cancel"))
    )
    on_busy: Literal["reject", "interrupt", "enqueue"] = attrs.field(
        default="reject", metadata=_spec(_choice("reject", "interrupt", "enqueue"))
    )
    subscribe: Literal["all", "status"] | None = attrs.field(
        default=None, metadata=_spec(_choice("all", "status", None))
    )
    # The UsageLimits asked (null ones left out), capped by the server (_policies.py).
    limits: Mapping[str, int | float] | None = attrs.field(
        default=None, metadata=_spec(_optional(limits_from_wire))
    )


@final
@attrs.frozen(kw_only=True)
class RunCancel:
    """``run.cancel``."""

    op: ClassVar[str] = "run.cancel"
    id: RequestId = 0
    run_id: str = attrs.field(metadata=_NAME)
    reason: str | None = attrs.field(default=None, metadata=_OPTIONAL_TEXT)
    mode: Literal["immediate", "after_turn"] = attrs.field(
        default="immediate", metadata=_CANCEL_MODE
    )


@final
@attrs.frozen(kw_only=True)
class RunInject:
    """``run.inject``."""

    op: ClassVar[str] = "run.inject"
    id: RequestId = 0
    run_id: str = attrs.field(metadata=_NAME)
    items: tuple[Item, ...] = attrs.field(metadata=_spec(_items))
    when: Literal["next_turn", "now", "when_idle"] = attrs.field(
        default="next_turn", metadata=_spec(_choice("next_turn", "now", "when_idle"))
    )


@final
@attrs.frozen(kw_only=True)
class RunWithdraw:
    """``run.withdraw``."""

    op: ClassVar[str] = "run.withdraw"
    id: RequestId = 0
    run_id: str = attrs.field(metadata=_NAME)
    injection_id: str = attrs.field(metadata=_NAME)


@final
@attrs.frozen(kw_only=True)
class RunApprove:
    """``run.approve`` (``message`` is accepted and ignored; ``content``: the answer to
    a question that asks for some, ``ToolContext.request_approval(schema=...)``)."""

    op: ClassVar[str] = "run.approve"
    id: RequestId = 0
    run_id: str = attrs.field(metadata=_NAME)
    call_id: str = attrs.field(metadata=_NAME)
    message: str | None = attrs.field(default=None, metadata=_OPTIONAL_TEXT)
    content: Mapping[str, Any] | None = attrs.field(
        default=None, metadata=_spec(_optional(_json_object))
    )


@final
@attrs.frozen(kw_only=True)
class RunReject:
    """``run.reject``: the model reads ``message``."""

    op: ClassVar[str] = "run.reject"
    id: RequestId = 0
    run_id: str = attrs.field(metadata=_NAME)
    call_id: str = attrs.field(metadata=_NAME)
    message: str | None = attrs.field(default=None, metadata=_OPTIONAL_TEXT)


@final
@attrs.frozen(kw_only=True)
class RunSubscribe:
    """``run.subscribe``."""

    op: ClassVar[str] = "run.subscribe"
    id: RequestId = 0
    run_id: str = attrs.field(metadata=_NAME)
    from_seq: int | None = attrs.field(default=None, metadata=_spec(_seq))
    events: Literal["all", "status"] = attrs.field(
        default="all", metadata=_spec(_choice("all", "status"))
    )
    # The run's subtree, merged (DESIGN §17); from_seq must then be 0 or absent.
    tree: bool = attrs.field(default=False, metadata=_spec(_flag))


@final
@attrs.frozen(kw_only=True)
class RunUnsubscribe:
    """``run.unsubscribe`` (``tree``: the tree subscription to the run)."""

    op: ClassVar[str] = "run.unsubscribe"
    id: RequestId = 0
    run_id: str = attrs.field(metadata=_NAME)
    tree: bool = attrs.field(default=False, metadata=_spec(_flag))


@final
@attrs.frozen(kw_only=True)
class RunGet:
    """``run.get``."""

    op: ClassVar[str] = "run.get"
    id: RequestId = 0
    run_id: str = attrs.field(metadata=_NAME)


@final
@attrs.frozen(kw_only=True)
class RunsList:
    """``runs.list``: the roots of the principal's trees, or every node (``all``)."""

    op: ClassVar[str] = "runs.list"
    id: RequestId = 0
    all: bool = attrs.field(default=False, metadata=_spec(_flag))


@final
@attrs.frozen(kw_only=True)
class SessionCancel:
    """``session.cancel``: cancel the run that holds the session."""

    op: ClassVar[str] = "session.cancel"
    id: RequestId = 0
    session_id: str = attrs.field(metadata=_NAME)
    reason: str | None = attrs.field(default=None, metadata=_OPTIONAL_TEXT)
    mode: Literal["immediate", "after_turn"] = attrs.field(
        default="immediate", metadata=_CANCEL_MODE
    )


def _fork_at(name: str, value: Any) -> int | tuple[str, int] | None:
    """``at`` of ``session.fork``: null, an item index, or ``{"run_id", "seq"}``."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if not 0 <= value < 2**53:
            raise ValueError(f"{name} must be an item index >= 0 (below 2**53)")
        return value
    if isinstance(value, dict):
        if set(value) != {"run_id", "seq"}:
            raise ValueError(f"{name} as an event position must be {{'run_id', 'seq'}} only")
        run_id = _string(MAX_NAME_LENGTH)(f"{name}.run_id", value["run_id"])
        seq = value["seq"]
        if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < 2**53:
            raise ValueError(f"{name}.seq must be an integer >= 0 (below 2**53)")
        return (run_id, seq)
    raise ValueError(f"{name} must be null, an item index or {{'run_id', 'seq'}}")


@final
@attrs.frozen(kw_only=True)
class SessionFork:
    """``session.fork``: copy a prefix of the session (and its tree's child sessions)
    into a new session of the principal (DESIGN §23)."""

    op: ClassVar[str] = "session.fork"
    id: RequestId = 0
    session_id: str = attrs.field(metadata=_NAME)
    new_session_id: str = attrs.field(metadata=_NAME)
    at: int | tuple[str, int] | None = attrs.field(default=None, metadata=_spec(_fork_at))


Request: TypeAlias = (
    RunStart
    | RunCancel
    | RunInject
    | RunWithdraw
    | RunApprove
    | RunReject
    | RunSubscribe
    | RunUnsubscribe
    | RunGet
    | RunsList
    | SessionCancel
    | SessionFork
)
"""A validated request frame: one typed class per op."""

OPS: Final[Mapping[str, type[Request]]] = {
    cls.op: cls for cls in cast(tuple[type[Request], ...], get_args(Request))
}
"""Every op and its request class (fields validated by their ``check`` metadata)."""


# NUL and lone surrogates (valid JSON: "\u0000", "\ud800"): neither can be stored in
# PostgreSQL text (a cluster's tables), nor encoded as UTF-8 (a lone surrogate), so no
# request may hold one anywhere, in one process as in a cluster: the same answer
# everywhere, before any op looks at the value. A surrogate pair in JSON decodes to
# one character, so every surrogate code point left in a str is a lone one.
UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")


def unstorable(value: Any) -> bool:
    """Whether a string anywhere in ``value`` (a parsed JSON value) holds NUL or a lone
    surrogate. Iterative: the parser bounds the depth, this adds no recursion."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if UNSTORABLE.search(node):
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def reject_constant(name: str) -> Any:
    """``json.loads``'s ``parse_constant``: NaN and the infinities are not JSON."""
    raise ValueError(f"{name} is not valid JSON")


def parse_request(text: str | bytes) -> Request:
    """Parse and validate one request frame into its typed request class.

    Raises:
        ProtocolError: ``invalid_json`` (not JSON, or a binary frame),
            ``invalid_request`` (not an object, bad ``id``, missing/unknown/wrong
            fields) or ``unknown_op``. ``request_id`` is set once the id was read.
    """
    if not isinstance(text, str):
        raise ProtocolError("invalid_json", "binary frames are not accepted; send JSON text")
    try:
        data = json.loads(text, parse_constant=reject_constant)
    except RecursionError:
        raise ProtocolError("invalid_json", "JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError is a ValueError
        raise ProtocolError("invalid_json", f"not valid JSON: {exc}") from None
    return validate_request(data)


def validate_request(data: Any) -> Request:
    """Validate one request already parsed from JSON (a frame's object, or a REST body
    with its route's ``op`` and ``id``) into its typed request class: the one check of
    every wire face, run once, at the edge.

    Raises:
        ProtocolError: as :func:`parse_request`, ``invalid_json`` aside.
    """
    if not isinstance(data, dict):
        raise ProtocolError("invalid_request", "a request must be a JSON object")
    request_id = data.get("id")
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        raise ProtocolError("invalid_request", "id must be a string or an integer")
    if isinstance(request_id, str) and len(request_id) > MAX_ID_LENGTH:
        raise ProtocolError("invalid_request", f"id is longer than {MAX_ID_LENGTH} characters")
    if isinstance(request_id, int) and abs(request_id) >= 2**53:
        raise ProtocolError("invalid_request", "an integer id must be below 2**53")
    for key, value in data.items():
        if unstorable(key) or unstorable(value):
            where = "a field name" if unstorable(key) else repr(key[:64])
            raise ProtocolError(
                "invalid_request",
                f"{where} holds a NUL character or a lone surrogate (U+D800..U+DFFF):"
                " strings must be Unicode text without NUL",
                request_id,
            )
    op = data.get("op")
    if not isinstance(op, str):
        raise ProtocolError("invalid_request", "op must be a string", request_id)
    cls = OPS.get(op)
    if cls is None:
        shown = op if len(op) <= 64 else op[:61] + "..."
        raise ProtocolError("unknown_op", f"unknown op {shown!r}", request_id)
    fields = [f for f in attrs.fields(cast(Any, cls)) if f.name != "id"]
    unknown = sorted(set(data) - {f.name for f in fields} - {"id", "op"})
    if unknown:
        shown_fields = ", ".join(repr(name[:64]) for name in unknown[:5])
        raise ProtocolError(
            "invalid_request", f"unknown field(s) for {op}: {shown_fields}", request_id
        )
    values: dict[str, Any] = {}
    for field in fields:
        name = field.name
        if name not in data:
            if field.default is attrs.NOTHING:
                raise ProtocolError("invalid_request", f"{op} needs {name!r}", request_id)
            continue
        try:
            value = field.metadata["check"](name, data[name])
        except ValueError as exc:
            raise ProtocolError("invalid_request", str(exc), request_id) from None
        values[name] = value
    request: Request = cast(Any, cls)(id=request_id, **values)
    return request
