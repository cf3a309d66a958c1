"""The agents ``trio-agents eval --app tests.support.evals_app:AGENTS`` runs in the
tests (tests/evals/test_eval_cli.py), on offline models.

``calc`` adds with its tool when asked ``add A B``, answers ``echo TEXT`` to anything
else, and blocks in ``slow`` when asked ``slow``; ``broken`` says ``It is 6.`` to every
``add`` (the regression the ``--compare`` test finds). Which one serves is
``$EVALS_APP_BROKEN``.
"""

from __future__ import annotations

import os

import trio

import trio_agents as ta
from trio_agents.models import ModelRequest, Turn

from .evals_support import RoutedModel, first_user_text

__all__ = ["AGENTS", "route"]


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@ta.function_tool
async def slow() -> str:
    """Take an hour."""
    await trio.sleep(3600)
    return "done"


def route(request: ModelRequest, *, broken: bool = False) -> Turn | str:
    """The model: ``add A B`` calls the tool and reads its result back; ``slow`` calls
    ``slow``; anything else is echoed."""
    results = [i for i in request.items if isinstance(i, ta.ToolResult)]
    if results:
        return "It is 6." if broken else f"It is {results[-1].output}."
    text = first_user_text(request)
    if text.startswith("add "):
        a, b = (int(word) for word in text.split()[1:3])
        return Turn(tool_calls=[("add", {"a": a, "b": b})])
    if text == "slow":
        return Turn(tool_calls=[("slow", {})])
    return f"echo {text}"


_BROKEN = os.environ.get("EVALS_APP_BROKEN") == "1"
AGENTS = {
    "calc": ta.Agent(
        name="calc",
        instructions="Add with the tool.",
        model=RoutedModel(lambda request: route(request, broken=_BROKEN)),
        tools=[add, slow],
    )
}
