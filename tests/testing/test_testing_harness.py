"""The harness tests itself: broken components are caught, named and shrunk."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import attrs
import hypothesis
import pytest
import trio
from hypothesis import strategies as st

import trio_agents as ta
import trio_agents.testing as tt
from tests.support.helpers import count_example
from trio_agents.models import ModelEvent


def agent_with(*tools: ta.Tool, model_wrapper: Callable[[ta.Model], ta.Model] | None = None) -> Any:
    def factory(model: ta.Model) -> ta.Agent:
        return ta.Agent(
            name="t", model=model_wrapper(model) if model_wrapper else model, tools=list(tools)
        )

    return factory


# ----------------------------------------------------------- broken components


@ta.function_tool
async def stubborn(seconds: float) -> str:
    """A tool that swallows trio.Cancelled: "errors must never reach the model"."""
    try:
        await trio.sleep(seconds)
    except BaseException:  # the bug: BaseException includes trio.Cancelled
        return "something went wrong, but it is fine"
    return f"slept {seconds:g} s"


@ta.function_tool
async def shielded(seconds: float) -> str:
    """A tool that finishes its work even when cancelled (a shielded upload)."""
    with trio.CancelScope(shield=True):
        await trio.sleep(seconds)
    return "uploaded"


@attrs.frozen
class DroppingModel:
    """A model adapter that "saves tokens" by dropping empty tool results: the provider
    then sees a tool call without a result."""

    inner: ta.Model

    def stream(
        self, request: ta.ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        kept = tuple(
            item
            for item in request.items
            if not (isinstance(item, ta.ToolResult) and not item.output)
        )
        return self.inner.stream(attrs.evolve(request, items=kept))


@ta.function_tool
async def maybe_empty(empty: bool) -> str:
    """Returns an empty string when asked."""
    return "" if empty else "data"


class TelemetryHooks(ta.RunHooks):
    """A hook that uploads telemetry fire-and-forget, in a system task."""

    async def on_tool_end(self, run: ta.Run, call: ta.ToolCall, result: ta.ToolResult) -> None:
        trio.lowlevel.spawn_system_task(self._upload, call.call_id, name=f"{run.id}:upload")

    async def _upload(self, call_id: str) -> None:
        await trio.sleep(3600)


def _only(*kinds: tt.OpKind) -> hypothesis.strategies.SearchStrategy[tuple[tt.Op, ...]]:
    return tt.schedules(kinds=kinds, max_ops=3)


def test_a_tool_that_swallows_cancelled_is_caught_and_shrunk() -> None:
    prop = tt.LifecycleProperty(
        agent_with(stubborn),
        script_strategy=tt.scripts([stubborn], unknown_tools=False, max_turns=3),
        schedule_strategy=_only("cancel", "inject", "subscribe"),
    )
    failure = prop.find_failure(max_examples=300)
    assert failure is not None
    assert failure.report.first is not None
    assert failure.report.first.invariant == "tool-cancellation"
    assert "swallow trio.Cancelled" in str(failure)
    # shrunk: one turn calling the tool, one cancel
    assert len(failure.script) == 1
    assert [op.kind for op in failure.schedule] == ["cancel"]
    assert len(failure.script[0].tool_calls) == 1


def test_a_tool_that_shields_its_work_breaks_the_cancel_latency() -> None:
    prop = tt.LifecycleProperty(
        agent_with(shielded),
        script_strategy=tt.scripts([shielded], arguments={"shielded": st.just({"seconds": 60.0})}),
        schedule_strategy=_only("cancel", "subscribe"),
    )
    failure = prop.find_failure(max_examples=300)
    assert failure is not None
    # It also swallowed the cancel (its result is "ok"); the latency is the real harm.
    assert failure.report.invariants == ("tool-cancellation", "cancel-latency")
    assert re.search(r"reached the terminal update 59\.\d+ virtual s later", str(failure))
    assert [op.kind for op in failure.schedule] == ["cancel"]


def test_a_model_adapter_that_drops_a_tool_result_is_caught() -> None:
    prop = tt.LifecycleProperty(
        agent_with(maybe_empty, model_wrapper=DroppingModel),
        schedule_strategy=_only("subscribe"),
    )
    failure = prop.find_failure(max_examples=300)
    assert failure is not None
    assert failure.report.first is not None
    assert failure.report.first.invariant == "model-input"
    assert "has no result" in failure.report.first.message
    assert failure.schedule == ()
    (turn,) = failure.script[:1]
    assert turn.tool_calls == (("maybe_empty", '{"empty": true}'),)


def test_a_hook_whose_task_outlives_the_run_is_caught() -> None:
    prop = tt.LifecycleProperty(
        agent_with(maybe_empty),
        schedule_strategy=_only("cancel"),
        run_options={"hooks": TelemetryHooks()},
    )
    failure = prop.find_failure(max_examples=300)
    assert failure is not None
    assert failure.report.invariants == ("task-leak",)
    assert ":upload" in str(failure)
    assert "(named after the run)" in str(failure)
    assert failure.schedule == ()
    assert len(failure.script) == 1


def test_the_property_raises_an_assertion_naming_the_invariant() -> None:
    prop = tt.LifecycleProperty(
        agent_with(stubborn),
        schedule_strategy=_only("cancel_in_tool"),
    )
    with pytest.raises(AssertionError, match=r"\[tool-cancellation\]"):
        prop.run(
            hypothesis.settings(
                max_examples=200,
                database=None,
                derandomize=True,
                phases=[hypothesis.Phase.generate],
                print_blob=False,
            )
        )


def test_a_correct_agent_passes(lifecycle_check: Callable[..., None]) -> None:
    tools = tt.standard_tools()
    lifecycle_check(
        agent_with(*tools.tools),
        tools=tools,
        settings=hypothesis.settings(max_examples=30, database=None, derandomize=True),
    )


# ------------------------------------------------------------------ the parts


def test_check_events_on_a_hand_driven_run() -> None:
    async def main() -> tuple[ta.RunResult, list[ta.RunEvent]]:
        model = tt.ScriptedModel([tt.Turn(tool_calls=[("maybe_empty", {"empty": False})]), "ok"])
        async with ta.open_run(agent_with(maybe_empty)(model), "hi") as run:
            pass
        return await run.wait(), [e async for e in run.events()]

    result, events = trio.run(main)
    report = tt.check_events(result, events)
    assert report.ok, str(report)
    assert str(report) == "all lifecycle invariants hold"
    broken = tt.check_events(result, events[:-1])
    assert broken.invariants[0] == "one-terminal"
    with pytest.raises(tt.LifecycleViolation) as info:
        broken.raise_for_violations()
    assert info.value.report is broken


def test_fake_tools_record_what_happened() -> None:
    tools = tt.standard_tools()
    script = [
        tt.Turn(
            tool_calls=[
                ("block", {}),
                ("sleep", {"seconds": 0.5}),
                ("fail", {"after": 0.25}),
                ("crunch", {"steps": 2}),
            ]
        )
    ]
    observation = tt.run_schedule(
        agent_with(*tools.tools), script, [tt.Op(1.0, "release")], recorder=tools.recorder
    )
    count_example()
    assert tt.check_run(observation).ok
    states = {c.tool: (c.state, c.ended_at) for c in observation.tool_calls}
    assert states["block"] == ("finished", 1.0 + 1 / 1024)
    assert states["sleep"] == ("finished", 0.5)
    assert states["fail"] == ("failed", 0.25)
    assert states["crunch"] == ("finished", None)
    assert tools.recorder.released

    cancelled = tt.run_schedule(
        agent_with(*tools.tools), script, [tt.Op(0.125, "cancel")], recorder=tools.recorder
    )
    assert {c.tool: c.state for c in cancelled.tool_calls}["block"] == "cancelled"
    assert {c.tool: c.state for c in cancelled.tool_calls}["sleep"] == "cancelled"


def test_schedules_are_sorted_and_items_are_injectable() -> None:
    @hypothesis.given(tt.schedules(), tt.items())
    @hypothesis.settings(max_examples=50, database=None)
    def check(schedule: tuple[tt.Op, ...], items: tuple[ta.Item, ...]) -> None:
        assert [op.at for op in schedule] == sorted(op.at for op in schedule)
        assert items
        assert ta.conversation_problems(items) == []

    check()


def test_describe_and_report_are_readable() -> None:
    observation = tt.run_schedule(
        agent_with(stubborn),
        [tt.Turn(tool_calls=[("stubborn", {"seconds": 5.0})])],
        [tt.Op(1.0, "cancel", reason="stop it")],
    )
    report = tt.check_run(observation)
    text = str(report)
    assert text.startswith("lifecycle invariant broken: [tool-cancellation] tool 'stubborn'")
    assert "1: cancel('stop it')" in text
    assert "outcome: cancelled (stop it)" in text
    assert set(report.invariants) <= set(tt.INVARIANTS)


def test_the_plugin_works_with_dash_p(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh pytest with Hypothesis' default profile (a 200 ms deadline, every health
    check on) and an agent with a sync tool that takes 0.25 s a call."""
    # Hypothesis picks its own lenient "ci" profile when CI is set: keep the default.
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(
        textwrap.dedent(
            """
            import time

            import hypothesis
            import trio_agents as ta


            def test_scripted(scripted_model):
                model = scripted_model(["hello"])
                assert model.turns[0].text == ("hello",)


            def test_lifecycle(lifecycle_check):
                @ta.function_tool
                async def add(a: int, b: int) -> int:
                    '''Add.'''
                    return a + b

                @ta.function_tool
                def crunch(rows: int) -> int:
                    '''Crunch rows in a worker thread, slowly.'''
                    time.sleep(0.25)
                    return rows

                assert hypothesis.settings().deadline is not None  # the default profile
                lifecycle_check(
                    lambda model: ta.Agent(name="x", model=model, tools=[add, crunch]),
                    settings=hypothesis.settings(max_examples=8, database=None),
                )
            """
        )
    )
    outcome = pytester.runpytest_subprocess(
        "-p", "trio_agents.testing.plugin", "-p", "no:cacheprovider"
    )
    outcome.assert_outcomes(passed=2)


