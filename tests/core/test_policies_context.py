"""Run policies (DESIGN §18), part one: the run's ``context=`` object and callable
instructions."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn

pytestmark = pytest.mark.trio


@attrs.frozen
class Deps:
    user: str
    db: dict[str, str]


async def test_context_reaches_tools_hooks_instructions_and_children() -> None:
    seen: list[tuple[str, Any]] = []

    @ta.function_tool
    async def whoami(ctx: ta.ToolContext[Deps]) -> str:
        """Who is asking."""
        seen.append(("tool", ctx.context))
        return ctx.context.db[ctx.context.user]

    @ta.function_tool
    def sync_whoami(ctx: ta.ToolContext[Deps]) -> str:
        """Who is asking, from a thread."""
        seen.append(("thread", ctx.context))
        return ctx.context.user

    class Hooks(ta.RunHooks):
        async def on_run_start(self, run: ta.Run) -> None:
            seen.append((f"hook:{run.agent.name}", run.context))

    def instructions(run: ta.Run) -> str:
        return f"You serve {run.context.user}."

    async def child_instructions(run: ta.Run) -> str:
        await trio.lowlevel.checkpoint()
        return f"Child serving {run.context.user}."

    child_model = ScriptedModel([Turn(tool_calls=[("whoami", {})]), "child done"])
    child = ta.Agent(
        name="child", instructions=child_instructions, model=child_model, tools=[whoami]
    )
    model = ScriptedModel(
        [
            Turn(tool_calls=[("whoami", {}), ("sync_whoami", {}), ("child", {"input": "x"})]),
            "done",
        ]
    )
    root = ta.Agent(
        name="root",
        instructions=instructions,
        model=model,
        tools=[whoami, sync_whoami, child.as_tool()],
    )
    deps = Deps("ada", {"ada": "Ada Lovelace"})
    result = await ta.run(root, "who am I?", context=deps, hooks=Hooks())
    assert result.status == "completed", result
    assert {who for who, _ in seen} == {"tool", "thread", "hook:root", "hook:child"}
    assert all(value is deps for _, value in seen)
    assert model.requests[0].instructions == "You serve ada."
    assert child_model.requests[0].instructions == "Child serving ada."


async def test_a_child_given_its_own_context_keeps_it() -> None:
    @ta.function_tool
    async def spawn(ctx: ta.ToolContext) -> str:
        """Spawn a child with its own context."""
        result = await ctx.run(
            ta.Agent(
                name="c", instructions=lambda run: str(run.context), model=ScriptedModel(["ok"])
            ),
            "hi",
            context="the child's own",
        )
        assert ctx.parent.children[-1].context == "the child's own"
        return str(result.final_output)

    root = ta.Agent(
        name="root", model=ScriptedModel([Turn(tool_calls=[("spawn", {})]), "done"]), tools=[spawn]
    )
    async with ta.open_run(root, "go", context="root's") as run:
        pass
    assert run.context == "root's"
    assert run.result is not None
    assert run.result.status == "completed"


@pytest.mark.parametrize(
    ("instructions", "reason"),
    [
        (lambda run: 1 / 0, "hook error: instructions raised ZeroDivisionError: division by zero"),
        (lambda run: 42, "hook error: instructions raised TypeError: returned int, not str"),
    ],
)
async def test_instructions_that_fail_fail_the_run_naming_them(
    instructions: Any, reason: str
) -> None:
    model = ScriptedModel(["never"])
    agent = ta.Agent(name="a", instructions=instructions, model=model)
    result = await ta.run(agent, "hi")
    assert result.status == "failed"
    assert result.reason == reason
    assert model.calls == 0  # no request was sent


async def test_a_hand_built_tool_context_carries_a_context() -> None:
    ctx: ta.ToolContext[Deps] = ta.ToolContext(
        run_id="r", call_id="c", tool_name="t", context=Deps("bob", {})
    )
    assert ctx.context.user == "bob"
    with pytest.raises(TypeError, match="instructions must be a str"):
        ta.Agent(name="a", instructions=3)  # type: ignore[arg-type]
