"""Handoffs that go back (DESIGN §17): agents that hand off to each other, named lazily
(``handoffs=[lambda: triage]``), and the ``max_handoffs`` bound on one run's switches."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn
from trio_agents.testing import check_events
from trio_agents.tracing import OpenTelemetryHooks

pytestmark = pytest.mark.trio

TO_BILLING = Turn(tool_calls=[("transfer_to_billing", {})])
TO_TRIAGE = Turn(tool_calls=[("transfer_to_triage", {})])


def triage_and_billing(
    triage_turns: list[Turn | str],
    billing_turns: list[Turn | str],
    *,
    default: Turn | str | None = None,
) -> tuple[ta.Agent, ta.Agent]:
    """triage ⇄ billing: triage names billing lazily, billing holds triage."""
    agents: dict[str, ta.Agent] = {}
    triage = ta.Agent(
        name="triage",
        instructions="Route the user.",
        model=ScriptedModel(triage_turns, default=default),
        handoffs=[lambda: agents["billing"]],
        max_turns=30,
    )
    billing = agents["billing"] = ta.Agent(
        name="billing",
        instructions="Handle refunds.",
        model=ScriptedModel(billing_turns, default=default),
        handoffs=[triage],
    )
    return triage, billing


def tool_results(result: ta.RunResult) -> list[tuple[str, str]]:
    return [(i.status, i.output) for i in result.conversation if isinstance(i, ta.ToolResult)]


async def test_triage_hands_to_billing_and_billing_hands_back() -> None:
    triage, billing = triage_and_billing([TO_BILLING, "triage: anything else?"], [TO_TRIAGE])
    async with ta.open_run(triage, "refund, then a question") as run:
        events = [e async for e in run.events()]
    result = run.result
    assert result is not None
    assert result.status == "completed", result
    assert result.final_output == "triage: anything else?"
    assert run.agent is triage
    switches = [(e.from_agent, e.to_agent) for e in events if isinstance(e, ta.RunHandoff)]
    assert switches == [("triage", "billing"), ("billing", "triage")]
    assert tool_results(result) == [
        ("ok", "transferred to billing"),
        ("ok", "transferred to triage"),
    ]
    assert check_events(result, events).ok
    # each agent's model was told about its own transfer tool and instructions
    assert isinstance(triage.model, ScriptedModel)
    assert isinstance(billing.model, ScriptedModel)
    (billing_request,) = billing.model.requests
    assert [t.name for t in billing_request.tools] == ["transfer_to_triage"]
    assert billing_request.instructions == "Handle refunds."
    assert [t.name for t in triage.model.requests[0].tools] == ["transfer_to_billing"]
    assert [t.name for t in triage.tool_specs()] == ["transfer_to_billing"]


async def test_a_transfer_past_max_handoffs_is_an_error_the_model_reads() -> None:
    triage, _billing = triage_and_billing(
        [TO_BILLING, TO_BILLING], [TO_TRIAGE, TO_TRIAGE, "billing: I will answer myself"]
    )
    result = await ta.run(triage, "ping-pong", max_handoffs=3)
    assert result.status == "completed", result
    assert result.final_output == "billing: I will answer myself"
    assert tool_results(result) == [
        ("ok", "transferred to billing"),
        ("ok", "transferred to triage"),
        ("ok", "transferred to billing"),
        ("error", "not transferred to triage: max_handoffs 3 reached; answer as billing"),
    ]


async def test_agents_that_always_hand_back_stop_at_the_default_bound() -> None:
    """Two models that only ever transfer: 10 switches (the default), then each transfer
    is refused until the run's max_turns ends it: never an endless loop."""
    agents: dict[str, ta.Agent] = {}
    triage = ta.Agent(
        name="triage",
        model=ScriptedModel([], default=TO_BILLING),
        handoffs=[lambda: agents["billing"]],
        max_turns=14,
    )
    agents["billing"] = ta.Agent(
        name="billing", model=ScriptedModel([], default=TO_TRIAGE), handoffs=[triage]
    )
    async with ta.open_run(triage, "loop") as run:
        events = [e async for e in run.events()]
    result = run.result
    assert result is not None
    assert (result.status, result.reason) == ("failed", "max_turns")
    assert sum(isinstance(e, ta.RunHandoff) for e in events) == 10
    refused = [o for s, o in tool_results(result) if s == "error"]
    assert len(refused) == 4
    assert refused[0] == "not transferred to billing: max_handoffs 10 reached; answer as triage"
    assert check_events(result, events).ok


