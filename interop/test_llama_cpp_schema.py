"""What we send, against llama-cpp-python's real request schema (``make interop``).

The loopback validator of ``tests/support/strict_servers.py`` says how llama-cpp-python treats
a request; here pydantic checks the same messages against ``llama_types.py`` from the
llama-cpp-python 0.3.36 source distribution (downloaded by ``install.sh``; the native
library is never built): our shape is accepted, the old one is refused with the error
the issue saw, and our validator agrees with the real schema case by case.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.sse_server import RecordedRequest
from tests.support.strict_servers import llama_cpp_python
from trio_agents._items import AssistantMessage, ToolCall, ToolResult, UserMessage
from trio_agents.models._openai import chat_messages

from .conftest import VENV

SCHEMA = VENV / "llama_cpp_schema" / "llama_types.py"
CHECKER = Path(__file__).with_name("llama_cpp_schema.py")


def validate(cases: list[list[dict[str, Any]]]) -> list[str | None]:
    if not SCHEMA.exists():
        pytest.fail(f"{SCHEMA} is missing: run `make interop` (it runs interop/install.sh)")
    done = subprocess.run(
        [str(VENV / "bin" / "python"), str(CHECKER)],
        input=json.dumps({"schema": str(SCHEMA), "cases": cases}),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    results: list[str | None] = json.loads(done.stdout)
    return results


CONVERSATION = (
    UserMessage("2+3, then 4+4?"),
    ToolCall("c1", "add", '{"a": 2, "b": 3}'),
    ToolResult("c1", "5"),
    AssistantMessage("Next:"),
    ToolCall("c2", "add", '{"a": 4, "b": 4}'),
    ToolResult("c2", "boom", status="error"),
    ToolCall("c3", "add", "{bad json"),
    ToolResult("c3", "cancelled: stop", status="cancelled"),
    AssistantMessage("Partial", status="incomplete"),
    UserMessage("go on"),
)

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
SHAPES: list[list[dict[str, Any]]] = [
    [{"role": "assistant", "content": "", "tool_calls": [CALL]}],  # ours
    [{"role": "assistant", "content": None, "tool_calls": [CALL]}],  # the old one
    [{"role": "assistant", "tool_calls": [CALL]}],  # passes the schema, breaks templates
    [{"role": "tool", "tool_call_id": "c1", "content": "5"}],
    [{"role": "tool", "tool_call_id": "c1", "content": None}],
    [{"role": "tool", "tool_call_id": None, "content": "5"}],
    [{"role": "tool", "content": "5"}],
    [{"role": "system", "content": "x"}],
    [{"role": "user", "content": "x"}],
    [{"role": "assistant", "content": 5}],
]


def test_our_messages_satisfy_the_real_schema() -> None:
    (result,) = validate([chat_messages("Be brief.", CONVERSATION)])
    assert result is None


def test_the_old_shape_fails_as_the_issue_saw() -> None:
    (result,) = validate([SHAPES[1]])
    assert result is not None
    assert "Input should be a valid string" in result


def test_our_loopback_validator_agrees_with_the_real_schema() -> None:
    real = validate(SHAPES)
    ours = [
        llama_cpp_python(
            RecordedRequest("POST", "/v1", {}, json.dumps({"messages": messages}).encode(), 0)
        )
        for messages in SHAPES
    ]
    for messages, schema_error, reply in zip(SHAPES, real, ours, strict=True):
        schema_rejects = schema_error is not None
        # A missing assistant content passes the schema; ours answers it as the
        # template error it then becomes (also a 500).
        template_error = "content" not in messages[0] and messages[0]["role"] == "assistant"
        assert (reply is not None) == (schema_rejects or template_error), (messages, schema_error)
