"""What PostgreSQL can store, for the values the cluster writes to its tables.

PostgreSQL's ``text`` holds no NUL, and UTF-8 (the client encoding) cannot encode a
lone surrogate; ``jsonb`` refuses both as ``\\u`` escapes. A row holding one fails its
whole statement (``DataError``) or, before it is sent, its encoding
(``UnicodeEncodeError``). The control channel refuses such strings from clients
(``invalid_request``), but a run's own values can hold them too — a model's error
message in a failure reason, text a tool or an application passes on — and must
never stop a node's writer. Where the cluster keeps JSON as ``text`` (events, session
items, commands, ``options``) it is ASCII-escaped JSON, so those characters are stored
faithfully; :func:`storable` is for the plain ``text`` columns (a run's ``reason``)
and the JSON that ``::jsonb`` casts read (a cancel's reason, a decision's message).
"""

from __future__ import annotations

import re
from typing import Any, Final, overload

import psycopg

__all__ = ["REPLACEMENT", "refused", "storable", "storable_json"]

REPLACEMENT: Final = "\ufffd"
"""What NUL and lone surrogates become in a plain ``text`` column."""

_UNSTORABLE: Final = re.compile("[\x00\ud800-\udfff]")


@overload
def storable(text: str) -> str: ...
@overload
def storable(text: str | None) -> str | None: ...
def storable(text: str | None) -> str | None:
    """``text`` with each NUL and lone surrogate replaced by U+FFFD (None stays None).
    A surrogate pair never occurs in a Python str (it is one character), so every
    surrogate code point in one is a lone one."""
    if text is None:
        return text
    return _UNSTORABLE.sub(REPLACEMENT, text)


def storable_json(value: Any) -> Any:
    """A JSON value (dicts, lists, scalars) with :func:`storable` applied to every
    string in it, keys included, for JSON that a ``::jsonb`` cast will read."""
    if isinstance(value, str):
        return storable(value)
    if isinstance(value, dict):
        return {storable(str(k)): storable_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(v) for v in value]
    return value


def refused(exc: BaseException) -> bool:
    """Whether the database refused a value of the statement (``ClusterDown`` from a
    ``DataError``: NUL, an encoding, a malformed value): retrying cannot help. Anything
    else is retried: the database unreachable, busy or timing out, or refusing for a
    while (a trigger, a full disk) until an operator heals it."""
    return isinstance(exc.__cause__, psycopg.DataError)
