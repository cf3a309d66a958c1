"""The AG-UI face on every node of a cluster (issue 27 item 5): two nodes on one
PostgreSQL database, each serving the HTTP faces over its own ``ClusterHost``. An AG-UI
run started on node A that stops for an approval is resumed on node B (the approval is
routed to A, the stream follows the run from the cluster's log), and a client of B that
goes away cancels the run A runs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import httpx
import trio

from tests.support import agui_support as agui
from tests.support.cluster_support import Node, node
from trio_agents.faces import HttpApp, http_app, serve_http
from trio_agents.models import Turn


@asynccontextmanager
async def _http(
    nursery: trio.Nursery, the_node: Node
) -> AsyncIterator[tuple[HttpApp, httpx.AsyncClient]]:
    """The node's HTTP faces (over its ``ClusterHost``) on a free port, and a client."""
    app = http_app(the_node.server.host, auth=agui.AUTH)
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


@attrs.frozen
class _Nodes:
    a: Node
    b: Node
    client_a: httpx.AsyncClient
    client_b: httpx.AsyncClient
    app_b: HttpApp


@asynccontextmanager
async def _two_nodes(pg_dsn: str) -> AsyncIterator[_Nodes]:
    """Nodes A and B on one database, each serving the ``ops`` agent (an approval, then
    the gated tool) over its HTTP faces; a hang guard around it all."""
    turns = [
        Turn(text="checking", tool_calls=[("launch", {})]),
        Turn(tool_calls=[("gated", {})]),
        "done",
    ]
    agents = {"ops": agui.scripted("ops", turns, agui.launch, agui.gated)}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            async with (
                node(nursery, agents, pg_dsn, "A") as a,
                node(nursery, agents, pg_dsn, "B") as b,
                _http(nursery, a) as (_, client_a),
                _http(nursery, b) as (app_b, client_b),
            ):
                yield _Nodes(a, b, client_a, client_b, app_b)
            nursery.cancel_scope.cancel()


async def test_an_agui_run_started_on_one_node_is_resumed_on_another(pg_dsn: str) -> None:
    gate = agui.new_gate()
    async with _two_nodes(pg_dsn) as nodes:
        first, interrupt = await agui.until_interrupt(nodes.client_a, "ops")
        run_id = agui.ours(first[0])["run_id"]
        gate.set()
        async with agui.agui_stream(nodes.client_b, "ops", agui.approve(interrupt)) as stream:
            second = await stream.rest()
        agui.check_order(second)
        assert second[-1]["outcome"] == {"type": "success"}, second[-1]
        results = [e["content"] for e in second if e["type"] == "TOOL_CALL_RESULT"]
        assert results == ["launched", "through"]
        text = "".join(e["delta"] for e in second if e["type"] == "TEXT_MESSAGE_CONTENT")
        assert text == "done"
        # Nothing of the first AG-UI run is sent again.
        assert "checking" not in text
        info = await nodes.b.server.host.wait_terminal("alice", run_id)
        assert info.status == "completed"


async def test_a_client_of_another_node_that_goes_away_cancels_the_run(pg_dsn: str) -> None:
    agui.new_gate()  # never opened: the run waits in the agui.gated tool until cancelled
    async with _two_nodes(pg_dsn) as nodes:
        first, interrupt = await agui.until_interrupt(nodes.client_a, "ops")
        run_id = agui.ours(first[0])["run_id"]
        async with agui.agui_stream(nodes.client_b, "ops", agui.approve(interrupt)) as stream:
            await stream.until("TOOL_CALL_START", toolCallName="gated")
        # Gone: node B applies on_disconnect (cancel), routed to node A.
        await agui.wait_streams_closed(nodes.app_b)
        info = await nodes.a.server.host.wait_terminal("alice", run_id)
        assert (info.status, info.reason) == ("cancelled", "client disconnected")
