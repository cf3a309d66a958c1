"""``trio-agents mcp --app ...`` over stdio, driven by the official ``mcp`` client
under Trio (as a desktop client starts it: a child process, JSON-RPC on its stdin and
stdout): tools, answers, structured output, isError, cancel with the repair in the
session, progress, elicitation, and the client closing the pipe mid-call with each
``--on-disconnect``.

What the runs left in the session is read back by the ``history`` agent, whose model
answers with the conversation it is sent (the process's host is not reachable from
here; its SQLite file is, through a second call or a second process)."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import mcp.types as types
import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.support.cli_support import ROOT, cli, cli_argv, cli_env, cli_process
from tests.support.mcp_face_app import agents

APP = "tests.support.mcp_face_app:AGENTS"
CANCEL_REASON = "mcp client cancelled"  # docs/mcp.md


@asynccontextmanager
async def stdio_mcp(
    db: Path, *extra: str, mode: str = "auto", **options: Any
) -> AsyncIterator[Client]:
    command, *args = cli_argv("mcp", "--app", APP, "--db", db, *extra)
    params = StdioServerParameters(command=command, args=args, env=cli_env(), cwd=str(ROOT))
    async with Client(params, mode=mode, **options) as mcp:
        yield mcp


def text_of(result: types.CallToolResult) -> str:
    (block,) = result.content
    assert isinstance(block, types.TextContent)
    return block.text


async def history(db: Path, session_id: str) -> list[str]:
    async with stdio_mcp(db) as mcp:
        seen = await mcp.call_tool("history", {"input": "and now?", "session_id": session_id})
    words: list[str] = json.loads(text_of(seen))
    return words


async def test_tools_answers_structured_output_and_errors(tmp_path: Path) -> None:
    async with stdio_mcp(tmp_path / "s.db") as mcp:
        tools = {tool.name: tool for tool in (await mcp.list_tools()).tools}
        echo = await mcp.call_tool("echo", {"input": "hi"})
        point = await mcp.call_tool("point", {"input": "where?"})
        broken = await mcp.call_tool("broken", {"input": "hi"})
    assert set(tools) == set(agents())
    assert tools["point"].output_schema is not None
    assert (text_of(echo), echo.is_error) == ("hello from echo", False)
    assert point.structured_content == {"x": 1, "y": 2}
    assert broken.is_error
    assert "the model is down" in text_of(broken)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_cancel_stops_the_run_and_the_session_holds_the_repair(
    tmp_path: Path, mode: str
) -> None:
    db = tmp_path / "s.db"
    seen: list[str] = []
    async with stdio_mcp(db, mode=mode) as mcp:
        with trio.CancelScope() as scope:

            async def progress(progress: float, total: float | None, message: str | None) -> None:
                seen.append(message or "")
                if message == "tool wait_forever started":
                    scope.cancel()

            await mcp.call_tool(
                "blocker", {"input": "go", "session_id": "s1"}, progress_callback=progress
            )
        # The same process goes on serving; the session is free again once the
        # cancelled run's repair is written (a busy session would refuse this call).
        after = await mcp.call_tool("history", {"input": "and now?", "session_id": "s1"})
    assert seen[:2] == ["queued", "running"]
    assert "thinking it over" in seen
    assert json.loads(text_of(after)) == [
        "user:go",
        "assistant:completed",
        "call:wait_forever",
        f"result:cancelled:cancelled: {CANCEL_REASON}",
        "user:and now?",
    ]


async def test_elicitation_over_stdio(tmp_path: Path) -> None:
    async def elicitation(_context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="decline")

    async with stdio_mcp(tmp_path / "s.db", mode="legacy", elicitation_callback=elicitation) as mcp:
        result = await mcp.call_tool("deployer", {"input": "ship it", "session_id": "d"})
    assert text_of(result) == "done"
    words = await history(tmp_path / "s.db", "d")
    assert words[1:3] == ["call:deploy", "result:error:rejected: declined by the user"]


@pytest.mark.parametrize(
    ("on_disconnect", "reason"),
    [("cancel", "client disconnected"), ("continue", "server shutdown")],
)
async def test_the_pipe_closed_mid_call_follows_on_disconnect(
    tmp_path: Path, on_disconnect: str, reason: str
) -> None:
    """The client leaves mid-call: with ``cancel`` the run is cancelled as its
    client's; with ``continue`` it runs on until the process exits (stdin closed),
    which cancels it as every server shutdown does. Either way the session holds the
    repair, with the reason."""
    db = tmp_path / "s.db"

    class ClientGone(Exception):
        pass

    with pytest.RaisesGroup(ClientGone, flatten_subgroups=True):
        async with (
            stdio_mcp(db, "--on-disconnect", on_disconnect, mode="legacy") as mcp,
            trio.open_nursery() as nursery,
        ):
            blocked = trio.Event()

            async def progress(progress: float, total: float | None, message: str | None) -> None:
                if message == "tool wait_forever started":
                    blocked.set()

            async def call() -> None:
                await mcp.call_tool(
                    "blocker", {"input": "go", "session_id": "s1"}, progress_callback=progress
                )

            nursery.start_soon(call)
            await blocked.wait()
            raise ClientGone
    words = await history(db, "s1")
    assert words[3] in (
        f"result:cancelled:cancelled: {reason}",
        f"result:cancelled:cancelled: {CANCEL_REASON}",
    )


def test_mcp_needs_an_app() -> None:
    done = cli("mcp")
    assert done.returncode == 2
    assert "--app" in done.stderr


# The SDK's HTTP transport leaves httpx2's body generators to the garbage collector,
# which Trio warns about (as in test_mcp_http.py): only those warnings.
@pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)2\.[^']*' was garbage collected:ResourceWarning"
)
async def test_trio_agents_serve_answers_mcp_on_its_http_port(tmp_path: Path) -> None:
    """The face is registered: ``trio-agents serve`` answers MCP at ``/mcp``."""
    args: list[str | os.PathLike[str]] = ["serve", "--port", "0", "--token", "tok"]
    args += ["--app", APP, "--db", tmp_path / "s.db"]
    async with cli_process(*args) as running:
        line = await running.stdout.until(lambda text: text.startswith("http: http://"))
        base = line.split()[1].rstrip("/")
        headers = {"Authorization": "Bearer tok"}
        async with httpx2.AsyncClient(
            headers=headers, timeout=httpx2.Timeout(30, read=None)
        ) as http:
            transport = streamable_http_client(f"{base}/mcp", http_client=http)
            async with Client(transport) as mcp:
                result = await mcp.call_tool("echo", {"input": "hi"})
        running.process.terminate()
    assert text_of(result) == "hello from echo"
