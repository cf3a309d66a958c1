"""A frozen node (issue 30 item 4): a node paused (``SIGSTOP``: a paused VM, a
partition that leaves its socket open) inside a flush keeps its transaction open, its
runs' row locks held, idle. The server ends that transaction once it has been idle for
half the lease (``idle_in_transaction_session_timeout``), so another node takes the
runs over once their leases expire, however long the freeze lasts; the node, resumed
(``SIGCONT``), finds its runs gone on, stops its attempts, and serves on.

Real node processes (tests/support/process_cluster.py) on the suite's PostgreSQL; the node
freezes itself at the exact point (tests/support/cluster_app.py, ``freeze-in-flush``). Waits
are on observable facts, bounded by ``trio.fail_after`` as hang guards only.
"""

from __future__ import annotations

from typing import Final

import trio

import trio_agents as ta
from tests.support.cluster_nodes_processes import LEASE, bounded_cluster, follow, start_on_first
from tests.support.process_cluster import (
    assert_same_events,
    has_status,
    is_resumed,
    items_of,
    owner_of,
    replay,
)

TAKEOVER_BOUND: Final = 30.0
"""A hang guard, well past the bound (the lease plus a scan plus the idle timeout: about
2.5 s here); without the idle timeout, the takeover never comes."""


async def test_a_node_frozen_inside_a_flush_has_its_runs_taken_over(pg_dsn: str) -> None:
    async with bounded_cluster(pg_dsn, 2, lease_ttl=LEASE) as (cluster, nursery):
        run = await start_on_first(cluster, "hold stream #fz", session_id="fz")
        await cluster.wait_executions(1, "model", "fz")
        owner = cluster.node(await owner_of(cluster, run.id))
        other = next(node for node in cluster.alive() if node is not owner)
        follower = await follow(nursery, cluster, run.id, other)
        await follower.wait_for(has_status(ta.RunStatus.RUNNING))
        cluster.freeze_in_next_flush(owner)
        cluster.open_gate("hold", "fz")  # alpha, beta: a flush, in which it freezes
        (frozen,) = await cluster.wait_executions(1, "freeze")
        assert run.id in str(frozen["run_id"]).split(",")
        with trio.fail_after(TAKEOVER_BOUND):
            await follower.wait_for(lambda event: is_resumed(event, 2))
        assert await owner_of(cluster, run.id) == other.node_id
        cluster.open_gate("stream", "fz")
        await follower.wait_for(has_status(ta.RunStatus.COMPLETED))
        # The frozen node goes on: it stops its stale attempt and serves on.
        cluster.thaw(owner)
        async with cluster.client(owner) as client:
            after = await client.start("worker", "hello", session_id="fz-after")
            assert (await after.wait()).status is ta.RunStatus.COMPLETED
        log = await replay(cluster, other, run.id)
        assert owner.running
    follower.check()
    assert_same_events(follower.events, log)
    assert [e for e in log if is_resumed(e)] == [next(e for e in log if is_resumed(e, 2))]
    assert ta.conversation_problems(items_of(log)) == []
    final = items_of(log)[-1]
    assert isinstance(final, ta.AssistantMessage)
    assert final.content == "alpha beta gamma"