# ------------------------------------------------------------ faults


def test_fault_tools_misbehave_as_documented() -> None:
    tools = tt.standard_tools(faults=True)
    script: list[tt.Turn | str] = [
        tt.Turn(
            tool_calls=[
                ("swallow", {"seconds": 2.0}),
                ("shield", {"seconds": 8.0}),
                ("stubborn", {}),
                ("garbage", {"kind": 0}),
                ("garbage", {"kind": 4}),
            ]
        ),
        "done",
    ]
    observation = tt.run_schedule(
        agent_with(*tools.tools),
        script,
        [tt.Op(0.5, "cancel", reason="stop")],
        recorder=tools.recorder,
    )
    count_example()
    # The run keeps its promises; the checker does not blame it for what the tools do.
    assert tt.check_run(observation).ok, tt.check_run(observation)
    records = {c.tool: c for c in observation.tool_calls if c.tool != "garbage"}
    assert {name: r.fault for name, r in records.items()} == {
        "swallow": "swallow",
        "shield": "shield",
        "stubborn": "stubborn",
    }
    assert records["shield"].ended_at == 8.0  # the cancel only reached it after its shield
    assert records["stubborn"].state == "finished"  # released once the schedule was over
    results = {
        item.call_id: item
        for item in observation.result.new_items
        if isinstance(item, ta.ToolResult)
    }
    assert all(isinstance(r.output, str) for r in results.values())
    assert observation.result.status == "cancelled"
    assert observation.event_times[-1] == pytest.approx(8.0)


