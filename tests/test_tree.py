"""Run trees (DESIGN §17): sub-agents as tools, ctx.run / ctx.open_run fan-out,
handoffs, tree handles and events, cancel and steering of any node."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn
from trio_agents.testing import check_events

pytestmark = pytest.mark.trio


def _calls(*calls: tuple[str, dict[str, Any]]) -> Turn:
    return Turn(tool_calls=list(calls))


@ta.function_tool
async def sleep_hour() -> str:
    """Sleep for an hour."""
    await trio.sleep(3600)
    return "woke"


def sleeper(name: str) -> ta.Agent:
    """An agent whose every run calls a tool that sleeps for an hour."""
    return ta.Agent(
        name=name, model=ScriptedModel([], default=_calls(("sleep_hour", {}))), tools=[sleep_hour]
    )


async def events(run: ta.Run) -> list[ta.RunEvent]:
    return [e async for e in run.events()]


def researcher(name: str, *turns: Turn | str, tools: list[ta.Tool] | None = None) -> ta.Agent:
    return ta.Agent(name=name, model=ScriptedModel(list(turns)), tools=tools or [])


async def test_as_tool_child_output_is_the_call_result() -> None:
    child = researcher("helper", "the answer is 42")
    root = ta.Agent(
        name="root",
        model=ScriptedModel([_calls(("helper", {"input": "what is it?"})), "done"]),
        tools=[child.as_tool()],
    )
    async with ta.open_run(root, "go") as run:
        pass
    result = run.result
    assert result is not None
    assert result.status == "completed", result
    results = [i for i in result.conversation if isinstance(i, ta.ToolResult)]
    assert [(r.output, r.status) for r in results] == [("the answer is 42", "ok")]
    (kid,) = run.children
    assert kid.parent_id == run.id
    assert kid.root_id == run.id
    assert kid.call_id == "call_1_0"
    assert run.find(kid.id) is kid
    assert run.find(run.id) is None
    assert kid.find(run.id) is None
    assert kid.result is not None
    assert kid.result.final_output == "the answer is 42"
    kinds = [
        (e.type, getattr(e, "status", None)) for e in await events(run) if e.type == "run.child"
    ]
    assert kinds == [("run.child", "queued"), ("run.child", "completed")]
    # tree usage adds the child's
    assert result.usage is not None
    assert result.tree_usage is not None
    assert kid.result.usage is not None
    assert result.tree_usage == result.usage + kid.result.usage
    # the child's input is the call's argument
    assert kid.result.conversation[0] == ta.UserMessage("what is it?")


async def test_parallel_branches_and_tree_events_in_order(autojump_clock: Any) -> None:
    kids = [researcher(f"r{i}", Turn(f"found {i}", delay=1 + i)) for i in range(3)]
    root = ta.Agent(
        name="root",
        model=ScriptedModel(
            [_calls(*[(f"r{i}", {"input": f"topic {i}"}) for i in range(3)]), "summary"]
        ),
        tools=[k.as_tool() for k in kids],
    )
    async with ta.open_run(root, "go") as run:
        tree_events = [e async for e in run.events(tree=True)]
    assert run.result is not None
    assert run.result.status == "completed"
    ids = {run.id} | {c.id for c in run.children}
    assert {e.run_id for e in tree_events} == ids
    # ends with the root's terminal update; every child's terminal comes before
    last = tree_events[-1]
    assert isinstance(last, ta.RunUpdated)
    assert last.run_id == run.id
    assert last.status.is_terminal
    for child in run.children:
        own = [e for e in tree_events if e.run_id == child.id]
        assert [e.seq for e in own] == list(range(1, len(own) + 1))
        report = check_events(child.result, own)  # each run's own stream is a valid run
        assert report.ok, str(report)
    # parallel: the children finished in the order of their delays
    ends = [e.child_id for e in tree_events if isinstance(e, ta.RunChild) and e.status != "queued"]
    assert [run.find(e).agent.name for e in ends] == ["r0", "r1", "r2"]  # type: ignore[union-attr]


async def test_cancel_root_cancels_every_descendant_bottom_up(autojump_clock: Any) -> None:
    leaf = sleeper("leaf")
    mid = ta.Agent(
        name="mid",
        model=ScriptedModel([_calls(("leaf", {"input": "a"}), ("leaf", {"input": "b"}))]),
        tools=[leaf.as_tool()],
    )
    root = ta.Agent(
        name="root", model=ScriptedModel([_calls(("mid", {"input": "x"}))]), tools=[mid.as_tool()]
    )
    async with ta.open_run(root, "go") as run:
        await trio.sleep(10)
        assert len(run.children) == 1
        assert len(run.children[0].children) == 2
        run.cancel("user pressed stop")
        tree = [e async for e in run.events(tree=True)]
    assert run.result is not None
    assert run.result.status == "cancelled"
    assert run.result.reason == "user pressed stop"
    (mid_run,) = run.children
    every = [mid_run, *mid_run.children]
    for node in every:
        assert node.result is not None
        assert node.result.status == "cancelled"
        assert node.result.reason == "parent cancelled"
        terminal = [e for e in tree if e.run_id == node.id and isinstance(e, ta.RunUpdated)][-1]
        assert terminal.detail["by"] == run.id
        assert terminal.detail["reason"] == "user pressed stop"
    # bottom-up: each child's terminal update precedes its parent's result for the call
    position = {id(e): i for i, e in enumerate(tree)}

    def terminal_of(node: ta.Run) -> int:
        return max(
            position[id(e)] for e in tree if e.run_id == node.id and isinstance(e, ta.RunUpdated)
        )

    def result_of(parent: ta.Run, call_id: str) -> int:
        return next(
            position[id(e)]
            for e in tree
            if e.run_id == parent.id
            and isinstance(e, ta.RunItemEvent)
            and isinstance(e.item, ta.ToolResult)
            and e.item.call_id == call_id
        )

    for node in every:
        assert node.parent is not None
        assert node.call_id is not None
        assert terminal_of(node) < result_of(node.parent, node.call_id)
    assert terminal_of(run) == len(tree) - 1


async def test_cancel_one_branch_the_parent_goes_on(autojump_clock: Any) -> None:
    slow = sleeper("slow")
    fast = researcher("fast", Turn("fast result", delay=100))
    root = ta.Agent(
        name="root",
        model=ScriptedModel(
            [_calls(("slow", {"input": "x"}), ("fast", {"input": "y"})), "combined"]
        ),
        tools=[slow.as_tool(), fast.as_tool()],
    )
    async with ta.open_run(root, "go") as run:
        await trio.sleep(10)
        branch = next(c for c in run.children if c.agent.name == "slow")
        branch.cancel("not needed")
    result = run.result
    assert result is not None
    assert result.status == "completed", result
    outputs = {
        i.call_id: (i.status, i.output) for i in result.conversation if isinstance(i, ta.ToolResult)
    }
    assert outputs[branch.call_id or ""] == ("cancelled", "sub-agent slow cancelled: not needed")
    assert branch.result is not None
    assert branch.result.reason == "not needed"
    assert "fast result" in [o for _, o in outputs.values()]


async def test_failing_child_gives_an_error_result_naming_it() -> None:
    broken = researcher("broken", Turn(fail="boom"))
    root = ta.Agent(
        name="root",
        model=ScriptedModel([_calls(("broken", {"input": "x"})), "coped"]),
        tools=[broken.as_tool()],
    )
    result = await ta.run(root, "go")
    assert result.status == "completed"
    (tool_result,) = [i for i in result.conversation if isinstance(i, ta.ToolResult)]
    assert tool_result.status == "error"
    assert tool_result.output.startswith("sub-agent broken failed: ")
    assert "boom" in tool_result.output
    # on_tool_error="fail": the parent fails instead
    root2 = ta.Agent(
        name="root",
        model=ScriptedModel([_calls(("broken", {"input": "x"})), "coped"]),
        tools=[researcher("broken", Turn(fail="boom")).as_tool()],
    )
    failed = await ta.run(root2, "go", on_tool_error="fail")
    assert failed.status == "failed"
    assert failed.reason is not None
    assert "sub-agent broken failed" in failed.reason


async def test_ctx_open_run_fan_out_and_ctx_run() -> None:
    seen: list[str] = []

    @ta.function_tool
    async def fan_out(ctx: ta.ToolContext, n: int) -> str:
        """Ask n helpers."""
        results: list[str] = []
        async with trio.open_nursery() as nursery:
            for i in range(n):

                async def one(i: int = i) -> None:
                    async with ctx.open_run(researcher(f"h{i}", f"h{i} says hi"), f"q{i}") as child:
                        seen.append(child.id)
                    assert child.result is not None
                    results.append(str(child.result.final_output))

                nursery.start_soon(one)
        single = await ctx.run(researcher("solo", "solo"), "q")
        return ", ".join(sorted(results)) + f"; {single.final_output}"

    root = ta.Agent(
        name="root", model=ScriptedModel([_calls(("fan_out", {"n": 3})), "ok"]), tools=[fan_out]
    )
    async with ta.open_run(root, "go") as run:
        pass
    assert run.result is not None
    assert run.result.status == "completed"
    outputs = [i.output for i in run.result.conversation if isinstance(i, ta.ToolResult)]
    assert outputs == ["h0 says hi, h1 says hi, h2 says hi; solo"]
    assert len(run.children) == 4
    assert {c.id for c in run.children[:3]} == set(seen)
    assert all(c.call_id == "call_1_0" for c in run.children)


async def test_handoff_same_run_continues_with_the_other_agent() -> None:
    billing_model = ScriptedModel(["billing here: refunded"])
    billing = ta.Agent(name="billing", instructions="handle refunds", model=billing_model)
    triage_model = ScriptedModel([_calls(("transfer_to_billing", {}))])
    triage = ta.Agent(name="triage", model=triage_model, handoffs=[billing])
    assert "transfer_to_billing" in [s.name for s in triage.tool_specs()]
    async with ta.open_run(triage, "refund please") as run:
        assert run.agent is triage
    result = run.result
    assert result is not None
    assert result.status == "completed", result
    assert result.final_output == "billing here: refunded"
    assert run.agent is billing
    handoffs = [e for e in await events(run) if isinstance(e, ta.RunHandoff)]
    assert [(h.from_agent, h.to_agent) for h in handoffs] == [("triage", "billing")]
    # the target's request: its instructions, the same conversation with the transfer
    (request,) = billing_model.requests
    assert request.instructions == "handle refunds"
    assert isinstance(request.items[-1], ta.ToolResult)
    assert request.items[-1].output == "transferred to billing"
    assert result.turns == 2


async def test_approval_in_a_grandchild_shows_on_every_ancestor(autojump_clock: Any) -> None:
    @ta.function_tool(needs_approval=True)
    async def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    leaf = researcher("leaf", _calls(("delete", {"path": "/tmp/x"})), "deleted it", tools=[delete])
    mid = ta.Agent(
        name="mid",
        model=ScriptedModel([_calls(("leaf", {"input": "a"})), "mid done"]),
        tools=[leaf.as_tool()],
    )
    root = ta.Agent(
        name="root",
        model=ScriptedModel([_calls(("mid", {"input": "x"})), "root done"]),
        tools=[mid.as_tool()],
    )
    async with ta.open_run(root, "go") as run:
        await trio.testing.wait_all_tasks_blocked()
        assert run.status == "awaiting_approval"
        grandchild = run.children[0].children[0]
        assert grandchild.status == "awaiting_approval"
        current = run.updated.current
        assert current.detail["waiting"] == [{"run_id": grandchild.id, "call_id": "call_1_0"}]
        assert current.detail["pending"] == []
        assert run.children[0].status == "awaiting_approval"
        # approve from another thread, on the grandchild's handle found from the root
        node = run.find(grandchild.id)
        assert node is grandchild
        await trio.to_thread.run_sync(node.approve, "call_1_0")
    assert run.result is not None
    assert run.result.status == "completed"
    statuses = [u.status for u in await events(run) if isinstance(u, ta.RunUpdated)]
    assert statuses == ["queued", "running", "awaiting_approval", "running", "completed"]


async def test_inject_into_a_child(autojump_clock: Any) -> None:
    child_model = ScriptedModel([Turn("first", delay=5), "second"])
    child = ta.Agent(name="kid", model=child_model)
    root = ta.Agent(
        name="root",
        model=ScriptedModel([_calls(("kid", {"input": "x"})), "ok"]),
        tools=[child.as_tool()],
    )
    async with ta.open_run(root, "go") as run:
        await trio.sleep(1)
        (kid,) = run.children
        kid.inject([{"role": "user", "content": "also this"}])
    assert kid.result is not None
    assert kid.result.final_output == "second"
    assert child_model.requests[1].items[-1] == ta.UserMessage("also this")


async def test_fifty_threads_cancel_random_nodes(autojump_clock: Any) -> None:
    leaf = sleeper("leaf")
    mid = ta.Agent(
        name="mid",
        model=ScriptedModel([], default=_calls(*[("leaf", {"input": str(i)}) for i in range(3)])),
        tools=[leaf.as_tool()],
    )
    root = ta.Agent(
        name="root",
        model=ScriptedModel([_calls(*[("mid", {"input": str(i)}) for i in range(3)])]),
        tools=[mid.as_tool()],
    )
    async with ta.open_run(root, "go") as run:
        await trio.sleep(1)
        nodes = [run, *run.children, *(g for c in run.children for g in c.children)]
        assert len(nodes) == 13
        barrier = threading.Barrier(50)

        def hammer(k: int) -> None:
            barrier.wait()
            nodes[(k * 7) % len(nodes)].cancel(f"thread {k}")

        threads = [threading.Thread(target=hammer, args=(k,)) for k in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            await trio.to_thread.run_sync(t.join)
    for node in nodes:
        assert node.result is not None
        assert node.result.status == "cancelled"
        report = check_events(node.result, await events(node))
        assert report.ok, str(report)
    assert run.result is not None
    conv = run.result.conversation
    assert ta.conversation_problems(conv) == []
