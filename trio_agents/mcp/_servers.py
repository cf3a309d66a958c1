"""MCP servers as async context managers, their tools as ordinary :class:`Tool`\\ s.

Built on the official ``mcp`` SDK, which is written on AnyIO and so runs under Trio.
The connection (the SDK's transport task group and ``ClientSession``) lives in a task
of its own, started in a nursery by ``__aenter__`` and ended by ``__aexit__``; tool
calls may come from any task of the same Trio run (a run's tool tasks).

Cancellation: a tool call is an ``await session.call_tool(...)``. When the run (or the
tool's timeout) cancels it, the SDK sends ``notifications/cancelled`` for the request,
in a shielded, bounded write, and the call raises ``Cancelled`` at once: the server is
told, nobody waits for it. The write goes through the transport's tasks, so those must
outlive the call even when the caller's scope covers both the run and the server's
block: hence the connection's own task, shielded once the connection is open.

Progress: each call passes a progress callback, so the SDK sends a progress token and
the server's ``notifications/progress`` for the call become ``ctx.progress(...)``.

A server that dies: its pending requests fail as the connection closes, and every later
call fails at once (the connection is marked closed), each with a :class:`MCPToolError`
naming the server — an error result the model reads, never a hang.
"""

from __future__ import annotations

import json
import logging
import math
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Self

import anyio
import httpx2
import mcp.types as mcp_types
import trio
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT

from .._error_text import summarize
from .._exceptions import TrioAgentsError
from .._tools import Tool, ToolContext

__all__ = ["MCPServerHTTP", "MCPServerStdio", "MCPToolError"]

logger = logging.getLogger("trio_agents.mcp")
# A deadline for closing the connection, set on its (shielded) task's scope by __aexit__:
# the SDK bounds each step of its own, shielded shutdown (0.5 s to flush, 2 s for the
# process to exit on its own, then the kill); this bounds what is not shielded.
_CLOSE_BOUND = 10.0
_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")


class MCPToolError(TrioAgentsError):
    """An MCP tool call did not give a result: the tool reported an error, the server
    answered with a protocol error, or the connection to the server is gone.

    The run turns it into an error result the model reads (``"error: MCPToolError:
    …"``).

    Attributes:
        server: the server's name.
        tool: the tool's name on the server.
    """

    def __init__(self, server: str, tool: str, message: str) -> None:
        super().__init__(f"MCP server {server!r}, tool {tool!r}: {message}")
        self.server = server
        self.tool = tool


def _tool_name(name: str, prefix: str) -> str:
    """A name our models accept (1-64 letters, digits, ``_``, ``-``) for an MCP tool."""
    return _BAD_NAME_CHARS.sub("_", prefix + name)[:64] or "tool"


