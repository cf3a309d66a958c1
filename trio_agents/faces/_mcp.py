"""The MCP face (DESIGN §22): every served agent is one MCP tool, and cancelling the
call really stops the run.

Built on the official ``mcp`` package's low-level :class:`~mcp.server.lowlevel.Server`
(the JSON-RPC, both protocol eras, validation) and, over HTTP, its
``StreamableHTTPSessionManager``; both are written on AnyIO and run here under Trio.
Nothing of the protocol is written by hand: this module maps tool calls to the
:class:`~trio_agents.hosting.RunHost` and the run's events back.

- **Tools.** One per agent of the host, named as the agent is registered. Arguments:
  ``input`` (the user's text) and an optional ``session_id`` (the conversation to
  continue; scoped to the principal, as on every face). An agent with an
  ``output_type`` declares its ``outputSchema`` (the schema every model request
  carries: a non-object type is wrapped as ``{"response": ...}``) and answers with
  ``structuredContent`` beside the text.
- **A call is a run**, owned by the call. Its result is the final answer; a run that
  ends ``failed`` or ``cancelled`` is a tool error (``isError``) holding the reason.
  A call on a session busy with another run waits for it (``on_busy="enqueue"``): a
  client cancelling a call, then calling again on the session, is answered after the
  cancelled run's repair, never ``session_busy``. A refused start (a limit) is an
  ``isError`` result with the §10 code; malformed arguments are a JSON-RPC error
  (``-32602``).
- **Cancel.** ``notifications/cancelled`` for the call — or, on the 2026-07-28 protocol
  over HTTP, the call's response stream closed by the client — is
  ``run.cancel("mcp client cancelled")``. The SDK never answers a cancelled request;
  the handler stays until the run's terminal update is in (the repair written to the
  session), so the face forgets the run only once it is really over.
- **A client that goes away** (the MCP session ended or expired, the stdio pipe
  closed) applies the run's ``on_disconnect``: ``"cancel"`` by default (reason
  ``"client disconnected"``: an MCP call has no way to re-attach, so a run nobody waits
  for is stopped), or ``"continue"`` (the run goes on; its principal sees it on the
  other faces).
- **Progress.** With a ``progressToken`` every run event worth telling becomes
  ``notifications/progress``: ``progress`` is the event's seq (strictly increasing),
  ``message`` one line: a status change (``"running"``, ``"awaiting approval: add
  {…}"``, …), a tool started or finished, a tool's own progress, a child run, or —
  while the model writes — the last :data:`PROGRESS_TEXT` characters of the turn's text
  so far (bounded: a long answer never makes quadratic traffic).
- **Approvals** become ``elicitation/create`` (form mode) to a client that declared
  the ``elicitation`` capability: on a connection that carries server requests (the
  handshake era: stdio, or Streamable HTTP with SSE) as a request while the call goes
  on; on 2026-07-28 (no server-initiated requests) as an ``InputRequiredResult``
  whose ``requestState`` is ``<run id>:<last seq told>``, the call retried with the
  answers. Accept approves the call, decline or cancel rejects it (with the form's
  ``message``, if any). Otherwise the run waits for the decision from another face
  (REST, A2A, AG-UI, the web UI), as usual.

HTTP: :func:`routes` serves ``/mcp`` behind the faces' bearer-token layer; the MCP
session is bound to the principal that opened it (another principal's request for it
answers 404, as an unknown session does). The SDK's session manager needs a task group
for the life of the server, and a face has no lifespan hook (``http_app`` composes
routes only): the manager runs in a Trio *system task*, started by the first ``/mcp``
request and stopped when the server shuts down (``Face.wait_closing``).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any, Final, Literal, final

import anyio
import attrs
import mcp.types as types
import trio
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request
from starlette.routing import Route

from .._items import UserMessage
from .._output import Accepted, OutputType, compile_output
from .._text_cleaning import clean_text
from .._typeschema import to_json_value
from ..hosting import HostError, Origin, RunHost, StartRequest
from ..hosting._requests import unstorable
from ._face import Face, Routes
from ._http_errors import error_response
from ._http_requests import PRINCIPAL_KEY, shown_description

__all__ = ["CANCEL_REASON", "MCP_PATH", "McpTools", "mcp_server", "routes"]

logger = logging.getLogger("trio_agents.faces.mcp")

MCP_PATH: Final = "/mcp"
"""Where :func:`routes` serves MCP's Streamable HTTP."""

