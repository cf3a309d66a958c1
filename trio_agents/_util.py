"""Small helpers shared by the run core and the control server (unit-tested on their own).

Exception groups: Trio's nurseries are strict (they wrap even a single error), so the
library boundary has to look inside groups. These helpers never unwrap a group that
holds several real errors; they only *describe* it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio

_T = TypeVar("_T")

__all__ = [
    "TextJoiner",
    "clean_text",
    "clean_value",
    "closing_listeners",
    "describe_error",
    "error_message",
    "first_leaf",
    "leaves",
    "only_cancelled",
    "send_within",
    "serving",
    "summarize",
]

_MAX_REASON = 500


def only_cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is a ``trio.Cancelled`` or a group (of groups) of nothing else."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(only_cancelled(e) for e in exc.exceptions)
    return False


def leaves(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc``, depth first (``[exc]`` for a plain one)."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    found: list[BaseException] = []
    for inner in exc.exceptions:
        found.extend(leaves(inner))
    return found


def first_leaf(exc: BaseException) -> BaseException:
    """The first non-group exception inside ``exc``."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


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


# ------------------------------------------------------------------- hostile text

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


@asynccontextmanager
async def serving(start: Callable[[trio.Nursery], Awaitable[_T]]) -> AsyncIterator[_T]:
    """Run a service for the duration of the block: ``start(nursery)`` starts it (and
    returns what the block gets); leaving the block cancels it, and the service's own
    graceful shutdown runs. An exception of the block propagates as itself (not in a
    group), as does one of the service; a group of nothing but ``Cancelled`` becomes its
    first ``Cancelled``. What ``open_control_server`` and ``LocalHost.running`` share."""
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            started = await start(nursery)
            try:
                yield started
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        others = [
            leaf
            for leaf in leaves(group)
            if leaf is not body_error and not isinstance(leaf, trio.Cancelled)
        ]
        if others:
            raise
        if body_error is not None:
            raise body_error from None
        raise first_leaf(group) from None


@asynccontextmanager
async def closing_listeners(listeners: Sequence[trio.SocketListener]) -> AsyncIterator[None]:
    """The body of a server on ``listeners``: a group of nothing but ``Cancelled`` leaves
    it as its first ``Cancelled`` (the cancellation that stopped the server), anything
    else as it is; the listeners are closed at the end, shielded, also when the server
    failed before it served them. What ``ControlServer.serve`` and ``serve_http`` share."""
    try:
        yield
    except BaseExceptionGroup as group:
        if only_cancelled(group):
            raise first_leaf(group) from None
        raise
    finally:
        with trio.CancelScope(shield=True):
            for listener in listeners:
                await listener.aclose()


async def send_within(
    inner: trio.abc.SendStream, data: bytes | bytearray | memoryview, bound: float
) -> bool:
    """``inner.send_all(data)`` bounded by ``bound`` seconds: True if it was sent; False if the
    peer read nothing for that long, and ``inner`` is then closed (shielded).
    An exception of the send propagates. The send of the websocket channel's
    ``GuardedStream`` and of the HTTP faces' listener; each marks itself broken on
    anything but True, so nothing is written after half a write."""
    with trio.move_on_after(bound) as timer:
        await inner.send_all(data)
    if not timer.cancelled_caught:
        return True
    with trio.CancelScope(shield=True):
        await inner.aclose()
    return False
