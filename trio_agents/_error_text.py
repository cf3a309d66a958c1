"""How an exception reads in a run's reason, a tool's error result or a log line: one
line, never raising, whatever the exception's ``__str__`` does (it is user code)."""

from __future__ import annotations

import trio

from ._exception_groups import leaves
from ._text_cleaning import clean_text

__all__ = ["describe_error", "error_message", "summarize"]

_MAX_REASON = 500


def error_message(exc: BaseException) -> str:
    """``str(exc)``, which is user code: one whose ``__str__`` raises (or returns no
    str) must not turn the report of an error into a new one."""
    try:
        text = str(exc)
    except Exception as inner:
        return f"<str() raised {type(inner).__name__}>"
    return clean_text(text)


def describe_error(exc: BaseException) -> str:
    """``"Type: message"`` (``"Type"`` without a message), safe for any exception."""
    text = " ".join(error_message(exc).split())  # one line, whatever the message held
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _one(exc: BaseException) -> str:
    if isinstance(exc, trio.Cancelled):  # only summarised when nothing asked for it
        return "a stray trio.Cancelled"
    return describe_error(exc)


def summarize(exc: BaseException) -> str:
    """A one-line summary of an error for ``RunResult.reason`` (at most 500 chars).

    Groups are described by what is inside them, never by the group's own message:
    one real error reads as that error; several read as ``"2 errors: A: x; B: y"``.
    ``trio.Cancelled`` leaves are left out when real errors sit beside them.
    """
    found = leaves(exc)
    real = [e for e in found if not isinstance(e, trio.Cancelled)] or found
    if len(real) == 1:
        summary = _one(real[0])
    else:
        summary = f"{len(real)} errors: " + "; ".join(_one(e) for e in real)
    return summary if len(summary) <= _MAX_REASON else summary[: _MAX_REASON - 3] + "..."
