"""What the stored sessions (:class:`SQLiteSession`, :class:`PostgresSession`) share
below their common face (``_stored_session.py``): their error, how an item becomes a
row and back, and their limiters."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

import trio

from .._exceptions import TrioAgentsError
from .._items import AssistantMessage, Item, ToolCall, ToolResult, UserMessage, item_from_json

__all__ = [
    "SessionStorageError",
    "check_session_id",
    "decode_item",
    "decode_rows",
    "encode_items",
    "run_limiter",
]

K = TypeVar("K", bound=Hashable)

_ITEM_TYPES = (UserMessage, AssistantMessage, ToolCall, ToolResult)


class SessionStorageError(TrioAgentsError):
    """A session database could not be opened, read or written.

    Raised for files that are not SQLite databases, databases that are not session
    databases, databases written by a newer trio_agents, failed migrations, stored items
    that cannot be read back, and errors of the database itself (a SQLite file locked
    past ``busy_timeout``, a PostgreSQL lock or statement timeout, a lost connection, a
    full disk, ...). Nothing is ever rewritten to "fix" it.

    Attributes:
        path: the SQLite database file, when known.
        session_id: the session concerned, when the error is about one session.
        position: the position of the unreadable item, for an unreadable item.
        database: the PostgreSQL database as ``host:port/dbname`` (never the password),
            for a :class:`~trio_agents.sessions.PostgresSession`.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        session_id: str | None = None,
        position: int | None = None,
        database: str | None = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.session_id = session_id
        self.position = position
        self.database = database


def check_session_id(_instance: object, _attribute: object, value: object) -> None:
    """An attrs validator: a session id is a non-empty str that a database can store.

    Refused up front rather than failing every later call: a lone surrogate (SQLite and
    PostgreSQL take UTF-8, which cannot encode one: a raw ``UnicodeEncodeError`` at each
    statement) and NUL (PostgreSQL's text cannot hold it)."""
    if not isinstance(value, str):
        raise TypeError(f"session_id must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError("session_id must not be empty")
    if "\x00" in value:
        raise ValueError(f"session_id must not contain NUL: {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"session_id must be encodable as UTF-8 (a lone surrogate at {exc.start}): {value!r}"
        ) from None


def encode_items(items: Sequence[Item]) -> list[str]:
    """Serialise items to JSON text, checking every element is an item first.

    Raises:
        TypeError: an element is not an item (nothing is encoded).
    """
    encoded: list[str] = []
    for index, item in enumerate(items):
        if not isinstance(item, _ITEM_TYPES):
            raise TypeError(f"item {index}: expected an item, got {type(item).__name__}")
        # ensure_ascii (the default) keeps any str storable: lone surrogates, and NUL,
        # which PostgreSQL's text type cannot hold, become \\u escapes.
        encoded.append(json.dumps(item.to_json(), separators=(",", ":")))
    return encoded


def decode_item(data: str) -> Item:
    """Read a row's JSON text back into an item.

    Raises:
        TypeError, ValueError, RecursionError: the text is not an item's JSON.
    """
    return item_from_json(json.loads(data))


def decode_rows(
    rows: Iterable[tuple[int, str]],
    where: str,
    session_id: str,
    error: Callable[..., SessionStorageError],
) -> list[Item]:
    """Decode ``(position, data)`` rows into items, oldest first.

    Raises:
        SessionStorageError: (made by ``error``) a row is not an item; the message
            names the session, ``where`` it is stored, and the row's position.
    """
    items: list[Item] = []
    for position, data in rows:
        try:
            items.append(decode_item(data))
        except (TypeError, ValueError, RecursionError) as exc:
            raise error(
                f"session {session_id!r} in {where}: the item at"
                f" position {position} cannot be read: {exc}",
                session_id=session_id,
                position=position,
            ) from exc
    return items


def run_limiter(
    var: trio.lowlevel.RunVar[dict[K, trio.CapacityLimiter]], key: K, size: int
) -> trio.CapacityLimiter:
    """The limiter (of ``size``) for ``key`` in this Trio run, kept in ``var``: one per
    database file or pool, shared by every session on it in the run."""
    try:
        limiters = var.get()
    except LookupError:
        limiters = {}
        var.set(limiters)
    limiter = limiters.get(key)
    if limiter is None:
        limiter = limiters[key] = trio.CapacityLimiter(size)
    return limiter
