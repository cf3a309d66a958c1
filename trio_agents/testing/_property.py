"""``LifecycleProperty``: one agent, fuzzed with random scripts and schedules."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

import attrs
import hypothesis
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from .. import Agent, Model, Tool
from ..models import ScriptedModel, Turn
from ..sessions import Session
from ._checker import check_run
from ._fakes import ToolRecorder
from ._faults import Faults
from ._invariants import Report
from ._observation import Observation
from ._runner import run_schedule
from ._strategies import FakeTools, Op, schedules, scripts

__all__ = ["Failure", "LifecycleProperty", "harness_settings", "lifecycle_test"]

AgentFactory = Callable[[Model], Agent]

Example = tuple[list[Turn], tuple[Op, ...], Faults]


def harness_settings(base: hypothesis.settings | None = None) -> hypothesis.settings:
    """``base`` (default: the current profile) without what depends on machine speed.

    No ``deadline`` (one example is a whole ``trio.run``; a sync tool's thread takes
    real time) and no ``too_slow`` health check (generating examples is slower on a
    busy machine). Everything else, ``max_examples`` included, stays as ``base`` says.
    """
    base = base if base is not None else hypothesis.settings()
    suppressed = list(dict.fromkeys([*base.suppress_health_check, HealthCheck.too_slow]))
    return hypothesis.settings(base, deadline=None, suppress_health_check=suppressed)


@final
@attrs.frozen(eq=False)
class Failure:
    """A (shrunk) example that breaks an invariant, from :meth:`LifecycleProperty.find_failure`.

    Attributes:
        script: the model script.
        schedule: the operations.
        report: what broke.
        observation: everything the runner saw.
        faults: the faults injected.
    """

    script: tuple[Turn, ...]
    schedule: tuple[Op, ...]
    report: Report
    observation: Observation
    faults: Faults = attrs.Factory(Faults)

    def __str__(self) -> str:
        return str(self.report)


@final
@attrs.define(eq=False)
class LifecycleProperty:
    """The lifecycle property of one agent: for every script and schedule drawn, the
    run obeys every invariant of :func:`~trio_agents.testing.check_run`.

    ``agent_factory(model)`` builds the agent around the harness's model (a
    :class:`ScriptedModel`, watched; it is called once per example, and once up front
    to learn the agent's tools). Scripts call the agent's tools with arguments drawn
    from their JSON schemas (or from ``tools``, a :class:`FakeTools`, whose strategies
    and recorder are then used). Example::

        prop = LifecycleProperty(lambda model: Agent(name="a", model=model, tools=[t]))
        prop.run()                       # a Hypothesis test; raises on a violation
        failure = prop.find_failure()    # or: the shrunk failing example, or None

    Attributes:
        agent_factory: builds the agent for a model.
        tools: a :class:`FakeTools` (strategies and recorder) or the tools to call;
            by default the agent's own tools.
        script_strategy: overrides the scripts drawn.
        schedule_strategy: overrides the schedules drawn (default :func:`schedules`).
        faults: a strategy of :class:`Faults` to inject (default: none), e.g.
            :func:`~trio_agents.testing.faults`.
        recorder: the fake tools' recorder, if not given by ``tools``.
        run_options: passed to ``open_run`` (``hooks``, ``max_turns``, ...).
        max_cancel_latency: passed to :func:`check_run`.
        session: give each run a fresh session (True: a ``MemorySession``; or a
            factory; False: none), checked afterwards (see :func:`run_schedule`).
        thread_hold: see :func:`run_schedule`.
        thread_grace: see :func:`run_schedule`.
    """

    agent_factory: AgentFactory
    tools: FakeTools | Sequence[Tool] | None = None
    script_strategy: st.SearchStrategy[list[Turn]] | None = None
    schedule_strategy: st.SearchStrategy[tuple[Op, ...]] | None = None
    recorder: ToolRecorder | None = None
    run_options: Mapping[str, Any] = attrs.field(factory=dict)
    max_cancel_latency: float | None = None
    faults: st.SearchStrategy[Faults] | None = None
    session: bool | Callable[[], Session] = True
    thread_hold: float | None = 1.0
    thread_grace: float = 5.0

    def strategy(self) -> st.SearchStrategy[Example]:
        """Triples of (script, schedule, faults)."""
        script = self.script_strategy
        if script is None:
            tools = self.tools
            if tools is None:
                tools = self.agent_factory(ScriptedModel([])).tools
            script = scripts(tools)
        schedule = self.schedule_strategy if self.schedule_strategy is not None else schedules()
        faults = self.faults if self.faults is not None else st.just(Faults())
        return st.tuples(script, schedule, faults)

    def _recorder(self) -> ToolRecorder | None:
        if self.recorder is not None:
            return self.recorder
        return self.tools.recorder if isinstance(self.tools, FakeTools) else None

    def observe(
        self, script: Sequence[Turn | str], schedule: Sequence[Op], faults: Faults | None = None
    ) -> Observation:
        """Run one example (see :func:`~trio_agents.testing.run_schedule`)."""
        return run_schedule(
            self.agent_factory,
            script,
            schedule,
            recorder=self._recorder(),
            run_options=self.run_options,
            faults=faults,
            session=self.session,
            thread_hold=self.thread_hold,
            thread_grace=self.thread_grace,
        )

    def check(
        self, script: Sequence[Turn | str], schedule: Sequence[Op], faults: Faults | None = None
    ) -> Report:
        """Run one example and check it."""
        observation = self.observe(script, schedule, faults)
        return check_run(observation, max_cancel_latency=self.max_cancel_latency)

    def test(self, settings: hypothesis.settings | None = None) -> Callable[[], None]:
        """A Hypothesis test function (no arguments) for this property.

        Call it, or assign it to a ``test_...`` name in a test module. It uses
        ``settings`` or else the Hypothesis profile active when it is called, always
        without a deadline or the ``too_slow`` health check (:func:`harness_settings`).
        """

        def lifecycle_property() -> None:
            @harness_settings(settings)
            @given(example=self.strategy())
            def lifecycle_example(example: Example) -> None:
                self.check(*example).raise_for_violations()

            lifecycle_example()

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
            # No explain phase: find() returns the example and prints no explanation,
            # and that phase re-runs the failing example under a line tracer (every line
            # of the run and of Trio: minutes on a loaded machine, for nothing read).
            phases=[phase for phase in hypothesis.Phase if phase is not hypothesis.Phase.explain],
        )
        # Keep what the failing examples showed: Hypothesis seeds Trio's scheduler for
        # each example it runs, a run outside it might order one tick differently.
        seen: list[tuple[Example, Observation, Report]] = []

        def broken(example: Example) -> bool:
            observation = self.observe(*example)
            report = check_run(observation, max_cancel_latency=self.max_cancel_latency)
            if report.ok:
                return False
            seen[:] = [*seen[-15:], (example, observation, report)]
            return True

        try:
            found = hypothesis.find(self.strategy(), broken, settings=settings)
        except hypothesis.errors.NoSuchExample:
            return None
        match = [(obs, rep) for example, obs, rep in seen if example == found]
        if match:
            observation, report = match[-1]
        else:  # pragma: no cover - find() returns an example it saw fail
            observation = self.observe(*found)
            report = check_run(observation, max_cancel_latency=self.max_cancel_latency)
        _script, schedule, faults = found
        return Failure(tuple(observation.script), tuple(schedule), report, observation, faults)


def lifecycle_test(
    *,
    tools: FakeTools | Sequence[Tool] | None = None,
    script_strategy: st.SearchStrategy[list[Turn]] | None = None,
    schedule_strategy: st.SearchStrategy[tuple[Op, ...]] | None = None,
    faults: st.SearchStrategy[Faults] | None = None,
    run_options: Mapping[str, Any] | None = None,
    settings: hypothesis.settings | None = None,
) -> Callable[[AgentFactory], Callable[[], None]]:
    """Decorate an agent factory to make it a lifecycle property test::

        @lifecycle_test()
        def test_my_agent(model: Model) -> Agent:
            return Agent(name="mine", model=model, tools=[search, fetch])

    The decorated name becomes a test without parameters (pytest collects it) that
    runs :class:`LifecycleProperty` with the Hypothesis profile active when it runs
    (or ``settings``), without a deadline or the ``too_slow`` health check. Use it on
    a sync test: each example calls ``trio.run``.
    """

    def decorate(factory: AgentFactory) -> Callable[[], None]:
        prop = LifecycleProperty(
            factory,
            tools=tools,
            script_strategy=script_strategy,
            schedule_strategy=schedule_strategy,
            faults=faults,
            run_options=dict(run_options or {}),
        )

        def test() -> None:
            prop.run(settings)

        test.__name__ = factory.__name__
        test.__qualname__ = factory.__qualname__
        test.__doc__ = factory.__doc__
        test.__module__ = factory.__module__
        return test

    return decorate
