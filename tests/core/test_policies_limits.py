"""Run policies (DESIGN §18): usage limits, counted over a run's whole subtree."""

from __future__ import annotations

from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.chat_wire import chunk
from tests.support.core_runs import assert_ended, assert_failed_with
from tests.support.core_trees import root_calling, run_events, tool_turn
from tests.support.sse_server import SSE, Reply, SSEServer
from trio_agents.models import OpenAIChatModel, ScriptedModel, Turn
from trio_agents.testing import check_events

pytestmark = pytest.mark.trio


@ta.function_tool
async def ping() -> str:
    """Ping."""
    return "pong"


def pinging_leaf() -> ta.Agent:
    """An agent, ``leaf``, that calls ``ping`` turn after turn (100 turns at most)."""
    return ta.Agent(
        name="leaf",
        model=ScriptedModel([], default=tool_turn(("ping", {}))),
        tools=[ping],
        max_turns=100,
    )


async def test_requests_limit_the_request_past_it_is_never_sent() -> None:
    model = ScriptedModel([], default=tool_turn(("ping", {})))
    agent = ta.Agent(name="a", model=model, tools=[ping], max_turns=50)
    async with ta.open_run(agent, "go", limits=ta.UsageLimits(requests=3)) as run:
        pass
    result, error = assert_failed_with(run, "usage limit: requests 4/3", ta.UsageLimitExceeded)
    assert error.name == "requests"
    assert model.calls == 3
    events = await run_events(run)
    assert check_events(result, events).ok
    terminal = events[-1]
    assert isinstance(terminal, ta.RunUpdated)
    assert terminal.detail["limits"]["requests"] == {"used": 4, "limit": 3}


async def test_tool_calls_limit_the_call_past_it_never_runs() -> None:
    ran: list[int] = []

    @ta.function_tool
    async def count(n: int) -> str:
        """Count."""
        ran.append(n)
        return "ok"

    model = ScriptedModel(
        [tool_turn(("count", {"n": 1}), ("count", {"n": 2}), ("count", {"n": 3}))]
    )
    agent = ta.Agent(name="a", model=model, tools=[count])
    result = await ta.run(agent, "go", limits=ta.UsageLimits(tool_calls=2), max_concurrent_tools=1)
    assert result.status == "failed"
    assert result.reason == "usage limit: tool_calls 3/2"
    assert len(ran) == 2
    assert ta.conversation_problems(result.conversation) == []


async def test_output_tokens_cut_a_stream_that_reports_no_usage(autojump_clock: Any) -> None:
    # 200 words of 5 characters; usage only at the end: the estimate (4 chars a token)
    # passes 20 tokens at the 17th word, and the stream is cut there.
    words = ["word "] * 200
    model = ScriptedModel([Turn(text=words, delay=0.01, usage=None)])
    agent = ta.Agent(name="a", model=model)
    async with ta.open_run(agent, "go", limits=ta.UsageLimits(output_tokens=20)) as run:
        pass
    result = assert_ended(run, "failed", "usage limit: output_tokens 22/20")  # 85 chars: 22 tokens
    deltas = [e for e in await run_events(run) if isinstance(e, ta.ResponseTextDelta)]
    assert len(deltas) == 17  # cut as soon as the estimate passed the limit
    (kept,) = [i for i in result.new_items if isinstance(i, ta.AssistantMessage)]
    assert kept.status == "incomplete"
    assert kept.content == "word " * 17


async def test_a_grandchild_passing_the_roots_limit_fails_the_root(autojump_clock: Any) -> None:
    leaf = pinging_leaf()
    mid = ta.Agent(
        name="mid",
        model=ScriptedModel([tool_turn(("leaf", {"input": "x"}))], default="mid done"),
        tools=[leaf.as_tool()],
    )
    root = ta.Agent(
        name="root",
        model=ScriptedModel([tool_turn(("mid", {"input": "x"}))], default="root done"),
        tools=[mid.as_tool()],
    )
    async with ta.open_run(root, "go", limits=ta.UsageLimits(requests=10)) as run:
        tree = [e async for e in run.events(tree=True)]
    result = assert_ended(run, "failed", "usage limit: requests 11/10")
    mid_run = run.children[0]
    leaf_run = mid_run.children[0]
    for node in (mid_run, leaf_run):
        assert node.result is not None
        assert node.result.status == "cancelled"
        terminal = [e for e in tree if e.run_id == node.id and isinstance(e, ta.RunUpdated)][-1]
        assert terminal.detail["by"] == run.id
        assert terminal.detail["reason"] == "usage limit: requests 11/10"
    # 1 root + 1 mid + 8 leaf requests were sent; the 11th never was
    assert result.tree_usage is not None
    assert isinstance(leaf.model, ScriptedModel)
    assert len(leaf.model.requests) == 8


