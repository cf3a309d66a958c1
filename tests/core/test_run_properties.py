"""Property tests of the run core, on the public harness (``trio_agents.testing``).

Random scripts x random schedules of cancels (both modes, and the caller's scope),
injections (every ``when``), withdrawals, approvals, rejections, subscribers and
releases, at virtual times: one ``trio.run`` per example on
``MockClock(autojump_threshold=0)``; ``check_run`` checks every lifecycle invariant.
The seeded "ci" profile runs a few hundred examples; ``make fuzz`` runs these and the
fault properties of ``test_harness_faults.py``, over 20,000 examples.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.core_schedules import ScheduleCase, schedule_agent, schedule_cases
from tests.support.helpers import count_example, lifecycle_settings
from trio_agents.testing import (
    HOSTILE_TEXTS,
    FakeTools,
    Op,
    Turn,
    check_run,
    hostile_items,
    hostile_text_tool,
    hostile_texts,
    run_schedule,
    schedules,
    scripts,
    standard_tools,
)

TOOLS = standard_tools()


class BalanceHooks(ta.RunHooks):
    """Counts start/end hook calls: every start must get exactly one end."""

    def __init__(self) -> None:
        self.open: dict[str, int] = {}

    def _add(self, key: str, n: int) -> None:
        self.open[key] = self.open.get(key, 0) + n

    async def on_run_start(self, run: ta.Run) -> None:
        self._add("run", 1)

    async def on_run_end(self, run: ta.Run, result: ta.RunResult) -> None:
        self._add("run", -1)

    async def on_model_start(self, run: ta.Run, turn: int, request: ta.ModelRequest) -> None:
        self._add(f"model:{turn}", 1)

    async def on_model_end(self, run: ta.Run, turn: int, outcome: str) -> None:
        self._add(f"model:{turn}", -1)

    async def on_tool_start(self, run: ta.Run, call: ta.ToolCall) -> None:
        self._add(f"tool:{call.call_id}", 1)

    async def on_tool_end(self, run: ta.Run, call: ta.ToolCall, result: ta.ToolResult) -> None:
        self._add(f"tool:{call.call_id}", -1)


@lifecycle_settings(weight=3)
@given(script=scripts(TOOLS), schedule=schedules(), max_turns=st.integers(1, 5))
def test_any_schedule_keeps_the_lifecycle_rules(
    script: list[Turn], schedule: tuple[Op, ...], max_turns: int
) -> None:
    count_example()
    observation = run_schedule(
        schedule_agent(TOOLS, max_turns), script, schedule, recorder=TOOLS.recorder
    )
    check_run(observation).raise_for_violations()
    # Beyond the generic invariants: what this tool set promises.
    result = observation.result
    for record in observation.tool_calls:
        assert record.state != "running", record
    if result.status == "completed":
        assert TOOLS.recorder.released or not any(
            c.tool == "block" and c.state == "cancelled" for c in observation.tool_calls
        )


@lifecycle_settings(weight=1)
@given(case=schedule_cases())
def test_hooks_stay_balanced_under_any_schedule(case: ScheduleCase) -> None:
    hooks = BalanceHooks()
    case.run(hooks)
    assert {k: v for k, v in hooks.open.items() if v} == {}


@pytest.mark.skipif(sys.platform != "linux", reason="the process check reads /proc")
@lifecycle_settings(weight=0.2)
@given(
    calls=st.lists(st.sampled_from([0.0, 3600.0]), min_size=1, max_size=2),
    schedule=schedules(kinds=("cancel", "cancel_after_turn", "outer_cancel"), max_ops=2),
)
def test_process_tools_die_with_the_run(calls: Sequence[float], schedule: tuple[Op, ...]) -> None:
    count_example()
    tools = standard_tools(threads=False, processes=True)
    script = [Turn(tool_calls=[("proc", {"seconds": s}) for s in calls])]
    observation = run_schedule(schedule_agent(tools, 3), script, schedule, recorder=tools.recorder)
    check_run(observation).raise_for_violations()
    assert all(c.state != "running" for c in observation.tool_calls)


# Hostile text (issue 29): the standard tools plus one returning lone surrogates, NUL
# and huge text; scripts streaming such text (an emoji's halves in two deltas among
# it); injections carrying it. The checker's "clean-text" invariant must hold.
HOSTILE_TOOLS = FakeTools(
    (*TOOLS.tools, hostile_text_tool(TOOLS.recorder)),
    TOOLS.recorder,
    {
        **TOOLS.arguments,
        "hostile": st.fixed_dictionaries(
            {"kind": st.integers(0, len(HOSTILE_TEXTS) - 1), "echo": hostile_texts()}
        ),
    },
)


@lifecycle_settings(weight=1)
@given(
    script=scripts(HOSTILE_TOOLS, hostile_text=True),
    # Cancel reasons (and rejection messages) with lone surrogates too.
    schedule=schedules(injected=hostile_items(), reasons=("stop", "r\udce9sum\udce9", "\ud800")),
    max_turns=st.integers(1, 5),
)
def test_hostile_text_keeps_the_lifecycle_rules(
    script: list[Turn], schedule: tuple[Op, ...], max_turns: int
) -> None:
    count_example()
    observation = run_schedule(
        schedule_agent(HOSTILE_TOOLS, max_turns),
        script,
        schedule,
        recorder=HOSTILE_TOOLS.recorder,
        session=True,
    )
    check_run(observation).raise_for_violations()