def _output(result: mcp_types.CallToolResult) -> str:
    """The text the model reads for a tool result."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, mcp_types.TextContent):
            parts.append(block.text)
        else:
            parts.append(json.dumps(block.model_dump(mode="json", exclude_none=True)))
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)


class _Server:
    """What :class:`MCPServerStdio` and :class:`MCPServerHTTP` share.

    Use it as ``async with server:``; inside, :meth:`list_tools` gives the server's
    tools as :class:`~trio_agents.Tool`\\ s for ``Agent(tools=...)``. Tools of a
    closed server answer with an error result.
    """

    def __init__(
        self,
        name: str,
        *,
        tool_prefix: str = "",
        call_timeout: float | None = None,
    ) -> None:
        self.name = name
        self._prefix = tool_prefix
        self._call_timeout = call_timeout
        self._stack: AsyncExitStack | None = None
        self._session: ClientSession | None = None
        self._closed_reason: str | None = None
        # The connection task's scope and its stop signal (made anew by each open).
        self._scope: trio.CancelScope | None = None
        self._closing = trio.Event()

    @property
    def session(self) -> ClientSession:
        """The SDK's ``ClientSession`` (for what this wrapper does not cover).

        Raises:
            RuntimeError: outside the ``async with`` block.
        """
        if self._session is None:
            raise RuntimeError(f"MCP server {self.name!r} is not open (use 'async with')")
        return self._session

    async def _open_transport(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        if self._stack is not None:
            raise RuntimeError(f"MCP server {self.name!r} is already open")
        self._closing = trio.Event()
        stack = AsyncExitStack()
        try:
            nursery = await stack.enter_async_context(trio.open_nursery())
            session = await nursery.start(self._connection)
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self._session, self._closed_reason = stack, session, None
        return self

    async def _connection(self, *, task_status: trio.TaskStatus[ClientSession]) -> None:
        """The connection's own task: the SDK's transport and session live here.

        Once the session is initialized, this task's scope is *shielded*: a scope of
        the caller's that covers both a run and this server's block then cancels the
        run's calls, whose ``notifications/cancelled`` the transport (still running
        here) writes out before ``__aexit__`` closes the connection. Without the
        shield the transport's tasks were cancelled in the same instant as the calls,
        and the server only saw its input close. ``__aexit__`` ends this task (and
        bounds it with a deadline on this scope).

        Never raises an ``Exception``: it would cancel the caller's block (this task
        lives in a nursery around it). A transport failure is logged, and the calls
        see a closed connection.
        """
        with trio.CancelScope() as scope:
            self._scope = scope
            stack = AsyncExitStack()
            try:
                read, write = await self._open_transport(stack)
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
            except BaseException:
                # Closed apart from the error, which propagates as it was raised (out of
                # __aenter__), not wrapped in the groups of the SDK's task groups.
                await stack.aclose()
                raise
            scope.shield = True
            task_status.started(session)
            try:
                await self._closing.wait()
            finally:
                try:
                    await stack.aclose()
                except Exception as error:
                    # A server that died leaves its transport's error to be raised
                    # here, after its calls already failed with MCPToolError: report
                    # it, never replace the block's own outcome with it. (Cancelled and
                    # KeyboardInterrupt propagate.)
                    logger.warning(
                        "MCP server %r: closing the connection raised %s",
                        self.name,
                        summarize(error),
                    )

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        stack, self._stack, self._session = self._stack, None, None
        self._closed_reason = "the server was closed"
        if stack is None:
            return
        self._closing.set()
        if self._scope is not None:
            # The connection's scope is shielded from the caller's: its own deadline
            # keeps closing bounded even when the caller's scope is cancelled.
            self._scope.deadline = trio.current_time() + _CLOSE_BOUND
        await stack.aclose()

    async def list_tools(self) -> list[Tool]:
        """The server's tools (every page), as tools an agent can call."""
        session = self.session
        tools: list[Tool] = []
        cursor: str | None = None
        while True:
            params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
            listed = await session.list_tools(params=params)
            tools.extend(self._wrap(tool) for tool in listed.tools)
            cursor = listed.next_cursor
            if not cursor:
                return tools

    def _wrap(self, tool: mcp_types.Tool) -> Tool:
        remote = tool.name

        async def call(ctx: ToolContext, arguments: dict[str, Any]) -> str:
            return await self._call(remote, arguments, ctx)

        return Tool.from_schema(
            _tool_name(remote, self._prefix),
            tool.description or "",
            tool.input_schema,
            call,
            timeout=self._call_timeout,
        )

    async def _call(
        self, tool: str, arguments: dict[str, Any], ctx: ToolContext | None = None
    ) -> str:
        session = self._session
        if session is None:
            raise MCPToolError(self.name, tool, self._closed_reason or "the server is not open")
        # With a callback the SDK sends a progress token, and each of the server's
        # notifications/progress for the call becomes a tool.progress event.
        on_progress = _progress_reporter(ctx) if ctx is not None else None
        try:
            result = await session.call_tool(tool, arguments, progress_callback=on_progress)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            raise MCPToolError(self.name, tool, "the connection to the server is gone") from exc
        except Exception as exc:
            if isinstance(exc, MCPToolError):
                raise
            raise MCPToolError(self.name, tool, _describe(exc)) from exc
        if not isinstance(result, mcp_types.CallToolResult):
            raise MCPToolError(self.name, tool, f"unexpected result {type(result).__name__}")
        if result.is_error:
            raise MCPToolError(self.name, tool, _output(result) or "the tool reported an error")
        return _output(result)


