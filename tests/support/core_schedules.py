"""The run-core property tests' shared case: a drawn tool set, turn limit, script and
schedule, run on the public harness (``trio_agents.testing.run_schedule``) and checked."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.helpers import count_example
from trio_agents.testing import (
    FakeTools,
    Observation,
    Op,
    Turn,
    check_run,
    run_schedule,
    schedules,
    scripts,
    tool_sets,
)


def schedule_agent(tools: FakeTools, max_turns: int) -> Callable[[ta.Model], ta.Agent]:
    """The agent factory ``run_schedule`` takes: ``tools`` and ``max_turns``."""

    def factory(model: ta.Model) -> ta.Agent:
        return ta.Agent(name="p", model=model, tools=list(tools.tools), max_turns=max_turns)

    return factory


@attrs.frozen
class ScheduleCase:
    """One drawn example: a tool set, a turn limit, a script and a schedule."""

    tools: FakeTools
    max_turns: int
    script: Sequence[Turn]
    schedule: tuple[Op, ...]

    def run(self, hooks: ta.RunHooks) -> Observation:
        """Count the example, run it with ``hooks`` (cleanup_timeout 1 s) and check
        every lifecycle invariant; the observation."""
        count_example()
        observation = run_schedule(
            schedule_agent(self.tools, self.max_turns),
            self.script,
            self.schedule,
            recorder=self.tools.recorder,
            run_options={"hooks": hooks, "cleanup_timeout": 1.0},
        )
        check_run(observation).raise_for_violations()
        return observation


@st.composite
def schedule_cases(draw: st.DrawFn) -> ScheduleCase:
    """A tool set, 1 to 4 turns, a script for those tools and up to six operations."""
    tools = draw(tool_sets())
    max_turns = draw(st.integers(1, 4))
    return ScheduleCase(tools, max_turns, draw(scripts(tools)), draw(schedules(max_ops=6)))
