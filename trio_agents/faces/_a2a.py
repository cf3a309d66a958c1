"""The A2A 1.0 face: JSON-RPC over HTTP at ``POST /a2a``, the agent card at
``GET /.well-known/agent-card.json``, streams as Server-Sent Events.

A client of a :class:`~trio_agents.hosting.RunHost` like every face: it turns JSON-RPC
requests into host calls and the host's answers (and :class:`HostError`) back into
JSON-RPC. :mod:`._a2a_tasks` builds the protocol's objects from a run's events;
:mod:`._a2a_v03` translates 0.3's names and shapes; this module reads requests, calls
the host and writes answers.

**One card, agents as skills.** The server is one A2A agent whose skills are its
registered agents: ``SendMessage`` starts the agent named by ``metadata.agent`` (the
request's or the message's), or the only one when the server has one. One card keeps
one endpoint for every task op (a task id is a run id whatever its agent), which is
what A2A clients expect of an agent; per-agent cards would split ``ListTasks`` and
``GetTask`` across endpoints for no gain.

**Cancel means stopped.** ``CancelTask`` answers only after the run's terminal update
(``host.cancel`` then ``host.wait_terminal``), with the run's final state — ``canceled``
and the reason in the status message, or the state it reached if it finished first. A
task already finished is ``TaskNotCancelableError``.

**Streams lose nothing.** A stream (``SendStreamingMessage``, ``SubscribeToTask``)
begins with the task as of the run's seq ``S`` (``metadata.seq``), built from the
run's log, then carries every later event with its seq in ``metadata.seq``: a client
that re-subscribes gets the state it missed in that first task and every event after
it, once. A ``Last-Event-ID: L`` header (SSE's own resume header) asks, after that
first task, for each event ``L+1..S`` too. Streams end after the run's terminal
update; an ``input-required`` task keeps its stream open (the run is waiting, not
done), so one stream can watch a task through its approvals.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, NoReturn

import attrs
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from .._items import UserMessage
from .._text_cleaning import clean_text
from ..hosting import HostedEvent, HostError, Origin, RunHost, StartRequest
from ..hosting._requests import reject_constant, unstorable
from ._a2a_tasks import STATE_OF, TaskView, stream_event
from ._a2a_v03 import METHODS as V03_METHODS
from ._a2a_v03 import params_from_v03, result_to_v03
from ._event_stream import EventStream
from ._face import Face, Routes
from ._http_errors import HOST_CODES, HttpError, error_response
from ._http_requests import principal_of, read_body, shown_description

__all__ = ["A2AFace", "RpcError", "routes"]

# JSON-RPC 2.0's codes, and A2A's (spec §5.4).
PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
SERVER_ERROR: Final = -32000  # JSON-RPC's implementation-defined range: §10 codes A2A lacks
TASK_NOT_FOUND: Final = -32001
TASK_NOT_CANCELABLE: Final = -32002
PUSH_NOT_SUPPORTED: Final = -32003
UNSUPPORTED_OPERATION: Final = -32004
CONTENT_TYPE_NOT_SUPPORTED: Final = -32005
VERSION_NOT_SUPPORTED: Final = -32009

_METHODS: Final = frozenset(
    {"SendMessage", "SendStreamingMessage", "GetTask", "ListTasks", "CancelTask", "SubscribeToTask"}
)
_PUSH_METHODS: Final = frozenset(
    {
        "CreateTaskPushNotificationConfig",
        "GetTaskPushNotificationConfig",
        "ListTaskPushNotificationConfigs",
        "DeleteTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/set",
        "tasks/pushNotificationConfig/get",
        "tasks/pushNotificationConfig/list",
        "tasks/pushNotificationConfig/delete",
    }
)
_VERSIONS: Final = frozenset({"0.3", "1.0"})
_ERROR_INFO: Final = "type.googleapis.com/google.rpc.ErrorInfo"
_MAX_PAGE: Final = 100


class RpcError(Exception):
    """A JSON-RPC error answer: ``code`` (JSON-RPC's or A2A's), a message, and the
    DESIGN §10 code it stands for (in the error's ``google.rpc.ErrorInfo`` data)."""

    def __init__(self, code: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.reason is not None:
            error["data"] = [
                {
                    "@type": _ERROR_INFO,
                    "reason": self.reason.upper(),
                    "domain": "trio-agents",
                    "metadata": {"code": self.reason},
                }
            ]
        return error


def _host_error(exc: HostError, *, op: str) -> RpcError:
    """The JSON-RPC error of a host's refusal, for the A2A operation that met it."""
    code = HOST_CODES.get(exc.code, exc.code)  # a §10 code, as every face gives
    if code == "not_found":
        return RpcError(TASK_NOT_FOUND, exc.message, code)
    if code == "run_closed":
        if op == "cancel":
            return RpcError(TASK_NOT_CANCELABLE, exc.message, code)
        return RpcError(UNSUPPORTED_OPERATION, exc.message, code)
    if code == "invalid_request":
        return RpcError(INVALID_PARAMS, exc.message, code)
    if code == "internal":
        return RpcError(INTERNAL_ERROR, exc.message, code)
    # limit_exceeded, inbox_full, session_busy, no_active_run: A2A has no code for
    # them; the §10 code travels in the data.
    return RpcError(SERVER_ERROR, exc.message, code)


def _fail(code: int, message: str) -> NoReturn:
    raise RpcError(code, message)


def _object(params: Mapping[str, Any], name: str, *, required: bool = False) -> dict[str, Any]:
    value = params.get(name)
    if value is None:
        if required:
            _fail(INVALID_PARAMS, f"params.{name} is required")
        return {}
    if not isinstance(value, Mapping):
        _fail(INVALID_PARAMS, f"params.{name} must be an object")
    return dict(value)


def _string(params: Mapping[str, Any], name: str, *, required: bool = False) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        if required:
            _fail(INVALID_PARAMS, f"params.{name} is required")
        return None
    if not isinstance(value, str):
        _fail(INVALID_PARAMS, f"params.{name} must be a string")
    return value


def _count(params: Mapping[str, Any], name: str) -> int | None:
    value = params.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _fail(INVALID_PARAMS, f"params.{name} must be an integer >= 0")
    return value


def _message_text(message: Mapping[str, Any]) -> str:
    """The text a message gives the run: its text parts, and data parts as JSON, in
    order, one per line. File parts are refused: a run's input is text."""
    parts = message.get("parts")
    if not isinstance(parts, list) or not parts:
        _fail(INVALID_PARAMS, "params.message.parts must be a non-empty array")
    texts: list[str] = []
    for part in parts:
        if not isinstance(part, Mapping):
            _fail(INVALID_PARAMS, "each part must be an object")
        if isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif "data" in part:
            texts.append(json.dumps(part["data"], ensure_ascii=False))
        elif "url" in part or "raw" in part:
            raise RpcError(CONTENT_TYPE_NOT_SUPPORTED, "file parts are not supported: send text")
        else:
            _fail(INVALID_PARAMS, "a part needs text, data, url or raw")
    return "\n".join(texts)


@attrs.frozen
class _Decision:
    approve: bool
    call_id: str | None
    message: str | None
    run_id: str | None = None
    # An approval's answer to a question that asks for content (its schema's form).
    content: dict[str, Any] | None = None


def _decision(message: Mapping[str, Any]) -> _Decision | None:
    """The approval decision a message carries: a data part ``{"decision": "approve" |
    "reject", "callId"?, "message"?, "content"?}`` (``content``: a question's answer,
    a JSON object), or a message whose only text is ``approve`` or
    ``reject`` (for plain-text clients; it names no call)."""
    parts = message.get("parts")
    if not isinstance(parts, list):
        return None
    for part in parts:
        data = part.get("data") if isinstance(part, Mapping) else None
        if isinstance(data, Mapping) and "decision" in data:
            decision = data["decision"]
            if decision not in ("approve", "reject"):
                _fail(INVALID_PARAMS, 'decision must be "approve" or "reject"')
            call_id, text, run_id = data.get("callId"), data.get("message"), data.get("runId")
            for name, value in (("callId", call_id), ("message", text), ("runId", run_id)):
                if value is not None and not isinstance(value, str):
                    _fail(INVALID_PARAMS, f"{name} must be a string")
            content = data.get("content")
            if content is not None and not isinstance(content, dict):
                _fail(INVALID_PARAMS, "content must be a JSON object")
            if content is not None and decision != "approve":
                _fail(INVALID_PARAMS, "content answers an approval only")
            return _Decision(decision == "approve", call_id, text, run_id, content)
    if len(parts) == 1 and isinstance(parts[0], Mapping) and isinstance(parts[0].get("text"), str):
        word = parts[0]["text"].strip().lower()
        if word in ("approve", "reject"):
            return _Decision(word == "approve", None, None)
    return None


def _request_object(body: bytes) -> dict[str, Any]:
    """The body as one JSON-RPC request object, or the error it deserves (answered
    with a null id: there is no object to read one from)."""
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise RpcError(PARSE_ERROR, "the body is not valid UTF-8 JSON") from None
    if isinstance(data, list):
        raise RpcError(INVALID_REQUEST, "batch requests are not supported: send one at a time")
    if not isinstance(data, dict):
        raise RpcError(INVALID_REQUEST, "a request must be a JSON object")
    return data


def _valid_id(data: Mapping[str, Any]) -> str | int | None:
    """The request's id if it is one JSON-RPC allows here (a string or an integer; a
    notification, without one, is not served), else None."""
    rpc_id = data.get("id")
    if isinstance(rpc_id, bool) or not isinstance(rpc_id, str | int):
        return None
    if isinstance(rpc_id, str) and clean_text(rpc_id) is not rpc_id:
        # A lone surrogate ("\ud800" is valid JSON): the answer, which must echo the
        # id, could not be encoded (a 500). Not repaired: the client would not know it.
        return None
    return rpc_id


def _sse(result: Mapping[str, Any], rpc_id: Any, *, event_id: int | None = None) -> bytes:
    """One SSE event carrying one JSON-RPC response (A2A §9.4.2)."""
    body = json.dumps({"jsonrpc": "2.0", "id": rpc_id, "result": result}, ensure_ascii=False)
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}data: {body}\n\n".encode()


def _sse_error(error: RpcError, rpc_id: Any) -> bytes:
    body = json.dumps({"jsonrpc": "2.0", "id": rpc_id, "error": error.to_json()})
    return f"event: error\ndata: {body}\n\n".encode()


def routes(face: Face) -> Routes:
    """The A2A routes: the card (public: it names the agents and how to authenticate,
    and holds no run and no principal's data — A2A's discovery) and ``POST /a2a``
    (authenticated, like every route holding runs)."""
    a2a = A2AFace(face)
    return Routes(
        routes=[Route("/a2a", a2a.rpc, methods=["POST"])],
        public=[Route("/.well-known/agent-card.json", a2a.card, methods=["GET"])],
    )


@attrs.define(eq=False)
class A2AFace:
    """The A2A face of a host (see the module docstring).

    Attributes:
        face: the host, the limits and the stream bookkeeping every face shares.
        name: the agent name the card gives the server.
    """

    face: Face
    name: str = "trio-agents"

    @property
    def host(self) -> RunHost:
        return self.face.host

    # ----------------------------------------------------------------- the card

    def card_json(self, base_url: str) -> dict[str, Any]:
        """The agent card (A2A §4.4.1): the server as one agent whose skills are its
        registered agents, one JSON-RPC interface speaking 1.0 and 0.3."""
        url = base_url.rstrip("/") + "/a2a"
        return {
            "name": self.name,
            "description": "trio-agents server: each skill is an agent; pick one with"
            ' metadata {"agent": "<skill id>"} on SendMessage.',
            "supportedInterfaces": [
                {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
                {"url": url, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
            ],
            "version": __version__,
            "capabilities": {
                "streaming": True,
                "pushNotifications": False,
                "extendedAgentCard": False,
            },
            "securitySchemes": {
                "bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}},
            },
            "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
            "defaultInputModes": ["text/plain", "application/json"],
            "defaultOutputModes": ["text/plain"],
            # An agent's own description when its author gave one (the card is
            # public: never anything from its instructions).
            "skills": [
                {
                    "id": name,
                    "name": name,
                    "description": shown_description(agent.description) or f"runs the {name} agent",
                    "tags": ["agent"],
                }
                for name, agent in sorted(self.host.agents.items())
            ],
        }

    async def card(self, request: Request) -> Response:
        return JSONResponse(
            self.card_json(str(request.base_url)), headers={"Cache-Control": "no-store"}
        )

    # --------------------------------------------------------------- JSON-RPC

    async def rpc(self, request: Request) -> Response:
        """One JSON-RPC request: parsed, checked, dispatched; every failure is a
        JSON-RPC error (HTTP 200, as A2A's clients expect), except a body past the
        limit (413) — the HTTP layer refuses it before JSON-RPC starts."""
        principal = principal_of(request)
        try:
            body = await read_body(request, self.face.limits.max_body_bytes)
        except HttpError as exc:
            return error_response(exc.code, exc.message, status=exc.status, headers=exc.headers)
        rpc_id: Any = None
        try:
            data = _request_object(body)
            # Every later error answers the request's id, once it could be read
            # (JSON-RPC 2.0 §5: null only when it could not).
            rpc_id = _valid_id(data)
            call = self._parse(data)
            version = request.headers.get("a2a-version", "").strip()
            if version and ".".join(version.split(".")[:2]) not in _VERSIONS:
                raise RpcError(
                    VERSION_NOT_SUPPORTED, f"A2A-Version {version} is not supported (1.0, 0.3)"
                )
            method, legacy = call["method"], call["method"] in V03_METHODS
            params = call["params"]
            if legacy:
                params = params_from_v03(method, params)
                method = V03_METHODS[method]
            if method in ("SendStreamingMessage", "SubscribeToTask"):
                stream = await self._open_stream(principal, method, params, request)
                return self._stream_response(principal, stream, rpc_id, legacy, method)
            result = await self._call(principal, method, params, request)
            if legacy:
                result = result_to_v03(method, result)
            return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "result": result})
        except RpcError as exc:
            return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "error": exc.to_json()})

    def _parse(self, data: dict[str, Any]) -> dict[str, Any]:
        """The call a request object asks for, or the JSON-RPC error it deserves."""
        if data.get("jsonrpc") != "2.0":
            raise RpcError(INVALID_REQUEST, 'jsonrpc must be "2.0"')
        rpc_id = _valid_id(data)
        if rpc_id is None:
            raise RpcError(
                INVALID_REQUEST,
                "id must be a string (Unicode text, no lone surrogate) or an integer"
                " (no notifications)",
            )
        method = data.get("method")
        if not isinstance(method, str):
            raise RpcError(INVALID_REQUEST, "method must be a string")
        if method in _PUSH_METHODS:
            raise RpcError(PUSH_NOT_SUPPORTED, "push notifications are not supported")
        if method not in _METHODS and method not in V03_METHODS:
            raise RpcError(METHOD_NOT_FOUND, f"unknown method {method[:100]!r}")
        params = data.get("params")
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "params must be an object")
        if unstorable(params):
            # Valid JSON, but no session store keeps it; every face refuses it alike.
            raise RpcError(
                INVALID_PARAMS,
                "a string holds a NUL character or a lone surrogate (U+D800..U+DFFF)",
            )
        return {"id": rpc_id, "method": method, "params": params}

    async def _call(
        self, principal: str, method: str, params: dict[str, Any], request: Request
    ) -> dict[str, Any]:
        if method == "SendMessage":
            return await self._send_message(principal, params, request)
        if method == "GetTask":
            task_id = _string(params, "id", required=True)
            assert task_id is not None
            history = _count(params, "historyLength")
            view = await self._snapshot(principal, task_id)
            return view.task(history_length=history)
        if method == "ListTasks":
            return await self._list_tasks(principal, params)
        if method == "CancelTask":
            return await self._cancel_task(principal, params)
        raise AssertionError(method)  # pragma: no cover - _parse lets no other through

    # ------------------------------------------------------------- the host side

    async def _snapshot(self, principal: str, run_id: str, info: Any = None) -> TaskView:
        """The task as of the seq of ``info``, the host's record of the run (None: its
        record read now), rebuilt from its log. Every task this face answers with is
        built here or by :func:`_rebuilt` (GetTask, ListTasks, SendMessage, CancelTask,
        a stream's first task), so two methods never disagree about one task."""
        try:
            async with self.host.events(principal, run_id) as events:
                if info is None:
                    info = await self.host.get(principal, run_id)
                view, _ = await _rebuilt(info, events)
                return view
        except HostError as exc:
            raise _host_error(exc, op="get") from None

    async def _settle(self, principal: str, run_id: str, from_seq: int) -> None:
        """Wait until the run, from ``from_seq`` on, ends or waits for approval (a
        blocking ``SendMessage``'s answer, A2A §3.2.2)."""
        try:
            async with self.host.events(
                principal, run_id, from_seq=from_seq, status_only=True
            ) as events:
                async for hosted in events:
                    event = hosted.event
                    if event.get("type") == "run.updated" and event.get("status") in (
                        "awaiting_approval",
                        "completed",
                        "failed",
                        "cancelled",
                    ):
                        return
        except HostError as exc:
            raise _host_error(exc, op="get") from None

    async def _settle_or_gone(
        self, request: Request, principal: str, run_id: str, from_seq: int
    ) -> None:
        """:meth:`_settle`, unless the client goes away first: a blocking SendMessage
        must not hold its handler (and a subscription) for a run nobody waits for. The
        run goes on either way (GetTask or SubscribeToTask find it)."""
        failed: list[RpcError] = []
        gone = False

        async def settle() -> None:
            try:
                await self._settle(principal, run_id, from_seq)
            except RpcError as exc:
                failed.append(exc)
            nursery.cancel_scope.cancel()

        async def watch() -> None:
            nonlocal gone
            while (await request.receive())["type"] != "http.disconnect":
                pass
            gone = True
            nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(settle)
            nursery.start_soon(watch)
        if failed:
            raise failed[0]
        if gone:
            raise RpcError(INTERNAL_ERROR, "the client went away")  # nobody reads it

    async def _start(self, principal: str, params: dict[str, Any]) -> str:
        """Start a run for a message that names no task; returns its id."""
        message = _object(params, "message", required=True)
        text = _message_text(message)
        agent = _object(params, "metadata").get("agent") or _object(message, "metadata").get(
            "agent"
        )
        if agent is None:
            if len(self.host.agents) != 1:
                _fail(
                    INVALID_PARAMS,
                    'name the agent with metadata {"agent": ...}; the skills of the card are'
                    " the agents",
                )
            (agent,) = self.host.agents
        if not isinstance(agent, str) or agent not in self.host.agents:
            _fail(INVALID_PARAMS, f"unknown agent {str(agent)[:100]!r}")
        context_id = _string(message, "contextId") or f"a2a-{uuid.uuid4().hex}"
        request = StartRequest(
            agent=agent,
            input=(UserMessage(text),),
            session_id=context_id,
            on_disconnect="continue",
        )
        try:
            return await self.host.start(Origin(principal=principal), request)
        except HostError as exc:
            raise _host_error(exc, op="start") from None

    async def _continue(self, principal: str, task_id: str, message: dict[str, Any]) -> int:
        """A message to an existing task: the decision for a waiting call, or more
        input for a working run (injected for its next turn). Returns the seq the run
        was at before, from which its answer is awaited."""
        try:
            info = await self.host.get(principal, task_id)
        except HostError as exc:
            raise _host_error(exc, op="get") from None
        context_id = _string(message, "contextId")
        if context_id is not None and context_id != (info.session_id or ""):
            _fail(INVALID_PARAMS, "contextId is not the task's")
        if str(info.status) in ("completed", "failed", "cancelled"):
            raise RpcError(
                UNSUPPORTED_OPERATION, f"the task is {info.status}: it takes no more messages"
            )
        decision = _decision(message)
        try:
            if str(info.status) == "awaiting_approval":
                if decision is None:
                    _fail(
                        INVALID_PARAMS,
                        'the task waits for approval: send a data part {"decision": "approve"'
                        ' | "reject", "callId": ..., "content"?: {...}}',
                    )
                run_id, call_id = await self._waiting_call(principal, task_id, decision)
                if decision.approve:
                    await self.host.approve(principal, run_id, call_id, decision.content)
                else:
                    await self.host.reject(principal, run_id, call_id, decision.message)
            elif decision is not None:
                _fail(INVALID_PARAMS, "no call of this task waits for approval")
            else:
                text = _message_text(message)
                await self.host.inject(principal, task_id, (UserMessage(text),))
        except HostError as exc:
            if exc.code == "not_found" and decision is not None:
                # the call, not the task, is unknown (the task was found above)
                raise RpcError(INVALID_PARAMS, exc.message, exc.code) from None
            raise _host_error(exc, op="message") from None
        return int(info.seq) + 1

    async def _waiting_call(
        self, principal: str, task_id: str, decision: _Decision
    ) -> tuple[str, str]:
        """The run and call a decision is for: among the calls the task waits for
        (its own and its descendants'), the one it names — or the only one."""
        view = await self._snapshot(principal, task_id)
        waiting = [(c["runId"], c["callId"]) for c in view.waiting_calls()]
        if decision.call_id is not None:
            waiting = [
                (run, call)
                for run, call in waiting
                if call == decision.call_id and decision.run_id in (None, run)
            ]
            if not waiting:
                _fail(INVALID_PARAMS, f"no call {decision.call_id[:100]!r} waits for approval")
        if len(waiting) != 1:
            _fail(INVALID_PARAMS, "several calls wait: name one with callId (and runId)")
        return waiting[0]

    async def _send_message(
        self, principal: str, params: dict[str, Any], request: Request
    ) -> dict[str, Any]:
        message = _object(params, "message", required=True)
        config = _object(params, "configuration")
        history = _count(config, "historyLength")
        immediately = config.get("returnImmediately", False)
        if not isinstance(immediately, bool):
            _fail(INVALID_PARAMS, "configuration.returnImmediately must be a boolean")
        task_id = _string(message, "taskId")
        if task_id is None:
            task_id = await self._start(principal, params)
            from_seq = 1
        else:
            from_seq = await self._continue(principal, task_id, message)
        if not immediately:
            await self._settle_or_gone(request, principal, task_id, from_seq)
        view = await self._snapshot(principal, task_id)
        return {"task": view.task(history_length=history)}

    async def _cancel_task(self, principal: str, params: dict[str, Any]) -> dict[str, Any]:
        task_id = _string(params, "id", required=True)
        assert task_id is not None
        reason = _object(params, "metadata").get("reason")
        if reason is not None and not isinstance(reason, str):
            _fail(INVALID_PARAMS, "metadata.reason must be a string")
        try:
            info = await self.host.get(principal, task_id)
            if str(info.status) in ("completed", "failed", "cancelled"):
                raise RpcError(TASK_NOT_CANCELABLE, f"the task is {info.status}", "run_closed")
            await self.host.cancel(principal, task_id, reason or "cancelled over A2A")
            # The answer waits for the run to have stopped: its terminal update.
            await self.host.wait_terminal(principal, task_id)
        except HostError as exc:
            raise _host_error(exc, op="cancel") from None
        view = await self._snapshot(principal, task_id)
        return view.task()

    async def _list_tasks(self, principal: str, params: dict[str, Any]) -> dict[str, Any]:
        context_id = _string(params, "contextId")
        state = _string(params, "status")
        if state == "TASK_STATE_UNSPECIFIED":
            state = None
        page_size = _count(params, "pageSize") or 50
        page_size = min(page_size, _MAX_PAGE)
        token = _string(params, "pageToken")
        history = _count(params, "historyLength")
        with_artifacts = params.get("includeArtifacts", False)
        if not isinstance(with_artifacts, bool):
            _fail(INVALID_PARAMS, "includeArtifacts must be a boolean")
        try:
            infos = await self.host.list(principal)
        except HostError as exc:
            raise _host_error(exc, op="list") from None
        # Newest first: the host lists in start order. Filtered on the host's record,
        # and each task of the page built from that same record (as of its seq), so a
        # listed task is in the state it was filtered by, and is what GetTask gives.
        infos = [
            info
            for info in reversed(infos)
            if (context_id is None or (info.session_id or "") == context_id)
            and (state is None or STATE_OF[str(info.status)] == state)
        ]
        start = 0
        if token is not None:
            ids = [info.run_id for info in infos]
            if token not in ids:
                _fail(INVALID_PARAMS, "pageToken is not a token this server gave")
            start = ids.index(token) + 1
        page = infos[start : start + page_size]
        tasks = []
        for info in page:
            try:
                view = await self._snapshot(principal, info.run_id, info)
            except RpcError:
                continue  # gone between the list and now
            tasks.append(view.task(history_length=history or 0, artifacts=with_artifacts))
        more = start + page_size < len(infos)
        return {
            "tasks": tasks,
            "nextPageToken": page[-1].run_id if more and page else "",
            "pageSize": page_size,
            "totalSize": len(infos),
        }

    # ---------------------------------------------------------------- streams

    async def _open_stream(
        self, principal: str, method: str, params: dict[str, Any], request: Request
    ) -> tuple[str, int | None]:
        """Do what a stream starts with (start the run, answer the approval, or check
        the task is live), so a refusal is a plain JSON-RPC error, before the SSE
        answer starts. Returns the task id and the Last-Event-ID asked for."""
        after: int | None = None
        last = request.headers.get("last-event-id")
        if last is not None:
            try:
                after = int(last)
            except ValueError:
                _fail(INVALID_PARAMS, "Last-Event-ID must be a seq (an integer)")
        if method == "SubscribeToTask":
            task_id = _string(params, "id", required=True)
            assert task_id is not None
            try:
                info = await self.host.get(principal, task_id)
            except HostError as exc:
                raise _host_error(exc, op="get") from None
            if str(info.status) in ("completed", "failed", "cancelled"):
                raise RpcError(
                    UNSUPPORTED_OPERATION, f"the task is {info.status}: nothing more to stream"
                )
            return task_id, after
        message = _object(params, "message", required=True)
        task_id = _string(message, "taskId")
        if task_id is None:
            task_id = await self._start(principal, params)
        else:
            await self._continue(principal, task_id, message)
        return task_id, after

    def _stream_response(
        self, principal: str, opened: tuple[str, int | None], rpc_id: Any, legacy: bool, method: str
    ) -> Response:
        task_id, after = opened
        host = self.host

        def shaped(result: dict[str, Any]) -> dict[str, Any]:
            return result_to_v03(method, result) if legacy else result

        @asynccontextmanager
        async def source() -> AsyncIterator[AsyncIterator[bytes]]:
            async with host.events(principal, task_id) as events:
                info = await host.get(principal, task_id)
                view, frames = await _rebuilt(info, events, after=after)
                backlog = [_sse(shaped(frame), rpc_id) for frame in frames]
                first = _sse(shaped({"task": view.task()}), rpc_id, event_id=view.seq)
                yield _frames(view, [first, *backlog], events, shaped, rpc_id)

        return EventStream(self.face, principal, source)