def test_fault_tools_that_finish_return_text() -> None:
    tools = tt.standard_tools(faults=True)
    script: list[tt.Turn | str] = [
        tt.Turn(tool_calls=[("garbage", {"kind": k}) for k in range(len(tt.GARBAGE))]),
        "ok",
    ]
    observation = tt.run_schedule(agent_with(*tools.tools), script, recorder=tools.recorder)
    assert tt.check_run(observation).ok
    outputs = [i for i in observation.result.new_items if isinstance(i, ta.ToolResult)]
    assert len(outputs) == len(tt.GARBAGE)
    assert {r.status for r in outputs} <= {"ok", "error"}
    assert any(r.status == "error" for r in outputs)  # the one that cannot even be printed


def test_the_checker_blames_a_user_tool_not_a_fault_tool_for_swallowing() -> None:
    tools = tt.standard_tools(faults=True)
    faulty = tt.run_schedule(
        agent_with(*tools.tools),
        [tt.Turn(tool_calls=[("swallow", {"seconds": 2.0})]), "done"],
        [tt.Op(0.0, "cancel_in_tool")],
        recorder=tools.recorder,
    )
    assert tt.check_run(faulty).ok
    users = tt.run_schedule(
        agent_with(stubborn),
        [tt.Turn(tool_calls=[("stubborn", {"seconds": 2.0})]), "done"],
        [tt.Op(0.0, "cancel_in_tool")],
    )
    assert tt.check_run(users).invariants == ("tool-cancellation",)
    assert "(tools running: ['call_1_0'])" in users.applied[0][1]


