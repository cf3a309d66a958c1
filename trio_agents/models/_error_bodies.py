"""Error bodies: what a provider's error response says, as a one-line :class:`ModelError`.

Servers describe errors in a handful of shapes (OpenAI's ``{"error": {...}}``, Ollama's
``{"error": "..."}``, FastAPI's ``{"detail": ...}``, plain text); :func:`parse_error_body`
reads them all into an :class:`ErrorInfo`, and :func:`http_error` /
:func:`stream_error` build the error a run sees, retryable unless the body blames the
request (:attr:`ErrorInfo.permanent`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

import attrs

from .._exceptions import ModelError
from ._retry import RETRYABLE_STATUS

__all__ = [
    "PERMANENT_KINDS",
    "ErrorInfo",
    "describe_exception",
    "error_detail",
    "http_error",
    "not_streamed_detail",
    "one_line",
    "parse_error_body",
    "stream_error",
]


def one_line(text: str, limit: int = 500) -> str:
    """``text`` on one line: runs of whitespace (newlines included) become one space,
    and more than ``limit`` characters are cut with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"


_NO_VALUE: Final = frozenset({"", "none", "null", "nil", "undefined"})

PERMANENT_KINDS: Final = (
    "invalid_request",
    "bad_request",
    "badrequest",
    "validation",
    "unprocessable",
    "context_length",
    "invalid_prompt",
    "invalid_api_key",
    "insufficient_quota",
    "authentication",
    "permission",
    "not_found",
    "notfound",
)
"""Error ``type``/``code`` fragments that say retrying the same request cannot help."""

_PERMANENT_MESSAGE: Final = re.compile(
    r"validation errors?\b|\binput should be\b|\bfield required\b"
    r"|failed to parse messages|invalid message content|invalid tool call arguments"
    r"|maximum context length|exceeds? (?:the )?context (?:window|length)",
    re.IGNORECASE,
)
"""Messages that are a schema-validation report or a context overflow: the request's fault."""


@attrs.frozen
class ErrorInfo:
    """What an error response body says.

    Attributes:
        kind: the error's ``type`` (or, without one, its ``code``), if it names one;
            placeholders such as ``"None"`` and a code equal to the HTTP status are
            not kinds.
        message: the server's message, on one line.
        permanent: the body says that sending the same request again cannot succeed
            (see :func:`parse_error_body`).
    """

    kind: str | None = None
    message: str | None = None
    permanent: bool = False

    def describe(self) -> str:
        """``"<kind>: <message>"``, or whichever of the two is there (may be empty)."""
        if self.kind and self.message:
            return f"{self.kind}: {self.message}"
        return self.kind or self.message or ""


def _kind_text(value: object, status: int | None) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, str):
        text = one_line(value, 100)
    else:
        return None
    if text.lower() in _NO_VALUE or (status is not None and text == str(status)):
        return None
    return text


