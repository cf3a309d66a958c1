"""The run store's record of started tool calls and of where a run's attempt takes
pushed ops: both fenced by the attempt that owns the run (DESIGN §20).

A real SQLite file; no Temporal server needed: these are the store's own promises, the
ones a resumed attempt (no tool twice) and a host's direct cancel push rely on.
"""

from __future__ import annotations

from pathlib import Path

from trio_agents import RunStatus
from trio_agents.hosting import RunInfo
from trio_agents.temporal import RunStore


def _info(run_id: str) -> RunInfo:
    return RunInfo(
        run_id=run_id, agent="a", session_id="s", status=RunStatus.QUEUED, reason=None, seq=0
    )


async def test_calls_recorded_by_the_owner_reach_the_next_attempt_and_a_fenced_ones_do_not(
    tmp_path: Path,
) -> None:
    async with RunStore(tmp_path / "runs.db") as store:
        first = await store.claim_attempt("r1", "p", "s", 1, _info("r1"), address="h:1")
        assert first.owned
        assert first.started == ()
        assert await store.record_call("r1", 1, "call-a")
        assert await store.record_call("r1", 1, "call-a")  # a repeat is harmless
        assert await store.record_call("r1", 1, "call-b")

        second = await store.claim_attempt("r1", "p", "s", 2, _info("r1"), address="h:2")
        assert second.owned
        assert second.started == ("call-a", "call-b")
        # The first attempt (a thawed worker) is fenced: its call is not recorded, so it
        # can never look started to anyone.
        assert not await store.record_call("r1", 1, "call-late")
        assert await store.record_call("r1", 2, "call-c")

        third = await store.claim_attempt("r1", "p", "s", 3, _info("r1"))
        assert third.started == ("call-a", "call-b", "call-c")
        # Another run's calls are its own.
        other = await store.claim_attempt("r2", "p", "s2", 1, _info("r2"))
        assert other.started == ()


async def test_the_push_address_is_the_owning_attempts_only(tmp_path: Path) -> None:
    async with RunStore(tmp_path / "runs.db") as store:
        assert await store.place_of("r1") is None
        await store.claim_attempt("r1", "p", None, 1, _info("r1"), address="h:1")
        assert await store.place_of("r1") == "h:1"
        # A stale attempt's claim is refused and leaves the address alone.
        await store.claim_attempt("r1", "p", None, 2, _info("r1"), address="h:2")
        stale = await store.claim_attempt("r1", "p", None, 1, _info("r1"), address="h:9")
        assert not stale.owned
        assert await store.place_of("r1") == "h:2"
        # An owner that recorded no address has none: not its predecessor's.
        await store.claim_attempt("r1", "p", None, 3, _info("r1"))
        assert await store.place_of("r1") is None
