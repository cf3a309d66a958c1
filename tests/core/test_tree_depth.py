"""How deep a run tree may grow (DESIGN §17, the ``max_depth`` run option): a child of
``ctx.run`` / ``as_tool`` runs on its parent's tool-call stack, so a tree that recurses
without end must end with a reason, never a ``RecursionError``."""

from __future__ import annotations

import gc
import sys
import warnings
from typing import Any

import pytest

import trio_agents as ta
from tests.support.core_trees import tool_turn
from trio_agents.models import ScriptedModel
from trio_agents.testing import check_events

pytestmark = pytest.mark.trio


def chain(levels: int) -> ta.Agent:
    """``a<levels-1>`` → … → ``a0`` → ``leaf``: each agent's first turn asks the next one
    (as a tool), its second answers ``"up"``; the leaf answers ``"leaf"``."""
    agent = ta.Agent(name="leaf", model=ScriptedModel(["leaf"]))
    for level in range(levels):
        below = agent
        agent = ta.Agent(
            name=f"a{level}",
            model=ScriptedModel([tool_turn((below.name, {"input": "go on"})), "up"]),
            tools=[below.as_tool()],
        )
    return agent


def deepest(run: ta.Run) -> tuple[ta.Run, int]:
    """The last run of a chain, and its depth (the root's is 0)."""
    depth = 0
    while run.children:
        (run,) = run.children
        depth += 1
    return run, depth


def call_results(run: ta.Run) -> list[tuple[str, str]]:
    assert run.result is not None
    return [(i.status, i.output) for i in run.result.conversation if isinstance(i, ta.ToolResult)]


async def every_node_is_valid(run: ta.Run) -> None:
    nodes = [run]
    while nodes:
        node = nodes.pop()
        nodes.extend(node.children)
        report = check_events(node.result, [e async for e in node.events()])
        assert report.ok, f"{node.agent.name}: {report}"


async def run_clean(agent: ta.Agent, **options: Any) -> ta.Run:
    """Run ``agent`` to its end, with any warning (a coroutine never awaited, say) an
    error, the garbage collected before the check."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        async with ta.open_run(agent, "go", **options) as run:
            pass
        gc.collect()
    assert [str(w.message) for w in caught] == []
    return run


async def test_a_chain_deeper_than_max_depth_stops_with_a_reason_the_model_reads() -> None:
    run = await run_clean(chain(40))  # 41 levels of agents; max_depth 32 by default
    assert run.result is not None
    assert run.result.status == "completed", run.result
    last, depth = deepest(run)
    assert depth == 32
    assert last.agent.name == "a7"  # a39 is the root, at depth 0
    # the call that would have started depth 33 is answered, not run
    assert call_results(last) == [("error", "sub-agent a6 not started: max_depth 32 reached")]
    assert last.result is not None
    assert last.result.final_output == "up"
    assert call_results(last.parent) == [("ok", "up")]  # type: ignore[arg-type]
    await every_node_is_valid(run)


async def test_max_depth_is_a_run_option_bounding_the_levels_below_the_run() -> None:
    run = await run_clean(chain(5), max_depth=2)
    last, depth = deepest(run)
    assert depth == 2
    assert call_results(last) == [("error", "sub-agent a1 not started: max_depth 2 reached")]
    # max_depth=0: no child at all
    run = await run_clean(chain(1), max_depth=0)
    assert run.children == ()
    assert call_results(run) == [("error", "sub-agent leaf not started: max_depth 0 reached")]
    # a child given a larger max_depth still ends where its ancestor's bound says
    lax = ta.Agent(
        name="root",
        model=ScriptedModel([tool_turn(("a3", {"input": "go"})), "root done"]),
        tools=[chain(4).as_tool(max_depth=10)],  # a3, its children allowed 10 levels
    )
    run = await run_clean(lax, max_depth=2)
    last, depth = deepest(run)
    assert depth == 2
    assert call_results(last) == [("error", "sub-agent a1 not started: max_depth 2 reached")]
    with pytest.raises(ValueError, match="max_depth must be >= 0"):
        await ta.run(chain(1), "go", max_depth=-1)
    with pytest.raises(TypeError, match="max_depth must be an int"):
        await ta.run(chain(1), "go", max_depth=2.5)


async def test_ctx_run_past_max_depth_raises_before_anything_of_the_child_exists() -> None:
    refused: list[ta.MaxDepthExceeded] = []

    @ta.function_tool
    async def delegate(ctx: ta.ToolContext, task: str) -> str:
        """Hand the task to a fresh copy of this agent."""
        try:
            result = await ctx.run(recursive, task)
        except ta.MaxDepthExceeded as exc:
            refused.append(exc)
            return f"did it myself: {exc}"
        return f"delegated: {result.final_output}"

    # One model for every level: calls 1-4 delegate (depths 0-3), the rest answer.
    recursive = ta.Agent(
        name="recursive",
        model=ScriptedModel([tool_turn(("delegate", {"task": "t"}))] * 4, default="answered"),
        tools=[delegate],
    )
    run = await run_clean(recursive, max_depth=3)
    assert run.result is not None
    assert run.result.status == "completed"
    last, depth = deepest(run)
    assert depth == 3
    (exc,) = refused
    assert isinstance(exc, ta.TrioAgentsError)
    assert (exc.agent, exc.depth, exc.max_depth) == ("recursive", 4, 3)
    assert str(exc) == "sub-agent recursive not started: max_depth 3 reached"
    assert call_results(last) == [("ok", f"did it myself: {exc}")]
    await every_node_is_valid(run)


async def test_on_tool_error_fail_makes_a_refused_level_fail_the_tree() -> None:
    run = await run_clean(chain(3), max_depth=1, on_tool_error="fail")
    assert run.result is not None
    assert run.result.status == "failed"
    last, depth = deepest(run)
    assert depth == 1
    assert last.result is not None
    assert last.result.status == "failed"
    assert isinstance(last.result.error, ta.MaxDepthExceeded)
    assert "max_depth 1 reached" in (last.result.reason or "")


async def test_max_depth_above_what_the_stack_holds_still_never_recurses_to_death() -> None:
    """A max_depth set past the interpreter's recursion limit: the stack's headroom
    refuses the level that would not fit, with a reason, instead of a RecursionError
    wherever it would strike (on today's main: a failed child, "RecursionError: maximum
    recursion depth exceeded", about 160 levels down)."""
    limit = sys.getrecursionlimit()
    run = await run_clean(chain(limit // 4), max_depth=limit)
    assert run.result is not None
    assert run.result.status == "completed", run.result
    last, depth = deepest(run)
    assert 0 < depth < limit // 4
    ((status, output),) = call_results(last)
    assert status == "error"
    assert output.startswith(f"sub-agent a{limit // 4 - depth - 2} not started: the Python stack")
    assert "RecursionError" not in repr(last.result)
    await every_node_is_valid(run)
