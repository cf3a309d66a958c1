"""The client side of the MCP tests: the test server (tests/support/mcp_server.py) in a
subprocess over stdio or Streamable HTTP, opened with trio_agents.mcp."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp.types as mcp_types
import pytest
import trio

from trio_agents.mcp import MCPServerHTTP, MCPServerStdio

SERVER = str(Path(__file__).resolve().parent / "mcp_server.py")
HANG_GUARD = 30  # seconds: a broken test fails instead of hanging


@asynccontextmanager
async def http_server_process() -> AsyncIterator[str]:
    """The test server over Streamable HTTP in a subprocess; yields its URL."""
    process = await trio.lowlevel.open_process(
        [sys.executable, SERVER, "http"], stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        line = b""
        with trio.fail_after(HANG_GUARD):
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(64)
                assert chunk, "the server exited before printing its port"
                line += chunk
        yield f"http://127.0.0.1:{int(line)}/mcp"
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
        if process.stdout is not None:
            await process.stdout.aclose()


@asynccontextmanager
async def open_server(transport: str, **kw: Any) -> AsyncIterator[Any]:
    if transport == "stdio":
        async with MCPServerStdio(sys.executable, [SERVER, "stdio"], **kw) as server:
            yield server
    else:
        async with http_server_process() as url, MCPServerHTTP(url, **kw) as server:
            yield server


# The SDK's HTTP transport (httpx2 over httpcore2) leaves response-body async generators to
# the garbage collector when a stream ends, and Trio's finalizer warns about each one.
# Only that warning, only from httpx2/httpcore2, only in the tests that speak HTTP.
HTTPCORE2_GC = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)2\.[^']*' was garbage collected:ResourceWarning"
)
TRANSPORTS = ["stdio", pytest.param("http", marks=HTTPCORE2_GC)]


async def call_text(server: Any, tool: str) -> str:
    """Call a tool through the SDK's session directly; its text."""
    result = await server.session.call_tool(tool, {})
    [block] = result.content
    assert isinstance(block, mcp_types.TextContent)
    return block.text
