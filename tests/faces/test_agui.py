"""The AG-UI face (DESIGN §19) end to end: a real server on loopback, read with an
httpx streaming client; every event parsed back with the ``ag-ui-protocol`` models and
checked against AG-UI's ordering rules. Text, tool calls, a fan-out of children as
steps, an approval interrupt answered by ``resume``, a cancel (``RUN_FINISHED`` with
the ``cancelled`` outcome, not a success), a failure (``RUN_ERROR``)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import trio

import trio_agents as ta
from tests.support import agui_support as agui
from trio_agents.models import ScriptedModel, Turn


@ta.function_tool
async def add(a: int, b: int) -> str:
    """Add two numbers."""
    return str(a + b)


@ta.function_tool
async def sleep_hour() -> str:
    """Sleep for an hour."""
    await trio.sleep(3600)
    return "woke"


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


async def test_text_and_tool_calls_stream_as_agui_events() -> None:
    agent = agui.scripted(
        "calc",
        [Turn(text="let me add", tool_calls=[("add", {"a": 2, "b": 3})]), "it is 5"],
        add,
    )
    events, host = await agui.whole_run({"calc": agent}, "calc")
    started, finished = events[0], events[-1]
    assert (started["threadId"], started["runId"]) == ("t1", "ag-1")
    run_id = agui.ours(started)["run_id"]
    usage = finished.pop("usage")  # the scripted model's estimate (see the usage tests)
    assert [entry["totalTokens"] > 0 for entry in usage] == [True]
    assert finished == {
        "type": "RUN_FINISHED",
        "threadId": "t1",
        "runId": "ag-1",
        "outcome": {"type": "success"},
        "metadata": {"trio-agents": {"run_id": run_id}},
    }
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "let me addit is 5"
    call = next(e for e in events if e["type"] == "TOOL_CALL_START")
    assert call["toolCallName"] == "add"
    args = "".join(e["delta"] for e in events if e["type"] == "TOOL_CALL_ARGS")
    assert args == '{"a": 2, "b": 3}'
    result = next(e for e in events if e["type"] == "TOOL_CALL_RESULT")
    assert (result["toolCallId"], result["content"]) == (call["toolCallId"], "5")
    assert _types(events).index("TOOL_CALL_END") < _types(events).index("TOOL_CALL_RESULT")
    # The run is ours: the thread is its session.
    info = await _finished_info(host, run_id)
    assert (info.session_id, info.status) == ("t1", "completed")


async def _finished_info(host: Any, run_id: str) -> Any:
    return await host.wait_terminal("alice", run_id)


async def test_the_thread_is_the_session_and_only_new_user_messages_are_input() -> None:
    model = ScriptedModel(["first answer", "second answer"])
    agent = ta.Agent(name="chat", instructions="test", model=model)
    with trio.fail_after(30):
        async with agui.agui_server({"chat": agent}) as (_, _, client):
            async with agui.agui_stream(client, "chat", agui.run_input(text="hello")) as stream:
                agui.check_order(await stream.rest())
            # The client sends the whole history, as AG-UI clients do: only the user
            # message after the last assistant message is new.
            body = agui.run_input(run="ag-2", text=None)
            body["messages"] = [
                {"id": "u1", "role": "user", "content": "hello"},
                {"id": "a1", "role": "assistant", "content": "first answer"},
                {"id": "u2", "role": "user", "content": [{"type": "text", "text": "again"}]},
            ]
            async with agui.agui_stream(client, "chat", body) as stream:
                agui.check_order(await stream.rest())
    second = model.requests[1].items
    assert [(type(i).__name__, getattr(i, "content", None)) for i in second] == [
        ("UserMessage", "hello"),
        ("AssistantMessage", "first answer"),
        ("UserMessage", "again"),
    ]


async def test_a_fan_out_of_children_streams_as_steps() -> None:
    helper = agui.scripted("helper", [], default=Turn(text="child says hi"))
    root = agui.scripted(
        "root",
        [Turn(tool_calls=[("helper", {"input": "x"}), ("helper", {"input": "y"})]), "both done"],
        helper.as_tool(),
    )
    events, _ = await agui.whole_run({"root": root}, "root")
    assert events[-1]["outcome"] == {"type": "success"}
    started = [e for e in events if e["type"] == "STEP_STARTED"]
    finished = [e for e in events if e["type"] == "STEP_FINISHED"]
    assert len(started) == len(finished) == 2
    assert {e["stepName"] for e in started} == {e["stepName"] for e in finished}
    assert all(agui.ours(e)["status"] == "completed" for e in finished)
    # The children's own text streams inside their steps, as messages of their own.
    child_ids = {agui.ours(e)["run_id"] for e in started}
    child_messages = {e["messageId"] for e in events if e["type"] == "TEXT_MESSAGE_START"} - {
        f"{agui.ours(events[0])['run_id']}.2"
    }
    assert {m.rsplit(".", 1)[0] for m in child_messages} == child_ids
    for step_start, step_end in zip(started, finished, strict=False):
        assert events.index(step_start) < events.index(step_end)


async def test_an_approval_interrupts_the_agui_run_and_resume_continues_it() -> None:
    agent = agui.scripted("ops", [Turn(tool_calls=[("launch", {})]), "launched it"], agui.launch)
    with trio.fail_after(30):
        async with agui.agui_server({"ops": agent}) as (host, _, client):
            first, interrupt = await agui.until_interrupt(client, "ops")
            call = next(e for e in first if e["type"] == "TOOL_CALL_START")
            assert interrupt["toolCallId"] == call["toolCallId"]
            assert interrupt["reason"] == "tool_approval"
            assert "launch" in interrupt["message"]
            assert interrupt["responseSchema"]["required"] == ["approved"]
            run_id = agui.ours(first[0])["run_id"]
            # Our run is alive, waiting: the AG-UI run ended, ours did not.
            assert (await host.get("alice", run_id)).status == "awaiting_approval"
            async with agui.agui_stream(client, "ops", agui.approve(interrupt)) as stream:
                second = await stream.rest()
    agui.check_order(second)
    assert second[0]["runId"] == "ag-2"
    assert agui.ours(second[0])["run_id"] == run_id
    result = next(e for e in second if e["type"] == "TOOL_CALL_RESULT")
    assert (result["toolCallId"], result["content"]) == (call["toolCallId"], "launched")
    text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "launched it"
    assert second[-1]["outcome"] == {"type": "success"}
    # Nothing the first AG-UI run sent is sent again.
    assert not any(e["type"] == "TOOL_CALL_START" for e in second)


async def test_a_rejected_or_dismissed_approval_answers_the_call_with_an_error() -> None:
    for status, payload, expected in (
        ("resolved", {"approved": False, "message": "not today"}, "not today"),
        ("cancelled", None, "the user dismissed the approval"),
    ):
        agent = agui.scripted("ops", [Turn(tool_calls=[("launch", {})]), "fine"], agui.launch)
        with trio.fail_after(30):
            async with agui.agui_server({"ops": agent}) as (_, _, client):
                _, interrupt = await agui.until_interrupt(client, "ops")
                body = agui.run_input(run="ag-2")
                entry: dict[str, Any] = {"interruptId": interrupt["id"], "status": status}
                if payload is not None:
                    entry["payload"] = payload
                body["resume"] = [entry]
                async with agui.agui_stream(client, "ops", body) as stream:
                    second = await stream.rest()
        agui.check_order(second)
        result = next(e for e in second if e["type"] == "TOOL_CALL_RESULT")
        assert expected in result["content"]
        assert agui.ours(result)["status"] == "error"
        assert second[-1]["outcome"] == {"type": "success"}


async def test_a_cancelled_run_finishes_cancelled_not_as_a_success() -> None:
    agent = agui.scripted("slow", [], sleep_hour, default=Turn(tool_calls=[("sleep_hour", {})]))
    with trio.fail_after(30):
        async with (
            agui.agui_server({"slow": agent}) as (_, _, client),
            agui.agui_stream(client, "slow", agui.run_input()) as stream,
        ):
            started = await stream.next()
            assert started is not None
            await stream.until("TOOL_CALL_END")
            # AG-UI has no cancel request: another face cancels by our run id.
            answer = await client.post(
                f"/runs/{agui.ours(started)['run_id']}/cancel",
                json={"reason": "enough"},
                headers=agui.ALICE,
            )
            assert answer.status_code < 300, answer.text
            events = await stream.rest()
    agui.check_order(events)
    finished = events[-1]
    assert finished["type"] == "RUN_FINISHED"
    assert finished["outcome"] == {"type": "cancelled"}
    assert agui.ours(finished)["reason"] == "enough"


async def test_a_failed_run_ends_with_run_error() -> None:
    agent = agui.scripted("broken", [Turn(text="partial ", fail=ValueError("model exploded"))])
    events, _ = await agui.whole_run({"broken": agent}, "broken")
    error = events[-1]
    assert error["type"] == "RUN_ERROR"
    assert error["code"] == "failed"
    assert error["message"]
    assert "RUN_FINISHED" not in _types(events)


async def test_a_session_busy_thread_is_refused_before_the_stream() -> None:
    agent = agui.scripted("ops", [Turn(tool_calls=[("launch", {})]), "x"], agui.launch)
    with trio.fail_after(30):
        async with agui.agui_server({"ops": agent}) as (_, _, client):
            async with agui.agui_stream(client, "ops", agui.run_input()) as stream:
                await stream.rest()  # ends on the interrupt; the run waits, busy
            answer = await client.post(
                "/ag-ui/ops", json=agui.run_input(run="ag-2"), headers=agui.ALICE
            )
    assert answer.status_code == 409
    assert answer.json()["error"]["code"] == "session_busy"


async def test_a_childs_approval_interrupts_and_the_resume_loses_nothing_of_its_siblings() -> None:
    """One child waits for an approval while its sibling is still working: the AG-UI run
    ends on the interrupt; the sibling finishes while no stream is open; the resumed
    AG-UI run carries the sibling's end and the approved call's result, and nothing
    the first AG-UI run already sent."""
    gate = agui.new_gate()
    asker = agui.scripted("asker", [Turn(tool_calls=[("launch", {})]), "asker done"], agui.launch)
    worker = agui.scripted("worker", [Turn(tool_calls=[("gated", {})]), "worker done"], agui.gated)
    root = agui.scripted(
        "root",
        [Turn(tool_calls=[("asker", {"input": "a"}), ("worker", {"input": "w"})]), "all done"],
        asker.as_tool(),
        worker.as_tool(),
    )
    with trio.fail_after(30):
        async with agui.agui_server({"root": root}) as (host, _, client):
            first, interrupt = await agui.until_interrupt(client, "root")
            asker_run = interrupt["metadata"]["trio-agents"]["run_id"]
            assert asker_run != agui.ours(first[0])["run_id"]
            assert (
                interrupt["toolCallId"]
                == f"{asker_run}.{interrupt['metadata']['trio-agents']['call_id']}"
            )
            # The worker goes on and finishes while no AG-UI stream is open.
            gate.set()
            worker_run = next(
                agui.ours(e)["run_id"]
                for e in first
                if e["type"] == "STEP_STARTED" and "worker" in e["stepName"]
            )
            assert (await host.wait_terminal("alice", worker_run)).status == "completed"
            async with agui.agui_stream(client, "root", agui.approve(interrupt)) as stream:
                second = await stream.rest()
    agui.check_order(second)
    assert second[-1]["outcome"] == {"type": "success"}
    results = {e["toolCallId"]: e["content"] for e in second if e["type"] == "TOOL_CALL_RESULT"}
    assert results[interrupt["toolCallId"]] == "launched"
    assert "through" in results.values()  # the worker's tool, run while no stream was open
    worker_text = "".join(
        e["delta"]
        for e in second
        if e["type"] == "TEXT_MESSAGE_CONTENT" and e["messageId"].startswith(worker_run)
    )
    assert worker_text == "worker done"
    # Nothing twice: every call is announced by one AG-UI run only.
    starts = [e["toolCallId"] for e in first + second if e["type"] == "TOOL_CALL_START"]
    assert len(starts) == len(set(starts)) == 4  # two of the root, one per child


async def test_a_resume_after_a_handoff_continues_the_run() -> None:
    billing = agui.scripted("billing", [Turn(tool_calls=[("launch", {})]), "billed"], agui.launch)
    triage = ta.Agent(
        name="triage",
        instructions="test",
        model=ScriptedModel([Turn(tool_calls=[("transfer_to_billing", {})])]),
        handoffs=[billing],
    )
    with trio.fail_after(30):
        async with agui.agui_server({"triage": triage}) as (_, _, client):
            first, interrupt = await agui.until_interrupt(client, "triage")
            handoff = next(e for e in first if e["type"] == "CUSTOM")
            assert handoff["name"] == "trio-agents.run.handoff"
            assert handoff["value"]["to_agent"] == "billing"
            # The AG-UI client still talks to the agent it started with.
            async with agui.agui_stream(client, "triage", agui.approve(interrupt)) as stream:
                second = await stream.rest()
    agui.check_order(second)
    assert second[-1]["outcome"] == {"type": "success"}
    assert "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT") == "billed"


async def test_steps_open_at_an_interrupt_close_innermost_first() -> None:
    """A grandchild waits for an approval inside a child: the AG-UI run ends on the
    interrupt with both steps open, and closes them as they nest — the grandchild's
    STEP_FINISHED before the child's — then the resumed run reopens them outer-first."""
    leaf = agui.scripted("leaf", [Turn(tool_calls=[("launch", {})]), "leaf done"], agui.launch)
    mid = agui.scripted(
        "mid", [Turn(tool_calls=[("leaf", {"input": "l"})]), "mid done"], leaf.as_tool()
    )
    root = agui.scripted(
        "root", [Turn(tool_calls=[("mid", {"input": "m"})]), "root done"], mid.as_tool()
    )
    with trio.fail_after(30):
        async with agui.agui_server({"root": root}) as (_, _, client):
            first, interrupt = await agui.until_interrupt(client, "root")
            async with agui.agui_stream(client, "root", agui.approve(interrupt)) as stream:
                second = await stream.rest()
    agui.check_order(second)
    assert second[-1]["outcome"] == {"type": "success"}
    started = [e["stepName"] for e in first if e["type"] == "STEP_STARTED"]
    assert [name.split(" ")[0] for name in started] == ["mid", "leaf"]
    closed = [e["stepName"] for e in first if e["type"] == "STEP_FINISHED"]
    assert closed == started[::-1]  # the grandchild's step first, then the child's
    assert first[-2]["type"] == "STEP_FINISHED"  # closed right before the RUN_FINISHED
    reopened = [e["stepName"] for e in second if e["type"] == "STEP_STARTED"]
    assert reopened == started  # outer first again
    finished = [e["stepName"] for e in second if e["type"] == "STEP_FINISHED"]
    assert finished == started[::-1]


