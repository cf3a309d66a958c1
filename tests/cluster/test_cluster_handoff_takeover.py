"""A run that had handed off survives its node as the agent it handed off to (DESIGN
§12, §17): the node taking it over resumes it as the agent of its last persisted
``run.handoff``, not as the one it was started with — around a handoff cycle too.

In-process nodes on the suite's real PostgreSQL (tests/support/cluster_support.py); the
crash is ``Node.crash`` (nothing more reaches the database, as with ``kill -9``).
"""

from __future__ import annotations

import trio

import trio_agents as ta
from tests.support.cluster_nodes import POLL, clients, query, two_nodes
from trio_agents.models import ScriptedModel, Turn


def desk(
    node: str,
    triage_model: ScriptedModel,
    billing_model: ScriptedModel,
    ran: list[str],
    started: trio.Event,
) -> tuple[dict[str, ta.Agent], ta.Agent]:
    """Agent ``"a"`` (triage) ⇄ billing, billing with a ``refund`` tool that records the
    node it ran on, sets ``started``, then blocks. Returns the served agents and billing."""
    agents: dict[str, ta.Agent] = {}

    @ta.function_tool
    async def refund() -> str:
        """Refund the order (not idempotent)."""
        ran.append(node)
        started.set()
        await trio.Event().wait()  # until its node dies
        return "refunded"

    triage = ta.Agent(name="a", model=triage_model, handoffs=[lambda: agents["billing"]])
    agents["billing"] = ta.Agent(
        name="billing", model=billing_model, tools=[refund], handoffs=[triage]
    )
    return {"a": triage}, agents["billing"]


async def handoff_persisted(dsn: str, run_id: str) -> None:
    """Wait until the run's run.handoff event is in the database (the owner's flush)."""
    sql = "SELECT 1 FROM trio_agents_events WHERE run_id = %s AND type = 'run.handoff'"
    while True:
        if await trio.to_thread.run_sync(query, dsn, sql, run_id):
            return
        await trio.sleep(POLL)


async def test_a_run_taken_over_after_a_handoff_goes_on_as_the_agent_it_handed_to(
    pg_dsn: str,
) -> None:
    ran: list[str] = []
    started = trio.Event()
    a_agents, _ = desk(
        "A",
        ScriptedModel([Turn(tool_calls=[("transfer_to_billing", {})])]),
        ScriptedModel([Turn(tool_calls=[ta.ToolCall("r1", "refund", "{}")])]),
        ran,
        started,
    )
    b_triage = ScriptedModel([], default="triage on B: wrong agent")
    b_billing = ScriptedModel([], default="billing on B: refund interrupted, will retry")
    b_agents, _ = desk("B", b_triage, b_billing, ran, trio.Event())
    async with two_nodes(pg_dsn, a_agents, b_agents) as (a, b), clients(a, b) as (ca, cb):
        run_id = await ca.start_run(agent="a", input="refund order 7", subscribe="all")
        with trio.fail_after(30):
            await started.wait()  # billing's refund started on A
            await handoff_persisted(pg_dsn, run_id)
        a.crash()
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        done = await cb.wait_terminal(run_id)
        assert done["event"]["status"] == "completed", done
        info = await cb.ok("run.get", run_id=run_id)
    assert ran == ["A"]  # never run twice
    assert b_triage.requests == []
    (request,) = b_billing.requests
    results = [i for i in request.items if isinstance(i, ta.ToolResult)]
    assert [(r.call_id, r.status) for r in results][-1] == ("r1", "error")
    assert results[-1].output.startswith("interrupted: node A stopped")
    assert info["run"]["agent"] == "billing", info