def test_faults_shrink_to_none_and_describe_themselves() -> None:
    assert not tt.Faults()
    fault = tt.Faults(
        model=(tt.ModelFault(2, "bytes_text", 1),),
        hooks=(tt.HookFault("on_tool_end", "block"),),
        session=tt.SessionFault("raise_on_add", 2),
    )
    assert fault
    assert fault.describe() == [
        "model call 2: bytes_text after 1 event(s)",
        "on_tool_end: block from call 1",
        "session: raise_on_add from call 2",
    ]
    smallest = hypothesis.find(
        tt.faults(), lambda f: True, settings=hypothesis.settings(database=None)
    )
    assert smallest == tt.Faults()
    with_a_model_fault = hypothesis.find(
        tt.faults(), lambda f: bool(f.model), settings=hypothesis.settings(database=None)
    )
    assert with_a_model_fault == tt.Faults(model=(tt.ModelFault(1, "raise", 0),))


def test_a_faulty_model_is_watched_and_its_fault_recorded() -> None:
    observation = tt.run_schedule(
        agent_with(maybe_empty),
        [tt.Turn(text="a b c", delay=0.25), "done"],
        faults=tt.Faults(model=(tt.ModelFault(1, "raise", 2),)),
    )
    (stream,) = observation.streams
    assert (stream.number, stream.opened_at, stream.closed_at) == (1, 0.0, 0.5)
    assert stream.fired_at == 0.5
    assert stream.error == "InjectedFault: model call 1 fell over (fault)"
    assert observation.result.status == "failed"
    assert "model call 1: raise after 2 event(s)" in observation.describe()


class LosingSession:
    """A user's session that acknowledges writes it never makes ("eventually
    consistent"): the run trusts it, and so would a client."""

    def __init__(self) -> None:
        self.inner = ta.sessions.MemorySession("losing")
        self.session_id = "losing"
        self.lock_key = self

    async def get_items(self) -> list[ta.Item]:
        return await self.inner.get_items()

    async def add_items(self, items: Any) -> None:
        items = list(items)
        await self.inner.add_items(items[:1])  # the first item only

    async def clear(self) -> None:
        await self.inner.clear()


def test_a_session_that_loses_writes_is_caught() -> None:
    prop = tt.LifecycleProperty(agent_with(maybe_empty), session=LosingSession)
    failure = prop.find_failure(max_examples=100)
    assert failure is not None
    assert {"session-stored", "session-error"} <= set(failure.report.invariants)
    assert "a client would trust it as saved" in str(failure)
    assert failure.schedule == ()


