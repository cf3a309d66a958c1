"""Property tests of run trees (DESIGN §17) on the public harness.

Random trees of agents (a root with 1-3 agent tools, maybe a grandchild), a script per
agent, faults in any node (models that raise or send garbage, hooks that raise or
block, tools that hang in a shield past ``cleanup_timeout`` or swallow their cancel,
the root's session), and schedules whose operations act on any node
(``Op.target``): one ``trio.run`` per example on ``MockClock(autojump_threshold=0)``;
``check_run`` checks every lifecycle invariant of the root, of every run below it,
and the tree invariants. The seeded "ci" profile runs about a hundred tree examples
in seconds; ``make fuzz`` runs over 20,000.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.helpers import count_example
from tests.support.testing_profiles import profile_settings
from trio_agents.models import ScriptedModel
from trio_agents.testing import (
    AgentTree,
    NodeRecord,
    Observation,
    Op,
    OpKind,
    Turn,
    agent_trees,
    check_events,
    check_run,
    check_tree,
    run_tree_schedule,
    schedules,
    standard_tools,
)

TREES = agent_trees()
QUIET_TREES = agent_trees(faults=False)
STEERING: tuple[OpKind, ...] = (
    "cancel",
    "cancel_in_tool",
    "cancel_after_turn",
    "inject",
    "withdraw",
    "approve",
    "reject",
    "subscribe",
    "release",
)
_SCHEDULES: dict[tuple[tuple[str, ...], bool], st.SearchStrategy[tuple[Op, ...]]] = {}


def _schedules(tree: AgentTree, steering: bool) -> st.SearchStrategy[tuple[Op, ...]]:
    """Schedules whose ops target the tree's agents (built once per shape: a strategy
    made in a draw is validated again at every example)."""
    key = (tree.names()[1:], steering)
    if key not in _SCHEDULES:
        kinds = STEERING if steering else None
        _SCHEDULES[key] = (
            schedules(targets=key[0], max_ops=6, kinds=kinds)
            if kinds is not None
            else schedules(targets=key[0], max_ops=6)
        )
    return _SCHEDULES[key]


def observe(tree: AgentTree, schedule: Sequence[Op], *, session: bool) -> Observation:
    return run_tree_schedule(
        tree.build,
        tree.scripts,
        schedule,
        faults=tree.faults,
        recorder=tree.tools.recorder,
        run_options={"cleanup_timeout": 1.0},
        session=session,
    )


def run_a_drawn_tree(
    data: st.DataObject,
    trees: st.SearchStrategy[AgentTree],
    *,
    steering: bool,
    sessions: st.SearchStrategy[bool],
) -> tuple[NodeRecord, ...]:
    """Draw a tree, a schedule on it and whether the root keeps a session; run it and
    check every invariant. The tree's nodes, root first."""
    count_example()
    tree = data.draw(trees, label="tree")
    schedule = data.draw(_schedules(tree, steering=steering), label="schedule")
    session = data.draw(sessions, label="session")
    observation = observe(tree, schedule, session=session)
    check_run(observation).raise_for_violations()
    assert observation.tree is not None
    return observation.tree.nodes


@profile_settings(ci=0.6, fuzz=4.5)
@given(data=st.data())
def test_tree_schedules_with_faults_keep_every_invariant(data: st.DataObject) -> None:
    nodes = run_a_drawn_tree(data, TREES, steering=False, sessions=st.booleans())
    for node in nodes:
        assert node.outcome is not None, node


@profile_settings(ci=0.4, fuzz=2.5)
@given(data=st.data())
def test_steering_any_node_keeps_every_invariant(data: st.DataObject) -> None:
    nodes = run_a_drawn_tree(data, QUIET_TREES, steering=True, sessions=st.just(False))
    # Without faults, a run below the root ends cancelled only by a cancel: its own
    # (the reason of the first one) or an ancestor's ("parent cancelled").
    for node in nodes[1:]:
        assert node.outcome is not None
        if node.outcome.status == "cancelled":
            assert node.cancels, node


# ------------------------------------------------------------------ targeted ops