def _describe(exc: BaseException) -> str:
    return summarize(exc)


def _progress_reporter(ctx: ToolContext) -> ProgressFnT:
    """An SDK progress callback that reports through ``ctx.progress``: the server's
    message (or ``"progress <n>"``), with ``progress`` and ``total`` as data."""

    async def report(progress: float, total: float | None, message: str | None) -> None:
        # A server's NaN or infinity stays out of the event: JSON has no such numbers,
        # and every subscriber of the run's events gets them as JSON.
        data: dict[str, Any] = {}
        if math.isfinite(progress):
            data["progress"] = progress
        if total is not None and math.isfinite(total):
            data["total"] = total
        ctx.progress(message if message else f"progress {progress:g}", **data)

    return report


class MCPServerStdio(_Server):
    """An MCP server run as a child process, spoken to over its stdin and stdout.

    The process is started when the ``async with`` block is entered and stopped
    (stdin closed, then terminated, then killed) when it is left, however it is left:
    it never outlives the block. Its stderr goes to ours.

    Args:
        command: the executable (``"python"``, ``"npx"``, ...).
        args: its arguments.
        env: extra environment variables (over a minimal default environment, as the
            SDK does: ``HOME``, ``PATH``, ...).
        cwd: the working directory.
        name: how errors and logs name the server (default: the command).
        tool_prefix: prepended to every tool name (to keep two servers' tools apart).
        call_timeout: seconds a tool call may take (the tools' ``timeout``); None for
            no limit.
    """

    def __init__(
        self,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        *,
        cwd: str | None = None,
        name: str | None = None,
        tool_prefix: str = "",
        call_timeout: float | None = None,
    ) -> None:
        super().__init__(name or command, tool_prefix=tool_prefix, call_timeout=call_timeout)
        self._params = StdioServerParameters(
            command=command,
            args=list(args),
            env=dict(env) if env is not None else None,
            cwd=cwd,
        )

    def __repr__(self) -> str:
        return f"<MCPServerStdio {self.name!r} {'open' if self._session else 'closed'}>"

    async def _open_transport(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        return await stack.enter_async_context(stdio_client(self._params, errlog=_errlog()))


def _errlog() -> Any:
    """Where the server's stderr goes: ours as it is now (the SDK's default is bound when
    it is imported, and may be a captured stream gone since), or the process's own
    stderr if ours has no file descriptor (say, redirected to a StringIO)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is OSError
            continue
    return subprocess.DEVNULL


class MCPServerHTTP(_Server):
    """An MCP server over Streamable HTTP.

    Args:
        url: the server's MCP endpoint (``http://127.0.0.1:8000/mcp``).
        headers: sent with every request (``Authorization``, ...).
        name: how errors name the server (default: the URL).
        tool_prefix: prepended to every tool name.
        call_timeout: seconds a tool call may take; None for no limit.
        connect_timeout: seconds to connect (and per write); responses have no read
            timeout of ours (a tool may take long: use ``call_timeout``).
    """

    def __init__(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        tool_prefix: str = "",
        call_timeout: float | None = None,
        connect_timeout: float = 30.0,
    ) -> None:
        super().__init__(name or url, tool_prefix=tool_prefix, call_timeout=call_timeout)
        self.url = url
        self._headers = dict(headers or {})
        if not (isinstance(connect_timeout, int | float) and connect_timeout > 0):
            raise ValueError(f"connect_timeout must be > 0, not {connect_timeout!r}")
        self._connect_timeout = float(connect_timeout)

    def __repr__(self) -> str:
        return f"<MCPServerHTTP {self.url!r} {'open' if self._session else 'closed'}>"

    async def _open_transport(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        timeout = httpx2.Timeout(self._connect_timeout, read=None)
        client = await stack.enter_async_context(
            httpx2.AsyncClient(headers=self._headers, timeout=timeout)
        )
        streams = await stack.enter_async_context(
            streamable_http_client(self.url, http_client=client)
        )
        return streams[0], streams[1]
