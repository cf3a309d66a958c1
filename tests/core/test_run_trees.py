"""Run trees (DESIGN §17): sub-agents as tools, ctx.run / ctx.open_run fan-out,
handoffs, tree handles and events, cancel and steering of any node."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.core_runs import assert_ended
from tests.support.core_trees import researcher, root_calling, run_events, tool_turn
from trio_agents.models import ScriptedModel, Turn
from trio_agents.testing import check_events

pytestmark = pytest.mark.trio


@ta.function_tool
async def sleep_hour() -> str:
    """Sleep for an hour."""
    await trio.sleep(3600)
    return "woke"


def sleeper(name: str) -> ta.Agent:
    """An agent whose every run calls a tool that sleeps for an hour."""
    return ta.Agent(
        name=name,
        model=ScriptedModel([], default=tool_turn(("sleep_hour", {}))),
        tools=[sleep_hour],
    )


async def test_as_tool_child_output_is_the_call_result() -> None:
    child = researcher("helper", "the answer is 42")
    root = root_calling(child, then="done", input="what is it?")
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
        (e.type, getattr(e, "status", None)) for e in await run_events(run) if e.type == "run.child"
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
            [tool_turn(*[(f"r{i}", {"input": f"topic {i}"}) for i in range(3)]), "summary"]
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
        model=ScriptedModel([tool_turn(("leaf", {"input": "a"}), ("leaf", {"input": "b"}))]),
        tools=[leaf.as_tool()],
    )
    root = ta.Agent(
        name="root",
        model=ScriptedModel([tool_turn(("mid", {"input": "x"}))]),
        tools=[mid.as_tool()],
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
    root = root_calling(slow, fast, then="combined")
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
    root = root_calling(broken, then="coped")
    result = await ta.run(root, "go")
    assert result.status == "completed"
    (tool_result,) = [i for i in result.conversation if isinstance(i, ta.ToolResult)]
    assert tool_result.status == "error"
    assert tool_result.output.startswith("sub-agent broken failed: ")
    assert "boom" in tool_result.output
    # on_tool_error="fail": the parent fails instead
    root2 = root_calling(researcher("broken", Turn(fail="boom")), then="coped")
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
        name="root", model=ScriptedModel([tool_turn(("fan_out", {"n": 3})), "ok"]), tools=[fan_out]
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
    triage_model = ScriptedModel([tool_turn(("transfer_to_billing", {}))])
    triage = ta.Agent(name="triage", model=triage_model, handoffs=[billing])
    assert "transfer_to_billing" in [s.name for s in triage.tool_specs()]
    async with ta.open_run(triage, "refund please") as run:
        assert run.agent is triage
    result = run.result
    assert result is not None
    assert result.status == "completed", result
    assert result.final_output == "billing here: refunded"
    assert run.agent is billing
    handoffs = [e for e in await run_events(run) if isinstance(e, ta.RunHandoff)]
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

    leaf = researcher(
        "leaf", tool_turn(("delete", {"path": "/tmp/x"})), "deleted it", tools=[delete]
    )
    mid = ta.Agent(
        name="mid",
        model=ScriptedModel([tool_turn(("leaf", {"input": "a"})), "mid done"]),
        tools=[leaf.as_tool()],
    )
    root = root_calling(mid)
    async with ta.open_run(root, "go") as run:
        await trio.testing.wait_all_tasks_blocked()
        assert run.status == "awaiting_approval"
        grandchild = run.children[0].children[0]
        assert grandchild.status == "awaiting_approval"
        current = run.updated.current
        # each waiting call named, with its arguments: what an approver at the root sees
        assert current.detail["waiting"] == [
            {
                "run_id": grandchild.id,
                "call_id": "call_1_0",
                "name": "delete",
                "arguments": '{"path": "/tmp/x"}',
            }
        ]
        assert current.detail["pending"] == []
        assert run.children[0].status == "awaiting_approval"
        # approve from another thread, on the grandchild's handle found from the root
        node = run.find(grandchild.id)
        assert node is grandchild
        await trio.to_thread.run_sync(node.approve, "call_1_0")
    assert run.result is not None
    assert run.result.status == "completed"
    statuses = [u.status for u in await run_events(run) if isinstance(u, ta.RunUpdated)]
    assert statuses == ["queued", "running", "awaiting_approval", "running", "completed"]


async def test_inject_into_a_child(autojump_clock: Any) -> None:
    child_model = ScriptedModel([Turn("first", delay=5), "second"])
    child = ta.Agent(name="kid", model=child_model)
    root = root_calling(child, then="ok")
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
        model=ScriptedModel(
            [], default=tool_turn(*[("leaf", {"input": str(i)}) for i in range(3)])
        ),
        tools=[leaf.as_tool()],
    )
    root = ta.Agent(
        name="root",
        model=ScriptedModel([tool_turn(*[("mid", {"input": str(i)}) for i in range(3)])]),
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
        # Joined on the Trio thread, blocking it on purpose: waiting in a worker thread
        # would let the autojump clock run the hour-long tools out (and the leaves into
        # max_turns) before every cancel arrived. cancel() never waits for the run.
        for t in threads:
            t.join()
    for node in nodes:
        assert node.result is not None
        assert node.result.status == "cancelled"
        report = check_events(node.result, await run_events(node))
        assert report.ok, str(report)
    assert run.result is not None
    conv = run.result.conversation
    assert ta.conversation_problems(conv) == []


# ---------------------------------------------------------------- faults in a child


class _ChildHookFails(ta.RunHooks):
    """Hooks inherited by the whole tree; they raise only in the child runs."""

    async def on_run_start(self, run: ta.Run) -> None:
        if run.parent is not None:
            raise RuntimeError("child hook broke")


async def _assert_tree_valid(run: ta.Run) -> None:
    """Every run of the tree: one terminal update, last; a valid conversation."""
    nodes = [run]
    while nodes:
        node = nodes.pop()
        nodes.extend(node.children)
        report = check_events(node.result, await run_events(node))
        assert report.ok, f"{node.agent.name}: {report}"


async def test_child_hook_raising_fails_only_the_child() -> None:
    root = root_calling(researcher("kid", "never"), then="root coped")
    async with ta.open_run(root, "go", hooks=_ChildHookFails()) as run:
        pass
    result = assert_ended(run, "completed", None)
    (kid,) = run.children
    assert kid.result is not None
    assert kid.result.status == "failed"
    assert kid.result.reason is not None
    assert "on_run_start" in kid.result.reason
    (tool_result,) = [i for i in result.conversation if isinstance(i, ta.ToolResult)]
    assert tool_result.status == "error"
    assert tool_result.output.startswith("sub-agent kid failed: hook error")
    await _assert_tree_valid(run)


async def test_child_session_write_failing_fails_the_child_not_the_parent() -> None:
    class Failing:
        """A session whose children cannot write."""

        def __init__(self, session_id: str, fail: bool) -> None:
            self.session_id = session_id
            self.fail = fail
            self.items: list[ta.Item] = []

        async def get_items(self) -> list[ta.Item]:
            return list(self.items)

        async def add_items(self, items: Any) -> None:
            if self.fail:
                raise OSError("disk full")
            self.items.extend(items)

        async def clear(self) -> None:
            self.items.clear()

        def with_id(self, session_id: str) -> Failing:
            return Failing(session_id, fail=True)

    session = Failing("s", fail=False)
    root = root_calling(researcher("kid", "child text"), then="root coped")
    async with ta.open_run(root, "go", session=session) as run:
        pass
    result = assert_ended(run, "completed", None)
    (kid,) = run.children
    assert kid.session is not None
    assert kid.session.session_id == "s/call_1_0"
    assert_ended(kid, "failed", "session error: OSError: disk full")
    # the parent's own session got the whole parent conversation, valid
    assert ta.conversation_problems(session.items) == []
    assert session.items == list(result.conversation)
    await _assert_tree_valid(run)


async def test_child_tool_blocking_in_a_shield_delays_but_never_breaks_the_tree(
    autojump_clock: Any,
) -> None:
    @ta.function_tool
    async def stubborn() -> str:
        """Ignore cancellation for a while."""
        with trio.CancelScope(shield=True):
            await trio.sleep(30)
        return "late"

    kid = ta.Agent(name="kid", model=ScriptedModel([tool_turn(("stubborn", {}))]), tools=[stubborn])
    root = root_calling(kid, then="root coped")
    async with ta.open_run(root, "go", cleanup_timeout=1) as run:
        await trio.sleep(5)
        run.cancel("stop")
    assert run.result is not None
    assert run.result.status == "cancelled"
    (child,) = run.children
    assert child.result is not None
    assert child.result.status == "cancelled"
    await _assert_tree_valid(run)


async def test_child_sessions_persist_under_parent_id_slash_call_id(tmp_path: Any) -> None:
    path = tmp_path / "tree.db"
    async with ta.sessions.SQLiteSession(path, "conv") as session:
        kids = [researcher(f"k{i}", f"kid {i} answer") for i in range(2)]
        root = ta.Agent(
            name="root",
            model=ScriptedModel(
                [tool_turn(("k0", {"input": "a"}), ("k1", {"input": "b"})), "both done"]
            ),
            tools=[k.as_tool() for k in kids],
        )
        result = await ta.run(root, "go", session=session)
        assert result.status == "completed"
        for index in range(2):
            async with ta.sessions.SQLiteSession(path, f"conv/call_1_{index}") as stored:
                items = await stored.get_items()
            assert items == [
                ta.UserMessage("ab"[index]),
                ta.AssistantMessage(f"kid {index} answer"),
            ]
        stored_parent = await session.get_items()
        assert stored_parent == list(result.conversation)


async def test_memory_session_children_share_its_store() -> None:
    session = ta.sessions.MemorySession("m")
    root = root_calling(researcher("kid", "stored"), then="root coped")
    result = await ta.run(root, "go", session=session)
    assert result.status == "completed"
    child_store = session.with_id("m/call_1_0")
    assert await child_store.get_items() == [ta.UserMessage("x"), ta.AssistantMessage("stored")]
    assert session.with_id("m/call_1_0") is child_store


# ----------------------------------------------------------------------- races


@pytest.mark.parametrize("cancel_at", [4.0, 5.0, 5.0001, 6.0])
async def test_cancel_racing_a_childs_completion(autojump_clock: Any, cancel_at: float) -> None:
    kid = researcher("kid", Turn("kid done", delay=5))
    root = root_calling(kid, then=Turn("root done", delay=5))
    async with ta.open_run(root, "go") as run:
        await trio.sleep(cancel_at)
        run.cancel("race")
    assert run.result is not None
    assert run.result.status == "cancelled"
    (child,) = run.children
    assert child.result is not None
    assert child.result.status in ("completed", "cancelled")
    # A child that completed answered the call, whenever the cancel came.
    (call_result,) = [i for i in run.result.conversation if isinstance(i, ta.ToolResult)]
    if child.result.status == "completed":
        assert (call_result.status, call_result.output) == ("ok", "kid done")
    else:
        assert call_result.status == "cancelled"
    await _assert_tree_valid(run)


@pytest.mark.parametrize("inject_at", [4.0, 5.0, 5.0001])
async def test_inject_into_a_child_racing_its_final_answer(
    autojump_clock: Any, inject_at: float
) -> None:
    kid_model = ScriptedModel([Turn("first", delay=5)], default=Turn("again"))
    kid = ta.Agent(name="kid", model=kid_model)
    root = root_calling(kid, then="root coped")
    outcome: str = ""
    async with ta.open_run(root, "go") as run:
        await trio.sleep(inject_at)
        (child,) = run.children
        try:
            child.inject([{"role": "user", "content": "late news"}])
            outcome = "accepted"
        except ta.RunClosedError:
            outcome = "refused"
    (child,) = run.children
    assert child.result is not None
    assert child.result.status == "completed"
    delivered = ta.UserMessage("late news") in child.result.conversation
    # accepted: delivered in one more turn; refused: the child had already ended
    assert delivered == (outcome == "accepted")
    assert child.result.unconsumed == ()
    await _assert_tree_valid(run)


async def test_grandchild_approval_racing_a_root_cancel(autojump_clock: Any) -> None:
    @ta.function_tool(needs_approval=True)
    async def risky() -> str:
        """Needs a yes."""
        return "done"

    leaf = researcher("leaf", tool_turn(("risky", {})), "leaf done", tools=[risky])
    mid = root_calling(leaf, then="mid done")
    mid = attrs_evolve_name(mid, "mid")
    root = root_calling(mid, then="root coped")
    errors: list[BaseException] = []
    async with ta.open_run(root, "go") as run:
        await trio.testing.wait_all_tasks_blocked()
        grandchild = run.children[0].children[0]
        assert grandchild.status == "awaiting_approval"

        def approve() -> None:
            try:
                grandchild.approve("call_1_0")
            except (ta.RunClosedError, ta.UnknownCallError) as exc:
                errors.append(exc)

        thread = threading.Thread(target=approve)
        thread.start()
        run.cancel("abort everything")
        await trio.to_thread.run_sync(thread.join)
    assert run.result is not None
    assert run.result.status == "cancelled"
    for node in (run.children[0], grandchild):
        assert node.result is not None
        assert node.result.status == "cancelled"
    await _assert_tree_valid(run)


def attrs_evolve_name(agent: ta.Agent, name: str) -> ta.Agent:
    import attrs

    return attrs.evolve(agent, name=name)


async def test_handoff_while_a_now_injection_arrives(autojump_clock: Any) -> None:
    expert_model = ScriptedModel([Turn("expert long answer " * 5, delay=1)], default="expert again")
    expert = ta.Agent(name="expert", model=expert_model)
    triage = ta.Agent(
        name="triage",
        model=ScriptedModel([Turn(tool_calls=[("transfer_to_expert", {})], delay=1)]),
        handoffs=[expert],
    )
    async with ta.open_run(triage, "help") as run:
        async for event in run.events():
            if isinstance(event, ta.RunHandoff):
                run.inject([{"role": "user", "content": "actually, urgent"}], when="now")
                break
    assert run.result is not None
    assert run.result.status == "completed"
    assert run.agent is expert
    assert ta.UserMessage("actually, urgent") in run.result.conversation
    report = check_events(run.result, await run_events(run))
    assert report.ok, str(report)


async def test_ctx_outside_a_run_and_after_its_call() -> None:
    ctx = ta.ToolContext(run_id="r", call_id="c", tool_name="t")
    with pytest.raises(RuntimeError, match="not made by a run"):
        await ctx.run(researcher("x", "y"), "hi")
    kept: list[ta.ToolContext] = []

    @ta.function_tool
    async def keep(ctx: ta.ToolContext) -> str:
        """Keep the context."""
        kept.append(ctx)
        return "kept"

    root = ta.Agent(name="root", model=ScriptedModel([tool_turn(("keep", {})), "ok"]), tools=[keep])
    await ta.run(root, "go")
    with pytest.raises(RuntimeError, match="has ended"):
        await kept[0].run(researcher("x", "y"), "hi")


async def test_handoff_and_as_tool_validation() -> None:
    a = ta.Agent(name="a b!", model=ScriptedModel(["x"]))
    assert a.as_tool().name == "a_b_"
    with pytest.raises(TypeError, match="list of agents"):
        ta.Agent(name="t", handoffs=a)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not an Agent"):
        ta.Agent(name="t", handoffs=["a"])  # type: ignore[list-item]

    @ta.function_tool(name="transfer_to_a_b_")
    def clash() -> None:
        """Clash."""

    with pytest.raises(ValueError, match="handoff"):
        ta.Agent(name="t", tools=[clash], handoffs=[a])
    with pytest.raises(TypeError, match="unknown run option"):
        a.as_tool(bogus=1)


# ------------------------------------------------------------------- durability


def _crashed_tree_rows() -> tuple[list[ta.Item], list[ta.Item]]:
    """What a process that died inside a child's tool left in the sessions: the
    parent's agent-tool call and the child's own tool call, both open."""
    parent: list[ta.Item] = [
        ta.UserMessage("go"),
        ta.ToolCall("call_1_0", "kid", json.dumps({"input": "x"})),
    ]
    child: list[ta.Item] = [ta.UserMessage("x"), ta.ToolCall("k1", "work", "{}")]
    return parent, child


@pytest.mark.parametrize("idempotent", [False, True])
async def test_resumed_parent_resumes_its_child_from_the_childs_session(
    tmp_path: Any, idempotent: bool
) -> None:
    ran: list[str] = []

    @ta.function_tool(idempotent=idempotent)
    async def work() -> str:
        """Do the work."""
        ran.append("work")
        return "worked"

    path = tmp_path / "tree.db"
    parent_rows, child_rows = _crashed_tree_rows()
    async with ta.sessions.SQLiteSession(path, "conv") as session:
        await session.add_items(parent_rows)
        async with ta.sessions.SQLiteSession(path, "conv/call_1_0") as child_session:
            await child_session.add_items(child_rows)
        kid_model = ScriptedModel(["kid finished"])
        kid = ta.Agent(name="kid", model=kid_model, tools=[work])
        root = ta.Agent(name="root", model=ScriptedModel(["root finished"]), tools=[kid.as_tool()])
        resume = ta.Resume(attempt=2, next_seq=10, started={"call_1_0"}, reason="node died")
        async with ta.open_run(root, [], session=session, resume=resume) as run:
            pass
        result = run.result
        assert result is not None
        assert result.status == "completed", result
        (child,) = run.children
        assert child.result is not None
        assert child.result.status == "completed"
        # the child's own started call: run again only if idempotent, else interrupted
        (work_result,) = [i for i in child.result.conversation if isinstance(i, ta.ToolResult)]
        if idempotent:
            assert ran == ["work"]
            assert (work_result.status, work_result.output) == ("ok", "worked")
        else:
            assert ran == []
            assert work_result.status == "error"
            assert work_result.output == "interrupted: node died"
        # the child's model saw its stored conversation, not a fresh input
        assert kid_model.requests[0].items[:2] == (ta.UserMessage("x"), child_rows[1])
        # the parent's call got the child's answer; both sessions hold valid conversations
        (call_result,) = [i for i in result.conversation if isinstance(i, ta.ToolResult)]
        assert call_result.output == "kid finished"
        async with ta.sessions.SQLiteSession(path, "conv/call_1_0") as child_session:
            stored_child = await child_session.get_items()
        assert ta.conversation_problems(stored_child) == []
        assert stored_child[-1] == ta.AssistantMessage("kid finished")
        assert await session.get_items() == list(result.conversation)


@pytest.mark.parametrize(
    ("kid_turn", "expected"),
    [
        ("the kid's answer", ("ok", "the kid's answer")),
        (Turn(fail="boom"), ("error", "sub-agent kid failed: ModelError: boom")),
    ],
    ids=["completed", "failed"],
)
async def test_a_finished_childs_answer_survives_a_cancel_during_its_session_close(
    tmp_path: Any, kid_turn: Turn | str, expected: tuple[str, str]
) -> None:
    """The child has its verdict and its terminal update; the root is cancelled while
    the child's SQLite session (made for it under "<id>/<call id>") is closing. The
    call keeps the child's answer (or its error result), in the root's result and in
    its session, like any tool that finished before a cancel."""
    path = tmp_path / "tree.db"
    kid = researcher("kid", kid_turn)
    root = root_calling(kid, then=Turn("root never answers", delay=3600))
    async with ta.sessions.SQLiteSession(path, "conv") as session:
        async with ta.open_run(root, "go", session=session) as run:
            async for event in run.events():
                if isinstance(event, ta.RunChild):
                    break
            (child,) = run.children
            await child.wait()
            # The child's task is now closing its session (a thread hop): cancel here.
            run.cancel("user pressed stop")
        assert run.result is not None
        assert (run.result.status, run.result.reason) == ("cancelled", "user pressed stop")
        assert child.result is not None
        assert child.result.status == ("completed" if expected[0] == "ok" else "failed")
        (call_result,) = [i for i in run.result.conversation if isinstance(i, ta.ToolResult)]
        assert (call_result.status, call_result.output[: len(expected[1])]) == expected
        assert await session.get_items() == list(run.result.conversation)
    await _assert_tree_valid(run)


async def test_a_resumed_child_keeps_the_id_and_seqs_its_earlier_attempt_had(
    tmp_path: Any,
) -> None:
    # Resume.children: the child an earlier attempt ran in call_1_0 was "run_kid" up to
    # seq 6; resumed, it is run_kid again, its events from seq 7 (and the parent's
    # run.child events name it).
    path = tmp_path / "tree.db"
    parent_rows, child_rows = _crashed_tree_rows()
    async with ta.sessions.SQLiteSession(path, "conv") as session:
        await session.add_items(parent_rows)
        async with ta.sessions.SQLiteSession(path, "conv/call_1_0") as child_session:
            await child_session.add_items(child_rows)

        @ta.function_tool
        async def work() -> str:
            """Do the work."""
            return "worked"

        kid = ta.Agent(name="kid", model=ScriptedModel(["kid finished"]), tools=[work])
        root = ta.Agent(name="root", model=ScriptedModel(["root finished"]), tools=[kid.as_tool()])
        resume = ta.Resume(
            attempt=2,
            next_seq=10,
            started={"call_1_0"},
            children={("run_root", "call_1_0"): ("run_kid", 7)},
        )
        async with ta.open_run(root, [], session=session, run_id="run_root", resume=resume) as run:
            events = [event async for event in run.events(tree=True)]
    assert run.result is not None
    assert run.result.status == "completed"
    (child,) = run.children
    assert child.id == "run_kid"
    kid_seqs = [event.seq for event in events if event.run_id == "run_kid"]
    assert kid_seqs == list(range(7, 7 + len(kid_seqs)))
    announced = {event.child_id for event in events if isinstance(event, ta.RunChild)}
    assert announced == {"run_kid"}


async def test_a_resumed_tree_with_a_barrier_asks_again_for_a_childs_unstarted_call(
    tmp_path: Any,
) -> None:
    # The before_tool barrier covers the whole tree, so Resume.started holds the
    # children's calls with the root's: the child's call that started (k1) is
    # interrupted, and its call that never started (k2, awaiting approval when the
    # process died) asks for its approval again and runs once approved.
    ran: list[str] = []

    @ta.function_tool
    async def work() -> str:
        """Do the work."""
        ran.append("work")
        return "worked"

    @ta.function_tool(needs_approval=True)
    async def guarded() -> str:
        """Run once approved."""
        ran.append("guarded")
        return "guarded ran"

    recorded: list[str] = []

    async def before_tool(call: ta.ToolCall) -> None:
        recorded.append(call.call_id)

    path = tmp_path / "tree.db"
    parent_rows, _ = _crashed_tree_rows()
    child_rows: list[ta.Item] = [ta.UserMessage("x"), ta.ToolCall("k1", "work", "{}")]
    child_rows.append(ta.ToolCall("k2", "guarded", "{}"))
    async with ta.sessions.SQLiteSession(path, "conv") as session:
        await session.add_items(parent_rows)
        async with ta.sessions.SQLiteSession(path, "conv/call_1_0") as child_session:
            await child_session.add_items(child_rows)
        kid = ta.Agent(name="kid", model=ScriptedModel(["kid finished"]), tools=[work, guarded])
        root = ta.Agent(name="root", model=ScriptedModel(["root finished"]), tools=[kid.as_tool()])
        resume = ta.Resume(attempt=2, next_seq=10, started={"call_1_0", "k1"}, reason="node died")
        async with ta.open_run(
            root, [], session=session, resume=resume, before_tool=before_tool
        ) as run:
            async for event in run.events():
                if isinstance(event, ta.RunUpdated) and event.status == "awaiting_approval":
                    waiting = [entry["call_id"] for entry in event.detail["waiting"]]
                    break
            (child,) = run.children
            child.approve("k2")
    assert waiting == ["k2"]
    assert run.result is not None
    assert run.result.status == "completed", run.result
    assert ran == ["guarded"]  # the started call never ran again
    # The agent-tool call (run again: it resumes the child) and the child's own call
    # were recorded before their tools ran.
    assert recorded == ["call_1_0", "k2"]
    assert child.result is not None
    outputs = {
        item.call_id: item.output
        for item in child.result.conversation
        if isinstance(item, ta.ToolResult)
    }
    assert outputs == {"k1": "interrupted: node died", "k2": "guarded ran"}
