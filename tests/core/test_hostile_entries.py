"""A user's text with a lone surrogate, entering a run's events, reasons and records
from in-process code: ``ctx.progress`` (nested data), ``run.cancel(reason)``, a
guardrail's ``info``, an agent's name (a handoff's target), a ``run_id``. Each is
cleaned where it enters (U+FFFD), as items are, so every event encodes as UTF-8: the
server's faces send them as is (``tests/faces/test_hostile_strings.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.core_runs import raising_tool
from tests.support.helpers import collect
from trio_agents.models import ScriptedModel, Turn
from trio_agents.testing import check_events

LONE = "\ud800"


def _encodes(events: list[ta.RunEvent]) -> str:
    text = json.dumps([event.to_json() for event in events], ensure_ascii=False)
    text.encode("utf-8")  # raises on a lone surrogate
    return text


@ta.function_tool
async def report(ctx: ta.ToolContext) -> str:
    """Report progress."""
    ctx.progress(f"m{LONE}", data={f"k{LONE}": [f"v{LONE}", ("\udc00", 1)]})
    return "ok"


async def test_progress_is_cleaned_through_nested_data() -> None:
    model = ScriptedModel([Turn(tool_calls=[("report", {})]), Turn(text="done")])
    async with ta.open_run(ta.Agent(name="a", model=model, tools=[report]), "go") as run:
        pass
    events = await collect(run)
    _encodes(events)
    (progress,) = [e for e in events if isinstance(e, ta.ToolProgress)]
    assert progress.message == "m\ufffd"
    assert progress.data == {"data": {"k\ufffd": ["v\ufffd", ("\ufffd", 1)]}}
    assert run.result is not None
    check_events(run.result, events).raise_for_violations()


@ta.function_tool
async def hang() -> str:
    """Wait."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


async def test_a_cancel_reason_is_cleaned_in_the_result_the_update_and_child_details(
    autojump_clock: trio.testing.MockClock,
) -> None:
    child = ta.Agent(
        name="child", model=ScriptedModel([], default=Turn(tool_calls=[("hang", {})])), tools=[hang]
    )
    parent_model = ScriptedModel([Turn(tool_calls=[("child", {"input": "x"})])])
    parent = ta.Agent(name="parent", model=parent_model, tools=[child.as_tool(name="child")])
    async with ta.open_run(parent, "go") as run:
        await trio.testing.wait_all_tasks_blocked()
        run.cancel(f"stop {LONE}")
    assert run.result is not None
    assert run.result.reason == "stop \ufffd"
    events = await collect(run, None)
    _encodes(events)
    (descendant,) = run.children
    last = [e async for e in descendant.events()][-1]
    assert isinstance(last, ta.RunUpdated)
    assert last.detail == {"by": run.id, "reason": "stop \ufffd"}


@ta.output_guardrail
async def refuse(_run: ta.Run, _text: Any) -> ta.GuardrailResult:
    return ta.GuardrailResult(tripped=True, info=f"bad {LONE}")


async def test_a_guardrail_info_is_cleaned_in_the_reason_and_the_error() -> None:
    agent = ta.Agent(name="g", model=ScriptedModel(["answer"]), output_guardrails=[refuse])
    result = await ta.run(agent, "go")
    assert result.status == "failed"
    assert result.reason == "guardrail refuse: bad \ufffd"
    assert str(result.error) == result.reason
    assert isinstance(result.error, ta.GuardrailTripped)
    assert result.error.info == f"bad {LONE}"  # the guardrail's own value, as it gave it


async def test_a_handoff_to_an_agent_named_with_a_lone_surrogate() -> None:
    target = ta.Agent(name=f"bill{LONE}", model=ScriptedModel(["billed"]))
    (spec,) = ta.Agent(name="t", model=ScriptedModel([]), handoffs=[target]).tool_specs()
    triage = ta.Agent(
        name="triage",
        model=ScriptedModel([Turn(tool_calls=[(spec.name, {})])]),
        handoffs=[target],
    )
    async with ta.open_run(triage, "go") as run:
        pass
    events = await collect(run)
    _encodes(events)
    (handoff,) = [e for e in events if isinstance(e, ta.RunHandoff)]
    assert handoff.to_agent == "bill\ufffd"


async def test_a_run_id_utf8_cannot_encode_is_refused() -> None:
    agent = ta.Agent(name="a", model=ScriptedModel(["hi"]))
    with pytest.raises(ValueError, match="run_id must be encodable"):
        await ta.run(agent, "go", run_id=f"r{LONE}")


async def test_a_failure_summarised_from_an_exception_message() -> None:
    """A failed run's reason summarises its error (``"Type: message"``): the message
    is the user's text, cleaned; ``result.error`` stays the exception raised."""
    tool = raising_tool("boom", RuntimeError, f"broke {LONE}")
    model = ScriptedModel([Turn(tool_calls=[("boom", {})])])
    agent = ta.Agent(name="a", model=model, tools=[tool])
    async with ta.open_run(agent, "go", on_tool_error="fail") as run:
        pass
    assert run.result is not None
    assert run.result.status == "failed"
    assert run.result.reason is not None
    assert "broke \ufffd" in run.result.reason
    _encodes(await collect(run))