def _researchers(models: Mapping[str, ta.Model]) -> ta.Agent:
    tools = list(TOOLS.tools)
    leaf = ta.Agent(name="leaf", model=models["leaf"], tools=tools)
    mid = ta.Agent(name="mid", model=models["mid"], tools=[leaf.as_tool(), *tools])
    return ta.Agent(name="root", model=models["root"], tools=[mid.as_tool(), *tools])


TOOLS = standard_tools(threads=False)
SCRIPTS: dict[str, list[Turn | str]] = {
    "root": [Turn(tool_calls=[("mid", {"input": "dig"}), ("sleep", {"seconds": 0.5})]), "done"],
    "mid": [Turn(tool_calls=[("leaf", {"input": "deeper"})]), "mid done"],
    "leaf": [Turn(tool_calls=[("guarded", {"seconds": 2.0})]), "leaf done"],
}


def test_a_targeted_cancel_ends_that_subtree_and_the_parent_goes_on() -> None:
    observation = run_tree_schedule(
        _researchers, SCRIPTS, [Op(1.0, "cancel", reason="enough", target="mid")]
    )
    check_run(observation).raise_for_violations()
    assert observation.result.status == "completed"
    assert observation.tree is not None
    root, mid, leaf = observation.tree.nodes
    assert (mid.agent, leaf.agent) == ("mid", "leaf")
    assert mid.outcome is not None
    assert leaf.outcome is not None
    assert (mid.outcome.status, mid.outcome.reason) == ("cancelled", "enough")
    assert (leaf.outcome.status, leaf.outcome.reason) == ("cancelled", "parent cancelled")
    terminal = leaf.events[-1]
    assert isinstance(terminal, ta.RunUpdated)
    assert terminal.detail == {"by": mid.run_id, "reason": "enough"}
    (answer,) = [
        i
        for i in observation.result.conversation
        if isinstance(i, ta.ToolResult) and i.call_id == mid.call_id
    ]
    assert (answer.status, answer.output) == ("cancelled", "sub-agent mid cancelled: enough")
    assert [c.kind for c in mid.cancels] == ["immediate"]
    assert [(c.kind, c.reason) for c in leaf.cancels] == [("outer", "parent cancelled")]
    assert f"(run {mid.run_id})" in observation.applied[0][1]
    assert root.run_id == observation.run_id


def test_an_op_without_a_live_run_of_its_target_does_nothing() -> None:
    schedule = [
        Op(0.0, "cancel", reason="too early", target="leaf"),  # no leaf run yet
        Op(0.5, "inject", target="nobody"),
        Op(1.0, "approve", target="leaf"),
        Op(30.0, "cancel", reason="too late", target="mid"),  # it has ended
    ]
    observation = run_tree_schedule(_researchers, SCRIPTS, schedule)
    check_run(observation).raise_for_violations()
    assert observation.result.status == "completed"
    notes = [note for _, note in observation.applied]
    assert len(notes) == 4
    assert ["nothing done" in note for note in notes] == [True, True, False, True], notes
    assert observation.tree is not None
    assert all(not node.cancels and not node.injections for node in observation.tree.nodes)


def test_inject_and_approve_reach_a_grandchild() -> None:
    schedule = [
        Op(0.5, "inject", target="leaf", items=(ta.UserMessage("also check the cache"),)),
        Op(1.0, "approve", target="leaf"),
    ]
    observation = run_tree_schedule(_researchers, SCRIPTS, schedule)
    check_run(observation).raise_for_violations()
    assert observation.tree is not None
    leaf = observation.tree.nodes[2]
    assert leaf.agent == "leaf"
    assert leaf.outcome is not None
    assert leaf.outcome.status == "completed"
    (injection,) = leaf.injections
    assert any(
        isinstance(e, ta.InboxDelivered) and e.injection_id == injection.id for e in leaf.events
    )
    assert ta.UserMessage("also check the cache") in leaf.outcome.conversation
    # the approval in the grandchild showed on the root, as waiting below it
    waiting = [
        e.detail
        for e in observation.events
        if isinstance(e, ta.RunUpdated) and e.status == "awaiting_approval"
    ]
    assert waiting
    assert waiting[0] == {
        "pending": [],
        "waiting": [
            {
                "run_id": leaf.run_id,
                "call_id": "call_1_0",
                "name": "guarded",
                "arguments": '{"seconds": 2.0}',
            }
        ],
    }
    assert "call_1_0" in observation.applied[1][1]


