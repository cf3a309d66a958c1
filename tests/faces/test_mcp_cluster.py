"""The MCP face over a PostgreSQL cluster node's host (issue 40: "on the cluster ... like
every face"): ``/mcp`` served by node B with :func:`trio_agents.hosting.serve` and
``HttpFaces(faces=("mcp",))``, its runs all placed on node A (B is full: a run of
another principal fills its one slot), so every call's run is owned by A and every op
on it is routed there. The official ``mcp`` client drives it: a call answered, and a
cancel of a call whose run A runs ends that run cancelled with the face's reason, the
repair in the session (what the next call on it is sent).

Both nodes in this process on the suite's PostgreSQL; ``trio.fail_after`` is a hang
guard only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx2
import mcp.types as types
import pytest
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

import trio_agents as ta
from tests.support.http_support import TOKENS
from tests.support.mcp_face_app import agents
from trio_agents.cluster import PostgresCluster
from trio_agents.control import Limits
from trio_agents.faces import HttpFaces
from trio_agents.hosting import Origin, RunHost, StartRequest, serve
from trio_agents.models import ScriptedModel, Turn

CANCEL_REASON = "mcp client cancelled"  # docs/mcp.md
HANG_GUARD = 90.0
_LIMITS = Limits(ping_interval=None, shutdown_timeout=10.0)

# As in test_mcp_http.py: the SDK's httpx2 transport leaves response-body generators to
# the collector; only that warning, only from httpx2/httpcore2.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)2\.[^']*' was garbage collected:ResourceWarning"
)


@ta.function_tool
async def hold() -> str:
    """Hold the node's one slot."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def _filler() -> ta.Agent:
    model = ScriptedModel([], default=Turn(tool_calls=[("hold", {})]))
    return ta.Agent(name="filler", instructions="test", model=model, tools=[hold])


@attrs.frozen
class Nodes:
    a: RunHost
    b: RunHost
    b_cluster: PostgresCluster
    url: str


async def _until(host: RunHost, principal: str, run_id: str, status: str) -> None:
    async with host.events(principal, run_id, status_only=True) as updates:
        async for hosted in updates:
            if hosted.event.get("status") == status:
                return
    raise AssertionError(f"{run_id} never reached {status}")


@asynccontextmanager
async def _two_nodes(dsn: str, served: Mapping[str, ta.Agent]) -> AsyncIterator[Nodes]:
    """Node A runs runs; node B serves ``/mcp`` and is full (its one slot held by
    carol's filler), so each MCP call's run is placed on A."""
    a = PostgresCluster(dsn, node_id="A", lease_ttl=5.0).host(served, limits=_LIMITS)
    b_cluster = PostgresCluster(dsn, node_id="B", lease_ttl=5.0, max_runs=1)
    b = b_cluster.host(served, limits=_LIMITS)
    with trio.fail_after(HANG_GUARD):
        async with a.running(), trio.open_nursery() as nursery:
            (port,) = await nursery.start(serve, b, [HttpFaces(auth=TOKENS, faces=("mcp",))])
            filler = await b.start(
                Origin(principal="carol"),
                StartRequest(agent="filler", input=(ta.UserMessage("hold"),)),
            )
            await _until(b, "carol", filler, "running")
            yield Nodes(a, b, b_cluster, f"http://127.0.0.1:{port}")
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def _mcp_client(url: str, mode: str) -> AsyncIterator[Client]:
    headers = httpx2.Headers({"Authorization": "Bearer tok-alice"})
    timeout = httpx2.Timeout(30, read=None)
    async with (
        httpx2.AsyncClient(headers=headers, timeout=timeout) as http,
        Client(streamable_http_client(url + "/mcp", http_client=http), mode=mode) as mcp,
    ):
        yield mcp


def _text(result: types.CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    return block.text


async def _cancel_once_blocked(mcp: Client) -> None:
    """Call the blocker on session s1; cancel the call once its tool runs (on A)."""
    with trio.CancelScope() as scope:

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            if message == "tool wait_forever started":
                scope.cancel()

        await mcp.call_tool(
            "blocker", {"input": "go", "session_id": "s1"}, progress_callback=progress
        )
    assert scope.cancelled_caught


# "legacy": the handshake era, whose cancel is notifications/cancelled; "auto" (the
# client's default, 2026-07-28): a call's cancel closes its HTTP stream.
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_mcp_on_a_cluster_node_answers_and_cancels_runs_another_node_owns(
    pg_dsn: str, mode: str
) -> None:
    served: dict[str, Any] = {**agents(), "filler": _filler()}
    async with _two_nodes(pg_dsn, served) as nodes, _mcp_client(nodes.url, mode) as mcp:
        tools = {tool.name for tool in (await mcp.list_tools()).tools}
        assert {"echo", "blocker", "history"} <= tools
        answered = await mcp.call_tool("echo", {"input": "hi"})
        assert not answered.is_error
        assert _text(answered) == "hello from echo"

        await _cancel_once_blocked(mcp)
        (blocked,) = [run for run in await nodes.b.list("alice") if run.agent == "blocker"]
        info = await nodes.b.wait_terminal("alice", blocked.run_id)
        assert (info.status.value, info.reason) == ("cancelled", CANCEL_REASON)
        # A, which ran it, says the same.
        on_a = await nodes.a.get("alice", blocked.run_id)
        assert (on_a.status.value, on_a.reason) == ("cancelled", CANCEL_REASON)
        # The session holds the repaired conversation (what the next run is sent).
        seen = await mcp.call_tool("history", {"input": "and now?", "session_id": "s1"})
        assert json.loads(_text(seen)) == [
            "user:go",
            "assistant:completed",
            "call:wait_forever",
            f"result:cancelled:cancelled: {CANCEL_REASON}",
            "user:and now?",
        ]
        # Every run of the calls ran on A, the cancel routed there: B owns the filler only.
        statistics = nodes.b_cluster.statistics()
        assert statistics.owned_runs == 1
        assert statistics.routed > 0