async def _rebuilt(
    info: Any, events: AsyncIterator[HostedEvent], *, after: int | None = None
) -> tuple[TaskView, list[dict[str, Any]]]:
    """The task as of ``info``'s seq: the view of the host's record, with the run's
    log (``events``, a subscription from seq 1) applied up to that seq; and, with
    ``after``, the stream events of the seqs after it (a ``Last-Event-ID`` backlog)."""
    view = TaskView.from_info(info)
    backlog: list[dict[str, Any]] = []
    if info.seq > 0:
        async for hosted in events:
            view.apply(hosted.event)
            if after is not None and hosted.seq > after:
                frame = stream_event(view, hosted.event)
                if frame is not None:
                    backlog.append(frame)
            if hosted.seq >= info.seq:
                break
    return view, backlog


async def _frames(
    view: TaskView,
    first: list[bytes],
    events: AsyncIterator[HostedEvent],
    shaped: Callable[[dict[str, Any]], dict[str, Any]],
    rpc_id: Any,
) -> AsyncIterator[bytes]:
    """The SSE frames of a task stream: the first task (and the asked-for backlog),
    then one frame per later event, until the run's terminal update. Holds no scope:
    the subscription is the caller's context manager."""
    for frame_bytes in first:
        yield frame_bytes
    try:
        async for hosted in events:
            view.apply(hosted.event)
            frame = stream_event(view, hosted.event)
            if frame is not None:
                yield _sse(shaped(frame), rpc_id, event_id=hosted.seq)
    except HostError as exc:
        yield _sse_error(_host_error(exc, op="get"), rpc_id)
