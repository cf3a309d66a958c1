"""The A2A face driven by the official ``a2a-sdk`` client (1.0 over JSON-RPC): start,
stream, cancel, re-subscribe — the client is what proves we speak the protocol."""

from __future__ import annotations

from typing import Any

import httpx
import trio
from a2a.compat.v0_3.jsonrpc_transport import CompatJsonRpcTransport
from a2a.helpers.proto_helpers import get_artifact_text, new_data_part, new_text_message
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)

import trio_agents as ta
from tests.support.a2a_support import ALICE, approver, in_asyncio, sdk_client, send_all, serving
from trio_agents.models import ScriptedModel, Turn


def _talker() -> ta.Agent:
    return ta.Agent(
        name="t", instructions="test", model=ScriptedModel([], default=Turn(text="one two three"))
    )


async def test_send_message_blocking_answers_the_completed_task() -> None:
    async with serving({"t": _talker()}) as (_host, url):

        async def main() -> Any:
            async with sdk_client(url, streaming=False) as client:
                task = (await send_all(client, "hi"))[-1].task
                got = await client.get_task(GetTaskRequest(id=task.id))
                listed = await client.list_tasks(ListTasksRequest())
                return task, got, listed

        task, got, listed = await in_asyncio(main)
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_artifact_text(task.artifacts[-1]) == "one two three"
    assert got.id == task.id
    assert got.context_id == task.context_id
    assert got.status.state == TaskState.TASK_STATE_COMPLETED
    assert [t.id for t in listed.tasks] == [task.id]


def _stepper(gate: trio.Event) -> ta.Agent:
    """Says "before ", then waits in a tool until ``gate`` is set, then says "after"."""

    @ta.function_tool
    async def hold() -> str:
        """Wait for the test."""
        await gate.wait()
        return "held"

    script = [Turn(text="before ", tool_calls=[("hold", {})]), Turn(text="after")]
    return ta.Agent(name="s", instructions="test", model=ScriptedModel(script), tools=[hold])


def _seq(metadata: Any) -> int:
    return int(metadata["seq"])


def _event_seq(event: Any) -> int:
    if event.HasField("task"):
        return _seq(event.task.metadata)
    if event.HasField("status_update"):
        return _seq(event.status_update.metadata)
    return _seq(event.artifact_update.metadata)


