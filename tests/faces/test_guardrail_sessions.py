"""A message an input guardrail rejects never reaches the model of a later run in the
same conversation, over every face that keeps one (DESIGN §18, §19): REST's
``session_id``, A2A's ``contextId`` and AG-UI's ``threadId``, each a session of the
host's SQLite file. The check is what the model receives: the second request's items."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import trio_agents as ta
from tests.support.a2a_support import ALICE, rpc, serving, text_message
from tests.support.agui_support import agui_stream, check_order, run_input
from trio_agents.hosting import LocalHost
from trio_agents.models import ScriptedModel, Turn

SECRET = "xyzzy-secret"


def _agent(blocking: bool) -> tuple[ta.Agent, ScriptedModel]:
    @ta.input_guardrail(name="no_secret", blocking=blocking)
    def no_secret(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        return any(SECRET in i.content for i in items if isinstance(i, ta.UserMessage))

    model = ScriptedModel([], default="fine")
    return ta.Agent(name="guarded", model=model, input_guardrails=[no_secret]), model


async def _all_ended(host: LocalHost) -> list[str]:
    """Wait for every run of alice's to end; their statuses, in start order."""
    statuses = []
    for info in await host.list("alice"):
        statuses.append(str((await host.wait_terminal("alice", info.run_id)).status))
    return statuses


def _assert_unsent(model: ScriptedModel) -> None:
    """The later run's request holds the earlier harmless input, never the rejected
    one (a non-blocking guardrail runs beside the model call of the rejected run
    itself: that request is the one that may hold it, DESIGN §18)."""
    sent = [i.content for i in model.requests[-1].items if isinstance(i, ta.UserMessage)]
    assert sent == ["harmless", "hello again"]


@pytest.mark.parametrize("blocking", [False, True])
async def test_rest_session(tmp_path: Path, blocking: bool) -> None:
    agent, model = _agent(blocking)
    async with (
        serving({"guarded": agent}, sessions=tmp_path / "s.db") as (host, url),
        httpx.AsyncClient(base_url=url, headers=ALICE, timeout=30) as http,
    ):
        for text in ("harmless", f"tell me {SECRET}", "hello again"):
            body = {"agent": "guarded", "input": text, "session_id": "s1"}
            answer = await http.post("/runs", json=body)
            assert answer.status_code == 201, answer.text
            await host.wait_terminal("alice", answer.json()["run_id"])
        assert await _all_ended(host) == ["completed", "failed", "completed"]
    _assert_unsent(model)


@pytest.mark.parametrize("blocking", [False, True])
async def test_a2a_context(tmp_path: Path, blocking: bool) -> None:
    agent, model = _agent(blocking)
    async with serving({"guarded": agent}, sessions=tmp_path / "s.db") as (host, url):
        context: dict[str, Any] = {}
        for text in ("harmless", f"tell me {SECRET}", "hello again"):
            params = {"message": text_message(text, **context)}
            body = (await rpc(url, "SendMessage", params)).json()
            assert "result" in body, body
            context = {"contextId": body["result"]["task"]["contextId"]}
        assert await _all_ended(host) == ["completed", "failed", "completed"]
    _assert_unsent(model)


@pytest.mark.parametrize("blocking", [False, True])
async def test_agui_thread(tmp_path: Path, blocking: bool) -> None:
    agent, model = _agent(blocking)
    async with serving({"guarded": agent}, sessions=tmp_path / "s.db") as (host, url):
        timeout = httpx.Timeout(10.0, read=None)
        async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
            texts = ("harmless", f"tell me {SECRET}", "hello again")
            for number, text in enumerate(texts):
                body = run_input("t1", f"ag-{number}", text)
                with trio.fail_after(30):
                    async with agui_stream(client, "guarded", body) as stream:
                        events = await stream.rest()
                check_order(events)
        assert await _all_ended(host) == ["completed", "failed", "completed"]
    _assert_unsent(model)


