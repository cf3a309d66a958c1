"""Repairing a stored conversation so that a crashed run never poisons the next one.

A run persists items as they are finalised, so a process killed mid-tool leaves a
:class:`~trio_agents.ToolCall` with no :class:`~trio_agents.ToolResult`. Sent to a model
as is, that conversation is rejected. :func:`repair_loaded` closes such calls with a
``cancelled`` result and drops results that answer nothing, so the repaired list always
satisfies the validity invariant checked by :func:`~trio_agents.conversation_problems`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .._items import AssistantMessage, Item, ToolCall, ToolResult, UserMessage

__all__ = ["INTERRUPTED_OUTPUT", "repair_keeping_tail", "repair_loaded"]

INTERRUPTED_OUTPUT: Final = "cancelled: interrupted"
"""The output of the result :func:`repair_loaded` inserts for a call that was never answered."""


def repair_loaded(items: Iterable[Item]) -> list[Item]:
    """Return a repaired copy of a loaded conversation (``items`` is not modified).

    A *call group* is a run of consecutive tool calls and results between two messages.
    The repair walks the conversation once and, keeping the order of everything it keeps:

    - closes every dangling call (a :class:`~trio_agents.ToolCall` with no result in its
      group) with ``ToolResult(call_id, "cancelled: interrupted", status="cancelled")``,
      inserted at the end of the group: after its last item, before the next message (or
      at the end of the conversation). Several dangling calls get their results in call
      order;
    - drops results that answer no open call of their group: orphans (no such call),
      second results for the same call, and late results for a call that an earlier
      group already closed;
    - drops a tool call that reuses the id of an earlier call (ids must be unique).

    A conversation that already satisfies the invariant is returned unchanged, and the
    repair is idempotent: ``repair_loaded(repair_loaded(x)) == repair_loaded(x)``.

    Raises:
        TypeError: an element of ``items`` is not an item.
    """
    repaired, _ = repair_keeping_tail(items, close_tail=True)
    return repaired


def repair_keeping_tail(
    items: Iterable[Item], *, close_tail: bool = False
) -> tuple[list[Item], list[ToolCall]]:
    """:func:`repair_loaded`, except that with ``close_tail=False`` the calls left open
    in the conversation's last group are not closed: they are returned (in call order)
    for a resumed run to decide (run them again, or answer them ``interrupted``)."""
    repaired: list[Item] = []
    seen_calls: set[str] = set()
    # Calls of the current group that have no result yet, in call order.
    open_calls: dict[str, None] = {}
    for index, item in enumerate(items):
        if isinstance(item, ToolCall):
            if item.call_id in seen_calls:
                continue
            seen_calls.add(item.call_id)
            open_calls[item.call_id] = None
            repaired.append(item)
        elif isinstance(item, ToolResult):
            if item.call_id in open_calls:
                del open_calls[item.call_id]
                repaired.append(item)
        elif isinstance(item, UserMessage | AssistantMessage):
            _close_group(open_calls, repaired)
            repaired.append(item)
        else:
            raise TypeError(f"item {index}: expected an item, got {type(item).__name__}")
    if close_tail:
        _close_group(open_calls, repaired)
        return repaired, []
    calls = {item.call_id: item for item in repaired if isinstance(item, ToolCall)}
    return repaired, [calls[call_id] for call_id in open_calls]


def _close_group(open_calls: dict[str, None], repaired: list[Item]) -> None:
    """Answer every call still open in the group with a cancelled result."""
    repaired.extend(
        ToolResult(call_id, INTERRUPTED_OUTPUT, status="cancelled") for call_id in open_calls
    )
    open_calls.clear()
