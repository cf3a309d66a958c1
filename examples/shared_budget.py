"""One budget for a fan-out of three sub-agents.

A lead agent asks three researcher sub-agents at once (three ``as_tool`` calls in one
turn). The lead's ``UsageLimits(requests=12)`` counts every model request of the whole
tree: the researchers keep searching until the tree's twelfth request, the thirteenth is
never sent, the lead fails with ``"usage limit: requests 13/12"``, and every researcher
ends ``cancelled`` naming the lead. Each researcher may also have a limit of its own.

Run: ``python examples/shared_budget.py`` (offline, on scripted models).
"""

from __future__ import annotations

import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn


@ta.function_tool
async def search(query: str) -> str:
    """Search the web (canned).

    Args:
        query: what to look for.
    """
    await trio.sleep(0.01)
    return f"3 results for {query!r}"


# A researcher that never stops searching on its own: only the budget stops it.
researcher = ta.Agent(
    name="researcher",
    model=ScriptedModel([], default=Turn(tool_calls=[("search", {"query": "more"})])),
    tools=[search],
    max_turns=100,
)
lead = ta.Agent(
    name="lead",
    model=ScriptedModel(
        [Turn(tool_calls=[("researcher", {"input": f"angle {n}"}) for n in range(3)])],
        default="summary",
    ),
    tools=[researcher.as_tool(limits=ta.UsageLimits(tool_calls=20))],
)


async def main() -> None:
    result = await ta.run(lead, "Research trio.", limits=ta.UsageLimits(requests=12))
    print(f"lead: {result.status} ({result.reason})")
    detail = result.tree_usage
    print(f"tree usage: {detail}")
    assert result.status == "failed"
    assert result.reason == "usage limit: requests 13/12"
    assert isinstance(result.error, ta.UsageLimitExceeded)


if __name__ == "__main__":
    trio.run(main)