CANCEL_REASON: Final = "mcp client cancelled"
"""The reason of a run whose MCP call the client cancelled."""

PROGRESS_TEXT: Final = 400
"""The most characters of the turn's text one progress message carries (its tail)."""

_INVALID_PARAMS: Final = -32602
_TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})
_CALL_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "properties": {
        "input": {"type": "string", "description": "The message for the agent."},
        "session_id": {
            "type": "string",
            "description": "The conversation to continue (omit for a fresh one).",
        },
    },
    "required": ["input"],
    "additionalProperties": False,
}
# What an approval's elicitation asks: nothing but an optional note (a form with no
# field is not valid in every client; a rejection's note goes back to the model).
_APPROVAL_FORM: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "message": {
            "type": "string",
            "title": "Note",
            "description": "Why, if you decline (the agent reads it).",
        }
    },
}


@final
class _CallOwner:
    """The owner (:class:`~trio_agents.hosting.Origin`) of a call's run: the call.
    Compared by identity."""

    __slots__ = ()


@attrs.define
class _View:
    """What a call learns from its run's events."""

    status: str = "queued"
    reason: str | None = None
    answer: str = ""  # the last completed assistant message
    final_arguments: str | None = None  # a final_answer call's arguments, if it ended so
    text: str = ""  # the current turn's streamed text
    calls: dict[str, tuple[str, str]] = attrs.field(factory=dict)  # call id -> name, args
    pending: tuple[str, ...] = ()
    seq: int = 0  # the last event's
    asking: tuple[str, ...] = ()  # approvals to ask in an InputRequiredResult
    # question id -> what it asks (detail["questions"]: ToolContext.request_approval)
    questions: dict[str, Mapping[str, Any]] = attrs.field(factory=dict)

    def apply(self, event: Mapping[str, Any]) -> str | None:
        """Fold one event in; returns the progress message it is worth, if any."""
        kind = event.get("type")
        if kind == "run.updated":
            return self._status(event)
        if kind == "response.text.delta":
            self.text += str(event.get("text", ""))
            tail = self.text[-PROGRESS_TEXT:]
            return tail if len(tail) == len(self.text) else "…" + tail
        if kind == "run.item":
            return self._item(event.get("item"))
        if kind == "tool.started":
            return f"tool {event.get('name', '?')} started"
        if kind == "tool.finished":
            return f"tool {event.get('name', '?')} finished: {event.get('status', '?')}"
        if kind == "tool.progress":
            return f"tool {event.get('name', '?')}: {_short(str(event.get('message', '')))}"
        if kind == "run.child":
            return f"child run {event.get('agent', '?')}: {event.get('status', '?')}"
        if kind == "run.handoff":
            return f"handed off to {event.get('to_agent', '?')}"
        return None

    def _status(self, event: Mapping[str, Any]) -> str:
        self.status = str(event.get("status"))
        self.reason = event.get("reason")
        detail = event.get("detail") or {}
        pending = detail.get("pending") if isinstance(detail, Mapping) else None
        self.pending = tuple(str(c) for c in pending) if isinstance(pending, list) else ()
        asked = detail.get("questions") if isinstance(detail, Mapping) else None
        self.questions = {
            str(q.get("id")): q
            for q in (asked if isinstance(asked, list) else ())
            if isinstance(q, Mapping) and isinstance(q.get("message"), str)
        }
        if self.pending:
            return "awaiting approval: " + ", ".join(self.describe(c) for c in self.pending)
        return self.status if self.reason is None else f"{self.status}: {self.reason}"

    def _item(self, item: object) -> str | None:
        if not isinstance(item, Mapping):
            return None
        kind = item.get("type")
        if kind == "function_call":
            call_id, name = str(item.get("call_id", "")), str(item.get("name", ""))
            self.calls[call_id] = (name, str(item.get("arguments", "")))
            if name == "final_answer":
                self.final_arguments = str(item.get("arguments", ""))
            return None
        if kind == "message" and item.get("role") == "assistant":
            self.text = ""
            if item.get("status", "completed") == "completed":
                self.answer = str(item.get("content", ""))
                self.final_arguments = None
        return None

    def describe(self, call_id: str) -> str:
        question = self.questions.get(call_id)
        if question is not None:
            return _short(str(question["message"]))
        name, arguments = self.calls.get(call_id, ("?", ""))
        return f"{name} {_short(arguments)}"

    def elicitation(self, run_id: str, call_id: str) -> tuple[str, dict[str, Any], bool]:
        """What the client is asked for ``call_id``: the message, the form's schema, and
        whether the form's content answers it (a question with a schema: approved with
        the accepted content); a call waiting to run is asked to be approved."""
        question = self.questions.get(call_id)
        if question is None:
            return _approval_message(run_id, call_id, self.describe(call_id)), _APPROVAL_FORM, False
        schema = question.get("schema")
        if isinstance(schema, Mapping):
            return str(question["message"]), dict(schema), True
        return str(question["message"]), _APPROVAL_FORM, False


