"""Tool-call ids: unique within a conversation, whatever ids a server sends."""

from __future__ import annotations

from collections.abc import Iterable
from typing import final

__all__ = ["CallIds"]


@final
class CallIds:
    """Keeps the tool-call ids of one response unique within the conversation.

    Some servers reuse ids: a proxy's mock that answers every turn with the same fixed
    id, small servers that number calls ``call_0``, ``call_1``, ... afresh in each
    response. The conversation needs unique ids (DESIGN §4), so a call whose id is
    already taken (by an item of the request, or by an earlier call of the same
    response) gets ``"<id>_<n>"`` with the smallest ``n >= 2`` that is free. It is
    deterministic, keeps the server's id recognisable, and stays within the
    ``[A-Za-z0-9_-]`` alphabet the strictest APIs accept. The new id is what the
    conversation stores and what later requests send, so the server sees consistent
    ids.
    """

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self._taken = set(taken)

    def unique(self, call_id: str) -> str:
        """Return ``call_id``, or a fresh id derived from it if it is taken; either
        way the returned id is taken from now on."""
        candidate = call_id
        number = 2
        while candidate in self._taken:
            candidate = f"{call_id}_{number}"
            number += 1
        self._taken.add(candidate)
        return candidate
