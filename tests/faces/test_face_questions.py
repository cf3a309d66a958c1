"""A question a running tool call asks (``ctx.request_approval``) as each face's client
sees it, over a real loopback HTTP server: REST shows it in the status detail and takes
``content`` with ``/approve`` (refused content is a 400 ``invalid_request`` and the
question stays pending); the websocket control channel's ``run.approve`` takes it too;
A2A's ``input-required`` status text is the question and a data part's ``content``
answers it; AG-UI's interrupt carries its message and form, and a resume's payload
``content`` answers it. The content reaches the tool as ``ApprovalDecision.content``.
"""

from __future__ import annotations

from contextlib import aclosing
from typing import Any

import httpx
import pytest
import trio

import trio_agents as ta
from tests.support import agui_support as agui
from tests.support.a2a_support import ALICE, rpc, serving, text_message
from tests.support.control_support import serving_alice
from tests.support.http_support import messages
from trio_agents.control import ControlError
from trio_agents.models import ScriptedModel, Turn

pytestmark = [
    pytest.mark.trio,
    # Leaving a status stream at its awaiting_approval update abandons httpx's nested
    # body generators (CONVENTIONS, "httpx aiter_lines()"): exactly those warnings.
    pytest.mark.filterwarnings(
        r"ignore:Async generator 'http(core|x)\._[^']*' was garbage collected:ResourceWarning"
    ),
]

SEAT_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "seat": {"type": "string", "enum": ["aisle", "window"]},
        "bags": {"type": "integer"},
    },
    "required": ["seat"],
}
QUESTION = "Which seat on flight 42?"


def booker(decisions: list[ta.ApprovalDecision]) -> dict[str, ta.Agent]:
    @ta.function_tool
    async def book(ctx: ta.ToolContext) -> str:
        """Book a seat once a person picked one."""
        decision = await ctx.request_approval(QUESTION, data={"flight": 42}, schema=SEAT_FORM)
        decisions.append(decision)
        return f"booked {decision.content}"

    model = ScriptedModel([Turn(tool_calls=[("book", {})]), Turn(text="done")])
    return {"booker": ta.Agent(name="booker", model=model, tools=[book])}


