"""A run taken over while queued for its session, cancelled as the session frees
(issue 30, item 2): the node that took it over stays up.

The nodes are ControlServers in one Trio process on the suite's real PostgreSQL
(tests/support/cluster_support.py). One window is widened deterministically, as
test_cluster_crash_and_partition.py does: the claim of the queued run's session, on the node that
took it over, completes only once the run was cancelled and its task ended — the
order in which a cancel arriving as the session frees lands on a loaded node.
"""

from __future__ import annotations

from typing import Any, Final

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_nodes import host_registry
from tests.support.cluster_support import client, node
from tests.support.process_cluster import open_cluster, poll_until, wait_status
from trio_agents.models import ScriptedModel, Turn

BOUND: Final = 60.0  # a hang guard


def _agents() -> dict[str, ta.Agent]:
    @ta.function_tool(needs_approval=True)
    async def delete() -> str:
        """Delete something once approved."""
        await trio.lowlevel.checkpoint()
        return "deleted"

    model = ScriptedModel([], default=Turn(tool_calls=[("delete", {})]))
    return {"a": ta.Agent(name="a", instructions="", model=model, tools=[delete])}


async def _until(predicate: Any) -> None:
    """Poll state nothing signals (another node's rows, a session's closing)."""
    while not predicate():  # noqa: ASYNC110 (no event to wait for)
        await trio.sleep(0.02)


async def test_a_taken_over_queued_run_cancelled_as_its_session_frees(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node used to crash: the takeover's input was written to the session of a
    run that had ended (``ClosedResourceError: this PostgresSession is closed``
    escaped into the server's nursery)."""
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, _agents(), pg_dsn, "A", lease_ttl=0.5) as a,
            node(nursery, _agents(), pg_dsn, "B", lease_ttl=0.5) as b,
            client(a.url) as ca,
            client(b.url) as cb,
        ):
            with trio.fail_after(BOUND):
                # The holder waits for an approval on B; a second run is queued
                # behind it for the session, on A. (The holder is not taken over
                # itself: a takeover's order against a queued run is issue 30's item 3.)
                holder = str(await cb.start_run(agent="a", input="x", session_id="s"))
                await cb.ok("run.subscribe", run_id=holder)
                queued = str(
                    await ca.start_run(agent="a", input="y", session_id="s", on_busy="enqueue")
                )
                await cb.wait_status(holder, "awaiting_approval")
                await cb.ok("run.subscribe", run_id=queued)
                await cb.wait_status(queued, "queued")

                registry = host_registry(b)
                real_claim = b.cluster._node.claim_queued

                async def claim_queued(**kwargs: Any) -> bool:
                    claimed = await real_claim(**kwargs)
                    if kwargs["run_id"] == queued and claimed:
                        # The run is cancelled as its session frees: it ends (and its
                        # session is closed) before the claim's next step.
                        entry = registry.runs[queued]
                        assert entry.run is not None
                        entry.run.cancel("cancelled as the session freed")
                        await entry.run.wait()
                        await _until(lambda: entry.log.session.inner._closed)
                    return claimed

                monkeypatch.setattr(b.cluster._node, "claim_queued", claim_queued)
                a.crash()  # B takes the queued run over once A's lease expires
                await _until(lambda: queued in registry.runs)  # queued again, on B
                await cb.ok("run.cancel", run_id=holder, reason="free the session")
                assert (await cb.wait_terminal(holder))["event"]["status"] == "cancelled"
                ended = (await cb.wait_terminal(queued))["event"]
                assert ended["status"] == "cancelled", ended
                # B is still up and serving.
                info = (await cb.ok("run.get", run_id=queued))["run"]
                assert info["status"] == "cancelled"
                again = str(await cb.start_run(agent="a", input="z", session_id="t"))
                await cb.ok("run.subscribe", run_id=again)
                await cb.wait_status(again, "awaiting_approval")
                await cb.end(again)
        nursery.cancel_scope.cancel()


# -- the same with real node processes ---------------------------------------------------


def _claim_waits_for_lock(dsn: str) -> bool:
    """Whether a node's claim of a queued run's session waits for a row lock."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE %s",
            ("%SET active_key%",),
        ).fetchone()
    return row is not None and int(row[0]) > 0


async def test_with_node_processes(pg_dsn: str) -> None:
    """``kill -9`` of the node where a run is queued for a session that a run on
    another node holds; that node takes the queued run over and claims the session for
    it as the holder ends, while (a row lock the test holds widens the window) that run is
    cancelled by its client: the claim is answered after the run ended and its
    session closed. That node used to crash."""
    async with open_cluster(pg_dsn, 2, lease_ttl=2.0) as cluster:
        with trio.fail_after(BOUND):
            first, second = cluster.alive()
            async with cluster.client(second) as c2:
                holder = await c2.start("worker", "stream #qh", session_id="qs")
            await cluster.wait_executions(1, "model", "qh")
            async with cluster.client(first) as c1:
                queued = await c1.start("worker", "hi", session_id="qs", on_busy="enqueue")
            await poll_until(lambda: _row_status(pg_dsn, queued.id) == "queued")
            await cluster.kill(first)
            await poll_until(lambda: _row_owner(pg_dsn, queued.id) == second.node_id)
            async with (
                cluster.client(second) as c2,
                cluster.client(second) as c3,
                trio.open_nursery() as nursery,
            ):
                with psycopg.connect(pg_dsn) as lock:
                    lock.execute(
                        "SELECT 1 FROM trio_agents_runs WHERE run_id = %s FOR UPDATE",
                        (queued.id,),
                    )
                    cluster.open_gate("stream", "qh")  # the holder ends: the claim comes
                    await poll_until(lambda: _claim_waits_for_lock(pg_dsn))
                    # The cancel ends the run at once; its record in the row (and so
                    # its answer) waits for the lock, behind the claim.
                    nursery.start_soon(c3.attach(queued.id).cancel, "as the session frees")
                    await wait_status(c2, queued.id, lambda info: info.status.is_terminal)
                    lock.rollback()  # the claim goes through now, for a run that ended
                ended = await c2.attach(queued.id).wait()
                assert ended.status is ta.RunStatus.CANCELLED, ended
                assert (await c2.attach(holder.id).wait()).status is ta.RunStatus.COMPLETED
                # The node is still up and serves.
                again = await c2.start("worker", "hi", session_id="qs")
                assert (await again.wait()).status is ta.RunStatus.COMPLETED
            assert second.running
    assert not [line for line in second.stderr if "ClosedResourceError" in line], second.output()


def _row_status(dsn: str, run_id: str) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT status FROM trio_agents_runs WHERE run_id = %s", (run_id,)
        ).fetchone()
    return None if row is None else str(row[0])


def _row_owner(dsn: str, run_id: str) -> str | None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT owner FROM trio_agents_runs WHERE run_id = %s", (run_id,)
        ).fetchone()
    return None if row is None or row[0] is None else str(row[0])
