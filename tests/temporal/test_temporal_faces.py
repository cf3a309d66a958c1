"""Every face over the TemporalHost: the websocket channel, REST + SSE (Last-Event-ID,
tree streams: what the web UI reads), A2A and AG-UI, served by ``hosting.serve`` over
runs that run on real worker processes of a real Temporal dev server."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import httpx
import httpx2
import mcp.types as mcp_types
import pytest
import trio
from mcp import Client as McpClient
from mcp.client.streamable_http import streamable_http_client

from tests.support.a2a_support import rpc, text_message
from tests.support.http_support import TOKENS, bearer, messages
from tests.support.temporal_app import AGENTS
from tests.support.temporal_support import Workers
from trio_agents.control import WebsocketFace, connect
from trio_agents.faces import HttpFaces
from trio_agents.hosting import Limits, ServedFace, open_server
from trio_agents.temporal import RunStore, TemporalHost

BOUND = 90.0
# Leaving an SSE stream mid-way abandons httpx's nested body generators (CONVENTIONS,
# "httpx aiter_lines()"): exactly those warnings, nothing else.
# (httpx2/httpcore2 likewise: the MCP client's transport.)
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)2?\.[^']*' was garbage collected:ResourceWarning"
)
V1 = {"A2A-Version": "1.0", **bearer("tok-alice")}


def _host(group: Workers) -> TemporalHost:
    return TemporalHost(
        group.target,
        AGENTS,
        store=RunStore.beside(group.db),
        task_queue=group.task_queue,
        limits=Limits(ping_interval=None),
        poll_interval=0.01,
    )


async def _status(http: httpx.AsyncClient, run_id: str, status: str) -> dict[str, Any]:
    """``GET /runs/{id}`` until the run has ``status`` (cross-process: polled)."""
    while True:
        answer = await http.get(f"/runs/{run_id}")
        assert answer.status_code == 200, answer.text
        run: dict[str, Any] = answer.json()["run"]
        if run["status"] == status:
            return run
        await trio.sleep(0.02)


async def _sse_until(http: httpx.AsyncClient, path: str, kind: str, **headers: str) -> list[Any]:
    """The SSE messages of ``path`` up to the first event of type ``kind``."""
    seen = []
    async with (
        http.stream("GET", path, headers=headers) as response,
        aclosing(messages(response)) as stream,
    ):
        assert response.status_code == 200
        async for message in stream:
            seen.append(message)
            if message.data["event"]["type"] == kind:
                break
    return seen


async def test_rest_sse_and_the_websocket_over_the_temporal_host(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(2)
    faces: list[ServedFace] = [WebsocketFace(auth=TOKENS), HttpFaces(auth=TOKENS)]
    with trio.fail_after(BOUND):
        async with open_server(_host(group), faces) as (ws_port, http_port):
            base = f"http://127.0.0.1:{http_port}"
            async with httpx.AsyncClient(
                base_url=base, headers=bearer("tok-alice"), timeout=BOUND
            ) as http:
                started = await http.post(
                    "/runs", json={"agent": "rules", "input": "block", "session_id": "s"}
                )
                assert started.status_code == 201, started.text
                run_id = started.json()["run_id"]
                seen = await _sse_until(http, f"/runs/{run_id}/events", "tool.started")
                # A client that reconnects with Last-Event-ID goes on where it was, even
                # after the worker running the run died and another resumed it.
                last = seen[-1].id
                pid = int((group.marks / f"{run_id}.started").read_text())
                os.kill(pid, signal.SIGKILL)
                rest = await _sse_until(
                    http, f"/runs/{run_id}/events", "run.updated", **{"Last-Event-ID": last}
                )
                assert rest[0].data["event"]["seq"] == seen[-1].data["event"]["seq"] + 1
                done = await _status(http, run_id, "completed")
                assert done["seq"] > seen[-1].data["event"]["seq"]
                # Another principal sees nothing of it.
                other = await http.get(f"/runs/{run_id}", headers=bearer("tok-bob"))
                assert other.status_code == 404

                blocked = await http.post("/runs", json={"agent": "rules", "input": "block"})
                blocked_id = blocked.json()["run_id"]
                await _sse_until(http, f"/runs/{blocked_id}/events", "tool.started")
                async with connect(f"ws://127.0.0.1:{ws_port}/", token="tok-alice") as client:
                    remote = client.attach(blocked_id)
                    assert (await remote.get()).agent == "rules"
                    await remote.cancel("enough")
                run = await _status(http, blocked_id, "cancelled")
                assert run["reason"] == "enough"
                # The web UI's reads: every run of every tree, and a tree stream.
                listed = await http.get("/runs", params={"all": "1"})
                assert {run_id, blocked_id} <= {r["run_id"] for r in listed.json()["runs"]}
                tree = await _sse_until(http, f"/runs/{run_id}/events?tree=1", "run.updated")
                assert tree[0].data["event"]["run_id"] == run_id
                page = await http.get("/ui/")
                assert page.status_code == 200


async def test_a2a_and_agui_over_the_temporal_host(workers: Callable[[int], Workers]) -> None:
    group = workers(1)
    faces: list[ServedFace] = [HttpFaces(auth=TOKENS)]
    with trio.fail_after(BOUND):
        async with open_server(_host(group), faces) as (http_port,):
            base = f"http://127.0.0.1:{http_port}"
            sent = await rpc(
                base,
                "SendMessage",
                {
                    "message": text_message("hello"),
                    "configuration": {"blocking": True},
                    "metadata": {"agent": "rules"},  # the app serves several agents
                },
                headers=V1,
            )
            assert sent.status_code == 200, sent.text
            task = sent.json()["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
            assert "echo: hello" in json.dumps(task)
            listed = await rpc(base, "ListTasks", {}, headers=V1)
            assert task["id"] in [t["id"] for t in listed.json()["result"]["tasks"]]

            async with httpx.AsyncClient(
                base_url=base, headers=bearer("tok-alice"), timeout=BOUND
            ) as http:
                blocked = await http.post("/runs", json={"agent": "rules", "input": "block"})
                blocked_id = blocked.json()["run_id"]
                await _sse_until(http, f"/runs/{blocked_id}/events", "tool.started")
                cancelled = await rpc(base, "CancelTask", {"id": blocked_id}, headers=V1)
                assert cancelled.status_code == 200, cancelled.text
                run = await _status(http, blocked_id, "cancelled")
                assert run["status"] == "cancelled"

                agui = await http.post(
                    "/ag-ui/rules",
                    json={
                        "threadId": "t1",
                        "runId": "r1",
                        "state": {},
                        "messages": [{"id": "m1", "role": "user", "content": "hi"}],
                        "tools": [],
                        "context": [],
                        "forwardedProps": {},
                    },
                )
                assert agui.status_code == 200, agui.text
                text = agui.text.replace(" ", "")
                assert '"type":"RUN_FINISHED"' in text
                assert "echo:hi" in text


async def test_the_mcp_face_over_the_temporal_host(workers: Callable[[int], Workers]) -> None:
    group = workers(1)
    host = _host(group)
    headers = httpx2.Headers({"Authorization": "Bearer tok-alice"})
    with trio.fail_after(BOUND):
        async with open_server(host, [HttpFaces(auth=TOKENS, faces=("mcp",))]) as (port,):
            url = f"http://127.0.0.1:{port}/mcp"
            async with (
                httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60, read=None)) as http,
                McpClient(streamable_http_client(url, http_client=http), mode="legacy") as mcp,
            ):
                answered = await mcp.call_tool("rules", {"input": "hello"})
                assert not answered.is_error
                (block,) = answered.content
                assert isinstance(block, mcp_types.TextContent)
                assert block.text == "echo: hello"
                # A cancelled call stops its run on the worker, with the face's reason.
                with trio.CancelScope() as scope:

                    async def progress(
                        progress: float, total: float | None, message: str | None
                    ) -> None:
                        if message == "tool block started":
                            scope.cancel()

                    await mcp.call_tool("rules", {"input": "block"}, progress_callback=progress)
                assert scope.cancelled_caught
                # (The client stays connected: its notice, not its going away, ends it.)
                runs = await host.list("alice")
                assert len(runs) == 2
                info = await host.wait_terminal("alice", runs[1].run_id)
                assert (info.status.value, info.reason) == ("cancelled", "mcp client cancelled")
