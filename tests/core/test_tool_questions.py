"""``ToolContext.request_approval``: a running call asks a question, pending in its run
(and shown above it) like a call waiting for approval, answered by ``run.approve`` /
``run.reject`` of its id; cancelling the run or the call ends the wait at once."""

from __future__ import annotations

import re
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.core_trees import researcher, root_calling, run_events, tool_turn
from trio_agents.models import ScriptedModel
from trio_agents.testing import check_events

pytestmark = pytest.mark.trio

FORM = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "size": {"type": "integer"}},
    "required": ["name"],
}


@ta.function_tool
async def deploy(ctx: ta.ToolContext, target: str) -> str:
    """Deploy to a target, once a person says yes."""
    decision = await ctx.request_approval(
        f"Deploy to {target}?", data={"target": target}, schema=FORM
    )
    return repr(decision)


@ta.function_tool(timeout=10)
async def deploy_slowly(ctx: ta.ToolContext) -> str:
    """Asks, and times out after 10 s."""
    await ctx.request_approval("Deploy?")
    return "unreachable"


def deployer(*then: str, tool: str = "deploy") -> ta.Agent:
    arguments = {"target": "prod"} if tool == "deploy" else {}
    model = ScriptedModel([tool_turn((tool, arguments)), *then])
    return ta.Agent(name="deployer", model=model, tools=[deploy, deploy_slowly])


def outputs(result: ta.RunResult | None) -> list[str]:
    assert result is not None
    return [item.output for item in result.new_items if isinstance(item, ta.ToolResult)]


async def test_the_question_is_pending_and_shown(autojump_clock: Any) -> None:
    async with ta.open_run(deployer("done"), "go") as run:
        await trio.sleep(1)
        assert run.status == "awaiting_approval"
        detail = run.updated.current.detail
        question_id = "call_1_0:ask-1"
        assert detail == {
            "pending": [question_id],
            "questions": [
                {
                    "id": question_id,
                    "call_id": "call_1_0",
                    "name": "deploy",
                    "message": "Deploy to prod?",
                    "data": {"target": "prod"},
                    "schema": FORM,
                }
            ],
        }
        assert run.statistics().pending_approvals == (question_id,)
        # The call is running: no tool call id but the question's is answerable.
        with pytest.raises(ta.UnknownCallError):
            run.approve("call_1_0")
        run.approve(question_id, content={"name": "web", "size": 3})
    assert outputs(run.result) == [
        "ApprovalDecision(approved=True, message=None, content={'name': 'web', 'size': 3})"
    ]
    statuses = [e.status for e in await run_events(run) if isinstance(e, ta.RunUpdated)]
    assert statuses == ["queued", "running", "awaiting_approval", "running", "completed"]


async def test_reject_and_approve_without_content(autojump_clock: Any) -> None:
    async with ta.open_run(deployer("done"), "go") as run:
        await trio.sleep(1)
        run.reject("call_1_0:ask-1", message="not on a Friday")
        with pytest.raises(ta.UnknownCallError):
            run.approve("call_1_0:ask-1")  # answered once
    assert outputs(run.result) == [
        "ApprovalDecision(approved=False, message='not on a Friday', content=None)"
    ]
    async with ta.open_run(deployer("done"), "go") as run:
        await trio.sleep(1)
        run.approve("call_1_0:ask-1")
    assert outputs(run.result) == ["ApprovalDecision(approved=True, message=None, content=None)"]


async def test_content_is_checked_and_a_refused_one_leaves_the_question(
    autojump_clock: Any,
) -> None:
    async with ta.open_run(deployer("done"), "go") as run:
        await trio.sleep(1)
        question_id = "call_1_0:ask-1"
        with pytest.raises(ValueError, match="missing required property 'name'"):
            run.approve(question_id, content={"size": 3})
        with pytest.raises(ValueError, match=r"\$\.size: expected integer, got string"):
            run.approve(question_id, content={"name": "x", "size": "big"})
        with pytest.raises(TypeError, match="JSON-serialisable"):
            run.approve(question_id, content={"name": object()})
        with pytest.raises(TypeError, match="mapping"):
            run.approve(question_id, content=["name"])  # type: ignore[arg-type]
        assert run.statistics().pending_approvals == (question_id,)
        run.approve(question_id, content={"name": "x"})
    assert outputs(run.result) == [
        "ApprovalDecision(approved=True, message=None, content={'name': 'x'})"
    ]


@ta.function_tool(needs_approval=True)
async def erase(path: str) -> str:
    """Erase a file (needs approval)."""
    return f"erased {path}"