def _kind_is_permanent(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if isinstance(value, int):
        return 400 <= value < 500 and value not in RETRYABLE_STATUS
    if isinstance(value, str):
        text = value.lower().replace("-", "_").replace(" ", "_")
        return any(fragment in text for fragment in PERMANENT_KINDS)
    return False


def parse_error_body(body: bytes, status: int | None = None) -> ErrorInfo:
    """Read an error response body (or an error event's JSON) into an :class:`ErrorInfo`.

    Understands ``{"error": {"type" | "code": ..., "message": ...}}`` (OpenAI,
    Anthropic, llama.cpp, llama-cpp-python, LiteLLM, vLLM), the same fields at the top
    level (older vLLM), ``{"error": "..."}`` (Ollama, TGI), ``{"detail": ...}``
    (FastAPI) and ``{"message": ...}``; otherwise the body's text is the message.

    ``permanent`` — the rule for not retrying a 5xx (or a 429): the body *blames the
    request*. That is an error ``type`` or ``code`` containing one of
    :data:`PERMANENT_KINDS` (``invalid_request_error``, ``BadRequestError``,
    ``context_length_exceeded``, ``insufficient_quota``, ...), a numeric ``code`` in
    400-499 other than 408/429, or a message that is a schema-validation report or a
    context overflow (pydantic's ``validation error``/``Input should be``/``Field
    required``, llama.cpp's ``Failed to parse messages``, ``maximum context length``).
    llama-cpp-python, for one, answers a request that fails its schema with HTTP 500
    and pydantic's report: the same request fails the same way every time.
    """
    text = body.decode("utf-8", errors="replace").strip()
    if not text:
        return ErrorInfo()
    try:
        data = json.loads(text)
    except ValueError:
        flat = one_line(text)
        return ErrorInfo(None, flat, bool(_PERMANENT_MESSAGE.search(flat)))
    if not isinstance(data, dict):
        return ErrorInfo(None, one_line(text))
    fields: Mapping[str, Any] = data
    error = data.get("error")
    if isinstance(error, dict):
        fields = error
    raw_message: object = fields.get("message")
    if isinstance(error, str) and error:
        raw_message = error
    if not raw_message:
        raw_message = data.get("detail") or data.get("message")
    if isinstance(raw_message, str):
        message: str | None = one_line(raw_message) or None
    elif raw_message:
        message = one_line(json.dumps(raw_message, ensure_ascii=False))
    else:
        message = None
    kinds = [fields.get("type"), fields.get("code"), data.get("error_type")]
    kind = next((k for k in (_kind_text(v, status) for v in kinds) if k), None)
    permanent = any(_kind_is_permanent(v) for v in kinds) or bool(
        message and _PERMANENT_MESSAGE.search(message)
    )
    if message is None and kind is None:
        message = one_line(text)
    return ErrorInfo(kind, message, permanent)


def error_detail(body: bytes, status: int | None = None) -> str | None:
    """The provider's error, as ``"<type or code>: <message>"`` on one line (``None``
    for an empty body); see :func:`parse_error_body`."""
    return parse_error_body(body, status).describe() or None


def http_error(label: str, status: int, body: bytes) -> ModelError:
    """The :class:`ModelError` for an HTTP error response, with a one-line message:
    ``"<label>: HTTP <status> <type or code>: <message>"``.

    Retryable: 408, 429 and 5xx, unless the body blames the request
    (:attr:`ErrorInfo.permanent`).
    """
    info = parse_error_body(body, status)
    message = f"{label}: HTTP {status}"
    if info.kind:
        message += f" {info.kind}"
    if info.message:
        message += f": {info.message}"
    elif not info.kind:
        message += " with an empty body"
    retryable = (status in RETRYABLE_STATUS or status >= 500) and not info.permanent
    return ModelError(message, status_code=status, retryable=retryable)


def stream_error(provider: str, data: Mapping[str, Any], *, retryable: bool) -> ModelError:
    """The :class:`ModelError` for an error object a server sent inside the stream."""
    info = parse_error_body(json.dumps(data).encode())
    detail = info.describe() or "error"
    return ModelError(
        f"{provider}: the server sent an error in the stream: {detail}",
        retryable=retryable and not info.permanent,
    )


def not_streamed_detail(body: bytes, status: int) -> str:
    """What to say about a JSON body that came where an event stream was expected.

    Only a body that *is* an error (an ``"error"`` member, or Anthropic's
    ``{"type": "error", ...}``) is read as one. Anything else — a whole non-streamed
    answer, say Anthropic's ``{"type": "message", ...}`` — is quoted, cut to a few
    hundred characters: its ``type`` names what it is, not an error.
    """
    text = body.decode("utf-8", errors="replace")
    if not text.strip():
        return "an empty body"
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and (data.get("error") or data.get("type") == "error"):
        detail = error_detail(body, status)
        if detail:
            return detail
    return repr(one_line(text, 300))


def describe_exception(exc: BaseException) -> str:
    """``"<class name>: <message on one line>"`` (the class name alone without a message)."""
    text = one_line(str(exc))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
