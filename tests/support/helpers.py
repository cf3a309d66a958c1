"""Shared helpers for the test suite."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hypothesis import settings

import trio_agents as ta

F = TypeVar("F", bound=Callable[..., Any])

EXAMPLES_RUN = [0]


def count_example() -> None:
    """Count one lifecycle example (reported at the end of the session)."""
    EXAMPLES_RUN[0] += 1


def lifecycle_settings(*, weight: float) -> Callable[[F], F]:
    """``max_examples`` as a multiple of the active profile's (ci: 100, fuzz: 3000)."""
    return settings(max_examples=max(5, int(settings().max_examples * weight)))


async def collect(run: ta.Run, from_seq: int | None = None) -> list[ta.RunEvent]:
    """Read a run's events to the end."""
    return [event async for event in run.events(from_seq)]


def statuses(events: Sequence[ta.RunEvent]) -> list[str]:
    return [e.status.value for e in events if isinstance(e, ta.RunUpdated)]


# What a repaired call's result says (docs/sessions.md "Repair on load"): written out
# here, not imported from the private module, so a change to it shows up as a test diff.
INTERRUPTED_OUTPUT = "cancelled: interrupted"


# A question with a form, asked mid-call (the host conformance suite and the cluster's
# routed questions ask it).
SEAT_FORM = {
    "type": "object",
    "properties": {"seat": {"type": "string", "enum": ["aisle", "window"]}},
    "required": ["seat"],
}


@ta.function_tool
async def book(ctx: ta.ToolContext) -> str:
    """Book a seat once a person picked one (a question with a form, mid-call)."""
    decision = await ctx.request_approval("Which seat?", schema=SEAT_FORM)
    return f"approved={decision.approved} content={decision.content}"