async def test_a_tool_calls_approval_takes_no_content(autojump_clock: Any) -> None:
    agent = ta.Agent(
        name="eraser",
        model=ScriptedModel([tool_turn(("erase", {"path": "/x"})), "ok"]),
        tools=[erase],
    )
    async with ta.open_run(agent, "go") as run:
        await trio.sleep(1)
        with pytest.raises(ValueError, match="takes no content"):
            run.approve("call_1_0", content={"a": 1})
        run.approve("call_1_0")
    assert outputs(run.result) == ["erased /x"]


async def test_a_question_without_a_schema_takes_no_content(autojump_clock: Any) -> None:
    async with ta.open_run(deployer("done", tool="deploy_slowly"), "go") as run:
        await trio.sleep(1)
        with pytest.raises(ValueError, match="question 'call_1_0:ask-1' takes no content"):
            run.approve("call_1_0:ask-1", content={"a": 1})
        run.cancel("enough")


async def test_cancel_while_the_question_waits(autojump_clock: Any) -> None:
    async with ta.open_run(deployer("never"), "go") as run:
        await trio.sleep(1)
        run.cancel("user pressed stop")
    result = run.result
    assert result is not None
    assert (result.status, result.reason) == ("cancelled", "user pressed stop")
    [answer] = [i for i in result.new_items if isinstance(i, ta.ToolResult)]
    assert answer.status == "cancelled"
    with pytest.raises(ta.RunClosedError):
        run.approve("call_1_0:ask-1")
    statuses = [e.status for e in await run_events(run) if isinstance(e, ta.RunUpdated)]
    # From the question straight to the terminal update, as for a call waiting for approval.
    assert statuses == ["queued", "running", "awaiting_approval", "cancelled"]


async def test_the_calls_timeout_withdraws_the_question(autojump_clock: Any) -> None:
    model = ScriptedModel([tool_turn(("deploy_slowly", {})), "went on"])
    agent = ta.Agent(name="deployer", model=model, tools=[deploy_slowly])
    async with ta.open_run(agent, "go") as run:
        await trio.sleep(1)
        assert run.status == "awaiting_approval"
        await trio.sleep(10)
    assert outputs(run.result) == ["timed out after 10 s"]
    with pytest.raises(ta.RunClosedError):
        run.approve("call_1_0:ask-1")
    statuses = [e.status for e in await run_events(run) if isinstance(e, ta.RunUpdated)]
    assert statuses == ["queued", "running", "awaiting_approval", "running", "completed"]


async def test_a_childs_question_is_shown_and_answered_from_above(autojump_clock: Any) -> None:
    child = researcher("child", tool_turn(("deploy", {"target": "staging"})), "deployed")
    child = ta.Agent(name="child", model=child.model, tools=[deploy])
    root = root_calling(child)
    async with ta.open_run(root, "go") as run:
        await trio.sleep(1)
        assert run.status == "awaiting_approval"
        [below] = run.children
        [waiting] = run.updated.current.detail["waiting"]
        assert waiting == {
            "run_id": below.id,
            "call_id": "call_1_0:ask-1",
            "name": "deploy",
            "arguments": '{"target": "staging"}',
            "question": {
                "id": "call_1_0:ask-1",
                "call_id": "call_1_0",
                "name": "deploy",
                "message": "Deploy to staging?",
                "data": {"target": "staging"},
                "schema": FORM,
            },
        }
        found = run.find(waiting["run_id"])
        assert found is not None
        found.approve(waiting["call_id"], content={"name": "s"})
    assert run.result is not None
    assert run.result.status == "completed"
    assert run.updated.current.status == "completed"


async def test_outside_a_run_or_a_running_call_it_is_refused() -> None:
    ctx = ta.ToolContext(run_id="r", call_id="c", tool_name="t")
    with pytest.raises(RuntimeError, match="not made by a run"):
        await ctx.request_approval("?")
    with pytest.raises(TypeError, match="message must be a str"):
        await ctx.request_approval(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="data must be JSON-serialisable"):
        await ctx.request_approval("?", data={"x": {1, 2}})
    with pytest.raises(TypeError, match="schema must be a mapping"):
        await ctx.request_approval("?", schema=["x"])  # type: ignore[arg-type]


async def test_the_checker_accepts_a_run_that_asked(autojump_clock: Any) -> None:
    async with ta.open_run(deployer("done"), "go") as run:
        await trio.sleep(1)
        run.approve("call_1_0:ask-1")
    report = check_events(run.result, await run_events(run))
    assert report.ok, report