# Costs no float holds exactly: a sum or difference through floats would show.
_ROOT_CALL = ta.Usage(100, 7, "big", cache_read_tokens=40, cost=Decimal("0.000123"))
_CHILD_CALL = ta.Usage(50, 3, "small", cache_write_tokens=10, cost=Decimal("0.0000071"))
_SECOND_CALL = ta.Usage(50, 3, "big", cache_read_tokens=0, cost=Decimal("0.0000071"))


async def test_run_finished_carries_the_trees_usage_by_model_and_its_cost() -> None:
    # Before: RUN_FINISHED had no usage; a client could not see what a run used.
    helper = ta.Agent(
        name="helper",
        instructions="test",
        model=ScriptedModel([], default=Turn(text="child says hi", usage=_CHILD_CALL)),
    )
    root = agui.scripted(
        "root",
        [
            Turn(
                tool_calls=[("helper", {"input": "x"}), ("helper", {"input": "y"})],
                usage=_ROOT_CALL,
            ),
            Turn(text="both done", usage=_ROOT_CALL),
        ],
        helper.as_tool(),
    )
    events, _ = await agui.whole_run({"root": root}, "root")
    finished = events[-1]
    assert finished["outcome"] == {"type": "success"}
    # AG-UI's accounting: the run's calls, its sub-agents' included, one entry a model.
    assert sorted(finished["usage"], key=lambda entry: entry["model"]) == [
        {
            "model": "big",
            "inputTokens": 200,
            "outputTokens": 14,
            "totalTokens": 214,
            "cachedInputTokens": 80,
        },
        {
            "model": "small",
            "inputTokens": 100,
            "outputTokens": 6,
            "totalTokens": 106,
            "cacheWriteInputTokens": 20,
        },
    ]
    # 2 x 0.000123 + 2 x 0.0000071, exactly (AG-UI's usage has no cost field).
    assert agui.ours(finished)["cost"] == "0.0002602"
    assert Decimal(agui.ours(finished)["cost"]) == 2 * _ROOT_CALL.cost + 2 * _CHILD_CALL.cost  # type: ignore[operator]