async def test_a_childs_own_limit_fails_only_the_child() -> None:
    leaf = pinging_leaf()
    root = root_calling(leaf.as_tool(limits=ta.UsageLimits(requests=2)), then="root coped")
    result = await ta.run(root, "go", limits=ta.UsageLimits(requests=100))
    assert result.status == "completed"
    (tool_result,) = [i for i in result.conversation if isinstance(i, ta.ToolResult)]
    assert tool_result.output == "sub-agent leaf failed: usage limit: requests 3/2"


async def test_deadline_ends_the_run_failed_timeout_and_wrap_up_asks_for_the_answer(
    autojump_clock: Any,
) -> None:
    @ta.function_tool
    async def slow() -> str:
        """Slow."""
        await trio.sleep(4)
        return "slow done"

    model = ScriptedModel([], default=tool_turn(("slow", {})))
    agent = ta.Agent(name="a", model=model, tools=[slow], max_turns=100)
    result = await ta.run(agent, "go", limits=ta.UsageLimits(deadline=10, wrap_up=3))
    assert result.status == "failed"
    assert result.reason == "timeout"
    assert isinstance(result.error, ta.UsageLimitExceeded)
    assert ta.UserMessage(ta.WRAP_UP_MESSAGE) in result.conversation
    assert ta.conversation_problems(result.conversation) == []

    # a model that answers once asked: the run completes before the deadline
    model2 = ScriptedModel([tool_turn(("slow", {})), tool_turn(("slow", {})), "final, as asked"])
    agent2 = ta.Agent(name="a", model=model2, tools=[slow])
    result2 = await ta.run(agent2, "go", limits=ta.UsageLimits(deadline=10, wrap_up=3))
    assert result2.status == "completed"
    assert result2.final_output == "final, as asked"
    assert ta.UserMessage(ta.WRAP_UP_MESSAGE) in result2.conversation


async def test_wrap_up_while_awaiting_approval(autojump_clock: Any) -> None:
    @ta.function_tool(needs_approval=True)
    async def risky() -> str:
        """Needs approval."""
        return "done"

    model = ScriptedModel([tool_turn(("risky", {})), "answered"])
    agent = ta.Agent(name="a", model=model, tools=[risky])
    async with ta.open_run(agent, "go", limits=ta.UsageLimits(deadline=10, wrap_up=5)) as run:
        await trio.sleep(6)  # past the wrap-up: the injection waits behind the approval
        assert run.status == "awaiting_approval"
        run.approve("call_1_0")
    assert_ended(run, "completed", None)
    assert model.requests[1].items[-1] == ta.UserMessage(ta.WRAP_UP_MESSAGE)


async def test_limits_validation() -> None:
    with pytest.raises(ValueError, match="needs a deadline"):
        ta.UsageLimits(wrap_up=1)
    with pytest.raises(ValueError, match="shorter than the deadline"):
        ta.UsageLimits(deadline=1, wrap_up=2)
    with pytest.raises(ValueError, match=">= 0"):
        ta.UsageLimits(requests=-1)
    with pytest.raises(TypeError):
        ta.UsageLimits(requests=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite number"):
        ta.UsageLimits(deadline=float("nan"))


async def test_a_limit_crossed_mid_stream_by_a_server_that_streams_no_usage(
    nursery: trio.Nursery,
) -> None:
    # A real loopback server speaking Chat Completions, streaming 500 deltas and never
    # any usage, holding the response open after them: the estimate cuts the stream,
    # and the connection is closed (the server sees the client go away).
    server = SSEServer()
    await nursery.start(server.serve)
    parts = [SSE(chunk("", role="assistant"))] + [SSE(chunk("abcd")) for _ in range(500)]
    server.add(Reply(events=parts, end="hold"))
    model = OpenAIChatModel(model="gpt-test", base_url=f"{server.base_url}/v1")
    agent = ta.Agent(name="a", model=model)
    with trio.fail_after(30):
        async with ta.open_run(agent, "go", limits=ta.UsageLimits(output_tokens=50)) as run:
            pass
    result = assert_ended(run, "failed", "usage limit: output_tokens 51/50")
    (kept,) = [i for i in result.new_items if isinstance(i, ta.AssistantMessage)]
    assert kept.content == "abcd" * 51
    assert kept.status == "incomplete"
    assert result.usage is None  # the server never reported any