def asking(schema: Any, message: str = "Deploy?", data: Any = None) -> ta.Agent:
    """An agent whose one tool asks with ``schema`` and returns what the ask raised."""

    @ta.function_tool
    async def ask(ctx: ta.ToolContext) -> str:
        """Asks."""
        try:
            decision = await ctx.request_approval(message, data=data, schema=schema)
        except (TypeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return repr(decision)

    model = ScriptedModel([tool_turn(("ask", {})), "done"])
    return ta.Agent(name="asker", model=model, tools=[ask])


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        # A property given as a type name, not a schema (an approve used to crash on it).
        ({"type": "object", "properties": {"name": "string"}}, r"\$\.properties\.name: a schema"),
        ({"type": "object", "properties": {"a": True}}, "a schema is a JSON object"),
        ({"type": "object", "properties": {"a": {"type": "text"}}}, "a JSON type"),
        ({"type": "object", "required": "name"}, "a list of property names"),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^x"}}}, "pattern"),
        ({"allOf": [{"type": "object"}]}, "allOf: keyword not supported"),
        ({"type": "object", "properties": {"a": {"minLength": -1}}}, "a count"),
    ],
)
async def test_a_schema_an_answer_could_not_be_checked_against_is_refused_when_asked(
    autojump_clock: Any, schema: Any, problem: str
) -> None:
    async with ta.open_run(asking(schema), "go") as run:
        pass
    (output,) = outputs(run.result)
    assert output.startswith("ValueError: the question's schema cannot check an answer")
    assert re.search(problem, output), output
    statuses = [e.status for e in await run_events(run) if isinstance(e, ta.RunUpdated)]
    assert "awaiting_approval" not in statuses  # never pending


async def test_a_question_too_large_to_show_is_refused_when_asked(autojump_clock: Any) -> None:
    async with ta.open_run(asking(None, message="?" * 8_193), "go") as run:
        pass
    assert outputs(run.result) == [
        "ValueError: a question's message has at most 8192 characters, this one 8193"
    ]
    async with ta.open_run(asking(None, data={"blob": "x" * 70_000}), "go") as run:
        pass
    (output,) = outputs(run.result)
    assert output.startswith("ValueError: a question's data and schema hold at most 65536 bytes")


MCP_FORM = {  # the shapes of an MCP elicitation form (server-everything's among them)
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name", "minLength": 2, "maxLength": 5},
        "email": {"type": "string", "format": "email"},
        "score": {"type": "integer", "minimum": 1, "maximum": 100, "default": 42},
        "ratio": {"type": "number", "exclusiveMinimum": 0},
        "hero": {"type": "string", "oneOf": [{"const": "h1", "title": "A"}, {"const": "h2"}]},
        "tags": {
            "type": "array",
            "minItems": 1,
            "maxItems": 2,
            "items": {"anyOf": [{"const": "x"}, {"const": "y"}]},
        },
    },
    "required": ["name"],
    "additionalProperties": False,
}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ({"name": "a"}, r"\$\.name: at least 2 characters, got 1"),
        ({"name": "abcdef"}, r"\$\.name: at most 5 characters"),
        ({"name": "ab", "score": 0}, r"\$\.score: minimum is 1, got 0"),
        ({"name": "ab", "score": 101}, r"\$\.score: maximum is 100"),
        ({"name": "ab", "score": 5.5}, r"\$\.score: expected integer, got number"),
        ({"name": "ab", "ratio": 0}, r"\$\.ratio: exclusiveMinimum is 0, got 0"),
        ({"name": "ab", "hero": "h3"}, r"\$\.hero: does not match exactly one"),
        ({"name": "ab", "tags": []}, r"\$\.tags: at least 1 items"),
        ({"name": "ab", "tags": ["x", "y", "x"]}, r"\$\.tags: at most 2 items"),
        ({"name": "ab", "tags": ["z"]}, r"\$\.tags\[0\]: matches none of its choices"),
        ({"name": "ab", "extra": 1}, r"\$: unexpected property 'extra'"),
    ],
)
async def test_content_is_checked_against_a_forms_constraints(
    autojump_clock: Any, content: dict[str, Any], problem: str
) -> None:
    async with ta.open_run(asking(MCP_FORM), "go") as run:
        await trio.sleep(1)
        question_id = "call_1_0:ask-1"
        with pytest.raises(ValueError, match=problem):
            run.approve(question_id, content=content)
        assert run.statistics().pending_approvals == (question_id,)  # nothing decided
        good = {"name": "ab", "email": "not checked", "score": 7.0, "hero": "h2", "tags": ["y"]}
        run.approve(question_id, content=good)
    (output,) = outputs(run.result)
    assert output.startswith("ApprovalDecision(approved=True")
    assert "'hero': 'h2'" in output