async def test_an_interrupted_and_a_resumed_agui_run_each_report_their_own_calls() -> None:
    agent = agui.scripted(
        "ops",
        [
            Turn(tool_calls=[("launch", {})], usage=_ROOT_CALL),
            Turn(text="launched it", usage=_SECOND_CALL),
        ],
        agui.launch,
    )
    with trio.fail_after(30):
        async with agui.agui_server({"ops": agent}) as (_, _, client):
            first, interrupt = await agui.until_interrupt(client, "ops")
            async with agui.agui_stream(client, "ops", agui.approve(interrupt)) as stream:
                second = await stream.rest()
    assert first[-1]["outcome"]["type"] == "interrupt"
    assert first[-1]["usage"] == [
        {
            "model": "big",
            "inputTokens": 100,
            "outputTokens": 7,
            "totalTokens": 107,
            "cachedInputTokens": 40,
        }
    ]
    assert agui.ours(first[-1])["cost"] == "0.000123"
    # The resumed AG-UI run: only the call it made, not the interrupted run's.
    assert second[-1]["outcome"] == {"type": "success"}
    assert second[-1]["usage"] == [
        {
            "model": "big",
            "inputTokens": 50,
            "outputTokens": 3,
            "totalTokens": 53,
            "cachedInputTokens": 0,
        }
    ]
    assert agui.ours(second[-1])["cost"] == "0.0000071"


async def test_a_failed_run_error_carries_what_it_used() -> None:
    failing = ta.ModelError("boom", status_code=400, retryable=False)
    agent = agui.scripted(
        "brittle",
        [Turn(tool_calls=[("add", {"a": 1, "b": 1})], usage=_ROOT_CALL), Turn(fail=failing)],
        add,
    )
    events, _ = await agui.whole_run({"brittle": agent}, "brittle")
    error = events[-1]
    assert error["type"] == "RUN_ERROR"
    assert [entry["inputTokens"] for entry in error["usage"]] == [100]
    assert agui.ours(error)["cost"] == "0.000123"
