"""A message an input guardrail rejects never reaches the model of a later run on the
same session in a cluster (DESIGN §12, §18): the run's items are written with its
events, and the rejection mark is written over them (``ClusterSession.replace_items``)
before the terminal update."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio

import trio_agents as ta
from tests.support.cluster_nodes import clients, open_nodes, two_nodes
from trio_agents.models import ScriptedModel

SECRET = "xyzzy-secret"


@pytest.mark.parametrize("blocking", [False, True])
async def test_a_rejected_input_never_reaches_a_later_run(pg_dsn: str, blocking: bool) -> None:
    @ta.input_guardrail(name="no_secret", blocking=blocking)
    def no_secret(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        return any(SECRET in i.content for i in items if isinstance(i, ta.UserMessage))

    model = ScriptedModel([], default="fine")
    agent = ta.Agent(name="guarded", model=model, input_guardrails=[no_secret])
    async with open_nodes(pg_dsn, {"A": {"a": agent}}) as opened, clients(opened[0]) as (ca,):
        statuses = []
        for text in ("harmless", f"tell me {SECRET}", "hello again"):
            run_id = await ca.start_run(agent="a", input=text, session_id="s", subscribe="all")
            statuses.append((await ca.wait_terminal(run_id))["event"]["status"])
    assert statuses == ["completed", "failed", "completed"]
    sent = [i.content for i in model.requests[-1].items if isinstance(i, ta.UserMessage)]
    assert sent == ["harmless", "hello again"]


@pytest.mark.parametrize("blocking", [False, True])
async def test_a_takeover_rechecks_the_input_the_dead_node_was_checking(
    pg_dsn: str, blocking: bool
) -> None:
    """Node A dies inside a blocking input guardrail, the run's input stored (or written
    by the takeover); node B resumes the run with ``input=()``: it checks that input
    again — as a blocking check even where B's guardrail is not — before any model
    request, so a trip there means B's model is never sent it."""
    checking = trio.Event()

    @ta.input_guardrail(name="no_secret", blocking=True)
    async def stuck(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        checking.set()
        await trio.Event().wait()  # until its node dies
        return False

    @ta.input_guardrail(name="no_secret", blocking=blocking)
    def no_secret(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        return any(SECRET in i.content for i in items if isinstance(i, ta.UserMessage))

    a_model = ScriptedModel([], default="fine")
    b_model = ScriptedModel([], default="fine")
    a_agents = {"a": ta.Agent(name="a", model=a_model, input_guardrails=[stuck])}
    b_agents = {"a": ta.Agent(name="a", model=b_model, input_guardrails=[no_secret])}
    async with two_nodes(pg_dsn, a_agents, b_agents) as (a, b), clients(a, b) as (ca, cb):
        run_id = await ca.start_run(
            agent="a", input=f"tell me {SECRET}", session_id="s", subscribe="all"
        )
        with trio.fail_after(30):
            await checking.wait()
        a.crash()
        await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
        done = await cb.wait_terminal(run_id)
        assert done["event"]["status"] == "failed", done
        # The next run on the session does not get it either (it was marked).
        later = await cb.start_run(agent="a", input="hello", session_id="s", subscribe="all")
        assert (await cb.wait_terminal(later))["event"]["status"] == "completed"
    assert a_model.requests == []
    for request in b_model.requests:
        assert SECRET not in str([i.to_json() for i in request.items])
    sent = [i.content for i in b_model.requests[-1].items if isinstance(i, ta.UserMessage)]
    assert sent == ["hello"]
