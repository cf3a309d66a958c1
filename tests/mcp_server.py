"""A real MCP server for the tests (the SDK's own ``MCPServer``), run in a subprocess.

``python tests/mcp_server.py stdio`` serves over stdin/stdout; ``python
tests/mcp_server.py http`` binds a free loopback port, prints it on one line, then
serves Streamable HTTP at ``/mcp``.
"""

from __future__ import annotations

import os
import socket
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("trio-agents-test")
# Created on first use, inside the server's event loop.
_events: dict[str, anyio.Event] = {}
HANG_GUARD = 30


def _event(name: str) -> anyio.Event:
    if name not in _events:
        _events[name] = anyio.Event()
    return _events[name]


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(name="text.upper")
def upper(text: str) -> str:
    """Upper-case a text."""
    return text.upper()


@server.tool()
def fail(message: str) -> str:
    """Always fails with the message."""
    raise ToolError(message)


@server.tool()
def env(name: str) -> str:
    """An environment variable of the server process."""
    return os.environ.get(name, "<unset>")


@server.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@server.tool()
async def slow() -> str:
    """Runs until cancelled; remembers that it was."""
    _event("started").set()
    try:
        await anyio.sleep_forever()
    except anyio.get_cancelled_exc_class():
        _event("cancelled").set()
        raise
    return "unreachable"


@server.tool()
async def wait_started() -> str:
    """Returns once a slow call has started."""
    with anyio.fail_after(HANG_GUARD):
        await _event("started").wait()
    return "started"


@server.tool()
async def was_cancelled() -> str:
    """Returns once a slow call was cancelled by the client's notifications/cancelled."""
    with anyio.fail_after(HANG_GUARD):
        await _event("cancelled").wait()
    return "cancelled"


@server.tool()
def crash() -> str:
    """The server process dies on the spot."""
    os._exit(3)


def serve_http() -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # connections wait in the backlog until uvicorn accepts them
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    if sys.argv[1] == "http":
        serve_http()
    else:
        server.run("stdio")
