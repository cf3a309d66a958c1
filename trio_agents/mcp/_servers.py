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

Sampling: a server's ``sampling/createMessage`` during a tool call is served by the
model of the run making the call (``ToolContext.model``: counted in the run's usage and
limits). The SDK hands it to a callback in the connection's task, which cannot tell which
of the calls in flight it belongs to (stdio carries no such link): it is served when the
calls in flight are all one run's, and refused with an error otherwise. The model call
runs in a scope the calling tool call cancels as it ends (cancelled with the run).

Elicitation: a server's ``elicitation/create`` during a tool call becomes a question of
the run making the call (``ToolContext.request_approval``): the run shows
``awaiting_approval`` with the question's id, and ``run.approve(id)`` (from any face)
answers ``accept`` — a form's content is its schema's defaults, or what
``run.approve(id, content=...)`` gives (checked against the form's schema); a URL is
taken as consented to —, ``run.reject(id, message=...)`` answers ``decline`` (the message goes
in the result's ``_meta``). The wait is in a scope the calling tool call cancels as it
ends, as sampling's is: a run cancelled, a call timed out or a server gone ends it at
once, and ``cancel`` is answered (if the server still listens). Which call asked is known
only when it is the one call in flight on the connection: an elicitation with several in
flight is refused with an error (open one connection per concurrent caller).

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
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT

from .._error_text import summarize
from .._exceptions import TrioAgentsError
from .._items import AssistantMessage, Item, UserMessage
from .._model import Finish, ModelRequest, TextDelta, Usage
from .._tools import Tool, ToolContext

__all__ = ["MCPServerHTTP", "MCPServerStdio", "MCPToolError"]

logger = logging.getLogger("trio_agents.mcp")
# A deadline for closing the connection, set on its (shielded) task's scope by __aexit__:
# the SDK bounds each step of its own, shielded shutdown (0.5 s to flush, 2 s for the
# process to exit on its own, then the kill); this bounds what is not shielded.
_CLOSE_BOUND = 10.0
_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
# The settings keys by which our models bound a response's length (chat completions and
# Anthropic; Responses; newer OpenAI chat): a sampling request's maxTokens lowers one the
# agent sets, never raises it, and is not added where none is (a model may reject a key).
_LENGTH_SETTINGS = ("max_tokens", "max_output_tokens", "max_completion_tokens")
# How long a call that ended waits for its sampling's model streams to close.
_SAMPLING_CLOSE_BOUND = 5.0
_STOP_REASONS = {"stop": "endTurn", "length": "maxTokens"}
# Where a declined elicitation's result carries the rejection's message (``_meta``).
_REASON_META = "trio-agents/reason"


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
        sampling: bool = True,
        elicitation: bool = True,
    ) -> None:
        self.name = name
        self._prefix = tool_prefix
        self._call_timeout = call_timeout
        self._sampling = sampling
        self._elicitation = elicitation
        # The tool calls in flight on this connection, each with the scopes of the
        # sampling requests served for it (cancelled as the call ends).
        self._calls: dict[int, tuple[ToolContext | None, dict[trio.CancelScope, trio.Event]]] = {}
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
                # Each callback declares its capability (the SDK does so for any
                # callback given): only when asked to, since it serves the requests.
                session = await stack.enter_async_context(
                    ClientSession(
                        read,
                        write,
                        sampling_callback=self._sample if self._sampling else None,
                        elicitation_callback=self._elicit if self._elicitation else None,
                    )
                )
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
        scopes: dict[trio.CancelScope, trio.Event] = {}
        key = id(scopes)
        self._calls[key] = (ctx, scopes)
        try:
            result = await session.call_tool(tool, arguments, progress_callback=on_progress)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
            raise MCPToolError(self.name, tool, "the connection to the server is gone") from exc
        except Exception as exc:
            if isinstance(exc, MCPToolError):
                raise
            raise MCPToolError(self.name, tool, _describe(exc)) from exc
        finally:
            # The call ended (so did the run, if it was cancelled): the sampling served
            # for it ends too, however far it got.
            del self._calls[key]
            if scopes:
                await _end_sampling(scopes)
        if not isinstance(result, mcp_types.CallToolResult):
            raise MCPToolError(self.name, tool, f"unexpected result {type(result).__name__}")
        if result.is_error:
            raise MCPToolError(self.name, tool, _output(result) or "the tool reported an error")
        return _output(result)

    async def _sample(
        self, context: ClientRequestContext, params: mcp_types.CreateMessageRequestParams
    ) -> mcp_types.CreateMessageResult | mcp_types.ErrorData:
        """The SDK's sampling callback: serve the request with the calling run's model.

        Never raises an ``Exception`` (an answer to the server, never a crash of the
        connection): a request that cannot be served is answered with an error.
        """
        found = self._calling("sampling")
        if isinstance(found, str):
            return _error(mcp_types.INVALID_REQUEST, found)
        ctx, scopes = found
        try:
            request = _sampling_request(params, ctx.parent.agent.model_settings)
        except ValueError as exc:
            return _error(mcp_types.INVALID_PARAMS, str(exc))
        done = trio.Event()
        with trio.CancelScope() as scope:
            scopes[scope] = done
            try:
                return await _complete(ctx, request)
            except Exception as exc:
                logger.info("MCP server %r: sampling failed: %s", self.name, summarize(exc))
                return _error(mcp_types.INTERNAL_ERROR, f"sampling failed: {summarize(exc)}")
            finally:
                del scopes[scope]
                done.set()
        # Only the calling tool call's end cancels this scope.
        return _error(mcp_types.INTERNAL_ERROR, "sampling cancelled: the tool call ended")

    async def _elicit(
        self, context: ClientRequestContext, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        """The SDK's elicitation callback: a question of the calling run, answered by
        ``run.approve`` / ``run.reject`` of its id (see the module's docstring).

        Never raises an ``Exception``: a request that cannot be asked is answered with
        an error.
        """
        found = self._calling("elicitation")
        if isinstance(found, str):
            return _error(mcp_types.INVALID_REQUEST, found)
        ctx, scopes = found
        data = _question_data(self.name, params)
        schema = (
            params.requested_schema
            if isinstance(params, mcp_types.ElicitRequestFormParams)
            else None
        )
        done = trio.Event()
        with trio.CancelScope() as scope:
            scopes[scope] = done
            try:
                decision = await ctx.request_approval(params.message, data=data, schema=schema)
            except Exception as exc:  # the call or the run ended as it was asked
                return _error(mcp_types.INVALID_REQUEST, f"elicitation refused: {summarize(exc)}")
            finally:
                del scopes[scope]
                done.set()
            if not decision.approved:
                logger.info("MCP server %r: elicitation declined: %s", self.name, decision.message)
                meta = None if decision.message is None else {_REASON_META: decision.message}
                return mcp_types.ElicitResult(action="decline", _meta=meta)
            if schema is None:
                return mcp_types.ElicitResult(action="accept")
            content = decision.content if decision.content is not None else _defaults(schema)
            try:
                return mcp_types.ElicitResult(action="accept", content=dict(content))
            except ValueError as exc:  # a value no elicitation content may hold
                return _error(mcp_types.INVALID_PARAMS, f"elicitation content: {summarize(exc)}")
        # Only the calling tool call's end cancels this scope (the run cancelled, the
        # call timed out, the server gone): the person never answered.
        return mcp_types.ElicitResult(action="cancel")

    def _calling(self, what: str) -> tuple[ToolContext, dict[trio.CancelScope, trio.Event]] | str:
        """The call a sampling or elicitation request is served for, or why there is
        none. Nothing on the wire says which call asked (stdio has no link, nor does
        the SDK pass one): sampling needs only the run (its model), so it is served
        while the calls in flight are all one run's; elicitation asks on behalf of
        one call, so only while it is the one in flight."""
        calls = list(self._calls.values())
        if not calls:
            return f"{what} is served only during a tool call of a run"
        runs = {id(_run_of(ctx)) for ctx, _ in calls}
        if any(_run_of(ctx) is None for ctx, _ in calls):
            return f"{what} is served only for a tool call made by a run"
        if len(runs) > 1:
            return (
                f"{what} cannot tell which run asked: tool calls of several runs are in"
                " flight on this connection (open one connection per run)"
            )
        if what == "elicitation" and len(calls) > 1:
            return (
                f"elicitation cannot tell which call asked: {len(calls)} tool calls are in"
                " flight on this connection (open one connection per concurrent call)"
            )
        ctx, scopes = calls[0]
        assert ctx is not None
        return ctx, scopes


async def _end_sampling(scopes: dict[trio.CancelScope, trio.Event]) -> None:
    """Cancel the sampling served for a call that ended, and wait (shielded: the call
    may be ending by cancellation) until each has closed its model stream, so the
    run's end comes after theirs, as after its own model calls'; bounded."""
    pending = list(scopes.items())
    for scope, _ in pending:
        scope.cancel()
    with trio.CancelScope(shield=True) as bound:
        bound.deadline = trio.current_time() + _SAMPLING_CLOSE_BOUND
        for _, done in pending:
            await done.wait()
    if bound.cancelled_caught:
        logger.warning("sampling did not end %s s after its tool call", _SAMPLING_CLOSE_BOUND)


def _run_of(ctx: ToolContext | None) -> object | None:
    """The run making the call, or None (no context, or one built by hand)."""
    if ctx is None:
        return None
    try:
        return ctx.parent
    except RuntimeError:
        return None


def _question_data(server: str, params: mcp_types.ElicitRequestParams) -> dict[str, Any]:
    """What a face shows of an elicitation beside its message (``data`` of the
    question): the server, the mode, and the form's schema or the URL."""
    data: dict[str, Any] = {"type": "mcp.elicitation", "server": server, "mode": params.mode}
    if isinstance(params, mcp_types.ElicitRequestFormParams):
        data["requested_schema"] = params.requested_schema
    else:
        data["url"] = params.url
    return data


def _defaults(schema: Mapping[str, Any]) -> dict[str, Any]:
    """A form's content from its schema's defaults (the properties that have one of the
    types an elicitation's content may hold: text, number, boolean, list of texts)."""
    content: dict[str, Any] = {}
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return content
    for name, spec in properties.items():
        if not isinstance(spec, Mapping) or "default" not in spec:
            continue
        value = spec["default"]
        if isinstance(value, str | int | float | bool) or (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            content[str(name)] = value
    return content


def _error(code: int, message: str) -> mcp_types.ErrorData:
    return mcp_types.ErrorData(code=code, message=message)


def _sampling_request(
    params: mcp_types.CreateMessageRequestParams, agent_settings: Mapping[str, Any]
) -> ModelRequest:
    """Our model request for a server's sampling request (text only; no tools).

    Raises:
        ValueError: what we cannot send (images, audio, tool use, tools).
    """
    if params.tools:
        raise ValueError("sampling with tools is not supported")
    items: list[Item] = []
    for message in params.messages:
        blocks = message.content if isinstance(message.content, list) else [message.content]
        texts: list[str] = []
        for block in blocks:
            if not isinstance(block, mcp_types.TextContent):
                raise ValueError(f"sampling supports text content only, not {block.type!r}")
            texts.append(block.text)
        text = "".join(texts)
        items.append(UserMessage(text) if message.role == "user" else AssistantMessage(text))
    if not items:
        raise ValueError("sampling needs at least one message")
    settings = dict(agent_settings)
    for key in _LENGTH_SETTINGS:
        value = settings.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            settings[key] = min(value, params.max_tokens)
    return ModelRequest(
        instructions=params.system_prompt or "", items=tuple(items), settings=settings
    )


async def _complete(ctx: ToolContext, request: ModelRequest) -> mcp_types.CreateMessageResult:
    """One call of the run's model (``ctx.model``: counted as the run's); its answer."""
    parts: list[str] = []
    reason: str | None = None
    usage: Usage | None = None
    async with ctx.model.stream(request) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                parts.append(event.text)
            elif isinstance(event, Finish):
                reason = event.reason
            elif isinstance(event, Usage):
                usage = event if usage is None else usage + event
            else:
                # A tool call: the request offered no tools, so this is no answer.
                raise ValueError(f"the model answered with {type(event).__name__}")
    return mcp_types.CreateMessageResult(
        role="assistant",
        content=mcp_types.TextContent(type="text", text="".join(parts)),
        model=(usage.model if usage is not None and usage.model else None)
        or type(ctx.parent.agent.model).__name__,
        stop_reason=_STOP_REASONS.get(reason, reason) if reason else "endTurn",
    )


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
        sampling: declare the sampling capability and serve a server's sampling
            requests with the calling run's model (see the module's docstring).
        elicitation: declare the elicitation capability (form and URL modes) and make
            a server's elicitation requests questions of the calling run, answered by
            ``run.approve`` / ``run.reject`` (see the module's docstring).
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
        sampling: bool = True,
        elicitation: bool = True,
    ) -> None:
        super().__init__(
            name or command,
            tool_prefix=tool_prefix,
            call_timeout=call_timeout,
            sampling=sampling,
            elicitation=elicitation,
        )
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
        sampling, elicitation: as for :class:`MCPServerStdio`.
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
        sampling: bool = True,
        elicitation: bool = True,
    ) -> None:
        super().__init__(
            name or url,
            tool_prefix=tool_prefix,
            call_timeout=call_timeout,
            sampling=sampling,
            elicitation=elicitation,
        )
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
