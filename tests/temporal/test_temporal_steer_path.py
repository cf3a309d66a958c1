"""A steering op through the TemporalHost (issue 38's T2 inject): the host sends the
``steer`` update to the root's workflow; the root of a run it started, or has steered,
is known without a read of the shared store (whose reads queue behind the host's own
polls of it). Real dev server, an embedded worker; every wait is bounded; none measures
time."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

import trio_agents as ta
from tests.support.temporal_support import GatedAgent, embedded_temporal_host
from trio_agents.hosting import HostError, Limits, Origin, StartRequest

LIMITS = Limits(start_rate=1_000, start_burst=1_000, max_runs_per_principal=1_000)
ALICE = Origin(principal="alice")


async def test_a_run_started_here_is_steered_without_reading_its_root_from_the_store(
    temporal_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gated = GatedAgent()
    called, gate, agents = gated.called, gated.gate, gated.agents
    start = StartRequest(agent="a", input=(ta.UserMessage("go"),))
    read: list[str] = []
    with trio.fail_after(90):
        async with embedded_temporal_host(
            temporal_server, tmp_path / "sessions.sqlite3", agents, LIMITS
        ) as host:
            store = host.store
            looked_up = store.root_of

            async def root_of(principal: str, run_id: str) -> str | None:
                read.append(run_id)
                return await looked_up(principal, run_id)

            monkeypatch.setattr(store, "root_of", root_of)
            run_id = await host.start(ALICE, start)
            await called.wait()
            # The root of a run this host started is known: the store (whose reads queue
            # behind the host's own polls of it) is not asked on the way to Temporal.
            first = await host.inject("alice", run_id, (ta.UserMessage("one"),))
            second = await host.inject("alice", run_id, (ta.UserMessage("two"),))
            # Another principal's op is still refused: its key is not the starter's.
            with pytest.raises(HostError) as refused:
                await host.inject("bob", run_id, (ta.UserMessage("three"),))
            gate.set()
            assert (await host.wait_terminal("alice", run_id)).status == "completed"
    assert first != second
    assert not first.startswith("pending-")
    assert refused.value.code == "not_found"
    assert read == [run_id]  # bob's op only