async def _awaiting(http: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """The run's first awaiting_approval update (its status stream, read to there)."""
    path = f"/runs/{run_id}/events?events=status"
    async with http.stream("GET", path) as stream, aclosing(messages(stream)) as got:
        async for message in got:
            event: dict[str, Any] = message.data["event"]
            if event["status"] == "awaiting_approval":
                return event
    raise AssertionError("the run never waited")


async def _terminal(http: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    async with http.stream("GET", f"/runs/{run_id}/events?events=status") as stream:
        got = [message async for message in messages(stream)]
    event: dict[str, Any] = got[-1].data["event"]
    return event


async def test_rest_shows_the_question_and_approve_sends_its_content() -> None:
    decisions: list[ta.ApprovalDecision] = []
    with trio.fail_after(30):
        async with (
            serving(booker(decisions)) as (_host, url),
            httpx.AsyncClient(base_url=url, headers=ALICE, timeout=None) as http,
        ):
            started = await http.post("/runs", json={"agent": "booker", "input": "book"})
            run_id = started.json()["run_id"]
            update = await _awaiting(http, run_id)
            [question] = update["detail"]["questions"]
            assert question == {
                "id": "call_1_0:ask-1",
                "call_id": "call_1_0",
                "name": "book",
                "message": QUESTION,
                "data": {"flight": 42},
                "schema": SEAT_FORM,
            }
            approve = f"/runs/{run_id}/approve"
            for content, says in [
                ({"seat": "roof"}, "seat"),  # not one of the enum's
                ({"bags": 1}, "seat"),  # the required field missing
                ([1, 2], "content must be a JSON object"),
                ("window", "content must be a JSON object"),
            ]:
                answer = await http.post(
                    approve, json={"call_id": question["id"], "content": content}
                )
                assert answer.status_code == 400, answer.text
                error = answer.json()["error"]
                assert error["code"] == "invalid_request"
                assert says in error["message"]
            # Nothing was decided: the question still waits, with the same detail.
            record = (await http.get(f"/runs/{run_id}")).json()["run"]
            assert record["status"] == "awaiting_approval"
            assert record["detail"] == update["detail"]
            assert decisions == []
            answer = await http.post(
                approve,
                json={"call_id": question["id"], "content": {"seat": "window", "bags": 2}},
            )
            assert answer.status_code == 200, answer.text
            assert (await _terminal(http, run_id))["status"] == "completed"
    assert decisions == [ta.ApprovalDecision(True, None, {"seat": "window", "bags": 2})]


async def test_the_control_channel_approves_with_content() -> None:
    decisions: list[ta.ApprovalDecision] = []
    with trio.fail_after(30):
        async with serving_alice(booker(decisions)) as (_server, alice):
            run = await alice.start("booker", "book")
            async for event in run.events():
                if isinstance(event, ta.RunUpdated) and event.status == "awaiting_approval":
                    [question] = event.detail["questions"]
                    break
            with pytest.raises(ControlError) as refused:
                await run.approve(question["id"], content={"seat": "roof"})
            assert refused.value.code == "invalid_request"
            await run.approve(question["id"], content={"seat": "aisle"})
            await run.wait()
    assert decisions == [ta.ApprovalDecision(True, None, {"seat": "aisle"})]


async def test_a2a_input_required_says_the_question_and_a_data_part_answers_it() -> None:
    decisions: list[ta.ApprovalDecision] = []
    with trio.fail_after(30):
        async with serving(booker(decisions)) as (_host, url):
            sent = await rpc(url, "SendMessage", {"message": text_message("book")})
            task = sent.json()["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
            text_part, data_part = task["status"]["message"]["parts"]
            assert text_part["text"].startswith(f"{QUESTION} (call_1_0:ask-1)")
            assert '"content"' in text_part["text"]  # says how to send the form's answer
            [waiting] = data_part["data"]["waiting"]
            assert waiting["callId"] == "call_1_0:ask-1"
            assert waiting["name"] == "book"
            assert waiting["question"] == {"message": QUESTION, "schema": SEAT_FORM}

            def answer(content: Any) -> dict[str, Any]:
                data = {"decision": "approve", "callId": waiting["callId"], "content": content}
                return {
                    "message": {
                        "messageId": f"m-{len(str(content))}",
                        "role": "ROLE_USER",
                        "taskId": task["id"],
                        "parts": [{"data": data}],
                    }
                }

            refused = (await rpc(url, "SendMessage", answer({"seat": "roof"}))).json()["error"]
            assert refused["code"] == -32602
            assert "seat" in refused["message"]
            refused = (await rpc(url, "SendMessage", answer(["window"]))).json()["error"]
            assert refused["code"] == -32602
            assert decisions == []
            done = (await rpc(url, "SendMessage", answer({"seat": "window"}))).json()
            assert done["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert decisions == [ta.ApprovalDecision(True, None, {"seat": "window"})]


async def test_agui_interrupt_carries_the_question_and_resume_its_content() -> None:
    decisions: list[ta.ApprovalDecision] = []
    with trio.fail_after(30):
        async with agui.agui_server(booker(decisions)) as (_host, _app, client):
            _, interrupt = await agui.until_interrupt(client, "booker")
            assert interrupt["message"] == QUESTION
            assert interrupt["toolCallId"] == "call_1_0"
            schema = interrupt["responseSchema"]
            assert schema["required"] == ["approved"]
            assert schema["properties"]["content"] == SEAT_FORM
            ours = agui.ours(interrupt)
            assert ours["call_id"] == "call_1_0:ask-1"
            assert ours["question"] == {
                "message": QUESTION,
                "schema": SEAT_FORM,
                "data": {"flight": 42},
            }

            def resume(content: Any, run: str) -> dict[str, Any]:
                body = agui.run_input(run=run)
                resolved = {"approved": True, "content": content}
                body["resume"] = [
                    {"interruptId": interrupt["id"], "status": "resolved", "payload": resolved}
                ]
                return body

            for bad, says in [({"seat": "roof"}, "seat"), (["aisle"], "must be an object")]:
                refused = await client.post(
                    "/ag-ui/booker", json=resume(bad, "ag-bad"), headers=agui.ALICE
                )
                assert refused.status_code == 400, refused.text
                error = refused.json()["error"]
                assert error["code"] == "invalid_request"
                assert says in error["message"]
            assert decisions == []
            body = resume({"seat": "aisle", "bags": 0}, "ag-2")
            async with agui.agui_stream(client, "booker", body) as stream:
                events = await stream.rest()
            assert events[-1]["type"] == "RUN_FINISHED"
            assert events[-1]["outcome"]["type"] == "success", events[-1]
    assert decisions == [ta.ApprovalDecision(True, None, {"seat": "aisle", "bags": 0})]
