"""The AG-UI face on every node of a cluster (issue 27 item 5): two nodes on one
PostgreSQL database, each serving the HTTP faces over its own ``ClusterHost``. An AG-UI
run started on node A that stops for an approval is resumed on node B (the approval is
routed to A, the stream follows the run from the cluster's log), and a client of B that
goes away cancels the run A runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.agui_support import AUTH, agui_stream, check_order, run_input
from tests.support.cluster_support import Node, node
from trio_agents.faces import HttpApp, http_app, serve_http
from trio_agents.hosting import HostError
from trio_agents.models import ScriptedModel, Turn

GATE: trio.Event | None = None


@ta.function_tool(needs_approval=True)
async def launch() -> str:
    """Launch, once approved."""
    return "launched"


@ta.function_tool
async def gated() -> str:
    """Wait until the test opens the gate."""
    assert GATE is not None
    await GATE.wait()
    return "through"


@asynccontextmanager
async def _http(
    nursery: trio.Nursery, the_node: Node
) -> AsyncIterator[tuple[HttpApp, httpx.AsyncClient]]:
    """The node's HTTP faces (over its ``ClusterHost``) on a free port, and a client."""
    app = http_app(the_node.server.host, auth=AUTH)
    scope = trio.CancelScope()

    async def serve(task_status: trio.TaskStatus[int]) -> None:
        with scope:
            await serve_http(app, "127.0.0.1", 0, task_status=task_status)

    port = await nursery.start(serve)
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", timeout=httpx.Timeout(10.0, read=None)
        ) as client:
            yield app, client
    finally:
        scope.cancel()


def _agents() -> dict[str, ta.Agent]:
    model = ScriptedModel(
        [
            Turn(text="checking", tool_calls=[("launch", {})]),
            Turn(tool_calls=[("gated", {})]),
            "done",
        ]
    )
    return {"ops": ta.Agent(name="ops", instructions="test", model=model, tools=[launch, gated])}


def _resume(first: list[dict[str, Any]]) -> dict[str, Any]:
    (interrupt,) = first[-1]["outcome"]["interrupts"]
    body = run_input(run="ag-2")
    body["resume"] = [
        {"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}
    ]
    return body


async def test_an_agui_run_started_on_one_node_is_resumed_on_another(pg_dsn: str) -> None:
    global GATE
    GATE = trio.Event()
    agents = _agents()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            async with (
                node(nursery, agents, pg_dsn, "A") as a,
                node(nursery, agents, pg_dsn, "B") as b,
                _http(nursery, a) as (_, client_a),
                _http(nursery, b) as (_, client_b),
            ):
                async with agui_stream(client_a, "ops", run_input()) as stream:
                    first = await stream.rest()
                check_order(first)
                assert first[-1]["outcome"]["type"] == "interrupt"
                run_id = first[0]["metadata"]["trio-agents"]["run_id"]
                # The premise: node B cannot give the tree of a run node A runs.
                with pytest.raises(HostError) as refused:
                    async with b.server.host.events("alice", run_id, tree=True):
                        pass
                assert refused.value.code == "invalid_request"
                GATE.set()
                async with agui_stream(client_b, "ops", _resume(first)) as stream:
                    second = await stream.rest()
                check_order(second)
                assert second[-1]["outcome"] == {"type": "success"}, second[-1]
                results = [e["content"] for e in second if e["type"] == "TOOL_CALL_RESULT"]
                assert results == ["launched", "through"]
                text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
                assert text == "done"
                # Nothing of the first AG-UI run is sent again.
                assert "checking" not in text
                info = await b.server.host.wait_terminal("alice", run_id)
                assert info.status == "completed"
            nursery.cancel_scope.cancel()


async def test_a_client_of_another_node_that_goes_away_cancels_the_run(pg_dsn: str) -> None:
    global GATE
    GATE = trio.Event()
    agents = _agents()
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            async with (
                node(nursery, agents, pg_dsn, "A") as a,
                node(nursery, agents, pg_dsn, "B") as b,
                _http(nursery, a) as (_, client_a),
                _http(nursery, b) as (app_b, client_b),
            ):
                async with agui_stream(client_a, "ops", run_input()) as stream:
                    first = await stream.rest()
                run_id = first[0]["metadata"]["trio-agents"]["run_id"]
                async with agui_stream(client_b, "ops", _resume(first)) as stream:
                    await stream.until("TOOL_CALL_START", toolCallName="gated")
                # Gone: node B applies on_disconnect (cancel), routed to node A.
                while app_b.statistics().streams:
                    await trio.testing.wait_all_tasks_blocked()
                info = await a.server.host.wait_terminal("alice", run_id)
                assert (info.status, info.reason) == ("cancelled", "client disconnected")
            nursery.cancel_scope.cancel()
