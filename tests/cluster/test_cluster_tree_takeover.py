"""A run tree in a cluster survives its node (DESIGN §17 "Sessions and durability").

The node running a tree is killed (``kill -9``) while a child run is inside its
non-idempotent tool. Another node takes the root over; the root runs its agent-tool
call again, which resumes the child from the child's session (stored in the cluster's
database under ``"<root's session key>/<call id>"``): the child's tool is not run a
second time (it reads ``interrupted``), the child answers, and the root completes.
Real node processes on the suite's real PostgreSQL (tests/support/process_cluster.py).
"""

from __future__ import annotations

import trio_agents as ta
from tests.support.cluster_nodes_processes import LEASE, bounded_cluster, follow, start_on_first
from tests.support.process_cluster import has_status, items_of, replay


async def test_kill_9_mid_child_tool_resumes_the_child_on_another_node(pg_dsn: str) -> None:
    async with bounded_cluster(pg_dsn, 3, lease_ttl=LEASE) as (cluster, nursery):
        run = await start_on_first(cluster, "delegate charge #dt", session_id="dt")
        (charged,) = await cluster.wait_executions(1, "charge")
        assert charged["run_id"] != run.id  # the child's call, not the root's
        owner = str(charged["node"])
        follower = await follow(nursery, cluster, run.id, owner)
        await cluster.kill(owner)
        cluster.open_gate("charge")  # a second execution would complete, and be seen
        await follower.wait_for(has_status(ta.RunStatus.COMPLETED))
        survivor = cluster.alive()[0]
        log = await replay(cluster, survivor, run.id)
    assert len(cluster.executions("charge")) == 1  # never run twice
    items = items_of(log)
    assert ta.conversation_problems(items) == []
    (helper_result,) = [i for i in items if isinstance(i, ta.ToolResult)]
    assert helper_result.status == "ok"
    assert helper_result.output.startswith("done charge=interrupted")
    final = items[-1]
    assert isinstance(final, ta.AssistantMessage)
    assert final.content.startswith("done helper=done charge=interrupted")
