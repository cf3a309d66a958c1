"""Forking a conversation (DESIGN §23): what every session backend shares.

A fork copies a prefix of a session's items into a new session of the same store, cut
at a complete item boundary that never splits a tool call from its result, together
with the child sessions of the tree (``"<session id>/<call id>"``, DESIGN §17) whose
call is kept. The plan (what is kept, which children go where) is computed here, over
items already read; each backend reads and writes (``MemorySession`` at once on the
Trio thread, the stored sessions in one transaction, :func:`fork_session` for any other
session with ``with_id``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import attrs

from .._exceptions import TrioAgentsError
from .._items import Item, ToolCall, ToolResult
from ._base import Session
from ._dangling_calls import repair_loaded

__all__ = [
    "CALL",
    "RESULT",
    "ForkAt",
    "ForkPlan",
    "Marked",
    "SessionExistsError",
    "Shape",
    "check_at",
    "check_new_id",
    "fork_cut",
    "fork_plan",
    "fork_point",
    "fork_session",
    "kept_items",
    "marked_of",
    "shape_of",
]

ForkAt: TypeAlias = int | tuple[str, int] | None
"""Where a fork cuts: an item index (``items[:at]`` are kept), an event position
``(run_id, seq)`` (resolved by a host that knows the run), or None (everything)."""


class SessionExistsError(TrioAgentsError):
    """A fork's new session id (or the id one of its child sessions would take) already
    holds items in the store: nothing was written.

    Attributes:
        session_id: the id that holds items.
    """

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {session_id!r} already holds items: a fork never overwrites")
        self.session_id = session_id


def check_at(at: object) -> int | None:
    """``at`` as an item index (None: everything), checked.

    Raises:
        TypeError: not an int, None or a ``(run_id, seq)`` pair.
        ValueError: a negative index, or an event position (sessions store items, not
            the events that added them: a host resolves one, see ``RunHost.fork_session``).
    """
    if at is None:
        return None
    if isinstance(at, bool) or not isinstance(at, int | tuple):
        raise TypeError(f"at must be an int, a (run_id, seq) pair or None, not {type(at).__name__}")
    if isinstance(at, tuple):
        if len(at) != 2 or not isinstance(at[0], str) or not isinstance(at[1], int):
            raise TypeError(f"at must be an int, a (run_id, seq) pair or None, not {at!r}")
        raise ValueError(
            "a session stores items, not the events that added them: it cannot resolve the"
            f" event position {at!r}; fork at an item index, or ask the server that ran the"
            " run (POST /sessions/{id}/fork, trio-agents ctl fork), which resolves it"
        )
    if at < 0:
        raise ValueError(f"at must be >= 0, got {at}")
    return at


def check_new_id(source_id: str, new_session_id: object) -> str:
    """The new session id, checked: a non-empty str without NUL or lone surrogates
    (what every store can hold), other than the source's.

    Raises:
        TypeError: not a str.
        ValueError: empty, unstorable, or the source's own id.
    """
    if not isinstance(new_session_id, str):
        raise TypeError(f"new_session_id must be a str, not {type(new_session_id).__name__}")
    if not new_session_id:
        raise ValueError("new_session_id must not be empty")
    if re.search("[\x00\ud800-\udfff]", new_session_id):
        raise ValueError(
            f"new_session_id must not hold NUL or a lone surrogate: {new_session_id[:64]!r}"
        )
    if new_session_id == source_id:
        raise ValueError(f"cannot fork session {source_id!r} into itself")
    return new_session_id


CALL: Final = "function_call"
RESULT: Final = "function_call_output"

Shape: TypeAlias = tuple[str | None, str | None]
"""What a fork needs of a stored item: its JSON ``type`` and ``call_id`` (a call is
``"function_call"``, a result ``"function_call_output"``; a message has no call id).
A stored session reads them in the database, so a fork never decodes the items."""

Marked: TypeAlias = tuple[int, str | None, str]
"""A stored item that has a call id, as a fork reads it: ``(index, type, call_id)``.
Only these decide where a fork may cut: every other item (a message) is a boundary
whenever no call is open, so a stored session reads just the rows holding a call id
(in a 10,000-item session with few tool calls, a few rows)."""


def shape_of(item: Item) -> Shape:
    """The :data:`Shape` of an item (as its stored JSON has it)."""
    if type(item) is ToolCall:
        return (CALL, item.call_id)
    if type(item) is ToolResult:
        return (RESULT, item.call_id)
    return ("message", None)


def marked_of(shapes: Iterable[Shape]) -> list[Marked]:
    """The :data:`Marked` items among ``shapes`` (every item's, in order)."""
    return [
        (index, kind, call_id)
        for index, (kind, call_id) in enumerate(shapes)
        if call_id is not None
    ]


def fork_point(items: Sequence[Item], at: int | None = None) -> int:
    """The number of items a fork at ``at`` keeps: ``min(at, len(items))`` (all for
    None) rounded down until no kept tool call is without its result (so the kept
    items are valid model input whenever ``items`` is, at every boundary).

    Raises:
        TypeError, ValueError: ``at`` is not a non-negative int or None.
    """
    return fork_cut(len(items), marked_of(shape_of(item) for item in items), check_at(at))[0]


def fork_cut(count: int, marked: Sequence[Marked], at: int | None) -> tuple[int, bool]:
    """:func:`fork_point` over a session of ``count`` items whose items with a call id
    are ``marked`` (in index order), and whether the kept prefix is clean as stored (no
    orphan result, no call id used twice): if not, the kept items are repaired before
    they are written.

    Walks the marked items only: between two of them (and after the last) lie
    messages, each a boundary if no call is open there.
    """
    end = count if at is None else min(at, count)
    open_calls: set[str] = set()
    seen: set[str] = set()
    last_closed = 0
    clean_until = 0  # the prefix up to here is clean
    clean = True
    for index, kind, call_id in marked:
        if index >= end:
            break
        if not open_calls:
            # The messages before this item (if any) end with nothing open.
            last_closed = index
            if clean:
                clean_until = index
        if kind == CALL:
            if call_id in seen:
                clean = False  # the repair drops a call that reuses an id: it opens nothing
            else:
                seen.add(call_id)
                open_calls.add(call_id)
        elif kind == RESULT:
            clean = clean and call_id in open_calls
            open_calls.discard(call_id)
        if not open_calls:
            last_closed = index + 1
            if clean:
                clean_until = last_closed
    if not open_calls:
        last_closed = end  # the messages up to the end
        if clean:
            clean_until = end
    return last_closed, clean_until == last_closed


@attrs.frozen
class ForkPlan:
    """What a fork writes.

    Attributes:
        kept: how many stored items the new session keeps (:func:`fork_point`).
        clean: whether they are valid as stored (else they are written repaired).
        children: ``{old child session id: new child session id}`` for every
            descendant session whose call is kept (copied whole).
    """

    kept: int
    clean: bool
    children: Mapping[str, str]


def fork_plan(
    source_id: str,
    new_session_id: str,
    count: int,
    marked: Sequence[Marked],
    at: int | None,
    descendant_ids: Iterable[str],
) -> ForkPlan:
    """Plan a fork of the source's ``count`` stored items (those with a call id:
    ``marked``) and of its descendant sessions (ids starting ``"<source_id>/"``).

    A descendant belongs to the call whose id its path starts with: ``"<src>/<call>"``,
    ``"<src>/<call>.<n>"`` (the n-th child run of one call) or anything below those
    (``"<src>/<call>/..."``); the longest call id of the source's conversation that
    matches wins. It is copied (whole, under ``"<new>/..."``) when that call is kept;
    since the cut never splits a call from its result, a kept call's child run had
    ended: its session is complete.
    """
    kept, clean = fork_cut(count, marked, at)
    calls = [call_id for _, kind, call_id in marked if kind == CALL]
    kept_calls = {call_id for index, kind, call_id in marked if kind == CALL and index < kept}
    head = source_id + "/"
    children: dict[str, str] = {}
    descendants = [child_id for child_id in descendant_ids if child_id.startswith(head)]
    if descendants:
        longest_first = sorted(set(calls), key=len, reverse=True)
        for child_id in descendants:
            call = _owning_call(child_id[len(head) :], longest_first)
            if call is not None and call in kept_calls:
                children[child_id] = new_session_id + "/" + child_id[len(head) :]
    return ForkPlan(kept, clean, children)


def kept_items(items: Sequence[Item], plan: ForkPlan) -> list[Item]:
    """The new session's items: the kept prefix, repaired unless it is clean."""
    prefix = list(items[: plan.kept])
    return prefix if plan.clean else repair_loaded(prefix)


_NTH = re.compile(r"\.[0-9]+(?:/|$)")


def _owning_call(rest: str, calls_longest_first: Sequence[str]) -> str | None:
    """The call id ``rest`` (a descendant id after ``"<src>/"``) belongs to, if any."""
    for call in calls_longest_first:
        if not rest.startswith(call):
            continue
        tail = rest[len(call) :]
        if not tail or tail.startswith("/") or _NTH.match(tail):
            return call
    return None


async def fork_session(session: Session, new_session_id: str, *, at: ForkAt = None) -> Session:
    """Fork any session (DESIGN §23) by reading its items and writing them: the
    default for a :class:`Session` without a ``fork`` method of its own.

    Needs the session's ``with_id`` (the new session is ``session.with_id(new)``); its
    tree's child sessions are forked too when it has ``child_session_ids()`` (else only
    its own conversation is). The items are read with ``get_stored_items()`` when the
    session has it (the original is never written, not even a repair), else with
    ``get_items()``.

    Not one transaction: a run writing to the source meanwhile may add items the fork
    does not see, but never half an item (each ``add_items`` is atomic) and never a
    call without its result. The backends' own ``fork`` methods are consistent
    snapshots.

    Raises:
        TypeError: the session has no ``with_id``; a bad ``at`` or id type.
        ValueError: a bad ``at`` or new id (an event position included: see
            :func:`check_at`).
        SessionExistsError: the new id, or one of its child ids, already holds items.
    """
    new_session_id = check_new_id(session.session_id, new_session_id)
    index = check_at(at)
    if getattr(session, "with_id", None) is None:
        raise TypeError(
            f"{type(session).__name__} has no with_id(): a fork needs a new session in the"
            " same store"
        )
    items = await _read(session)
    list_children = getattr(session, "child_session_ids", None)
    descendants: list[str] = [] if list_children is None else list(await list_children())
    marked = marked_of(shape_of(item) for item in items)
    plan = fork_plan(session.session_id, new_session_id, len(items), marked, index, descendants)
    opened: list[Session] = []

    def open_id(base: Any, session_id: str) -> Session:
        made: Session = base.with_id(session_id)
        opened.append(made)
        return made

    try:
        target = open_id(session, new_session_id)
        writes: list[tuple[Session, list[Item]]] = [(target, kept_items(items, plan))]
        for old, new in plan.children.items():
            # The copy through the fork's with_id, the original through the source's:
            # a store that keeps a tree in the objects that made it has each where a
            # run of that tree looks for it.
            writes.append((open_id(target, new), await _read(open_id(session, old))))
        for each, _ in writes:
            if await each.get_items():
                raise SessionExistsError(each.session_id)
        for each, each_items in writes:
            if each_items:
                await each.add_items(each_items)
    except BaseException:
        for each in opened:
            await _close(each, session)
        raise
    for each in opened[1:]:
        await _close(each, session)
    return target


async def _read(session: Any) -> list[Item]:
    raw = getattr(session, "get_stored_items", None)
    items: list[Item] = await (raw() if raw is not None else session.get_items())
    return items


async def _close(session: Any, source: Session) -> None:
    """Close a session object the fork opened (never the source: ``with_id`` of a
    memory session may return it)."""
    aclose = getattr(session, "aclose", None)
    if aclose is not None and session is not source:
        await aclose()
