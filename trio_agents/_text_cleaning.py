"""Hostile text: a Python str may hold lone surrogates, which UTF-8 (every model API,
session and wire) cannot. What enters an item, an event or a record is cleaned here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["TextJoiner", "clean_text", "clean_value"]

_HIGH_SURROGATES = range(0xD800, 0xDC00)


def clean_text(text: str) -> str:
    """``text`` in a form every model API and session accepts: each surrogate pair
    joined into its character, each lone surrogate replaced by U+FFFD.

    A Python str can hold lone surrogates (``os.fsdecode`` of a non-UTF-8 file name,
    ``json.loads('"\\ud83d"')``, an emoji streamed as two escaped halves); UTF-8 cannot,
    so the next request's body (and every later one that sends the item) would fail to
    encode. NUL is kept: it is valid JSON (``\\u0000``), and the sessions store it
    escaped (PostgreSQL's ``TEXT`` could not hold it raw).

    The check costs one pass over text that is not ASCII (``str.isascii`` is a flag
    read), and the result is the same object when nothing needed repair.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # UTF-16 with surrogatepass writes each surrogate as the code unit it is; the
        # decoder then pairs what pairs and replaces what does not.
        return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def clean_value(value: Any) -> Any:
    """``value`` with :func:`clean_text` applied to every str in it, dict keys
    included, through nested dicts, lists and tuples (a JSON-like value: what a tool's
    ``ctx.progress(**data)`` or a status update's ``detail`` carries). Anything else
    is left as it is. A user's str that enters an event or a run record is cleaned
    where it enters, as items are: one lone surrogate in a published event would make
    every face that encodes it as UTF-8 (an SSE stream, a JSON answer) fail on it, for
    as long as the run is retained.

    A value nested too deeply to walk (``RecursionError``) is given back as it is: no
    JSON encoder can encode it either, so it meets the same refusal wherever it would
    be encoded (a cluster stores such an event as "could not be stored" and fails only
    its run), rather than a ``RecursionError`` out of the user's ``ctx.progress``.
    """
    try:
        return _clean_value(value)
    except RecursionError:
        return value


def _clean_value(value: Any) -> Any:
    # Exact types first: a str or a dict is what a detail or a payload holds, and
    # isinstance(x, Mapping) goes through ABCMeta.__instancecheck__ (two Python calls).
    kind = type(value)
    if kind is str:
        return value if value.isascii() else clean_text(value)
    if kind is dict:
        return {
            key if type(key) is str and key.isascii() else _clean_key(key): (
                item if type(item) is str and item.isascii() else _clean_value(item)
            )
            for key, item in value.items()
        }
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, Mapping):
        return {
            clean_text(key) if isinstance(key, str) else key: _clean_value(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_clean_value(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_clean_value(item) for item in value)
    return value


def _clean_key(key: Any) -> Any:
    return clean_text(key) if isinstance(key, str) else key


class TextJoiner:
    """Cleans a stream of text deltas as they arrive (:func:`clean_text` per delta).

    A server may split a character's surrogate pair across two deltas (``"\\ud83d"``
    then ``"\\ude00"``): a delta that ends with a high surrogate keeps it back until
    the next delta says whether its low half follows. The deltas given out, joined,
    equal :func:`clean_text` of the deltas taken in, joined (after :meth:`flush`).
    """

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = ""  # a high surrogate waiting for its low half

    def feed(self, text: str) -> str:
        """The clean text to give out now for the delta ``text`` (maybe "")."""
        if self.held:
            text = self.held + text
            self.held = ""
        if text and ord(text[-1]) in _HIGH_SURROGATES:
            self.held = text[-1]
            text = text[:-1]
        return clean_text(text)

    def flush(self) -> str:
        """At the end of the stream: a high surrogate still held is lone (U+FFFD)."""
        held, self.held = self.held, ""
        return clean_text(held)
