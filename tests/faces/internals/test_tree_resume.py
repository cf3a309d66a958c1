"""The re-attach of a tree stream by ``Last-Event-ID: <run_id>:<seq>`` (a private
contract of ``trio_agents.faces._rest``): resume right after the named event, or say
``events.dropped`` and give what is retained when it is gone."""

from __future__ import annotations

from collections.abc import AsyncIterator

from trio_agents.faces._rest import _resume_tree
from trio_agents.hosting import HostedEvent


def _event(run_id: str, seq: int) -> HostedEvent:
    return HostedEvent(run_id, seq, {"type": "run.item", "run_id": run_id, "seq": seq})


async def _replay(events: list[HostedEvent]) -> AsyncIterator[HostedEvent]:
    for event in events:
        yield event


async def _resumed(
    events: list[HostedEvent], after: tuple[str, int], bound: int = 100
) -> list[str]:
    out = []
    async for event in _resume_tree(_replay(events), after, bound):
        kind = event.event["type"]
        out.append("dropped" if kind == "events.dropped" else f"{event.run_id}:{event.seq}")
    return out


TREE = [_event("r", 1), _event("c", 1), _event("r", 2), _event("c", 2), _event("r", 3)]


async def test_resumes_right_after_the_named_event() -> None:
    assert await _resumed(TREE, ("c", 1)) == ["r:2", "c:2", "r:3"]
    assert await _resumed(TREE, ("r", 3)) == []


async def test_a_named_event_no_longer_retained_says_dropped_then_gives_the_rest() -> None:
    retained = TREE[2:]  # r:1 and c:1 were trimmed
    assert await _resumed(retained, ("c", 1)) == ["dropped", "r:2", "c:2", "r:3"]


async def test_an_event_never_seen_gives_up_after_the_bound() -> None:
    assert await _resumed(TREE, ("x", 9), bound=2) == ["dropped", "r:1", "c:1", "r:2", "c:2", "r:3"]
    assert await _resumed(TREE, ("x", 9)) == ["dropped", "r:1", "c:1", "r:2", "c:2", "r:3"]
