"""A message an input guardrail rejects never reaches the model of a later run on the
same session in a cluster (DESIGN §12, §18): the run's items are written with its
events, and the rejection mark is written over them (``ClusterSession.replace_items``)
before the terminal update."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

import trio_agents as ta
from tests.support.cluster_nodes import clients, open_nodes
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
