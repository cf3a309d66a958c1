"""Usage limits across a takeover (DESIGN §12, §18): what a run's limits counted before
its node died stays counted by the attempt that takes it over, and its deadline counts
from its original start, not from the takeover.

In-process nodes on the suite's real PostgreSQL (``tests/support/cluster_nodes.py``):
node A runs the run into a tool that never returns and "crashes" (nothing more of it
reaches the database); B takes the run over once its lease expires.
"""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from decimal import Decimal
from typing import Any

import trio

import trio_agents as ta
from tests.support.cluster_nodes import agents, clients, open_nodes, query, row_of, waiting_tool
from tests.support.cluster_support import Client, Node
from trio_agents.models import ScriptedModel, Turn


def _nodes(dsn: str, model: ScriptedModel) -> AbstractAsyncContextManager[list[Node]]:
    # A's tool waits for ever (the run is mid-tool when A dies); B's answers at once.
    done = trio.Event()
    done.set()
    return open_nodes(
        dsn,
        {
            "A": agents(model, [waiting_tool(trio.Event())]),
            "B": agents(model, [waiting_tool(done)]),
        },
        # Long enough that B keeps its own lease on a loaded machine (at 0.5 s a slow
        # renewal lost it, and B took the run over from itself: attempt 3); short
        # enough that B takes A's run over soon after A dies.
        lease_ttl=2.0,
    )


async def _taken_over(cb: Client, dsn: str, run_id: str) -> dict[str, Any]:
    await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
    with trio.fail_after(60):
        done = await cb.wait_terminal(run_id)
    row = await row_of(dsn, run_id)
    assert (row["owner"], row["attempt"]) == ("B", 2), row  # B's attempt ended it
    event: dict[str, Any] = done["event"]
    return event


async def test_requests_spent_before_a_takeover_still_count_after_it(pg_dsn: str) -> None:
    # requests=2: A's attempt sends request 1 (a tool call) and dies in the tool. B's
    # attempt may send one more request (the call, answered "interrupted", calls the
    # tool again), not two: its third would pass the limit. Before, B counted from 0
    # and the run completed with 3 requests.
    wait = Turn(tool_calls=[("wait", {})])
    model = ScriptedModel([wait, wait], default="ok")
    async with _nodes(pg_dsn, model) as (a, b), clients(a, b) as (ca, cb):
        run_id = await ca.start_until_tool(agent="a", input="go", limits={"requests": 2})
        a.crash()
        done = await _taken_over(cb, pg_dsn, run_id)
    assert done["status"] == "failed", done
    assert done["reason"] == "usage limit: requests 3/2", done
    assert len(model.requests) == 2  # the third was never sent
    assert done["detail"]["limits"]["requests"] == {"used": 3, "limit": 2}


async def test_tool_calls_spent_before_a_takeover_still_count_after_it(pg_dsn: str) -> None:
    wait = Turn(tool_calls=[("wait", {})])
    model = ScriptedModel([wait, wait], default="ok")
    async with _nodes(pg_dsn, model) as (a, b), clients(a, b) as (ca, cb):
        run_id = await ca.start_until_tool(agent="a", input="go", limits={"tool_calls": 1})
        a.crash()
        done = await _taken_over(cb, pg_dsn, run_id)
    assert (done["status"], done["reason"]) == ("failed", "usage limit: tool_calls 2/1"), done


async def test_a_deadline_counts_from_the_runs_original_start_across_a_takeover(
    pg_dsn: str,
) -> None:
    # A 10-minute deadline, and the run accepted an hour ago (its row's created_at set
    # back while A runs it): the attempt that takes it over is past its deadline at
    # once. Before, the deadline restarted with the attempt and the run completed.
    model = ScriptedModel([Turn(tool_calls=[("wait", {})])], default="ok")
    async with _nodes(pg_dsn, model) as (a, b), clients(a, b) as (ca, cb):
        run_id = await ca.start_until_tool(agent="a", input="go", limits={"deadline": 600})
        await trio.to_thread.run_sync(
            query,
            pg_dsn,
            "UPDATE trio_agents_runs SET created_at = now() - interval '1 hour'"
            " WHERE run_id = %s RETURNING run_id",
            run_id,
        )
        a.crash()
        done = await _taken_over(cb, pg_dsn, run_id)
    assert (done["status"], done["reason"]) == ("failed", "timeout"), done
    assert len(model.requests) == 1  # B never called the model


async def test_the_usage_of_calls_before_a_takeover_stays_the_runs(pg_dsn: str) -> None:
    # A's attempt makes one priced call and dies in the tool; B's makes the next. The
    # run's usage (its record, read from B and from the row) counts both, exactly.
    # Before, B's attempt started from nothing: the record showed B's call only.
    first = ta.Usage(100, 7, "m", cache_read_tokens=40, cost=Decimal("0.000123"))
    second = ta.Usage(30, 2, "m", cache_read_tokens=0, cost=Decimal("0.0000071"))
    model = ScriptedModel(
        [Turn(tool_calls=[("wait", {})], usage=first)], default=Turn(text="ok", usage=second)
    )
    async with _nodes(pg_dsn, model) as (a, b), clients(a, b) as (ca, cb):
        run_id = await ca.start_until_tool(agent="a", input="go")
        a.crash()
        done = await _taken_over(cb, pg_dsn, run_id)
        record = (await cb.ok("run.get", run_id=run_id))["run"]
    assert done["status"] == "completed", done
    total = first + second
    assert total.cost == Decimal("0.0001301")
    assert record["usage"] == total.to_json()
    sql = "SELECT run_usage FROM trio_agents_runs WHERE run_id = %s"
    rows = await trio.to_thread.run_sync(query, pg_dsn, sql, run_id)
    assert json.loads(rows[0][0]) == total.to_json()
