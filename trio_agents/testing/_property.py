"""``LifecycleProperty``: one agent, fuzzed with random scripts and schedules."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import attrs
import hypothesis
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from .._agent import Agent
from .._model import Model
from .._tools import Tool
from ..models._scripted import ScriptedModel, Turn
from ._check import Report, check_run
from ._fakes import ToolRecorder
from ._runner import Observation, run_schedule
from ._strategies import FakeTools, Op, schedules, scripts

__all__ = ["Failure", "LifecycleProperty", "lifecycle_test"]

AgentFactory = Callable[[Model], Agent]


@final
@attrs.frozen(eq=False)
class Failure:
    """A (shrunk) example that breaks an invariant, from :meth:`LifecycleProperty.find_failure`.

    Attributes:
        script: the model script.
        schedule: the operations.
        report: what broke.
        observation: everything the runner saw.
    """

    script: tuple[Turn, ...]
    schedule: tuple[Op, ...]
    report: Report
    observation: Observation

    def __str__(self) -> str:
        return str(self.report)


@final
@attrs.define(eq=False)
class LifecycleProperty:
    """The lifecycle property of one agent: for every script and schedule drawn, the
    run obeys every invariant of :func:`~trio_agents.testing.check_run`.

    ``agent_factory(model)`` builds the agent around the harness's
    :class:`ScriptedModel` (it is called once per example, and once up front to learn
    the agent's tools). Scripts call the agent's tools with arguments drawn from their
    JSON schemas (or from ``tools``, a :class:`FakeTools`, whose strategies and
    recorder are then used). Example::

        prop = LifecycleProperty(lambda model: Agent(name="a", model=model, tools=[t]))
        prop.run()                       # a Hypothesis test; raises on a violation
        failure = prop.find_failure()    # or: the shrunk failing example, or None

    Attributes:
        agent_factory: builds the agent for a model.
        tools: a :class:`FakeTools` (strategies and recorder) or the tools to call;
            by default the agent's own tools.
        script_strategy: overrides the scripts drawn.
        schedule_strategy: overrides the schedules drawn (default :func:`schedules`).
        recorder: the fake tools' recorder, if not given by ``tools``.
        run_options: passed to ``open_run`` (``hooks``, ``max_turns``, ...).
        max_cancel_latency: passed to :func:`check_run`.
    """

    agent_factory: AgentFactory
    tools: FakeTools | Sequence[Tool] | None = None
    script_strategy: st.SearchStrategy[list[Turn]] | None = None
    schedule_strategy: st.SearchStrategy[tuple[Op, ...]] | None = None
    recorder: ToolRecorder | None = None
    run_options: Mapping[str, Any] = attrs.field(factory=dict)
    max_cancel_latency: float | None = None

    def strategy(self) -> st.SearchStrategy[tuple[list[Turn], tuple[Op, ...]]]:
        """Pairs of (script, schedule)."""
        script = self.script_strategy
        if script is None:
            tools = self.tools
            if tools is None:
                tools = self.agent_factory(ScriptedModel([])).tools
            script = scripts(tools)
        schedule = self.schedule_strategy if self.schedule_strategy is not None else schedules()
        return st.tuples(script, schedule)

    def _recorder(self) -> ToolRecorder | None:
        if self.recorder is not None:
            return self.recorder
        return self.tools.recorder if isinstance(self.tools, FakeTools) else None

    def observe(self, script: Sequence[Turn | str], schedule: Sequence[Op]) -> Observation:
        """Run one example (see :func:`~trio_agents.testing.run_schedule`)."""
        return run_schedule(
            self.agent_factory,
            script,
            schedule,
            recorder=self._recorder(),
            run_options=self.run_options,
        )

    def check(self, script: Sequence[Turn | str], schedule: Sequence[Op]) -> Report:
        """Run one example and check it."""
        return check_run(self.observe(script, schedule), max_cancel_latency=self.max_cancel_latency)

    def test(self, settings: hypothesis.settings | None = None) -> Callable[[], None]:
        """A Hypothesis test function (no arguments) for this property.

        Call it, or assign it to a ``test_...`` name in a test module. It uses the
        current Hypothesis profile unless ``settings`` is given.
        """

        @given(example=self.strategy())
        def lifecycle_property(example: tuple[list[Turn], tuple[Op, ...]]) -> None:
            script, schedule = example
            self.check(script, schedule).raise_for_violations()

        if settings is not None:
            return settings(lifecycle_property)
        return lifecycle_property

    def run(self, settings: hypothesis.settings | None = None) -> None:
        """Run the property now; raise (with the shrunk example) on a violation."""
        self.test(settings)()

    def find_failure(self, *, max_examples: int = 500, database: bool = False) -> Failure | None:
        """Search for an example that breaks an invariant; return it shrunk, or None.

        Uses :func:`hypothesis.find` (derandomized, so the answer is reproducible).
        """
        settings = hypothesis.settings(
            max_examples=max_examples,
            derandomize=True,
            database=None if not database else hypothesis.settings().database,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        try:
            script, schedule = hypothesis.find(
                self.strategy(),
                lambda example: not self.check(*example).ok,
                settings=settings,
            )
        except hypothesis.errors.NoSuchExample:
            return None
        observation = self.observe(script, schedule)
        report = check_run(observation, max_cancel_latency=self.max_cancel_latency)
        return Failure(tuple(observation.script), tuple(schedule), report, observation)


def lifecycle_test(
    *,
    tools: FakeTools | Sequence[Tool] | None = None,
    script_strategy: st.SearchStrategy[list[Turn]] | None = None,
    schedule_strategy: st.SearchStrategy[tuple[Op, ...]] | None = None,
    run_options: Mapping[str, Any] | None = None,
    settings: hypothesis.settings | None = None,
) -> Callable[[AgentFactory], Callable[[], None]]:
    """Decorate an agent factory to make it a lifecycle property test::

        @lifecycle_test()
        def test_my_agent(model: Model) -> Agent:
            return Agent(name="mine", model=model, tools=[search, fetch])

    The decorated name becomes a test without parameters (pytest collects it) that
    runs :class:`LifecycleProperty` with the current Hypothesis profile (or
    ``settings``). Use it on a sync test: each example calls ``trio.run``.
    """

    def decorate(factory: AgentFactory) -> Callable[[], None]:
        prop = LifecycleProperty(
            factory,
            tools=tools,
            script_strategy=script_strategy,
            schedule_strategy=schedule_strategy,
            run_options=dict(run_options or {}),
        )
        inner = prop.test(settings)

        def test() -> None:
            inner()

        test.__name__ = factory.__name__
        test.__qualname__ = factory.__qualname__
        test.__doc__ = factory.__doc__
        test.__module__ = factory.__module__
        return test

    return decorate
