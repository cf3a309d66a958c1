"""``trio-agents ctl`` verbs against a live in-process server (human and ``--json``
output), and ``serve --app`` loading. The process-level cases are in test_cli.py."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

import trio_agents as ta
from tests.support.cli_app import AGENTS, blocker
from tests.support.control_support import serving
from trio_agents._cli import CLIError
from trio_agents._cli._args import parse
from trio_agents._cli._ctl import run_ctl
from trio_agents._cli._errors import explain
from trio_agents._cli._serve import load_app
from trio_agents.control import RemoteRun, connect
from trio_agents.models import ScriptedModel, Turn

HANG_GUARD = 30  # seconds; a bound against hangs, never a wait


async def ctl(url: str, *argv: str) -> list[str]:
    """Run ``trio-agents ctl URL --token tok-alice ARGV`` in process; its output lines."""
    out = io.StringIO()
    code = await run_ctl(parse(["ctl", url, "--token", "tok-alice", *argv]), out)
    assert code == 0
    return out.getvalue().splitlines()


def app() -> dict[str, ta.Agent]:
    return {"a": ta.Agent(name="a", model=ScriptedModel([], default=Turn(text="hi there")))}


async def test_start_watch_list_get_for_people() -> None:
    with trio.fail_after(HANG_GUARD):
        async with serving(app()) as (_, url):
            lines = await ctl(url, "start", "a", "yo", "--session", "s1")
            run_id = lines[0].removeprefix("run ").removesuffix(" started")
            assert lines[1:] == [
                "[run.updated] queued (turn 0)",
                "[run.updated] running (turn 0)",
                "assistant> hi there",
                "[run.updated] completed (turn 1)",
            ]
            assert await ctl(url, "watch", run_id) == lines[1:]
            table = await ctl(url, "list")
            assert table[0].split() == [
                "RUN",
                "AGENT",
                "SESSION",
                "STATUS",
                "TURN",
                "SEQ",
                "REASON",
            ]
            assert table[1].split()[:5] == [run_id, "a", "s1", "completed", "1"]
            assert await ctl(url, "get", run_id) == table


async def test_json_output_for_scripts() -> None:
    with trio.fail_after(HANG_GUARD):
        async with serving(app()) as (_, url):
            events = [json.loads(line) for line in await ctl(url, "--json", "start", "a", "yo")]
            assert [e["type"] for e in events][-1] == "run.updated"
            assert events[-1]["status"] == "completed"
            run_id = events[0]["run_id"]
            # --json is accepted after the verb too
            assert [
                json.loads(line) for line in await ctl(url, "watch", run_id, "--json")
            ] == events
            (listed,) = [json.loads(line) for line in await ctl(url, "list", "--json")]
            assert (listed["run_id"], listed["status"]) == (run_id, "completed")
            assert json.loads((await ctl(url, "--json", "get", run_id))[0]) == listed
            (detached,) = await ctl(url, "--json", "start", "a", "again", "--detach")
            assert set(json.loads(detached)) == {"run_id"}


async def test_detach_prints_the_bare_run_id() -> None:
    with trio.fail_after(HANG_GUARD):
        async with serving({"blocker": blocker()}) as (_, url):
            (run_id,) = await ctl(url, "start", "blocker", "hi", "--detach")
            assert await ctl(url, "cancel", run_id, "--reason", "enough") == [
                f"run {run_id}: cancel requested"
            ]
            async with connect(url, token="tok-alice") as client:
                terminal = await client.attach(run_id).wait()
    assert (terminal.status, terminal.reason) == ("cancelled", "enough")


@ta.function_tool(needs_approval=True)
async def delete(path: str) -> str:
    """Delete a file (needs approval)."""
    await trio.lowlevel.checkpoint()
    return f"deleted {path}"


@asynccontextmanager
async def awaiting_approval(model: ScriptedModel) -> AsyncIterator[tuple[str, RemoteRun, str]]:
    """Serve the agent ``careful`` (tool ``delete``) on ``model``; start a run and wait
    until its call awaits approval: the server's URL, the run and the call's id."""
    agents = {"careful": ta.Agent(name="careful", model=model, tools=[delete])}
    async with serving(agents) as (_, url), connect(url, token="tok-alice") as client:
        run = await client.start("careful", "clean up")
        yield url, run, await pending_call(run)


async def test_inject_withdraw_reject() -> None:
    model = ScriptedModel([Turn(tool_calls=[("delete", {"path": "/etc"})]), "Not deleted."])
    with trio.fail_after(HANG_GUARD):
        async with awaiting_approval(model) as (url, run, call_id):
            (injection,) = await ctl(url, "inject", run.id, "also the logs")
            assert await ctl(url, "withdraw", run.id, injection) == [
                f"run {run.id}: injection {injection} withdrawn"
            ]
            (again,) = await ctl(url, "--json", "withdraw", run.id, injection)
            assert json.loads(again) == {
                "run_id": run.id,
                "injection_id": injection,
                "withdrawn": False,
            }
            assert await ctl(url, "reject", run.id, call_id, "--message", "not /etc") == [
                f"run {run.id}: call {call_id} rejected"
            ]
            items = [e.item async for e in run.events() if isinstance(e, ta.RunItemEvent)]
            terminal = await run.wait()
    assert terminal.status == "completed"
    (result,) = [item for item in items if isinstance(item, ta.ToolResult)]
    assert result.status == "error"
    assert "not /etc" in result.output
    # the withdrawn injection never reached the model
    assert all("also the logs" not in str(request.items) for request in model.requests)


async def test_approve() -> None:
    model = ScriptedModel([Turn(tool_calls=[("delete", {"path": "/tmp/x"})]), "Done."])
    with trio.fail_after(HANG_GUARD):
        async with awaiting_approval(model) as (url, run, call_id):
            (line,) = await ctl(url, "--json", "approve", run.id, call_id)
            assert json.loads(line) == {"run_id": run.id, "call_id": call_id, "approved": True}
            assert (await run.wait()).status == "completed"


@ta.function_tool
async def pick(ctx: ta.ToolContext) -> str:
    """Ask which color (a question whose answer has content); return the answer."""
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}
    decision = await ctx.request_approval("which color?", schema=schema)
    assert decision.content is not None
    return f"color: {decision.content['color']}"


async def test_approve_with_content_answers_a_question() -> None:
    model = ScriptedModel([Turn(tool_calls=[("pick", {})]), "Picked."])
    agents = {"asks": ta.Agent(name="asks", model=model, tools=[pick])}
    with trio.fail_after(HANG_GUARD):
        async with serving(agents) as (_, url), connect(url, token="tok-alice") as client:
            run = await client.start("asks", "pick one")
            question = await pending_call(run)
            # Valid JSON that does not match the question's schema: the server's refusal,
            # nothing decided (the question still waits).
            with pytest.raises(BaseException) as caught:  # noqa: PT011 - a group, as above
                await ctl(url, "approve", run.id, question, "--content", '{"color": 5}')
            message, status = explain(caught.value) or ("", 0)
            assert status == 1
            assert message.startswith("the server refused the request:")
            assert "schema" in message
            (line,) = await ctl(
                url, "--json", "approve", run.id, question, "--content", '{"color": "red"}'
            )
            assert json.loads(line) == {
                "run_id": run.id,
                "call_id": question,
                "approved": True,
                "content": {"color": "red"},
            }
            items = [e.item async for e in run.events() if isinstance(e, ta.RunItemEvent)]
            assert (await run.wait()).status == "completed"
    (result,) = [item for item in items if isinstance(item, ta.ToolResult)]
    assert result.output == "color: red"


@pytest.mark.parametrize(
    ("content", "says"),
    [("{color: red}", "not valid JSON"), ('["red"]', "must be a JSON object"), ("", "JSON")],
)
def test_approve_content_must_be_a_json_object(
    content: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse(["ctl", "ws://127.0.0.1:1", "approve", "r1", "c1", "--content", content])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "argument --content:" in err
    assert says in err
    assert err.count("\n") == 1


async def test_a_finished_run_is_a_clear_error() -> None:
    with trio.fail_after(HANG_GUARD):
        async with serving(app()) as (_, url):
            (run_id,) = await ctl(url, "start", "a", "yo", "--detach")
            async with connect(url, token="tok-alice") as client:
                await client.attach(run_id).wait()
            with pytest.raises(BaseException) as caught:  # noqa: PT011 - a group, explained below
                await ctl(url, "inject", run_id, "late")
    assert explain(caught.value) == (
        f"cannot inject into run {run_id}: it has already ended (completed)",
        1,
    )


def test_serve_app_loading() -> None:
    assert load_app("tests.support.cli_app:AGENTS") == AGENTS
    single = load_app("tests.support.cli_app:blocker")  # a factory returning one Agent
    assert list(single) == ["blocker"]
    with pytest.raises(CLIError, match="must look like MODULE:ATTR"):
        load_app("tests.support.cli_app")
    with pytest.raises(CLIError, match="is module; it must be a mapping"):
        load_app("tests.support.cli_app:trio")


async def pending_call(run: RemoteRun) -> str:
    """The one call ``run`` waits for approval of, once it waits."""
    async for update in run.updated:
        if update.status == "awaiting_approval":
            (call_id,) = update.detail["pending"]
            return str(call_id)
    raise AssertionError("the run ended without awaiting approval")
