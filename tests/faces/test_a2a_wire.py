"""The A2A face against raw JSON-RPC over httpx: auth on every method, principals'
isolation, garbage JSON-RPC, oversized bodies, CancelTask waiting for the stop and
racing completion, re-subscription with Last-Event-ID, approvals, 0.3 names."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx
import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.a2a_support import (
    ALICE,
    BOB,
    approver,
    raw_post,
    rpc,
    serving,
    sse,
    text_message,
)
from trio_agents.hosting import LocalHost, RunHost
from trio_agents.models import ScriptedModel, Turn

METHODS = [
    "SendMessage",
    "SendStreamingMessage",
    "GetTask",
    "ListTasks",
    "CancelTask",
    "SubscribeToTask",
    "message/send",
    "message/stream",
    "tasks/get",
    "tasks/cancel",
    "tasks/resubscribe",
]


def _talker(text: str = "one two three") -> ta.Agent:
    return ta.Agent(name="t", instructions="test", model=ScriptedModel([], default=Turn(text=text)))


def _holder(
    gate: trio.Event, *, stubborn: trio.Event | None = None, reached: trio.Event | None = None
) -> ta.Agent:
    """Waits in a tool until ``gate`` is set; with ``stubborn``, a cancel of the tool
    is held (in a shield) until that event is set too, and ``reached`` says when."""

    @ta.function_tool
    async def hold() -> str:
        """Wait for the test."""
        try:
            await gate.wait()
        finally:
            if stubborn is not None:
                if reached is not None:
                    reached.set()
                with trio.CancelScope(shield=True):
                    await stubborn.wait()
        return "held"

    script = [Turn(text="before ", tool_calls=[("hold", {})]), Turn(text="after")]
    return ta.Agent(name="h", instructions="test", model=ScriptedModel(script), tools=[hold])


async def _start(url: str, text: str = "go", **params: Any) -> dict[str, Any]:
    config = {"returnImmediately": True}
    answer = await rpc(
        url, "SendMessage", {"message": text_message(text), "configuration": config, **params}
    )
    body = answer.json()
    assert "result" in body, body
    return dict(body["result"]["task"])


async def _until_state(url: str, task_id: str, state: str) -> dict[str, Any]:
    async with sse(url, "SubscribeToTask", {"id": task_id}) as stream:
        while (message := await stream.next()) is not None:
            result = message["result"]
            status = (result.get("task") or result.get("statusUpdate") or {}).get("status")
            if status and status["state"] == state:
                return dict(result)
    raise AssertionError(f"{task_id} never reached {state}")


def _update(result: dict[str, Any]) -> dict[str, Any]:
    """The status or artifact update a stream result holds."""
    update = result.get("statusUpdate") or result.get("artifactUpdate")
    assert isinstance(update, dict), result
    return update


def _error(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert "result" not in body, body
    return dict(body["error"])


async def test_a_tasks_metadata_carries_the_runs_exact_usage() -> None:
    from decimal import Decimal

    usage = ta.Usage(30, 4, "m1", cache_read_tokens=20, cost=Decimal("0.0000123"))
    priced = ta.Agent(name="p", model=ScriptedModel([Turn(text="ok", usage=usage)]))
    with trio.fail_after(20):
        async with serving({"p": priced}) as (_, url):
            answer = await rpc(url, "SendMessage", {"message": text_message("go")})
            task = answer.json()["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED"
            assert task["metadata"]["usage"] == usage.to_json()
            got = (await rpc(url, "GetTask", {"id": task["id"]})).json()["result"]
            assert got["metadata"]["usage"] == {
                "input_tokens": 30,
                "output_tokens": 4,
                "model": "m1",
                "cache_read_tokens": 20,
                "cost": "0.0000123",
            }


# --------------------------------------------------------------------- auth


@pytest.mark.parametrize("method", METHODS)
async def test_no_token_is_401_on_every_method(method: str) -> None:
    async with serving({"t": _talker()}) as (_host, url):
        for headers in (None, {"Authorization": "Bearer nope"}, {"Authorization": "tok-alice"}):
            answer = await rpc(url, method, {"id": "x"}, headers=headers)
            assert answer.status_code == 401
            assert answer.json()["error"]["code"] == "unauthorized"


async def test_the_card_is_public_and_lists_the_agents_as_skills() -> None:
    async with (
        serving({"t": _talker(), "h": _holder(trio.Event())}) as (_host, url),
        httpx.AsyncClient() as client,
    ):
        card = (await client.get(f"{url}/.well-known/agent-card.json")).json()
    assert [s["id"] for s in card["skills"]] == ["h", "t"]
    assert {(i["protocolBinding"], i["protocolVersion"]) for i in card["supportedInterfaces"]} == {
        ("JSONRPC", "1.0"),
        ("JSONRPC", "0.3"),
    }
    assert all(i["url"] == f"{url}/a2a" for i in card["supportedInterfaces"])
    assert card["capabilities"]["streaming"] is True
    assert "bearer" in card["securitySchemes"]


async def test_another_principals_task_is_not_found_on_every_method() -> None:
    gate = trio.Event()
    async with serving({"h": _holder(gate)}) as (host, url):
        task = await _start(url)
        other = {"id": task["id"]}
        for method in (
            "GetTask",
            "CancelTask",
            "SubscribeToTask",
            "tasks/get",
            "tasks/cancel",
            "tasks/resubscribe",
        ):
            error = _error(await rpc(url, method, other, headers=BOB))
            assert error["code"] == -32001, (method, error)
        for method in ("SendMessage", "SendStreamingMessage", "message/send", "message/stream"):
            message = text_message("more", taskId=task["id"])
            if method.startswith("message/"):
                message = {
                    "kind": "message",
                    "messageId": "m",
                    "role": "user",
                    "taskId": task["id"],
                    "parts": [{"kind": "text", "text": "more"}],
                }
            error = _error(await rpc(url, method, {"message": message}, headers=BOB))
            assert error["code"] == -32001, (method, error)
        listed = (await rpc(url, "ListTasks", {}, headers=BOB)).json()["result"]
        assert listed["tasks"] == []
        assert listed["totalSize"] == 0
        # and bob's attempts changed nothing
        assert str((await host.get("alice", task["id"])).status) != "cancelled"
        gate.set()


# ------------------------------------------------------------- garbage JSON-RPC


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", -32700),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": NaN}}', -32700),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "a\\u0000b"}}',
            -32602,
        ),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "\\ud800"}}', -32602),
        (b"\xff\xfe", -32700),
        (b"", -32700),
        (b"[]", -32600),
        (b'[{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}]', -32600),
        (b'"a string"', -32600),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}', -32600),
        (b'{"id": 1, "method": "GetTask", "params": {"id": "x"}}', -32600),
        (b'{"jsonrpc": "2.0", "method": "GetTask", "params": {"id": "x"}}', -32600),
        (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "GetTask", "params": {}}', -32600),
        (b'{"jsonrpc": "2.0", "id": true, "method": "GetTask", "params": {}}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 7, "params": {}}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "DropTables", "params": {}}', -32601),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask"}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": []}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {}}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": 5}}', -32602),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}', -32602),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"parts": []}}}',
            -32602,
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"parts": [{"url": "http://x"}]}}}',
            -32005,
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"parts": [{"text": "x"}]}, "metadata": {"agent": "nobody"}}}',
            -32602,
        ),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageSize": -1}}', -32602),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {"pageToken": "forged"}}',
            -32602,
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "no-such-task"}}',
            -32001,
        ),
        (
            b'{"jsonrpc": "2.0", "id": 1, "method": "CreateTaskPushNotificationConfig", "params": {}}',
            -32003,
        ),
    ],
)
async def test_garbage_json_rpc_answers_json_rpc_errors(body: bytes, code: int) -> None:
    async with serving({"t": _talker()}) as (_host, url):
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                f"{url}/a2a", content=body, headers={**ALICE, "Content-Type": "application/json"}
            )
        error = _error(answer)
        assert error["code"] == code, error
        assert isinstance(error["message"], str)
        assert error["message"]


@pytest.mark.parametrize("rpc_id", [7, "req-7"])
@pytest.mark.parametrize(
    ("method", "params", "code"),
    [
        ("DropTables", {}, -32601),
        ("GetTask", None, -32602),
        ("GetTask", [], -32602),
        ("GetTask", {"id": "a\u0000b"}, -32602),
        ("SendStreamingMessage", None, -32602),
        ("CreateTaskPushNotificationConfig", {}, -32003),
    ],
)
async def test_an_error_answer_echoes_the_id_the_request_had(
    rpc_id: Any, method: str, params: Any, code: int
) -> None:
    """An unknown method, missing or invalid params, an unsupported method: the request
    object had a valid id, so the error answers it (JSON-RPC 2.0 §5: null only when
    the id could not be read)."""
    async with serving({"t": _talker()}) as (_host, url):
        answer = await rpc(url, method, params, rpc_id=rpc_id)
    error = _error(answer)
    assert error["code"] == code, error
    assert answer.json()["id"] == rpc_id


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "GetTask", "params": {}}',
        b'{"jsonrpc": "2.0", "id": true, "method": "GetTask", "params": {}}',
    ],
)
async def test_an_error_answers_a_null_id_when_the_id_could_not_be_read(body: bytes) -> None:
    async with serving({"t": _talker()}) as (_host, url), httpx.AsyncClient() as client:
        answer = await client.post(
            f"{url}/a2a", content=body, headers={**ALICE, "Content-Type": "application/json"}
        )
    _error(answer)
    assert answer.json()["id"] is None


async def test_an_unsupported_version_header_is_version_not_supported() -> None:
    async with serving({"t": _talker()}) as (_host, url):
        for version, ok in (
            ("1.0", True),
            ("0.3", True),
            ("1.0.2", True),
            ("0.5", False),
            ("2.0", False),
        ):
            answer = await rpc(url, "ListTasks", {}, headers={**ALICE, "A2A-Version": version})
            body = answer.json()
            assert ("result" in body) is ok, (version, body)
            if not ok:
                assert body["error"]["code"] == -32009


async def test_an_oversized_body_is_413_without_being_read() -> None:
    async with serving({"t": _talker()}) as (_host, url):
        big = 2 << 20  # past the default max_body_bytes (1 MiB)
        declared = {**ALICE, "Content-Type": "application/json", "Content-Length": str(big)}
        assert await raw_post(url, declared, [b"{" + b" " * 1000]) == 413
        undeclared = {**ALICE, "Content-Type": "application/json"}
        assert await raw_post(url, undeclared, [b" " * (1 << 19)] * 4) == 413
        # and the server goes on answering
        assert (await rpc(url, "ListTasks", {})).json()["result"]["tasks"] == []


async def test_host_errors_carry_their_code_in_error_info() -> None:
    async with serving({"t": _talker()}) as (_host, url):
        error = _error(await rpc(url, "GetTask", {"id": "nope"}))
    assert error["code"] == -32001
    (info,) = error["data"]
    assert info["@type"] == "type.googleapis.com/google.rpc.ErrorInfo"
    assert info["metadata"] == {"code": "not_found"}


# ------------------------------------------------------------------- cancel


async def _cancel_into(answers: list[httpx.Response], url: str, task_id: str) -> None:
    answers.append(await rpc(url, "CancelTask", {"id": task_id}))


async def test_cancel_task_answers_only_once_the_run_has_stopped() -> None:
    gate, stubborn, reached = trio.Event(), trio.Event(), trio.Event()
    async with serving({"h": _holder(gate, stubborn=stubborn, reached=reached)}) as (host, url):
        task = await _start(url)
        await _until_state(url, task["id"], "TASK_STATE_WORKING")
        answers: list[httpx.Response] = []

        async def cancel() -> None:
            answers.append(
                await rpc(url, "CancelTask", {"id": task["id"], "metadata": {"reason": "stop"}})
            )

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel)
            try:
                # The cancel reached the run, whose tool holds it: the answer waits.
                await reached.wait()
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                assert answers == []
                assert not (await host.get("alice", task["id"])).status.is_terminal
            finally:
                stubborn.set()
        answer = answers[0].json()["result"]
    assert answer["status"]["state"] == "TASK_STATE_CANCELED"
    assert answer["status"]["message"]["parts"][0]["text"] == "stop"


async def test_cancel_of_a_finished_task_is_not_cancelable() -> None:
    async with serving({"t": _talker()}) as (_host, url):
        sent = (await rpc(url, "SendMessage", {"message": text_message("hi")})).json()["result"][
            "task"
        ]
        assert sent["status"]["state"] == "TASK_STATE_COMPLETED"
        error = _error(await rpc(url, "CancelTask", {"id": sent["id"]}))
        assert error["code"] == -32002
        error = _error(await rpc(url, "SubscribeToTask", {"id": sent["id"]}))
        assert error["code"] == -32004
        error = _error(
            await rpc(url, "SendMessage", {"message": text_message("more", taskId=sent["id"])})
        )
        assert error["code"] == -32004


async def test_cancel_task_racing_completion_answers_the_state_the_task_ended_in() -> None:
    """The gate opens (the run completes) while CancelTask is on its way: the answer is
    either TaskNotCancelableError or the terminal task — and GetTask agrees with it."""
    seen: set[str] = set()
    for round in range(8):
        gate = trio.Event()
        async with serving({"h": _holder(gate)}) as (_host, url):
            task = await _start(url)
            await _until_state(url, task["id"], "TASK_STATE_WORKING")
            answers: list[httpx.Response] = []
            async with trio.open_nursery() as nursery:
                if round % 2:
                    gate.set()
                nursery.start_soon(_cancel_into, answers, url, task["id"])
                for _ in range(round):
                    await trio.lowlevel.checkpoint()
                gate.set()
            body = answers[0].json()
            final = (await rpc(url, "GetTask", {"id": task["id"]})).json()["result"]
        assert final["status"]["state"] in ("TASK_STATE_COMPLETED", "TASK_STATE_CANCELED")
        if "error" in body:
            assert body["error"]["code"] == -32002
            seen.add("not cancelable")
        else:
            assert body["result"]["status"]["state"] == final["status"]["state"]
            seen.add(final["status"]["state"])
    assert seen  # at least one way; which ones depends on the schedule


# ---------------------------------------------------------------- streams


async def test_resubscribe_with_last_event_id_replays_each_event_after_it() -> None:
    gate = trio.Event()
    async with serving({"h": _holder(gate)}) as (_host, url):
        task = await _start(url)
        await _until_state(url, task["id"], "TASK_STATE_WORKING")
        params = {"id": task["id"]}
        async with sse(url, "SubscribeToTask", params, rpc_id="s") as stream:
            first = await stream.next()
            assert first is not None
            snapshot = first["result"]["task"]
        seq = snapshot["metadata"]["seq"]
        assert seq >= 3
        got: list[dict[str, Any]] = []
        async with sse(
            url, "SubscribeToTask", params, rpc_id="s", headers={**ALICE, "Last-Event-ID": "1"}
        ) as stream:
            while (message := await stream.next()) is not None:
                assert message["id"] == "s"
                got.append(message["result"])
                if len(got) == 1:
                    gate.set()
    assert got[0]["task"]["metadata"]["seq"] >= seq
    replayed = [_update(r)["metadata"]["seq"] for r in got[1:]]
    # 2.. the snapshot's seq (the backlog asked for), then every later event, once
    assert replayed == list(range(2, replayed[-1] + 1))
    assert got[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_streaming_send_message_frames_json_rpc_in_sse() -> None:
    async with (
        serving({"t": _talker()}) as (_host, url),
        sse(url, "SendStreamingMessage", {"message": text_message("hi")}, rpc_id=42) as stream,
    ):
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        got = await stream.rest()
    assert all(m["jsonrpc"] == "2.0" and m["id"] == 42 for m in got)
    assert "task" in got[0]["result"]
    text = "".join(
        m["result"]["artifactUpdate"]["artifact"]["parts"][0]["text"]
        for m in got
        if "artifactUpdate" in m["result"] and m["result"]["artifactUpdate"]["append"]
    )
    assert text == "one two three"
    last = got[-1]["result"]["statusUpdate"]
    assert last["status"]["state"] == "TASK_STATE_COMPLETED"
    seqs = [
        (m["result"].get("statusUpdate") or m["result"].get("artifactUpdate"))["metadata"]["seq"]
        for m in got[1:]
    ]
    assert seqs == sorted(set(seqs))


# -------------------------------------------------------------- approvals


@pytest.mark.parametrize("answer", ["reject-data", "reject-text", "approve-text"])
async def test_input_required_answered_by_a_message(answer: str) -> None:
    async with serving({"a": approver()}) as (_host, url):
        waiting = (await rpc(url, "SendMessage", {"message": text_message("launch")})).json()[
            "result"
        ]["task"]
        assert waiting["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        (call,) = waiting["status"]["message"]["parts"][1]["data"]["waiting"]
        # a message without a decision is refused while a call waits
        error = _error(
            await rpc(url, "SendMessage", {"message": text_message("hm", taskId=waiting["id"])})
        )
        assert error["code"] == -32602
        parts: list[dict[str, Any]]
        if answer == "reject-data":
            parts = [
                {
                    "data": {
                        "decision": "reject",
                        "callId": call["callId"],
                        "message": "no launches today",
                    }
                }
            ]
        else:
            parts = [{"text": answer.split("-")[0].upper()}]
        message = {"messageId": "m2", "role": "ROLE_USER", "taskId": waiting["id"], "parts": parts}
        done = (await rpc(url, "SendMessage", {"message": message})).json()["result"]["task"]
        assert done["status"]["state"] == "TASK_STATE_COMPLETED"
        outputs = [m for m in done["history"] if m["role"] == "ROLE_AGENT"]
        assert outputs[-1]["parts"][0]["text"] == "done"


async def test_a_message_to_a_working_task_is_injected() -> None:
    gate = trio.Event()
    async with serving({"h": _holder(gate)}) as (host, url):
        task = await _start(url)
        await _until_state(url, task["id"], "TASK_STATE_WORKING")
        sent = await rpc(
            url,
            "SendMessage",
            {
                "message": text_message("also this", taskId=task["id"]),
                "configuration": {"returnImmediately": True},
            },
        )
        assert sent.json()["result"]["task"]["id"] == task["id"]
        gate.set()
        info = await host.wait_terminal("alice", task["id"])
        final = (await rpc(url, "GetTask", {"id": task["id"]})).json()["result"]
    assert str(info.status) == "completed"
    users = [m["parts"][0]["text"] for m in final["history"] if m["role"] == "ROLE_USER"]
    assert users == ["go", "also this"]


# ------------------------------------------------------------ 0.3 names


async def test_03_method_names_take_and_give_03_shapes() -> None:
    gate = trio.Event()
    async with serving({"h": _holder(gate)}) as (_host, url):
        message = {
            "kind": "message",
            "messageId": "m1",
            "role": "user",
            "parts": [{"kind": "text", "text": "go"}],
        }
        sent = (
            await rpc(
                url, "message/send", {"message": message, "configuration": {"blocking": False}}
            )
        ).json()["result"]
        assert sent["kind"] == "task"
        assert sent["status"]["state"] in ("submitted", "working")
        got = (await rpc(url, "tasks/get", {"id": sent["id"]})).json()["result"]
        assert got["kind"] == "task"
        assert got["id"] == sent["id"]
        async with sse(url, "tasks/resubscribe", {"id": sent["id"]}) as stream:
            first = await stream.next()
            assert first is not None
            gate.set()
            got = [first, *await stream.rest()]
        kinds = [m["result"]["kind"] for m in got]
        last = got[-1]["result"]
        assert kinds[0] == "task"
        assert set(kinds[1:]) <= {"status-update", "artifact-update"}
        assert last["kind"] == "status-update"
        assert last["final"] is True
        assert last["status"]["state"] == "completed"
        listed = (await rpc(url, "tasks/list", {"status": "completed"})).json()["result"]
        assert [(t["kind"], t["id"]) for t in listed["tasks"]] == [("task", sent["id"])]
        assert (await rpc(url, "tasks/list", {"status": "working"})).json()["result"]["tasks"] == []
        error = (await rpc(url, "tasks/cancel", {"id": sent["id"]})).json()["error"]
        assert error["code"] == -32002


async def test_a_call_waiting_in_a_child_run_is_answered_through_the_root_task() -> None:
    """A sub-agent's tool waits for approval: the root task is input-required, its
    status names the child's call (``runId``), and a message to the root answers it."""

    @ta.function_tool(needs_approval=True)
    async def launch() -> str:
        """Launch, once approved."""
        return "launched"

    child = ta.Agent(
        name="child",
        instructions="test",
        model=ScriptedModel([Turn(tool_calls=[("launch", {})]), Turn(text="child done")]),
        tools=[launch],
    )
    root = ta.Agent(
        name="root",
        instructions="test",
        model=ScriptedModel(
            [Turn(tool_calls=[("child", {"input": "go"})]), Turn(text="root done")]
        ),
        tools=[child.as_tool()],
    )
    async with serving({"root": root}) as (_host, url):
        answer = await rpc(url, "SendMessage", {"message": text_message("delegate")})
        waiting = answer.json()["result"]["task"]
        assert waiting["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        (call,) = waiting["status"]["message"]["parts"][1]["data"]["waiting"]
        assert call["runId"] != waiting["id"]
        message = {
            "messageId": "m2",
            "role": "ROLE_USER",
            "taskId": waiting["id"],
            "parts": [{"text": "approve"}],
        }
        done = (await rpc(url, "SendMessage", {"message": message})).json()["result"]["task"]
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    assert done["artifacts"][-1]["parts"][0]["text"] == "root done"


def _nested_launcher() -> ta.Agent:
    """``root`` delegates to ``mid``, which delegates to ``leaf``, whose ``launch``
    (target "moon") needs approval: the call waits two runs below the root task."""

    @ta.function_tool(needs_approval=True)
    async def launch(target: str) -> str:
        """Launch towards ``target``, once approved."""
        return f"launched to {target}"

    leaf = ta.Agent(
        name="leaf",
        instructions="test",
        model=ScriptedModel(
            [Turn(tool_calls=[("launch", {"target": "moon"})]), Turn(text="leaf done")]
        ),
        tools=[launch],
    )
    mid = ta.Agent(
        name="mid",
        instructions="test",
        model=ScriptedModel([Turn(tool_calls=[("leaf", {"input": "go"})]), Turn(text="mid done")]),
        tools=[leaf.as_tool()],
    )
    return ta.Agent(
        name="root",
        instructions="test",
        model=ScriptedModel([Turn(tool_calls=[("mid", {"input": "go"})]), Turn(text="root done")]),
        tools=[mid.as_tool()],
    )


def _waiting(task: dict[str, Any]) -> list[dict[str, Any]]:
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", task["status"]
    calls: list[dict[str, Any]] = task["status"]["message"]["parts"][1]["data"]["waiting"]
    return calls


async def test_a_call_waiting_in_a_sub_agent_is_named_with_its_arguments() -> None:
    """The approver of a root task waiting on a grandchild's call sees what it approves:
    the call's tool name and arguments, in SendMessage's answer, GetTask, ListTasks and
    a stream's first task alike — never a blind ``"?"``."""
    async with serving({"root": _nested_launcher()}) as (host, url):
        sent = (await rpc(url, "SendMessage", {"message": text_message("go")})).json()
        task = sent["result"]["task"]
        got = (await rpc(url, "GetTask", {"id": task["id"]})).json()["result"]
        listed = (await rpc(url, "ListTasks", {})).json()["result"]["tasks"]
        async with sse(url, "SubscribeToTask", {"id": task["id"]}) as stream:
            first = await stream.next()
        assert first is not None
        (root,) = await host.list("alice")
        (mid_id,) = root.children or ()
        (leaf_id,) = (await host.get("alice", mid_id)).children or ()
        for seen in (task, got, listed[0], first["result"]["task"]):
            (call,) = _waiting(seen)
            assert call["runId"] == leaf_id
            assert call["name"] == "launch"
            assert json.loads(call["arguments"]) == {"target": "moon"}
            assert "launch (" in seen["status"]["message"]["parts"][0]["text"]
        approve = {"decision": "approve", "callId": call["callId"], "runId": leaf_id}
        message = {"messageId": "m2", "role": "ROLE_USER", "taskId": task["id"]}
        done = await rpc(url, "SendMessage", {"message": {**message, "parts": [{"data": approve}]}})
    assert done.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"


@pytest.mark.parametrize("agents", ["own call", "sub-agent's call"])
async def test_list_tasks_and_get_task_give_the_same_task(agents: str) -> None:
    """ListTasks and GetTask build a task from the same record: the same status (the
    calls waiting, named; the timestamp), the same seq, the same artifacts."""
    agent = approver() if agents == "own call" else _nested_launcher()
    async with serving({agent.name: agent}) as (_host, url):
        task = (await rpc(url, "SendMessage", {"message": text_message("go")})).json()["result"][
            "task"
        ]
        got = (await rpc(url, "GetTask", {"id": task["id"], "historyLength": 0})).json()["result"]
        listed = (
            await rpc(url, "ListTasks", {"includeArtifacts": True, "historyLength": 0})
        ).json()["result"]
        waiting = (await rpc(url, "ListTasks", {"status": "TASK_STATE_INPUT_REQUIRED"})).json()[
            "result"
        ]
    assert listed["tasks"] == [got]
    assert got["metadata"]["seq"] == task["metadata"]["seq"] > 0
    assert got["status"] == task["status"]
    assert all(call["name"] != "?" for call in _waiting(got))
    (only,) = waiting["tasks"]
    assert (only["status"], only["metadata"]) == (got["status"], got["metadata"])


class _Watched:
    """A host proxy that tells when a status-only subscription (a blocking
    SendMessage's wait) opens and closes."""

    def __init__(self, host: LocalHost) -> None:
        self._host = host
        self.opened = trio.Event()
        self.closed = trio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)

    @asynccontextmanager
    async def events(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async with self._host.events(*args, **kwargs) as events:
            watched = kwargs.get("status_only", False)
            if watched:
                self.opened.set()
            try:
                yield events
            finally:
                if watched:
                    self.closed.set()


async def test_a_blocking_send_message_stops_waiting_when_its_client_goes_away() -> None:
    """The client of a blocking SendMessage hangs up while the run works: the handler
    stops waiting (its subscription closes), the run goes on."""
    gate = trio.Event()
    proxies: list[_Watched] = []

    def wrap(host: LocalHost) -> RunHost:
        proxies.append(_Watched(host))
        return cast(RunHost, proxies[0])

    async with serving({"h": _holder(gate)}, wrap=wrap) as (host, url):
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "SendMessage",
                "params": {"message": text_message("go")},
            }
        )
        head = (
            f"POST /a2a HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer tok-alice\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all((head + body).encode())
            await proxies[0].opened.wait()  # the handler waits for the run
        with trio.fail_after(10):  # a hang guard: it closes at once
            await proxies[0].closed.wait()
        (info,) = await host.list("alice")
        assert not info.status.is_terminal  # the run goes on
        gate.set()
        assert str((await host.wait_terminal("alice", info.run_id)).status) == "completed"


async def test_a_busy_context_is_a_server_error_carrying_session_busy() -> None:
    """A second task in a context (session) whose run is still working: the host's
    ``session_busy``, which A2A has no code for — -32000, the §10 code in ErrorInfo."""
    gate = trio.Event()
    async with serving({"h": _holder(gate)}) as (_host, url):
        task = await _start(url)
        busy = {"message": text_message("again", contextId=task["contextId"])}
        error = _error(await rpc(url, "SendMessage", busy))
        assert error["code"] == -32000
        assert error["data"][0]["metadata"] == {"code": "session_busy"}
        gate.set()