# ------------------------------------------------------------------ the checker


def _update(seq: int, status: str, **detail: Any) -> ta.RunUpdated:
    reason = "stop" if status in ("failed", "cancelled") else None
    return ta.RunUpdated("r", seq, ta.RunStatus(status), reason, 1, 0.0, detail)


def _statuses(*updates: ta.RunUpdated) -> list[str]:
    report = check_events(None, list(updates))
    return [str(v) for v in report.violations if v.invariant == "statuses"]


def test_awaiting_approval_again_when_the_waiting_calls_change() -> None:
    below = [{"run_id": "kid", "call_id": "c1"}]
    more = [*below, {"run_id": "kid2", "call_id": "c1"}]
    legal = _statuses(
        _update(1, "queued"),
        _update(2, "running"),
        _update(3, "awaiting_approval", pending=[], waiting=below),
        _update(4, "awaiting_approval", pending=["own"], waiting=more),
        _update(5, "running"),
        _update(6, "cancelled"),
    )
    assert legal == []
    unchanged = _statuses(
        _update(1, "queued"),
        _update(2, "running"),
        _update(3, "awaiting_approval", pending=["own"]),
        _update(4, "awaiting_approval", pending=["own"]),
        _update(5, "cancelled"),
    )
    assert unchanged == ["[statuses] awaiting_approval repeated unchanged (seq 3 → 4)"]
    empty = _statuses(
        _update(1, "queued"),
        _update(2, "running"),
        _update(3, "awaiting_approval", pending=[], waiting=[]),
        _update(4, "cancelled"),
    )
    assert empty == ["[statuses] awaiting_approval (seq 3) lists no calls"]


def test_running_again_when_a_model_request_waits_for_its_rate_limit() -> None:
    legal = _statuses(
        _update(1, "queued"),
        _update(2, "running"),
        _update(3, "running", throttled="rate limit"),
        _update(4, "running"),
        _update(5, "completed"),
    )
    assert legal == []
    unchanged = _statuses(
        _update(1, "queued"),
        _update(2, "running"),
        _update(3, "running"),
        _update(4, "completed"),
    )
    assert unchanged == ["[statuses] running repeated unchanged (seq 2 → 3)"]


def _cancelled_mid() -> Observation:
    schedule = [Op(0.5, "approve", target="leaf"), Op(1.0, "cancel", reason="enough", target="mid")]
    observation = run_tree_schedule(_researchers, SCRIPTS, schedule, recorder=TOOLS.recorder)
    assert check_run(observation).ok
    return observation


def _with_nodes(observation: Observation, **changes: Any) -> Observation:
    assert observation.tree is not None
    return attrs.evolve(observation, tree=attrs.evolve(observation.tree, **changes))


def _broken(observation: Observation) -> list[str]:
    return list(check_run(observation).invariants)


def test_the_checker_sees_a_child_that_ends_after_its_call() -> None:
    observation = _cancelled_mid()
    assert observation.tree is not None
    events = list(observation.tree.events)
    _root, mid, _leaf = observation.tree.nodes
    terminal = mid.events[-1]
    # Move the child's terminal update behind everything its parent did.
    events.remove(terminal)
    events.insert(len(events) - 1, terminal)
    assert "tree-bottom-up" in _broken(_with_nodes(observation, events=tuple(events)))


def test_the_checker_sees_a_task_or_tool_of_a_child_outliving_the_call() -> None:
    observation = _cancelled_mid()
    assert observation.tree is not None
    late = _with_nodes(observation, outlived=("task 'x:tool' of run x lived",))
    assert _broken(late) == ["tree-call-scope"]
    _root, _mid, leaf = observation.tree.nodes
    (record,) = leaf.tool_calls
    running = attrs.evolve(record, state="running", ended_at=None)
    calls = tuple(running if c is record else c for c in observation.tree.tool_calls)
    assert "tree-call-scope" in _broken(_with_nodes(observation, tool_calls=calls))