def _short(text: str, at_most: int = 200) -> str:
    return text if len(text) <= at_most else text[: at_most - 1] + "…"


def _tool_error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


def _arguments(arguments: Mapping[str, Any] | None) -> tuple[str, str | None]:
    """A call's ``input`` and ``session_id``; a JSON-RPC error for anything else."""
    arguments = arguments or {}
    unknown = sorted(set(arguments) - {"input", "session_id"})
    if unknown:
        shown = ", ".join(repr(clean_text(name[:64])) for name in unknown[:5])
        raise MCPError(_INVALID_PARAMS, f"unknown argument(s): {shown}")
    text, session_id = arguments.get("input"), arguments.get("session_id")
    if not isinstance(text, str):
        raise MCPError(_INVALID_PARAMS, "'input' must be a string")
    if session_id is not None and (not isinstance(session_id, str) or not session_id):
        raise MCPError(_INVALID_PARAMS, "'session_id' must be a non-empty string")
    if unstorable(text) or (session_id is not None and unstorable(session_id)):
        raise MCPError(
            _INVALID_PARAMS,
            "a string holds a NUL character or a lone surrogate: strings must be Unicode"
            " text without NUL",
        )
    return text, session_id


def _structured(output: OutputType, view: _View) -> Any:
    """The final answer as ``structuredContent`` (envelope included: what the
    ``outputSchema`` says), or None if it cannot be read back."""
    if view.final_arguments is not None:
        attempt = output.take_arguments(view.final_arguments)
    else:
        attempt = output.take_text(view.answer)
    if not isinstance(attempt, Accepted):  # pragma: no cover - the run accepted it
        return None
    ok, value = to_json_value(attempt.value)
    if not ok:  # pragma: no cover - a converted value is JSON by construction
        return None
    envelope = output.spec.envelope
    return {envelope: value} if envelope is not None else value


