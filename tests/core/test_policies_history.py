"""Run policies (DESIGN §18): history — what each model request is sent, never what is
stored."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.core_trees import tool_turn
from trio_agents.models import ScriptedModel, Turn


@ta.function_tool
async def ping() -> str:
    """Ping."""
    return "pong"


def _history(turns: int) -> list[ta.Item]:
    """A stored conversation of ``turns`` turns, each a question, a call, its result
    and an answer."""
    items: list[ta.Item] = []
    for n in range(turns):
        items += [
            ta.UserMessage(f"question {n}"),
            ta.ToolCall(f"old_{n}", "ping", "{}"),
            ta.ToolResult(f"old_{n}", "pong"),
            ta.AssistantMessage(f"answer {n}"),
        ]
    return items


async def test_keep_last_turns_sends_whole_turns_and_stores_everything() -> None:
    session = ta.sessions.MemorySession("h")
    await session.add_items(_history(5))
    model = ScriptedModel([tool_turn(("ping", {})), "fine"])
    agent = ta.Agent(name="a", model=model, tools=[ping], history=ta.KeepLastTurns(2))
    result = await ta.run(agent, "question 5", session=session)
    assert result.status == "completed"
    first, second = model.requests
    assert first.items[0] == ta.UserMessage("question 4")
    assert len(first.items) == 5  # turn 4 whole, then the new question
    assert second.items[0] == ta.UserMessage("question 4")
    assert ta.conversation_problems(second.items) == []
    stored = await session.get_items()
    assert len(stored) == 20 + 4  # the session keeps everything
    assert stored == list(result.conversation)


async def test_token_window_drops_oldest_turns_until_it_fits() -> None:
    model = ScriptedModel(["ok"])
    agent = ta.Agent(name="a", model=model, history=ta.TokenWindow(60))
    result = await ta.run(agent, [*_history(10), ta.UserMessage("now")])
    assert result.status == "completed"
    (request,) = model.requests
    sent = list(request.items)
    assert sent[-1] == ta.UserMessage("now")
    assert 1 < len(sent) < 41
    assert isinstance(sent[0], ta.UserMessage)  # whole turns only
    assert ta.conversation_problems(sent) == []
    # the last turn is sent even when it alone is larger
    big = ScriptedModel(["ok"])
    huge = ta.Agent(name="a", model=big, history=ta.TokenWindow(1))
    await ta.run(huge, [*_history(3), ta.UserMessage("x" * 1000)])
    assert big.requests[0].items == (ta.UserMessage("x" * 1000),)


async def test_summarize_replaces_what_it_drops_with_one_summary_cached() -> None:
    summarizer = ScriptedModel(["they asked ten questions, all pinged"], default="second summary")
    model = ScriptedModel([tool_turn(("ping", {})), "done"])
    agent = ta.Agent(
        name="a", model=model, tools=[ping], history=ta.Summarize(summarizer, keep_last_turns=1)
    )
    result = await ta.run(agent, [*_history(10), ta.UserMessage("now")])
    assert result.status == "completed"
    first, second = model.requests
    assert first.items[0] == ta.UserMessage(
        "Summary of the earlier conversation: they asked ten questions, all pinged"
    )
    assert isinstance(first.items[0], ta.UserMessage)
    assert first.items[0].content.startswith(ta.SUMMARY_PREFIX)
    assert first.items[1:] == (ta.UserMessage("now"),)
    assert second.items[0] == first.items[0]
    assert summarizer.calls == 1  # cached: nothing more was dropped for the second request
    # the summary's call counts in the run's usage
    assert result.usage is not None
    transcript = summarizer.requests[0].items[0]
    assert isinstance(transcript, ta.UserMessage)
    assert transcript.content.startswith("user: question 0")


async def test_a_summary_counts_in_the_limits() -> None:
    summarizer = ScriptedModel(["summary"])
    model = ScriptedModel(["never"])
    agent = ta.Agent(name="a", model=model, history=ta.Summarize(summarizer, keep_last_turns=1))
    result = await ta.run(
        agent, [*_history(3), ta.UserMessage("now")], limits=ta.UsageLimits(requests=1)
    )
    assert result.status == "failed"
    # the summary's call is made (1/1) to build the request, which would be the second:
    # it is never sent
    assert result.reason == "usage limit: requests 2/1"
    assert summarizer.calls == 1
    assert model.calls == 0


async def test_a_summary_call_is_cancelled_with_the_run(autojump_clock: Any) -> None:
    summarizer = ScriptedModel([Turn(["slow ", "summary"], delay=100)])
    agent = ta.Agent(
        name="a", model=ScriptedModel(["x"]), history=ta.Summarize(summarizer, keep_last_turns=1)
    )
    async with ta.open_run(agent, [*_history(2), ta.UserMessage("now")]) as run:
        await trio.sleep(1)
        run.cancel("stop")
    assert run.result is not None
    assert run.result.status == "cancelled"
    assert summarizer.open_streams == 0


def _drops_a_result(items: Sequence[ta.Item]) -> list[ta.Item]:
    return [i for i in items if not isinstance(i, ta.ToolResult)]


@pytest.mark.parametrize(
    ("policy", "reason"),
    [
        (_drops_a_result, "invalid conversation: history returned an invalid conversation: "),
        (lambda items: "garbage", "invalid conversation: history returned str, not a list"),
        (lambda items: [1, 2], "invalid conversation: history returned a int among the items"),
        (lambda items: [], "invalid conversation: history returned no items"),
        (lambda items: 1 / 0, "hook error: history raised ZeroDivisionError"),
    ],
)
async def test_a_history_policy_returning_garbage_fails_the_run_and_sends_nothing(
    policy: Any, reason: str
) -> None:
    model = ScriptedModel(["never"])
    agent = ta.Agent(name="a", model=model, history=policy)
    result = await ta.run(agent, [*_history(2), ta.UserMessage("now")])
    assert result.status == "failed"
    assert result.reason is not None
    assert result.reason.startswith(reason), result.reason
    assert model.calls == 0
    assert ta.conversation_problems(result.conversation) == []


async def test_an_async_history_callable() -> None:
    async def last_message(items: Sequence[ta.Item]) -> list[ta.Item]:
        await trio.lowlevel.checkpoint()
        return [items[-1]]

    model = ScriptedModel(["ok"])
    result = await ta.run(
        ta.Agent(name="a", model=model, history=last_message), [*_history(2), ta.UserMessage("hi")]
    )
    assert result.status == "completed"
    assert model.requests[0].items == (ta.UserMessage("hi"),)


async def test_history_validation() -> None:
    with pytest.raises(TypeError, match="history must be"):
        ta.Agent(name="a", history=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=">= 1"):
        ta.KeepLastTurns(0)
    with pytest.raises(TypeError, match="needs a Model"):
        ta.Summarize("model")  # type: ignore[arg-type]
