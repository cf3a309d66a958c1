"""repair_loaded: a stored conversation with dangling calls or orphan results is made valid."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.helpers import INTERRUPTED_OUTPUT
from trio_agents import (
    AssistantMessage,
    Item,
    ToolCall,
    ToolResult,
    UserMessage,
    conversation_problems,
)
from trio_agents.sessions import repair_loaded

text = st.text(max_size=10)
# A few call ids, so that duplicates, orphans and late results are common.
call_ids = st.sampled_from(["a", "b", "c", "d"])
items = st.one_of(
    st.builds(UserMessage, text),
    st.builds(AssistantMessage, text, st.sampled_from(["completed", "incomplete"])),
    st.builds(ToolCall, call_ids, st.sampled_from(["add", "search"]), text),
    st.builds(ToolResult, call_ids, text, st.sampled_from(["ok", "error", "cancelled"])),
)


@st.composite
def valid_conversations(draw: st.DrawFn) -> list[Item]:
    """Conversations that satisfy the invariant: messages and fully answered call groups."""
    conversation: list[Item] = []
    next_id = 0
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.booleans()):
            conversation.append(
                draw(st.builds(UserMessage, text) | st.builds(AssistantMessage, text))
            )
            continue
        ids = [f"call-{next_id + i}" for i in range(draw(st.integers(1, 3)))]
        next_id += len(ids)
        # Calls first, then their results in any order; or each call straight followed by
        # its result.
        calls: list[Item] = [ToolCall(i, "tool") for i in ids]
        results: list[Item] = [ToolResult(i, f"out {i}") for i in draw(st.permutations(ids))]
        if draw(st.booleans()):
            conversation += calls + results
        else:
            for call in calls:
                assert isinstance(call, ToolCall)
                conversation += [call, ToolResult(call.call_id, "out")]
    return conversation


def cancelled(call_id: str) -> ToolResult:
    return ToolResult(call_id, INTERRUPTED_OUTPUT, status="cancelled")


def test_valid_conversation_is_unchanged() -> None:
    conversation: list[Item] = [
        UserMessage("hi"),
        ToolCall("a", "add"),
        ToolCall("b", "add"),
        ToolResult("b", "2"),
        ToolResult("a", "1"),
        AssistantMessage("done"),
    ]
    assert repair_loaded(conversation) == conversation


def test_dangling_call_at_the_end() -> None:
    repaired = repair_loaded([UserMessage("hi"), ToolCall("a", "add")])
    assert repaired == [UserMessage("hi"), ToolCall("a", "add"), cancelled("a")]
    assert repaired[-1] == ToolResult("a", "cancelled: interrupted", status="cancelled")


def test_dangling_call_before_the_next_message() -> None:
    repaired = repair_loaded([UserMessage("hi"), ToolCall("a", "add"), UserMessage("again")])
    assert repaired == [
        UserMessage("hi"),
        ToolCall("a", "add"),
        cancelled("a"),
        UserMessage("again"),
    ]


def test_several_dangling_calls_get_results_after_the_group_in_call_order() -> None:
    repaired = repair_loaded(
        [
            UserMessage("hi"),
            ToolCall("a", "add"),
            ToolCall("b", "add"),
            ToolCall("c", "add"),
            ToolResult("b", "2"),
            AssistantMessage("partial", status="incomplete"),
            ToolCall("d", "add"),
        ]
    )
    assert repaired == [
        UserMessage("hi"),
        ToolCall("a", "add"),
        ToolCall("b", "add"),
        ToolCall("c", "add"),
        ToolResult("b", "2"),
        cancelled("a"),
        cancelled("c"),
        AssistantMessage("partial", status="incomplete"),
        ToolCall("d", "add"),
        cancelled("d"),
    ]


def test_orphan_and_duplicate_results_are_dropped() -> None:
    repaired = repair_loaded(
        [
            ToolResult("nobody", "?"),
            UserMessage("hi"),
            ToolCall("a", "add"),
            ToolResult("a", "1"),
            ToolResult("a", "1 again"),
            ToolResult("x", "orphan"),
            AssistantMessage("ok"),
            ToolResult("a", "very late"),
        ]
    )
    assert repaired == [
        UserMessage("hi"),
        ToolCall("a", "add"),
        ToolResult("a", "1"),
        AssistantMessage("ok"),
    ]


def test_late_result_after_the_group_closed_is_dropped() -> None:
    # The call was closed by the repair before the message; its late result would be a
    # second answer.
    repaired = repair_loaded([ToolCall("a", "add"), UserMessage("next"), ToolResult("a", "late")])
    assert repaired == [ToolCall("a", "add"), cancelled("a"), UserMessage("next")]


def test_duplicate_call_id_is_dropped() -> None:
    repaired = repair_loaded(
        [ToolCall("a", "add"), ToolResult("a", "1"), ToolCall("a", "again"), ToolResult("a", "2")]
    )
    assert repaired == [ToolCall("a", "add"), ToolResult("a", "1")]


def test_empty() -> None:
    assert repair_loaded([]) == []


def test_input_is_not_modified() -> None:
    conversation: list[Item] = [ToolCall("a", "add"), ToolResult("z", "orphan")]
    snapshot = list(conversation)
    repair_loaded(conversation)
    assert conversation == snapshot


def test_accepts_any_iterable() -> None:
    assert repair_loaded(iter([ToolCall("a", "add")])) == [ToolCall("a", "add"), cancelled("a")]


def test_rejects_non_items() -> None:
    with pytest.raises(TypeError, match="item 1"):
        repair_loaded([UserMessage("hi"), {"role": "user", "content": "x"}])  # type: ignore[list-item]


@given(st.lists(items, max_size=25))
def test_repaired_conversation_is_always_valid(conversation: list[Item]) -> None:
    repaired = repair_loaded(conversation)
    assert conversation_problems(repaired) == []


@given(st.lists(items, max_size=25))
def test_repair_is_idempotent(conversation: list[Item]) -> None:
    once = repair_loaded(conversation)
    assert repair_loaded(once) == once


@given(st.lists(items, max_size=25))
def test_repair_only_drops_results_and_duplicate_calls_and_adds_cancelled_results(
    conversation: list[Item],
) -> None:
    repaired = repair_loaded(conversation)
    messages = [i for i in conversation if isinstance(i, UserMessage | AssistantMessage)]
    assert [i for i in repaired if isinstance(i, UserMessage | AssistantMessage)] == messages
    call_ids = [i.call_id for i in repaired if isinstance(i, ToolCall)]
    assert sorted(call_ids) == sorted({i.call_id for i in conversation if isinstance(i, ToolCall)})
    # What is kept from the input keeps its order; anything else is an inserted cancelled
    # result (generated outputs are too short to equal INTERRUPTED_OUTPUT, so the greedy
    # match below cannot mistake one for the other).
    position = 0
    for item in repaired:
        try:
            position = conversation.index(item, position) + 1
        except ValueError:
            assert isinstance(item, ToolResult)
            assert item == cancelled(item.call_id)


@given(valid_conversations())
def test_valid_conversations_are_unchanged(conversation: list[Item]) -> None:
    assert conversation_problems(conversation) == []
    assert repair_loaded(conversation) == conversation
