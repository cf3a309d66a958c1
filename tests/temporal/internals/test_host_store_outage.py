"""A TemporalHost's follower of the shared store (``_poll``) waits out a store that
fails (a database restart, a failover, a pool wait past its timeout) instead of dying
with it: it once let the ``RunStoreError`` out, which ended the host's task nursery and
so the whole server. Once the store answers again every subscriber is woken (writes
may have been missed). No Temporal server: the host's constructor connects nothing."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_agents.temporal import RunStoreError, TemporalHost
from trio_agents.temporal._trio_worker import _record_call

pytestmark = pytest.mark.trio


class FlakyStore:
    """The one store method the follower calls; down: it raises."""

    def __init__(self) -> None:
        self.version = 1
        self.down = False
        self.calls = 0

    async def data_version(self) -> int:
        await trio.lowlevel.checkpoint()
        self.calls += 1
        if self.down:
            raise RunStoreError("database db:5432/runs: connection refused")
        return self.version


async def test_the_follower_waits_out_a_store_outage_and_wakes_everyone_after(
    autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store = FlakyStore()
    host = TemporalHost("127.0.0.1:1", {}, store=store)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(host._poll)
        await trio.sleep(1)
        store.down = True
        woken = host._changed
        await trio.sleep(60)  # a minute down: the follower is still there, backing off
        assert not woken.is_set()
        looks = store.calls
        await trio.sleep(60)
        assert store.calls - looks <= 13  # backed off (every 5 s at most), not a busy loop
        store.down = False  # back, with nothing changed that the follower saw
        with trio.fail_after(10):
            await woken.wait()
        # Followed as before: a change is seen at the next look.
        woken = host._changed
        store.version += 1
        with trio.fail_after(1):
            await woken.wait()
        nursery.cancel_scope.cancel()
    messages = [record.getMessage() for record in caplog.records]
    assert sum("the run store failed" in m for m in messages) == 1  # once per outage
    assert sum("the run store answers again" in m for m in messages) == 1


class FlakyCalls:
    """``record_call`` failing ``failures`` times, then recording."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    async def record_call(self, root_id: str, attempt: int, call_id: str) -> bool:
        await trio.lowlevel.checkpoint()
        self.calls += 1
        if self.calls <= self.failures:
            raise RunStoreError("database db:5432/runs: the connection was lost")
        return True


async def test_a_tool_call_waits_out_a_store_blip_before_it_starts(autojump_clock: Any) -> None:
    """The before-tool barrier records the call in the store; a blip of the store is
    retried (a call id is recorded once, so a retry is safe), a long outage fails the
    call after a bounded wait."""
    store = FlakyCalls(failures=3)
    assert await _record_call(store, "r1", 1, "call_1")  # type: ignore[arg-type]
    assert store.calls == 4
    down = FlakyCalls(failures=10**6)
    started = trio.current_time()
    with pytest.raises(RunStoreError):
        await _record_call(down, "r1", 1, "call_1")  # type: ignore[arg-type]
    assert 25 <= trio.current_time() - started <= 30