async def test_stream_then_resubscribe_mid_run_drops_nothing() -> None:
    """A streaming client leaves mid-run; re-subscribing gives the task as of seq S,
    then every event S+1.. to the terminal one: no gap, no duplicate, the whole text."""
    gate = trio.Event()
    async with serving({"s": _stepper(gate)}) as (_host, url):

        async def main() -> Any:
            async with sdk_client(url) as client:
                first: list[Any] = []
                async for event in client.send_message(
                    SendMessageRequest(message=new_text_message("go"))
                ):
                    first.append(event)
                    if event.HasField("status_update") and (
                        event.status_update.metadata["type"] == "tool.started"
                    ):
                        break  # the client goes away mid-run
                task_id = first[0].task.id
                second: list[Any] = []
                async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
                    second.append(event)
                    if len(second) == 1:
                        trio.from_thread.run_sync(gate.set)  # the run may go on now
                final = await client.get_task(GetTaskRequest(id=task_id))
                return first, second, final

        first, second, final = await in_asyncio(main)
    assert first[0].HasField("task")
    first_seqs = [_event_seq(e) for e in first[1:]]
    assert first_seqs == sorted(set(first_seqs))
    snapshot = second[0].task
    assert second[0].HasField("task")
    assert _seq(snapshot.metadata) >= first_seqs[-1]
    assert get_artifact_text(snapshot.artifacts[0]) == "before "
    later = [_event_seq(e) for e in second[1:]]
    assert later == list(range(_seq(snapshot.metadata) + 1, later[-1] + 1))
    assert second[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert final.status.state == TaskState.TASK_STATE_COMPLETED
    assert [get_artifact_text(a) for a in final.artifacts] == ["before ", "after"]


async def test_cancel_task_answers_the_canceled_task_with_its_reason() -> None:
    gate = trio.Event()  # never set: the run waits in its tool until cancelled
    async with serving({"s": _stepper(gate)}) as (host, url):

        async def main() -> Any:
            async with sdk_client(url) as client:
                async for event in client.send_message(
                    SendMessageRequest(message=new_text_message("go"))
                ):
                    if event.HasField("status_update") and (
                        event.status_update.metadata["type"] == "tool.started"
                    ):
                        task_id = event.status_update.task_id
                        break
                request = CancelTaskRequest(id=task_id)
                request.metadata["reason"] = "user pressed stop"
                return await client.cancel_task(request)

        task = await in_asyncio(main)
        info = await host.get("alice", task.id)
    assert task.status.state == TaskState.TASK_STATE_CANCELED
    assert task.status.message.parts[0].text == "user pressed stop"
    assert str(info.status) == "cancelled"
    assert info.reason == "user pressed stop"


async def test_approval_is_input_required_answered_by_a_message() -> None:
    async with serving({"a": approver()}) as (_host, url):

        async def main() -> Any:
            async with sdk_client(url, streaming=False) as client:
                waiting = (await send_all(client, "launch it"))[-1].task
                answer = new_text_message("", task_id=waiting.id, context_id=waiting.context_id)
                del answer.parts[:]
                answer.parts.append(new_data_part({"decision": "approve"}))
                done = (await send_all(client, answer))[-1].task
                return waiting, done

        waiting, done = await in_asyncio(main)
    assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    calls = waiting.status.message.parts[1].data.struct_value["waiting"]
    assert [c["name"] for c in calls] == ["launch"]
    assert done.id == waiting.id
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_artifact_text(done.artifacts[-1]) == "done"


async def test_the_sdk_0_3_transport_sends_03_names_and_reads_03_shapes() -> None:
    """The SDK's own 0.3 client (``message/send``, ``tasks/get``, ``message/stream``,
    ``tasks/resubscribe``, ``tasks/cancel``, with 0.3's objects) against the same face."""
    gate = trio.Event()
    async with serving({"t": _talker(), "s": _stepper(gate)}) as (_host, url):

        async def main() -> Any:
            async with httpx.AsyncClient(headers=ALICE, timeout=30) as http:
                transport = CompatJsonRpcTransport(http, None, f"{url}/a2a", is_shared_httpx=True)
                request = SendMessageRequest(message=new_text_message("hi"))
                request.metadata["agent"] = "t"
                sent = (await transport.send_message(request)).task
                got = await transport.get_task(GetTaskRequest(id=sent.id))
                request = SendMessageRequest(message=new_text_message("go"))
                request.metadata["agent"] = "s"
                async for event in transport.send_message_streaming(request):
                    if event.HasField("status_update") and (
                        event.status_update.metadata["type"] == "tool.started"
                    ):
                        task_id = event.status_update.task_id
                        break
                async for event in transport.subscribe(SubscribeToTaskRequest(id=task_id)):
                    resubscribed = event
                    break
                canceled = await transport.cancel_task(CancelTaskRequest(id=task_id))
                return sent, got, resubscribed, canceled

        sent, got, resubscribed, canceled = await in_asyncio(main)
    assert sent.status.state == TaskState.TASK_STATE_COMPLETED
    assert get_artifact_text(sent.artifacts[-1]) == "one two three"
    assert got.id == sent.id
    assert got.status.state == TaskState.TASK_STATE_COMPLETED
    assert resubscribed.task.status.state == TaskState.TASK_STATE_WORKING
    assert canceled.status.state == TaskState.TASK_STATE_CANCELED


def _delegating_launcher() -> ta.Agent:
    """``root`` delegates to ``child``, whose ``launch`` (target "moon") needs approval."""

    @ta.function_tool(needs_approval=True)
    async def launch(target: str) -> str:
        """Launch towards ``target``, once approved."""
        return f"launched to {target}"

    child = ta.Agent(
        name="child",
        instructions="test",
        model=ScriptedModel([Turn(tool_calls=[("launch", {"target": "moon"})]), Turn(text="ok")]),
        tools=[launch],
    )
    return ta.Agent(
        name="root",
        instructions="test",
        model=ScriptedModel([Turn(tool_calls=[("child", {"input": "go"})]), Turn(text="done")]),
        tools=[child.as_tool()],
    )


async def test_a_sub_agents_waiting_call_is_named_and_listed_as_got() -> None:
    """Through the SDK's client: the root task waiting on a sub-agent's call names the
    call and its arguments, and ListTasks gives the task exactly as GetTask does."""
    async with serving({"root": _delegating_launcher()}) as (_host, url):

        async def main() -> Any:
            async with sdk_client(url, streaming=False) as client:
                waiting = (await send_all(client, "go"))[-1].task
                got = await client.get_task(GetTaskRequest(id=waiting.id, history_length=0))
                listed = await client.list_tasks(
                    ListTasksRequest(include_artifacts=True, history_length=0)
                )
                return waiting, got, listed

        waiting, got, listed = await in_asyncio(main)
    assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    (call,) = waiting.status.message.parts[1].data.struct_value["waiting"]
    assert (call["name"], call["arguments"]) == ("launch", '{"target": "moon"}')
    assert call["runId"] != waiting.id
    assert list(listed.tasks) == [got]
    assert got.status == waiting.status