def _clean_observation() -> tt.Observation:
    observation = tt.run_schedule(
        agent_with(maybe_empty),
        [tt.Turn(text="let me look", tool_calls=[("maybe_empty", {"empty": False})]), "ok"],
        session=True,
    )
    assert tt.check_run(observation).ok
    return observation


def test_the_checker_names_what_a_broken_run_core_does() -> None:
    """Broken runs, made by editing a clean observation: each names its invariant."""
    clean = _clean_observation()
    assert clean.fresh_run is not None
    assert clean.fresh_run.outcome == "completed"
    assert clean.stored == clean.result.conversation

    def broken(**changes: Any) -> tuple[str, ...]:
        return tt.check_run(attrs.evolve(clean, **changes)).invariants

    never_ended = [e for e in clean.events if e is not clean.events[-1]]
    assert broken(
        outcome=None,
        events=tuple(never_ended),
        event_times=clean.event_times[:-1],
        run_error="TypeError: boom",
        ended={"wait": False, "updated": False, "events": False, "late_events": False},
    )[:2] == ("run-ends", "one-terminal")
    busy = attrs.evolve(clean.fresh_run, outcome="busy")
    assert broken(fresh_run=busy) == ("session-released",)
    assert broken(stored=clean.stored[:2]) == ("session-error",)
    start = tt.HookCall("on_tool_start", "tool:x", 0.0, outcome="returned", ended_at=0.0)
    assert broken(hook_calls=(start,)) == ("hooks-balanced",)
    stream = tt.StreamRecord(1, 0.0, 0.0, tt.ModelFault(1, "unknown_event"), fired_at=0.0)
    assert broken(streams=(stream,)) == ("model-events",)
    late = (*clean.event_times[:-1], clean.event_times[-2] + 6.0)
    assert broken(event_times=late) == ("cleanup-latency",)
    dropped = [
        e
        for e in clean.events
        if not (isinstance(e, ta.RunItemEvent) and isinstance(e.item, ta.AssistantMessage))
    ]
    assert "streamed-text" in tt.check_events(clean.result, dropped).invariants


def test_examples_replay_exactly_threads_faults_and_all() -> None:
    """Two passes over the same (derandomized) examples see the same runs, event by
    event and tick by tick: Hypothesis seeds Trio's scheduler for each example, and
    thread tools hold the MockClock while they work."""
    tools = tt.standard_tools(faults=True)
    passes: list[list[list[tuple[str, str, int, float]]]] = []

    @hypothesis.given(tt.scripts(tools), tt.schedules(), tt.faults(session=False))
    @hypothesis.example(
        [
            tt.Turn(
                text="a b",
                tool_calls=[
                    ("crunch", {"steps": 3}),
                    ("shield", {"seconds": 2.0}),
                    ("stubborn", {}),
                    ("sleep", {"seconds": 0.5}),
                ],
            )
        ],
        (tt.Op(0.0, "cancel_in_tool"), tt.Op(1.0, "inject", when="now")),
        tt.Faults(hooks=(tt.HookFault("on_tool_end", "block"),)),
    )
    @hypothesis.settings(max_examples=25, database=None, derandomize=True)
    def record(script: list[tt.Turn], schedule: tuple[tt.Op, ...], fault: tt.Faults) -> None:
        observation = tt.run_schedule(
            agent_with(*tools.tools), script, schedule, recorder=tools.recorder, faults=fault
        )
        passes[-1].append(
            [
                (e.type, getattr(e, "name", ""), e.seq, t)
                for e, t in zip(observation.events, observation.event_times, strict=True)
            ]
        )

    for _ in range(2):
        passes.append([])
        record()
    assert len(passes[0]) == 26
    assert passes[0] == passes[1]
    started = {
        name for trace in passes[0] for (kind, name, _, _) in trace if kind == "tool.started"
    }
    assert {"crunch", "stubborn", "shield", "swallow"} <= started


# ------------------------------------------------------------ defaults that work


