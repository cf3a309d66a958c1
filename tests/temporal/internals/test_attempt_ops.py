"""``Attempt.apply`` applies a recorded op once: the ``steer`` update's op reaches the
workflow's history only when its workflow task completes, after the push, so a workflow
task lost in between (its worker died) runs the update again on another worker, which
pushes the same op (same index) to the same attempt again. No Temporal server here: a
real run in this Trio thread, the attempt as the worker holds it."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.core_trees import researcher, root_calling, tool_turn
from trio_agents.models import ScriptedModel, Turn
from trio_agents.temporal import _activity
from trio_agents.temporal._activity import Attempt
from trio_agents.temporal._types import SteeringOp

pytestmark = pytest.mark.trio


def _inject(index: int) -> SteeringOp:
    op = SteeringOp(op="inject", items=[ta.UserMessage("psst").to_json()], when="next_turn")
    op.index = index
    return op


async def test_a_recorded_op_pushed_twice_is_applied_once(autojump_clock: Any) -> None:
    gate = trio.Event()

    @ta.function_tool
    async def wait() -> str:
        """Wait for the gate."""
        await gate.wait()
        return "released"

    model = ScriptedModel([Turn(tool_calls=[("wait", {})])], default=Turn(text="ok"))
    agent = ta.Agent(name="a", model=model, tools=[wait])
    attempt = Attempt("r1")
    async with ta.open_run(agent, "go") as run:
        attempt.started(run)
        await trio.sleep(1)
        answers = []

        async def push(op: SteeringOp) -> None:
            answers.append(await attempt.apply(op))

        async with trio.open_nursery() as nursery:  # the same op, twice at once
            nursery.start_soon(push, _inject(3))
            nursery.start_soon(push, _inject(3))
        answers.append(await attempt.apply(_inject(3)))  # and once more, later
        assert len({a.injection_id for a in answers}) == 1
        assert all(a.ok for a in answers)
        # The same index with another op (a re-run workflow task that ordered its
        # updates otherwise): applied, not answered with the first op's answer.
        reordered = _inject(3)
        reordered.items = [ta.UserMessage("other").to_json()]
        assert (await attempt.apply(reordered)).injection_id != answers[0].injection_id
        # Another recorded op, and an op the host pushes without recording (no
        # index): each applied.
        other = await attempt.apply(_inject(4))
        unrecorded = await attempt.apply(
            SteeringOp(op="inject", items=[ta.UserMessage("psst").to_json()], when="next_turn")
        )
        assert len({answers[0].injection_id, other.injection_id, unrecorded.injection_id}) == 3
        gate.set()
    texts = [
        str(item.to_json().get("content"))
        for item in model.requests[-1].items
        if isinstance(item, ta.UserMessage)
    ]
    assert sum("psst" in text for text in texts) == 3, texts
    assert sum("other" in text for text in texts) == 1, texts


async def test_a_stale_decision_for_a_resumed_child_is_answered_within_a_bound(
    autojump_clock: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision for a child of a resumed tree waits until that child has asked for its
    left-open calls again; one for a call the child does not wait for (a second click,
    an id already decided) must not wait for the child's next event, which a long tool
    call holds back: answered ``not_found`` within the bound. (The child here settles
    never: a resumed child re-running an idempotent tool emits no event until it ends.)"""

    async def never(root: ta.Run, node_id: str) -> None:
        await trio.sleep_forever()

    monkeypatch.setattr(_activity, "_settle_node", never)
    gate = trio.Event()

    @ta.function_tool
    async def long_tool() -> str:
        """Works for a long time."""
        await gate.wait()
        return "done"

    child = researcher("child", tool_turn(("long_tool", {})), "child done", tools=[long_tool])
    attempt = Attempt("root")
    async with ta.open_run(root_calling(child), "go") as run:
        await trio.sleep(1)
        (child_run,) = run.children
        attempt.started(run)
        # The root has settled (it asked its model again); the child is in its tool.
        attempt.resuming(frozenset({child_run.id})).set()
        op = SteeringOp(op="approve", target="call_nope", node=child_run.id)
        started = trio.current_time()
        with trio.fail_after(60):
            answer = await attempt.apply(op)
        assert (answer.ok, answer.code) == (False, "not_found")
        assert trio.current_time() - started <= 5
        gate.set()