class McpTools:
    """The tools of a host as MCP sees them, and the calls that run them.

    Args:
        host: the run host.
        principal: the principal of calls that carry none (stdio: the one local
            user); over HTTP each call has its request's.
        on_disconnect: what a client that goes away does to its calls' runs.
        cleanup_timeout: how long a cancelled call waits for its run's terminal update.
    """

    def __init__(
        self,
        host: RunHost,
        *,
        principal: str | None = None,
        on_disconnect: Literal["cancel", "continue"] = "cancel",
        cleanup_timeout: float = 10.0,
    ) -> None:
        if on_disconnect not in ("cancel", "continue"):
            raise ValueError("on_disconnect must be 'cancel' or 'continue'")
        self.host = host
        self.principal = principal
        self.on_disconnect: Literal["cancel", "continue"] = on_disconnect
        self.cleanup_timeout = cleanup_timeout
        self._outputs: dict[str, OutputType | None] = {}
        # Owners of runs whose call answered InputRequiredResult, until it is retried.
        self._parked: dict[str, tuple[str, object]] = {}  # run id -> principal, owner

    def _output(self, name: str) -> OutputType | None:
        if name not in self._outputs:
            self._outputs[name] = compile_output(self.host.agents[name].output_type)
        return self._outputs[name]

    def tools(self) -> list[types.Tool]:
        """One tool per agent of the host."""
        tools = []
        for name, agent in self.host.agents.items():
            output = self._output(name)
            description = shown_description(agent.description) or f"Ask the agent {name!r}."
            tools.append(
                types.Tool(
                    name=name,
                    description=description,
                    input_schema=dict(_CALL_SCHEMA),
                    output_schema=dict(output.spec.schema) if output is not None else None,
                )
            )
        return tools

    async def list_tools(
        self, _ctx: ServerRequestContext[Any], _params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools())

    def _principal(self, ctx: ServerRequestContext[Any]) -> str:
        request = ctx.request
        if isinstance(request, Request):
            principal = request.scope.get(PRINCIPAL_KEY)
            if isinstance(principal, str):
                return principal
        if self.principal is None:  # pragma: no cover - every route is authenticated
            raise MCPError(_INVALID_PARAMS, "no principal for this call")
        return self.principal

    async def call_tool(
        self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Run the agent ``params.name`` on the call's input (the module docstring)."""
        name = params.name
        if name not in self.host.agents:
            raise MCPError(_INVALID_PARAMS, f"unknown tool: {clean_text(name[:128])!r}")
        principal = self._principal(ctx)
        if params.request_state is not None:
            return await self._resume(ctx, principal, params)
        text, session_id = _arguments(params.arguments)
        owner = _CallOwner()
        try:
            run_id = await self.host.start(
                Origin(principal=principal, owner=owner),
                StartRequest(
                    agent=name,
                    input=(UserMessage(text),),
                    session_id=session_id,
                    on_disconnect=self.on_disconnect,
                    # A call waits for the session's active run (MCP has no busy
                    # answer a client would retry): so a call made right after
                    # cancelling another on the session runs once its repair is in.
                    on_busy="enqueue",
                ),
            )
        except HostError as exc:
            self.host.disconnected(owner)
            if exc.code == "invalid_request":
                raise MCPError(_INVALID_PARAMS, exc.message) from None
            return _tool_error(f"{exc.code}: {exc.message}")
        return await self._follow(ctx, principal, name, run_id, owner, 0)

    async def _resume(
        self, ctx: ServerRequestContext[Any], principal: str, params: types.CallToolRequestParams
    ) -> types.CallToolResult | types.InputRequiredResult:
        """A call retried with the answers to the approvals it asked (2026-07-28's
        multi-round-trip requests): decide them, then follow the run on.

        The ``requestState`` is ``<run id>:<seq>`` (the last event the first leg
        told); the client may forge it, so it names only a run the host finds for this
        principal — one the principal could decide on any face anyway."""
        run_id, _, told = (params.request_state or "").rpartition(":")
        try:
            info = await self.host.get(principal, run_id)
            after = int(told)
        except (HostError, ValueError):
            raise MCPError(_INVALID_PARAMS, "unknown or malformed requestState") from None
        if info.agent != params.name:
            raise MCPError(_INVALID_PARAMS, "the requestState is another tool's")
        parked = self._parked.pop(run_id, None)
        owner = parked[1] if parked is not None else _CallOwner()
        answered: set[str] = set()
        # The questions with a form: an accepted answer's content is their answer.
        forms = {
            str(q.get("id"))
            for q in info.detail.get("questions") or ()
            if isinstance(q, Mapping) and isinstance(q.get("schema"), Mapping)
        }
        for call_id, answer in (params.input_responses or {}).items():
            if isinstance(answer, types.ElicitResult):
                answered.add(call_id)
                await self._decide(
                    principal, run_id, call_id, answer, with_content=call_id in forms
                )
        return await self._follow(ctx, principal, params.name, run_id, owner, after, answered)

    async def _follow(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        name: str,
        run_id: str,
        owner: object,
        after: int,
        answered: set[str] | None = None,
    ) -> types.CallToolResult | types.InputRequiredResult:
        """Follow the run (telling events past ``after``) to its end, or to approvals
        the client is asked in an ``InputRequiredResult``."""
        parked = False
        try:
            view = await self._watch(ctx, principal, run_id, after, set(answered or ()))
            if view.asking:
                # The client answers in a retry of this call: the run waits, owned
                # still by this call (the retry takes the owner over).
                parked = True
                await self._park(principal, run_id, owner)
                return types.InputRequiredResult(
                    input_requests={
                        call_id: _approval_request(*view.elicitation(run_id, call_id)[:2])
                        for call_id in view.asking
                    },
                    request_state=f"{run_id}:{view.seq}",
                )
        except BaseException:
            # Cancelled: by the client (its notice, or its stream closed) or because
            # the connection went away. Either way nothing more is sent for this
            # request; the run's end is waited for before the face forgets it.
            with trio.CancelScope(shield=True) as cleanup:
                cleanup.deadline = trio.current_time() + self.cleanup_timeout
                await self._abandoned(ctx, principal, run_id, owner)
            raise
        finally:
            if not parked:
                self.host.disconnected(owner)
        return self._result(name, run_id, view)

    def _result(self, name: str, run_id: str, view: _View) -> types.CallToolResult:
        if view.status != "completed":
            reason = view.reason or "no reason given"
            return _tool_error(f"run {run_id} {view.status}: {reason}")
        output = self._output(name)
        structured = None if output is None else _structured(output, view)
        answer = view.answer
        if view.final_arguments is not None and structured is not None:
            answer = json.dumps(structured, ensure_ascii=False)
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=answer)],
            structured_content=structured,
        )

    async def _park(self, principal: str, run_id: str, owner: object) -> None:
        """Keep the owner of a run whose call answered ``InputRequiredResult`` for its
        retry; forget those of parked runs that ended meanwhile (decided and finished
        on another face: no retry will come), so what is kept is bounded by the live
        runs a principal may have."""
        for other, (who, kept) in list(self._parked.items()):
            try:
                info = await self.host.get(who, other)
            except HostError:
                info = None
            if (info is None or info.status.value in _TERMINAL) and other in self._parked:
                del self._parked[other]
                self.host.disconnected(kept)
        self._parked[run_id] = (principal, owner)

    async def _watch(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        run_id: str,
        after: int,
        asked: set[str],
    ) -> _View:
        """Follow the run to its terminal update: progress out (for events past
        ``after``, which an earlier leg of the call told), approvals asked (those not
        in ``asked``, from the status at ``after`` on: a retry that left one
        unanswered asks it again). Stops early, with ``view.asking`` set, when
        approvals are to be asked in an ``InputRequiredResult``."""
        view = _View()
        how = _elicitation(ctx)
        async with trio.open_nursery() as nursery:
            async with self.host.events(principal, run_id, from_seq=1) as events:
                async for hosted in events:
                    view.seq = hosted.seq
                    message = view.apply(hosted.event)
                    if hosted.seq < after:
                        continue  # told and asked by an earlier leg of this call
                    if message is not None and hosted.seq > after:
                        await ctx.session.report_progress(hosted.seq, None, message)
                    new = [c for c in view.pending if c not in asked]
                    asked.update(new)
                    if new and how == "input_required":
                        view.asking = tuple(new)
                        break
                    for call_id in new if how == "request" else ():
                        asked_for = view.elicitation(run_id, call_id)
                        nursery.start_soon(self._elicit, ctx, principal, run_id, call_id, asked_for)
            # The run is over (or waits for this call's client): an approval still
            # asked is moot (the SDK tells the client its request is cancelled).
            nursery.cancel_scope.cancel()
        return view

    async def _elicit(
        self,
        ctx: ServerRequestContext[Any],
        principal: str,
        run_id: str,
        call_id: str,
        asked_for: tuple[str, dict[str, Any], bool],
    ) -> None:
        """Ask the client to approve one call (or answer a question: its message, its
        form); its answer decides it (unless another face decided first, or the run
        ended)."""
        message, schema, with_content = asked_for
        try:
            answer = await ctx.session.elicit_form(
                message, schema, related_request_id=ctx.request_id
            )
        except (MCPError, ValidationError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            # The client could not answer (an error, a malformed answer, the
            # connection gone): the run keeps waiting, answerable from every face.
            logger.info("elicitation for call %s of run %s got no answer", call_id, run_id)
            return
        await self._decide(principal, run_id, call_id, answer, with_content=with_content)

    async def _decide(
        self,
        principal: str,
        run_id: str,
        call_id: str,
        answer: types.ElicitResult,
        *,
        with_content: bool,
    ) -> None:
        """An elicitation's answer as the call's decision: accept approves (with the
        form's content, for a question that asks for some); decline or cancel rejects,
        with the form's note (else what the user did)."""
        note = (answer.content or {}).get("message")
        if unstorable(answer.content):
            # Checked at the edge, as every face checks what a client sends: the
            # question stays pending, answerable here again or on another face.
            logger.info("elicitation for %s of run %s: NUL or a lone surrogate", call_id, run_id)
            return
        try:
            if answer.action == "accept":
                content = dict(answer.content or {}) if with_content else None
                await self.host.approve(principal, run_id, call_id, content)
            else:
                message = (
                    note if isinstance(note, str) and note else f"{answer.action}d by the user"
                )
                await self.host.reject(principal, run_id, call_id, message)
        except HostError as exc:
            # Decided on another face first, or the run ended: nothing to do. Content
            # the question's schema refuses leaves it pending, answerable elsewhere.
            if exc.code == "invalid_request":
                logger.info("elicitation for %s of run %s: %s", call_id, run_id, exc.message)

    async def _abandoned(
        self, ctx: ServerRequestContext[Any], principal: str, run_id: str, owner: object
    ) -> None:
        if _client_cancelled(ctx):
            try:
                await self.host.cancel(principal, run_id, CANCEL_REASON)
            except HostError:
                return  # already over (it ended as the notice came): nothing to wait for
            await self.host.wait_terminal(principal, run_id)
            return
        self.host.disconnected(owner)
        if self.on_disconnect == "cancel":
            # (HostError: a run this call started is its principal's to see; never.)
            with contextlib.suppress(HostError):
                await self.host.wait_terminal(principal, run_id)


def _elicitation(ctx: ServerRequestContext[Any]) -> Literal["request", "input_required"] | None:
    """How approvals are asked of this call's client: an ``elicitation/create``
    request (a connection that carries server requests), an ``InputRequiredResult``
    (2026-07-28, whose requests never start from the server), or not at all (a
    client without the ``elicitation`` capability)."""
    session = ctx.session
    capable = session.check_client_capability(
        types.ClientCapabilities(elicitation=types.ElicitationCapability())
    )
    if not capable:
        return None
    if session.can_send_request:
        return "request"
    return "input_required" if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS else None


def _approval_message(run_id: str, call_id: str, call: str) -> str:
    return f"The agent wants to call {call} (run {run_id}, call {call_id}). Approve?"


def _approval_request(message: str, schema: dict[str, Any]) -> types.ElicitRequest:
    return types.ElicitRequest(
        params=types.ElicitRequestFormParams(message=message, requested_schema=schema)
    )


def _client_cancelled(ctx: ServerRequestContext[Any]) -> bool:
    """Whether a cancelled call was cancelled by its client (not by its connection
    going away).

    On the 2026-07-28 protocol over HTTP a call is its own HTTP exchange: the client
    closing it *is* the cancel. Otherwise the SDK's dispatcher sets the request's
    ``cancel_requested`` when ``notifications/cancelled`` names it, before it cancels
    the handler; the low-level context does not carry the dispatch context (the SDK's
    own ``TODO(L54)``), so it is read through the session that holds it.
    """
    if ctx.request is not None and ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return True
    dispatch = getattr(ctx.session, "_request_outbound", None)
    event = getattr(dispatch, "cancel_requested", None)
    return isinstance(event, anyio.Event) and event.is_set()


def mcp_server(tools: McpTools, *, name: str = "trio-agents") -> Server[Any]:
    """The SDK's low-level :class:`~mcp.server.lowlevel.Server` serving ``tools``."""
    return Server(name, on_list_tools=tools.list_tools, on_call_tool=tools.call_tool)


@final
class _McpHttp:
    """``/mcp``: the SDK's Streamable HTTP session manager, its sessions bound to the
    request's principal."""

    def __init__(self, face: Face, tools: McpTools) -> None:
        self.face = face
        self.manager = StreamableHTTPSessionManager(
            mcp_server(tools), max_request_body_size=face.limits.max_body_bytes
        )
        self._ready: trio.Event | None = None
        self._stopped = False

    async def _run_manager(self) -> None:
        assert self._ready is not None
        try:
            async with self.manager.run():
                self._ready.set()
                await self.face.wait_closing()
        except Exception:  # a system task must not raise: it would end the Trio run
            logger.exception("the MCP session manager crashed")
        finally:
            self._stopped = True
            self._ready.set()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._ready is None and not self.face.closing:
            self._ready = trio.Event()
            trio.lowlevel.spawn_system_task(self._run_manager, name="trio_agents MCP sessions")
        if self._ready is not None:
            await self._ready.wait()
        if self._ready is None or self._stopped:
            response = error_response("internal", "the server is shutting down", status=503)
            await response(scope, receive, send)
            return
        principal = scope[PRINCIPAL_KEY]
        # The SDK binds a session to the credential that opened it: ours is the principal.
        token = AccessToken(token="", client_id=principal, scopes=[], subject=principal)
        scope["user"] = AuthenticatedUser(token)
        await self.manager.handle_request(scope, receive, send)


def routes(face: Face) -> Routes:
    """The MCP face's routes: Streamable HTTP at :data:`MCP_PATH`."""
    app = _McpHttp(face, McpTools(face.host))
    return Routes(routes=[Route(MCP_PATH, endpoint=app, methods=["GET", "POST", "DELETE"])])
