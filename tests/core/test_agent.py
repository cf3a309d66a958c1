"""``Agent`` construction: model strings, and errors that name what was passed."""

from __future__ import annotations

from typing import Any

import pytest

import trio_agents as ta
from trio_agents.models import AnthropicModel, DemoModel, OpenAIChatModel


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_model_strings_are_resolved_at_construction() -> None:
    openai = ta.Agent(name="a", model="openai:gpt-4o-mini").model
    assert isinstance(openai, OpenAIChatModel)
    assert openai.model == "gpt-4o-mini"
    local = ta.Agent(name="a", model="openai:llama3.1:8b@http://127.0.0.1:11434/v1").model
    assert isinstance(local, OpenAIChatModel)
    assert (local.model, local.base_url) == ("llama3.1:8b", "http://127.0.0.1:11434/v1")
    claude = ta.Agent(name="a", model="anthropic:claude-3-5-haiku-latest").model
    assert isinstance(claude, AnthropicModel)
    assert isinstance(ta.Agent(name="a", model="demo").model, DemoModel)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("gpt-4o", "has no provider prefix"),
        ("claude-3-5-haiku-latest", "has no provider prefix"),
        ("mistral:large", "names an unknown provider 'mistral'"),
        ("openai:", "names no model after 'openai:'"),
    ],
)
def test_an_unknown_model_string_names_it_and_the_prefixes(spec: str, problem: str) -> None:
    with pytest.raises(
        ValueError, match="known prefixes: openai:, openai-responses:, anthropic:"
    ) as caught:
        ta.Agent(name="a", model=spec)
    message = str(caught.value)
    assert message.startswith(f"Agent(model={spec!r}): model string {spec!r} {problem}")


def test_a_prefixless_model_string_gets_a_suggestion() -> None:
    with pytest.raises(ValueError, match=r"Did you mean 'openai:gpt-4o'\?$"):
        ta.Agent(name="a", model="gpt-4o")
    with pytest.raises(ValueError, match=r"Did you mean 'anthropic:claude-3-opus'\?$"):
        ta.Agent(name="a", model="claude-3-opus")


def test_a_model_that_is_not_a_model() -> None:
    with pytest.raises(
        TypeError, match=r"Agent\(model=\.\.\.\) got int \(42\); pass a model string"
    ):
        ta.Agent(name="a", model=42)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        (
            ["add"],
            "Agent(tools=...): element 0 is str ('add'); tools must be"
            " @function_tool-decorated functions or Tool objects",
        ),
        (
            [add, 3],
            "Agent(tools=...): element 1 is int (3); tools must be"
            " @function_tool-decorated functions or Tool objects",
        ),
        ([dict], "Agent(tools=...): element 0 is type (<class 'dict'>); tools must be"),
        ("add", "Agent(tools=...) takes a list of tools, not str ('add')"),
        (add, "Agent(tools=...) takes a list of tools, not a single tool: tools=[add]"),
    ],
)
def test_bad_tools_name_the_element_and_what_to_pass(tools: Any, message: str) -> None:
    with pytest.raises(TypeError) as caught:
        ta.Agent(name="a", tools=tools)
    assert str(caught.value).startswith(message)
    assert "function_tool() needs" not in str(caught.value)


def test_a_function_that_cannot_be_a_tool_names_its_index() -> None:
    def bad(*args: int) -> int:
        return 0

    with pytest.raises(
        (TypeError, ValueError), match=r"^Agent\(tools=\.\.\.\): element 1 is function"
    ):
        ta.Agent(name="a", tools=[add, bad])


def test_duplicate_tool_names() -> None:
    with pytest.raises(ValueError, match="several tools named 'add'"):
        ta.Agent(name="a", tools=[add, add])
