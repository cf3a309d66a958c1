"""A real MCP server for the tests (the SDK's own ``MCPServer``), run in a subprocess.

``python tests/support/mcp_server.py stdio`` serves over stdin/stdout; ``python
tests/support/mcp_server.py http`` binds a free loopback port, prints it on one line, then
serves Streamable HTTP at ``/mcp``.

With ``TRIO_AGENTS_MCP_RECORD=<file>`` in its environment, the server appends every
``notifications/cancelled`` it receives to that file (one JSON line each), so a test
can tell a cancel notice from a closed input after the process is gone. Over HTTP it is
recorded as its POST arrives, before the SDK answers it: the SDK answers a notification's
POST with 202 *before* it hands the notice to the session, so a client that then ends
the session (``DELETE``) can have it terminated first, and the notice, received, is
dropped (``ClosedResourceError`` in ``_handle_post_request``) — the SDK's race, not the
client's, and one a loaded machine hits.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import warnings
from typing import Any

import anyio
import mcp.types as types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher

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


@server.tool()
async def slow_progress(steps: int, ctx: Context) -> str:
    """Reports ``steps`` progress notifications, then runs until cancelled."""
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, f"step {step} of {steps}")
    _event("started").set()
    await anyio.sleep_forever()
    return "unreachable"


@server.tool()
async def progress_then_done(steps: int, ctx: Context) -> str:
    """Reports ``steps`` progress notifications, then returns."""
    for step in range(1, steps + 1):
        await ctx.report_progress(step, None, None if step % 2 else f"step {step}")
    return "done"


@server.tool()
async def sample(prompt: str, ctx: Context) -> str:
    """Asks the client's model (sampling/createMessage), answers what it said: its
    ``model|stopReason|text``, or ``sampling refused: <error>``."""
    message = types.SamplingMessage(
        role="user", content=types.TextContent(type="text", text=prompt)
    )
    _event("sampling").set()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sampling is deprecated in the 2026 protocol
            result = await ctx.session.create_message(
                [message],
                max_tokens=7,
                system_prompt="Answer in one word.",
                related_request_id=ctx.request_id,
            )
    except MCPError as error:
        return f"sampling refused: {error}"
    except anyio.get_cancelled_exc_class():
        _event("sampling cancelled").set()
        raise
    assert isinstance(result.content, types.TextContent)
    return f"{result.model}|{result.stop_reason}|{result.content.text}"


@server.tool()
async def client_can_sample(ctx: Context) -> str:
    """Whether the client declared the sampling capability."""
    capabilities = ctx.session.client_capabilities
    return str(capabilities is not None and capabilities.sampling is not None)


@server.tool()
async def sampling_was_cancelled() -> str:
    """Returns once a sample call was cancelled (by the client's notifications/cancelled)."""
    with anyio.fail_after(HANG_GUARD):
        await _event("sampling cancelled").wait()
    return "cancelled"


# The form the elicit tool asks for: two fields with defaults, one without.
ELICIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "colour": {"type": "string", "default": "blue"},
        "count": {"type": "integer", "default": 3},
        "agree": {"type": "boolean"},
    },
    "required": ["colour"],
}


@server.tool()
async def elicit(question: str, ctx: Context) -> str:
    """Asks the client for a form (elicitation/create), answers what it said as JSON:
    ``{"action", "content", "meta"}``, or ``elicitation refused: <error>``."""
    _event("elicitation").set()
    try:
        result = await ctx.session.elicit_form(
            question, ELICIT_SCHEMA, related_request_id=ctx.request_id
        )
    except MCPError as error:
        return f"elicitation refused: {error}"
    except anyio.get_cancelled_exc_class():
        _event("elicitation cancelled").set()
        raise
    return json.dumps({"action": result.action, "content": result.content, "meta": result.meta})


@server.tool()
async def elicit_url(url: str, ctx: Context) -> str:
    """Asks the client to open a URL (URL-mode elicitation); answers the action."""
    result = await ctx.elicit_url("Sign in, please.", url, "elicitation-1")
    return str(result.action)


@server.tool()
async def elicitation_was_cancelled() -> str:
    """Returns once an elicit call was cancelled (by the client's notifications/cancelled)."""
    with anyio.fail_after(HANG_GUARD):
        await _event("elicitation cancelled").wait()
    return "cancelled"


_notices: list[Any] = []


@server.tool()
async def cancel_notices() -> str:
    """Once a recorded notifications/cancelled has arrived: how many have (an HTTP
    server answers a notification's POST before it dispatches it)."""
    with anyio.fail_after(HANG_GUARD):
        await _event("notice").wait()
    return str(len(_notices))


def _record_cancel_notices(path: str) -> None:
    """Append each notifications/cancelled the server receives to ``path``."""
    dispatch = JSONRPCDispatcher._dispatch_notification

    def recording(self: Any, msg: Any, *args: Any, **kwargs: Any) -> None:
        if msg.method == "notifications/cancelled":
            with open(path, "a", encoding="utf-8") as file:
                file.write(json.dumps(msg.params) + "\n")
            _notices.append(msg.params)
            _event("notice").set()
        dispatch(self, msg, *args, **kwargs)

    JSONRPCDispatcher._dispatch_notification = recording  # type: ignore[method-assign]


def _record_posted_cancel_notices(app: Any, path: str) -> Any:
    """``app`` (the Streamable HTTP ASGI app), appending each ``notifications/cancelled``
    POSTed to it to ``path`` as the body arrives (then replaying the body to ``app``)."""

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        read: list[Any] = []
        while True:
            message = await receive()
            read.append(message)
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        try:
            body = json.loads(b"".join(m.get("body", b"") for m in read))
        except ValueError:
            body = None
        for item in body if isinstance(body, list) else [body]:
            if isinstance(item, dict) and item.get("method") == "notifications/cancelled":
                # Written before the app answers (the point); a one-line append.
                with open(path, "a", encoding="utf-8") as file:  # noqa: ASYNC230
                    file.write(json.dumps(item.get("params")) + "\n")

        async def replayed() -> Any:
            return read.pop(0) if read else await receive()

        await app(scope, replayed, send)

    return recording


def serve_http() -> None:
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # connections wait in the backlog until uvicorn accepts them
    print(sock.getsockname()[1], flush=True)
    app: Any = server.streamable_http_app()
    record = os.environ.get("TRIO_AGENTS_MCP_RECORD")
    if record:
        app = _record_posted_cancel_notices(app, record)
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    if sys.argv[1] != "http" and os.environ.get("TRIO_AGENTS_MCP_RECORD"):
        _record_cancel_notices(os.environ["TRIO_AGENTS_MCP_RECORD"])
    if sys.argv[1] == "http":
        serve_http()
    else:
        server.run("stdio")
