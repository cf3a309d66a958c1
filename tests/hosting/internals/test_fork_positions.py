"""Resolving a fork's event position ``(run_id, seq)`` from a run's ``run.item`` events
(DESIGN §23), as the cluster and Temporal hosts do: each event carries its item's index
in the run's conversation (its position in the session)."""

from __future__ import annotations

import pytest
import trio

import trio_agents as ta
from trio_agents.hosting._error_codes import ProtocolError
from trio_agents.hosting._session_fork import item_index_of, item_position
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import MemorySession, fork_point


@ta.function_tool
async def look(q: str) -> str:
    """Look."""
    await trio.lowlevel.checkpoint()
    return q


async def test_every_seq_of_a_second_run_resolves_to_what_its_session_held() -> None:
    """Two runs on one session; for every seq of the second, the position resolved from
    its events' JSON is what the session held once that event was applied."""
    session = MemorySession("s")
    model = ScriptedModel(
        ["first answer", Turn(tool_calls=[("look", {"q": "a"})]), "second answer"]
    )
    agent = ta.Agent(name="a", model=model, tools=[look])
    await ta.run(agent, "one", session=session)
    async with ta.open_run(agent, "two", session=session) as run:
        pass
    events = [e.to_json() async for e in run.events()]
    items = [(e["seq"], item_index_of(e)) for e in events if e["type"] == "run.item"]
    stored = await session.get_items()
    assert [index for _, index in items] == list(range(2, len(stored)))
    for seq in range(1, events[-1]["seq"] + 2):
        applied = 2 + sum(1 for s, _ in items if s <= seq)
        assert item_position(run.id, seq, items) == applied
        assert fork_point(stored, applied) <= applied


def test_a_run_without_items_or_indexes_is_refused_clearly() -> None:
    with pytest.raises(ProtocolError, match="added no item") as info:
        item_position("r", 3, [])
    assert info.value.code == "invalid_request"
    with pytest.raises(ProtocolError, match="do not say where its items are"):
        item_position("r", 3, [(2, None), (4, None)])
    assert item_index_of({"index": True}) is None
    assert item_index_of({"index": 7}) == 7