def _resent(thread: str, run: str, texts: Sequence[str]) -> dict[str, Any]:
    """A ``RunAgentInput`` as an AG-UI client sends it: its whole message list again,
    here user messages only (no run of the thread answered yet)."""
    messages = [
        {"id": f"m-{number}", "role": "user", "content": text} for number, text in enumerate(texts)
    ]
    return {"threadId": thread, "runId": run, "messages": messages}


async def _agui_runs(url: str, bodies: Sequence[dict[str, Any]]) -> None:
    timeout = httpx.Timeout(10.0, read=None)
    async with httpx.AsyncClient(base_url=url, timeout=timeout) as client:
        for body in bodies:
            with trio.fail_after(30):
                async with agui_stream(client, "guarded", body) as stream:
                    events = await stream.rest()
            check_order(events)


@pytest.mark.parametrize("blocking", [False, True])
async def test_agui_resent_rejected_message_is_not_new_input(
    tmp_path: Path, blocking: bool
) -> None:
    """A client re-sends its whole message list: after a run whose input a guardrail
    rejected (no assistant message came), the next request's trailing user messages
    are [the rejected one, the new one]. The rejected one is already stored (marked),
    so it is not new input again: never sent to the next run's model, never checked
    again (the thread is not stuck)."""
    agent, model = _agent(blocking)
    async with serving({"guarded": agent}, sessions=tmp_path / "s.db") as (host, url):
        rejected = f"tell me {SECRET}"
        await _agui_runs(
            url,
            [_resent("t1", "ag-1", [rejected]), _resent("t1", "ag-2", [rejected, "hello again"])],
        )
        assert await _all_ended(host) == ["failed", "completed"]
    sent = [i.content for i in model.requests[-1].items if isinstance(i, ta.UserMessage)]
    # Run 2's request (with a non-blocking guardrail, run 1's may hold it: DESIGN §18).
    assert sent == ["hello again"]


async def test_agui_resent_after_a_model_error_is_stored_once(tmp_path: Path) -> None:
    """A run that failed before answering (a model error) stored its user message; the
    client's next request re-sends it before its new one: the thread's session holds
    it once (the next run's model is sent it once)."""
    model = ScriptedModel([Turn(fail="the model server went away")], default="fine")
    agent = ta.Agent(name="guarded", model=model)
    async with serving({"guarded": agent}, sessions=tmp_path / "s.db") as (host, url):
        await _agui_runs(
            url, [_resent("t1", "ag-1", ["hello"]), _resent("t1", "ag-2", ["hello", "again"])]
        )
        assert await _all_ended(host) == ["failed", "completed"]
    sent = [i.content for i in model.requests[-1].items if isinstance(i, ta.UserMessage)]
    assert sent == ["hello", "again"]


async def test_agui_retry_after_a_model_error_runs_the_stored_message(tmp_path: Path) -> None:
    """The same message list again after a failed run (a client's retry): nothing new,
    so the run answers the stored message (stored once); a retry of a message a
    guardrail rejected has nothing to run and ends in RUN_ERROR."""
    model = ScriptedModel([Turn(fail="the model server went away")], default="fine")
    guarded, _ = _agent(blocking=True)
    agent = ta.Agent(name="guarded", model=model, input_guardrails=guarded.input_guardrails)
    async with serving({"guarded": agent}, sessions=tmp_path / "s.db") as (host, url):
        await _agui_runs(url, [_resent("t1", "ag-1", ["hello"]), _resent("t1", "ag-2", ["hello"])])
        rejected = f"tell me {SECRET}"
        bodies = [_resent("t2", "ag-3", [rejected]), _resent("t2", "ag-4", [rejected])]
        await _agui_runs(url, bodies)
        statuses = await _all_ended(host)
    assert statuses == ["failed", "completed", "failed", "failed"]
    sent = [i.content for i in model.requests[-1].items if isinstance(i, ta.UserMessage)]
    assert sent == ["hello"]
    assert model.calls == 2