def test_the_checker_sees_a_cancel_that_climbs_to_the_parent() -> None:
    observation = _cancelled_mid()
    assert observation.tree is not None
    result = attrs.evolve(observation.result, status=ta.RunStatus.CANCELLED, reason="enough")
    root = attrs.evolve(observation.tree.nodes[0], outcome=result)
    nodes = (root, *observation.tree.nodes[1:])
    assert "tree-subtree-cancel" in _broken(_with_nodes(observation, nodes=nodes))


def test_the_checker_sees_an_invalid_conversation_below_the_root() -> None:
    observation = _cancelled_mid()
    assert observation.tree is not None
    leaf = observation.tree.nodes[2]
    assert leaf.outcome is not None
    orphan = ta.ToolResult("nobody_called_me", "?")
    outcome = attrs.evolve(leaf.outcome, conversation=(*leaf.outcome.conversation, orphan))
    nodes = (*observation.tree.nodes[:2], attrs.evolve(leaf, outcome=outcome))
    assert "tree-conversations" in _broken(_with_nodes(observation, nodes=nodes))


def test_check_tree_on_a_tree_driven_by_hand(autojump_clock: Any) -> None:
    async def main() -> ta.Run:
        models = {
            name: ScriptedModel(list(script), default="the end") for name, script in SCRIPTS.items()
        }
        async with ta.open_run(_researchers(models), "go") as run:
            await trio.sleep(1.0)
            (mid,) = run.children
            (leaf,) = mid.children
            assert leaf.status == "awaiting_approval"
            assert run.status == "awaiting_approval"
            leaf.cancel("not needed")
        return run

    run = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    report = check_tree(run)
    assert report.ok, report
    assert "leaf" in report.example
    assert run.result is not None
    assert run.result.status == "completed"


def test_a_node_record_names_its_place_in_the_tree() -> None:
    observation = _cancelled_mid()
    assert observation.tree is not None
    nodes: tuple[NodeRecord, ...] = observation.tree.nodes
    assert [(n.depth, n.height) for n in nodes] == [(0, 2), (1, 1), (2, 0)]
    assert nodes[1].parent_id == nodes[0].run_id
    assert nodes[2].parent_id == nodes[1].run_id
    text = observation.describe()
    assert "tree:" in text
    assert "    leaf" in text


# ------------------------------------------------------------------ found by the properties


class SlowChildEnd(ta.RunHooks):
    """A child run's on_run_end takes a while (in its bounded, shielded repair)."""

    async def on_run_end(self, run: ta.Run, result: ta.RunResult) -> None:
        if run.parent is not None:
            await trio.sleep(0.5)


@pytest.mark.trio
async def test_parent_cancelled_during_a_childs_repair_ends_the_call_cancelled(
    autojump_clock: Any,
) -> None:
    """Found by the tree property (tool-cancellation): the child failed by itself and
    was still in its repair when the root was cancelled; the root's call then ended
    'error' (the child's failure) instead of 'cancelled', like any call running when
    its run is cancelled."""
    child = ta.Agent(name="kid", model=ScriptedModel([Turn(fail="boom")]))
    root = ta.Agent(
        name="root",
        model=ScriptedModel([Turn(tool_calls=[("kid", {"input": "x"})]), "done"]),
        tools=[child.as_tool()],
    )
    async with ta.open_run(root, "go", hooks=SlowChildEnd()) as run:
        await trio.sleep(0.25)  # the child failed at t=0 and is in its on_run_end
        (kid,) = run.children
        assert not kid.status.is_terminal
        run.cancel("stop")
    assert run.result is not None
    assert run.result.status == "cancelled"
    assert kid.result is not None
    assert kid.result.status == "failed"  # its own verdict, given before the cancel
    (answer,) = [i for i in run.result.conversation if isinstance(i, ta.ToolResult)]
    assert (answer.status, answer.output) == ("cancelled", "cancelled: stop")