@ta.function_tool
async def weather(city: str) -> str:
    """Look up the weather (a user's tool: "never show the model an error")."""
    try:
        await trio.sleep(0.5)  # a slow API
    except trio.Cancelled:
        return "weather unavailable"  # the bug: swallows the cancellation
    return f"sunny in {city}"


def test_a_swallowing_tool_is_found_within_the_default_budget() -> None:
    """Default strategies, default example budget (Hypothesis' "default" profile, 100
    examples), derandomized so the test is deterministic."""
    prop = tt.LifecycleProperty(lambda model: ta.Agent(name="w", model=model, tools=[weather]))
    default = hypothesis.settings.get_profile("default")
    assert default.max_examples == 100
    with pytest.raises(tt.LifecycleViolation, match=r"\[tool-cancellation\] tool 'weather'"):
        prop.run(hypothesis.settings(default, derandomize=True, database=None, print_blob=False))


def test_harness_settings_drop_what_depends_on_machine_speed() -> None:
    default = hypothesis.settings.get_profile("default")
    assert default.deadline is not None
    settings = tt.harness_settings(default)
    assert settings.deadline is None
    assert hypothesis.HealthCheck.too_slow in settings.suppress_health_check
    assert settings.max_examples == default.max_examples
    mine = hypothesis.settings(
        max_examples=7, suppress_health_check=[hypothesis.HealthCheck.data_too_large]
    )
    assert set(tt.harness_settings(mine).suppress_health_check) == {
        hypothesis.HealthCheck.data_too_large,
        hypothesis.HealthCheck.too_slow,
    }
    assert tt.harness_settings(mine).max_examples == 7


@ta.function_tool
def report(ctx: ta.ToolContext, rows: int) -> str:
    """Build a report in a worker thread (a user's sync tool; takes 0.3 s)."""
    # Longer than Hypothesis' default 200 ms deadline. It waits on ctx.cancelled, as a
    # sync tool should: one that slept through a cancel would be a thread-leak whenever
    # a loaded machine let its real 0.3 s outlast the harness's clock hold.
    if ctx.cancelled.wait(0.3):
        return "cancelled"
    return f"{rows} rows"


def test_lifecycle_test_runs_a_sync_tool_under_the_default_profile() -> None:
    @tt.lifecycle_test(
        script_strategy=st.just(
            [tt.Turn(tool_calls=[("report", {"rows": 3})]), tt.Turn(text="done")]
        ),
        settings=hypothesis.settings(
            hypothesis.settings.get_profile("default"), max_examples=2, database=None
        ),
    )
    def test_reporting_agent(model: ta.Model) -> ta.Agent:
        return ta.Agent(name="r", model=model, tools=[report])

    test_reporting_agent()  # no DeadlineExceeded


def test_lifecycle_check_runs_a_sync_tool(lifecycle_check: Callable[..., None]) -> None:
    lifecycle_check(
        agent_with(report),
        script_strategy=st.just(
            [tt.Turn(tool_calls=[("report", {"rows": 1})]), tt.Turn(text="done")]
        ),
        settings=hypothesis.settings(
            hypothesis.settings.get_profile("default"), max_examples=2, database=None
        ),
    )


def check_export_cancelled(
    prop: tt.LifecycleProperty, release: threading.Event | None = None
) -> tt.Report:
    """Check one example where the model calls ``export_rows`` and the run is cancelled
    at 0.5 s; then set ``release`` (whatever happened) to let the tool's thread go."""
    try:
        return prop.check(
            [tt.Turn(tool_calls=[("export_rows", {"rows": 3})]), "done"],
            [tt.Op(0.5, "cancel", reason="stop")],
        )
    finally:
        if release is not None:
            release.set()


def test_a_user_thread_tool_that_ignores_cancellation_is_reported() -> None:
    stop = threading.Event()

    @ta.function_tool
    def export_rows(ctx: ta.ToolContext, rows: int) -> str:
        """Export rows to a slow warehouse (30 s), never looking at ctx.cancelled."""
        stop.wait(30)
        return f"exported {rows}"

    prop = tt.LifecycleProperty(agent_with(export_rows), thread_grace=0.5)
    report = check_export_cancelled(prop, stop)
    assert report.invariants == ("thread-leak",), report
    assert "does a sync tool ignore ctx.cancelled?" in str(report)
    assert "outcome: cancelled (stop)" in str(report)


