"""The run timeline (DESIGN §23) of any run the public harness generates: random scripts
and schedules (cancels of both modes and from outside, injections of every ``when``,
approvals, rejections), random trees of agents with faults in any node and ops on any
node. Whatever happened, the timeline derived from the run's (or the tree's) events has
well-nested spans, and once the run ended every span is closed with a final status."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.core_schedules import schedule_agent
from tests.support.helpers import count_example, lifecycle_settings
from tests.support.testing_profiles import profile_settings
from tests.support.timeline_checks import span_problems
from trio_agents.testing import (
    Op,
    Turn,
    agent_trees,
    run_schedule,
    run_tree_schedule,
    schedules,
    scripts,
    standard_tools,
)

TOOLS = standard_tools()
TREES = agent_trees()


@lifecycle_settings(weight=1)
@given(script=scripts(TOOLS), schedule=schedules(), max_turns=st.integers(1, 5))
def test_the_timeline_of_any_run_is_closed_and_well_nested(
    script: list[Turn], schedule: tuple[Op, ...], max_turns: int
) -> None:
    count_example()
    observation = run_schedule(
        schedule_agent(TOOLS, max_turns), script, schedule, recorder=TOOLS.recorder
    )
    timeline = ta.timeline(observation.events)
    assert span_problems(timeline, closed=True) == []
    (run,) = [span for span in timeline.spans if span.kind == "run"]
    assert run.status == observation.result.status
    # One model span per model call the run started, whatever cut it.
    turns = [span.turn or 0 for span in timeline.spans if span.kind == "model"]
    assert sorted(turns) == list(range(1, observation.result.turns + 1))
    # Every tool call of the conversation is a span, with its result's status.
    results = {
        item.call_id: item.status
        for item in observation.result.new_items
        if isinstance(item, ta.ToolResult)
    }
    tools = {span.call_id: span.status for span in timeline.spans if span.kind == "tool"}
    assert {call: tools[call] for call in results if call in tools} == {
        call: status for call, status in results.items() if call in tools
    }


@profile_settings(ci=0.4, fuzz=2.5)
@given(data=st.data())
def test_the_timeline_of_any_tree_is_closed_and_well_nested(data: st.DataObject) -> None:
    count_example()
    tree = data.draw(TREES, label="tree")
    schedule = data.draw(schedules(targets=tree.names()[1:], max_ops=6), label="schedule")
    observation = run_tree_schedule(
        tree.build,
        tree.scripts,
        schedule,
        faults=tree.faults,
        recorder=tree.tools.recorder,
        run_options={"cleanup_timeout": 1.0},
    )
    assert observation.tree is not None
    assert observation.tree.complete
    nodes = observation.tree.nodes
    timeline = ta.timeline(observation.tree.events, names={nodes[0].run_id: nodes[0].agent})
    assert span_problems(timeline, closed=True) == []
    runs = {span.id: span for span in timeline.spans if span.kind == "run"}
    assert set(runs) == {node.run_id for node in nodes}
    for node in nodes:
        assert node.outcome is not None
        assert runs[node.run_id].status == node.outcome.status
        assert runs[node.run_id].name == node.agent
