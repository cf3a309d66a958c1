"""Conversation items: JSON round trip, dict conversion, the validity invariant."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import trio_agents as ta

text = st.text(max_size=20)
ids = st.text(min_size=1, max_size=8)
items = st.one_of(
    st.builds(ta.UserMessage, text),
    st.builds(ta.AssistantMessage, text, st.sampled_from(["completed", "incomplete"])),
    st.builds(ta.ToolCall, ids, ids, text),
    st.builds(ta.ToolResult, ids, text, st.sampled_from(["ok", "error", "cancelled"])),
)


@given(items)
def test_json_round_trip(item: ta.Item) -> None:
    data = json.loads(json.dumps(item.to_json()))
    assert ta.item_from_json(data) == item
    assert type(item).from_json(data) == item


def test_to_json_shapes() -> None:
    assert ta.UserMessage("hi").to_json() == {"type": "message", "role": "user", "content": "hi"}
    assert ta.ToolCall("c", "add", '{"a":1}').to_json() == {
        "type": "function_call",
        "call_id": "c",
        "name": "add",
        "arguments": '{"a":1}',
    }
    assert ta.ToolResult("c", "3").to_json()["type"] == "function_call_output"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"role": "user", "content": "hi"}, ta.UserMessage("hi")),
        ({"role": "assistant", "content": "yo"}, ta.AssistantMessage("yo")),
        (
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            ta.UserMessage("ab"),
        ),
        (
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            ta.ToolCall("c1", "f", "{}"),
        ),
        (
            {"type": "function_call_output", "call_id": "c1", "output": "x"},
            ta.ToolResult("c1", "x"),
        ),
    ],
)
def test_dicts_are_converted(data: dict[str, Any], expected: ta.Item) -> None:
    assert ta.coerce_items(data) == [expected]
    assert ta.coerce_items([data]) == [expected]


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (42, TypeError, "input must be"),
        (b"bytes", TypeError, "input must be"),
        ([{"role": "system", "content": "x"}], ValueError, "item 0: message role"),
        ([{"role": "user"}], ValueError, "missing the 'content'"),
        ([{"role": "user", "content": 3}], TypeError, "content must be"),
        ([{"type": "function_call", "name": "f"}], ValueError, "call_id"),
        (
            [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}],
            TypeError,
            "raw JSON",
        ),
        ([{"type": "weird"}], ValueError, "unknown item type"),
        ([{}], ValueError, "'type' or a 'role'"),
        (["ok", 5], TypeError, "item 1"),
        ([{"role": "assistant", "content": "x", "status": "half"}], ValueError, "status"),
    ],
)
def test_bad_items_raise_clear_errors(bad: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ta.coerce_items(bad)


def test_item_constructors_validate() -> None:
    with pytest.raises(ValueError, match="call_id"):
        ta.ToolCall("", "f", "{}")
    with pytest.raises(TypeError, match="content"):
        ta.UserMessage(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="status"):
        ta.ToolResult("c", "x", "maybe")  # type: ignore[arg-type]


def test_conversation_problems() -> None:
    call = ta.ToolCall("c1", "f", "{}")
    ok: list[ta.Item] = [
        ta.UserMessage("q"),
        call,
        ta.ToolResult("c1", "r"),
        ta.AssistantMessage("a"),
    ]
    assert ta.conversation_problems(ok) == []
    assert ta.conversation_problems([call]) == ["item 0: call 'c1' has no result"]
    assert ta.conversation_problems([call], allow_open_calls=True) == []
    assert "has no result before item 1" in ta.conversation_problems([call, ta.UserMessage("x")])[0]
    assert "unknown call" in ta.conversation_problems([ta.ToolResult("zz", "r")])[0]
    dup: list[ta.Item] = [call, ta.ToolResult("c1", "r"), call, ta.ToolResult("c1", "r")]
    problems = ta.conversation_problems(dup)
    assert any("duplicate call id" in p for p in problems)


def test_conversation_problems_name_each_break_of_a_call_id() -> None:
    # The checker keeps one record per call id (was it called, was it answered): each
    # way to break the invariant still gets its own message, in order.
    call = ta.ToolCall("c1", "f", "{}")
    result = ta.ToolResult("c1", "r")
    assert ta.conversation_problems([ta.ToolResult("zz", "r"), ta.ToolResult("zz", "r")]) == [
        "item 0: result for unknown call 'zz'",
        "item 1: second result for call 'zz'",
    ]
    assert ta.conversation_problems([call, ta.UserMessage("x"), result]) == [
        "item 0: call 'c1' has no result before item 1",
        "item 2: result for unknown call 'c1'",
    ]
    assert ta.conversation_problems([call, result, call, result]) == [
        "item 2: duplicate call id 'c1'",
        "item 3: second result for call 'c1'",
        "item 2: call 'c1' has no result",
    ]
    # A result first, then a call of that id: the call is no duplicate, the second
    # result is one.
    assert ta.conversation_problems([result, call, result]) == [
        "item 0: result for unknown call 'c1'",
        "item 2: second result for call 'c1'",
        "item 1: call 'c1' has no result",
    ]