def test_waiting_fake_tools_are_let_go_even_when_the_schedule_is_cut_short() -> None:
    """An outer cancel ends the caller's block before the rest of the schedule: the
    harness still releases the fake tools (a stubborn thread is not the run's leak)."""
    tools = tt.standard_tools(faults=True)
    observation = tt.run_schedule(
        agent_with(*tools.tools),
        [tt.Turn(tool_calls=[("stubborn", {})])],
        [tt.Op(0.5, "outer_cancel"), tt.Op(8.0, "subscribe")],
        recorder=tools.recorder,
    )
    assert tt.check_run(observation).ok, tt.check_run(observation)
    assert observation.result.reason == "parent cancelled"
    assert [c.state for c in observation.tool_calls] == ["finished"]


class ReleaseOnToolEnd(ta.RunHooks):
    """Lets a thread tool go once the run has closed its call (as cancelled)."""

    def __init__(self, release: threading.Event) -> None:
        self.release = release

    async def on_tool_end(self, run: ta.Run, call: ta.ToolCall, result: ta.ToolResult) -> None:
        self.release.set()


@pytest.mark.parametrize("takes_ctx", [True, False])
def test_a_thread_tool_returning_after_its_cancel_unread_is_reported_whatever_the_grace(
    takes_ctx: bool,
) -> None:
    """Issue 29: the tool ignores the cancel only until the run's repair lets it go
    (well within the default 5 s grace): found by what it did (returned after its call
    was cancelled, never having read ctx.cancelled), not by how long it ran."""
    release = threading.Event()

    if takes_ctx:

        @ta.function_tool
        def export_rows(ctx: ta.ToolContext, rows: int) -> str:
            """Export rows, never looking at ctx.cancelled."""
            release.wait(30)
            return f"exported {rows}"

    else:

        @ta.function_tool
        def export_rows(rows: int) -> str:
            """Export rows; it cannot even see a cancellation."""
            release.wait(30)
            return f"exported {rows}"

    prop = tt.LifecycleProperty(
        agent_with(export_rows), run_options={"hooks": ReleaseOnToolEnd(release)}, thread_hold=0.05
    )
    report = check_export_cancelled(prop, release)
    assert report.invariants == ("thread-leak",), report
    assert "returned after its call was cancelled, never having read ctx.cancelled" in str(report)


def test_a_thread_tool_that_reads_ctx_cancelled_is_not_reported() -> None:
    @ta.function_tool
    def export_rows(ctx: ta.ToolContext, rows: int) -> str:
        """Export rows, stopping when cancelled."""
        ctx.cancelled.wait(30)
        return "stopped"

    prop = tt.LifecycleProperty(agent_with(export_rows), thread_hold=0.05)
    report = check_export_cancelled(prop)
    assert report.ok, report


def test_a_process_leaked_with_an_explicit_env_is_reported() -> None:
    """Issue 29: the child gets env= without the harness's marker; it is still found,
    as a descendant of the process that was not there before the run."""
    started: list[subprocess.Popen[bytes]] = []

    @ta.function_tool
    def launch() -> str:
        """Start a helper process and forget about it."""
        started.append(
            subprocess.Popen(
                [sys.executable, "-c", "import time; time.sleep(60)"],
                env={"PATH": os.environ.get("PATH", "")},
                stdin=subprocess.DEVNULL,
            )
        )
        return "launched"

    prop = tt.LifecycleProperty(agent_with(launch))
    try:
        report = prop.check([tt.Turn(tool_calls=[("launch", {})]), "done"], [])
    finally:
        for process in started:
            process.kill()
            process.wait()
    assert started
    assert report.invariants == ("process-leak",), report
    assert f"process {started[0].pid} " in str(report)
