"""The harness tests itself: broken components are caught, named and shrunk."""

from __future__ import annotations

import re
import textwrap
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
from trio_agents.models import ModelEvent

from .helpers import count_example


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


def test_the_plugin_works_with_dash_p(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        textwrap.dedent(
            """
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

                lifecycle_check(
                    lambda model: ta.Agent(name="x", model=model, tools=[add]),
                    settings=hypothesis.settings(max_examples=10, database=None),
                )
            """
        )
    )
    outcome = pytester.runpytest_subprocess(
        "-p", "trio_agents.testing.plugin", "-p", "no:cacheprovider"
    )
    outcome.assert_outcomes(passed=2)