async def test_max_handoffs_zero_offers_the_tools_but_never_switches() -> None:
    triage, _billing = triage_and_billing([TO_BILLING, "triage answers"], [])
    result = await ta.run(triage, "x", max_handoffs=0)
    assert result.status == "completed"
    assert tool_results(result) == [
        ("error", "not transferred to billing: max_handoffs 0 reached; answer as triage")
    ]
    with pytest.raises(ValueError, match="max_handoffs must be >= 0"):
        await ta.run(triage, "x", max_handoffs=-1)


async def test_a_cycle_in_a_child_run_and_in_tracing() -> None:
    """A cycle inside an as_tool child; the spans stay balanced, and each model call's
    span names the agent that made it."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    triage, _billing = triage_and_billing([TO_BILLING, "triage done"], [TO_TRIAGE])
    root = ta.Agent(
        name="root",
        model=ScriptedModel([Turn(tool_calls=[("triage", {"input": "help"})]), "root done"]),
        tools=[triage.as_tool()],
    )
    result = await ta.run(root, "go", hooks=OpenTelemetryHooks(provider))
    assert result.status == "completed", result
    assert tool_results(result) == [("ok", "triage done")]
    spans = exporter.get_finished_spans()
    chats = [
        str((s.attributes or {}).get("gen_ai.agent.name"))
        for s in spans
        if s.name.startswith("chat")
    ]
    assert sorted(chats) == sorted(["root", "root", "triage", "billing", "triage"])
    invoked = sorted(s.name for s in spans if s.name.startswith("invoke_agent"))
    assert invoked == ["invoke_agent root", "invoke_agent triage"]


async def test_lazy_targets_are_checked_when_a_run_is_made() -> None:
    def no_agent() -> Any:
        return "billing"

    def broken() -> ta.Agent:
        raise LookupError("no such agent")

    with pytest.raises(TypeError, match=r"handoffs element 0 .* returned str, not an Agent"):
        await ta.run(ta.Agent(name="t", handoffs=[no_agent]), "x")
    with pytest.raises(TypeError, match="raised LookupError: no such agent"):
        await ta.run(ta.Agent(name="t", handoffs=[broken]), "x")
    # a target's own lazy targets too: every agent the run can reach
    deep = ta.Agent(name="mid", handoffs=[broken])
    with pytest.raises(TypeError, match="Agent 'mid'"):
        await ta.run(ta.Agent(name="t", handoffs=[lambda: deep]), "x")
    # two targets with one tool name, or a tool named like a handoff tool
    twin = ta.Agent(name="b")
    with pytest.raises(ValueError, match="two targets"):
        await ta.run(ta.Agent(name="t", handoffs=[lambda: twin, lambda: ta.Agent(name="b")]), "x")

    @ta.function_tool(name="transfer_to_b")
    def clash() -> None:
        """Clash."""

    with pytest.raises(ValueError, match="the name of a handoff tool"):
        await ta.run(ta.Agent(name="t", tools=[clash], handoffs=[lambda: twin]), "x")
    with pytest.raises(TypeError, match="list of agents"):
        ta.Agent(name="t", handoffs=lambda: twin)  # type: ignore[arg-type]
    # a lazy target is called once: not when the agent is made, at its first run
    calls: list[str] = []

    def counted() -> ta.Agent:
        calls.append("called")
        return twin

    lazy = ta.Agent(name="t", model=ScriptedModel([], default="ok"), handoffs=[counted])
    assert calls == []
    for _ in range(2):
        assert (await ta.run(lazy, "x")).status == "completed"
    assert calls == ["called"]
    assert [t.name for t in lazy.tool_specs()] == ["transfer_to_b"]
    with pytest.raises(TypeError, match="not an Agent"):
        ta.Agent(name="t", handoffs=[ta.Agent])  # type: ignore[list-item]


# ------------------------------------------------------------------------ resume


def _refund_tool(ran: list[str]) -> ta.Tool:
    @ta.function_tool
    async def refund() -> str:
        """Refund the order (not idempotent)."""
        ran.append("refund")
        return "refunded"

    return refund


def _stopped_in_billing() -> list[ta.Item]:
    """What a run that handed off to billing, then died in billing's refund call, left
    in its session."""
    return [
        ta.UserMessage("refund order 7"),
        ta.ToolCall("c1", "transfer_to_billing", "{}"),
        ta.ToolResult("c1", "transferred to billing"),
        ta.ToolCall("c2", "refund", "{}"),
    ]


def _desk(ran: list[str]) -> tuple[ta.Agent, ta.Agent]:
    """triage ⇄ billing, billing with the refund tool; billing answers once resumed."""
    agents: dict[str, ta.Agent] = {}
    triage = ta.Agent(
        name="triage",
        model=ScriptedModel([], default="triage should not answer"),
        handoffs=[lambda: agents["billing"]],
    )
    billing = agents["billing"] = ta.Agent(
        name="billing",
        model=ScriptedModel([], default="billing: the refund was interrupted, retrying"),
        tools=[_refund_tool(ran)],
        handoffs=[triage],
    )
    return triage, billing


async def test_a_resumed_run_continues_as_the_agent_it_had_handed_off_to(tmp_path: Any) -> None:
    ran: list[str] = []
    triage, billing = _desk(ran)
    async with ta.sessions.SQLiteSession(tmp_path / "desk.db", "s") as session:
        await session.add_items(_stopped_in_billing())
        resume = ta.Resume(
            attempt=2, next_seq=9, started={"c2"}, reason="node died", agent="billing"
        )
        async with ta.open_run(triage, [], session=session, resume=resume) as run:
            pass
        result = run.result
        assert result is not None
        assert result.status == "completed", result
        assert run.agent is billing
        # billing's own tool call was settled by billing's rule (started, not
        # idempotent: interrupted), and billing's model answered
        assert ran == []
        assert tool_results(result)[-1] == ("error", "interrupted: node died")
        assert result.final_output == "billing: the refund was interrupted, retrying"
        assert isinstance(triage.model, ScriptedModel)
        assert triage.model.requests == []
        assert await session.get_items() == list(result.conversation)
        # a name the starting agent cannot reach: refused before anything starts
        unknown = ta.Resume(attempt=3, next_seq=20, agent="accounts")
        with pytest.raises(ValueError, match="no agent of that name"):
            async with ta.open_run(triage, [], session=session, resume=unknown):
                pass  # pragma: no cover - never entered


async def test_a_resumed_child_continues_as_the_agent_it_had_handed_off_to(
    tmp_path: Any,
) -> None:
    """A resumed parent resumes its agent-tool child from the child's session; the
    child had handed off to billing before its process died: it goes on as billing (its
    session holds only its own items, so its transfers say where it was)."""
    ran: list[str] = []
    triage, billing = _desk(ran)
    root = ta.Agent(name="root", model=ScriptedModel(["root: done"]), tools=[triage.as_tool()])
    path = tmp_path / "tree.db"
    async with ta.sessions.SQLiteSession(path, "conv") as session:
        await session.add_items(
            [ta.UserMessage("go"), ta.ToolCall("call_1_0", "triage", '{"input": "refund"}')]
        )
        async with ta.sessions.SQLiteSession(path, "conv/call_1_0") as child_session:
            await child_session.add_items(_stopped_in_billing())
        resume = ta.Resume(attempt=2, next_seq=5, started={"call_1_0"}, reason="node died")
        async with ta.open_run(root, [], session=session, resume=resume) as run:
            pass
    assert run.result is not None
    assert run.result.status == "completed", run.result
    (child,) = run.children
    assert child.agent is billing
    assert child.result is not None
    assert tool_results(child.result)[-1] == ("error", "interrupted: node died")
    assert tool_results(run.result) == [("ok", "billing: the refund was interrupted, retrying")]
    assert isinstance(triage.model, ScriptedModel)
    assert triage.model.requests == []
