"""The REST + SSE face (DESIGN §19): the websocket channel's ops as HTTP routes, and a
run's events as Server-Sent Events.

Bodies are validated by the very checks of the websocket channel's request frames
(``hosting/_requests.py``): the same fields, types, bounds and messages on both faces,
with the same meaning. ``POST /runs`` with ``subscribe`` answers with the run's event
stream, which is the connection that started the run: its end before the run's applies
``on_disconnect`` through the host's owner record, as a websocket's close does. Without
``subscribe`` no connection stays open, so ``on_disconnect: "cancel"`` is refused.

Event streams: every message carries the event as the websocket channel's ``event``
frame carries it (``{"run_id", "seq", "event"}``), with ``id: <seq>``. A client that
lost the stream re-attaches with ``Last-Event-ID: <seq>`` (or ``?from_seq=<seq + 1>``
where it cannot set headers; the header wins when both are given, as an EventSource
re-sends the header with the original URL) and gets every event after it, once. Past
the run's retention, the stream starts with an ``events.dropped`` event (it has no
``id:``, so the client's last id stays the last event it got).

A tree stream (``?tree=1``) merges the subtree's events, each with its own run id and
per-run seq, so its ids are ``<run_id>:<seq>``: the last event the client got. The
merged order is fixed once it happened, so a re-attach replays the tree and resumes
right after that event; if that event is no longer retained, the stream starts with
``events.dropped`` (``first_missing_seq`` and ``count`` null: what is missing spans
several runs) and goes on with the oldest event retained after it.

``POST /runs/{id}/replay`` (DESIGN §23) sends a run's recorded ``model.request`` again,
to the model of a served agent named in the body — never a model string or a URL from
the client — and answers the response. It is the one route that waits on a model: it
is held against the principal's ``max_streams_per_principal`` and cancelled when the
client leaves or the server begins to shut down.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any, Final, final

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive

from .._exceptions import ModelError
from .._model import model_name
from .._replay import ModelResponse
from .._replay import replay as replay_request
from ..hosting import HostedEvent, HostError, Origin, StartRequest, run_timeline
from ..hosting._error_codes import ProtocolError
from ..hosting._requests import UNSTORABLE as _UNSTORABLE
from ..hosting._requests import (
    RunApprove,
    RunCancel,
    RunInject,
    RunReject,
    RunStart,
    RunWithdraw,
    SessionCancel,
    SessionFork,
    validate_request,
)
from ..hosting._server_limits import MAX_NAME_LENGTH
from ._event_stream import EventStream, sse_message
from ._face import Face, Routes
from ._http_errors import HttpError
from ._http_requests import principal_of, read_json

__all__ = ["routes"]


@final
class _StreamOwner:
    """The owner (:class:`~trio_agents.hosting.Origin`) of a run started by ``POST
    /runs`` with ``subscribe``: the stream answering it. Compared by identity."""

    __slots__ = ()


def _answer(data: Mapping[str, Any], status: int = 200) -> JSONResponse:
    return JSONResponse(dict(data), status_code=status, headers={"Cache-Control": "no-store"})


def _validate(op: str, body: Any, **path: str) -> Any:
    """``body`` (plus the path's fields) checked as the websocket's ``op`` frame."""
    if not isinstance(body, dict):
        raise HttpError("invalid_request", "the body must be a JSON object")
    refused = sorted(set(body) & ({"id", "op"} | set(path)))
    if refused:
        shown = ", ".join(repr(name[:64]) for name in refused[:5])
        raise HttpError("invalid_request", f"unknown field(s) for this route: {shown}")
    try:
        # The body is parsed JSON already (read_json): validated as it is, once.
        return validate_request({**body, **path, "id": 0, "op": op})
    except ProtocolError as exc:
        raise HttpError(exc.code, exc.message) from None


def _flag(request: Request, name: str) -> bool:
    value = request.query_params.get(name)
    if value is None or value in ("0", "false", ""):
        return False
    if value in ("1", "true"):
        return True
    raise HttpError("invalid_request", f"?{name}= must be 1, true, 0 or false")


def _info(info: Any) -> dict[str, Any]:
    json_of = getattr(info, "to_json", None)
    return dict(json_of()) if callable(json_of) else dict(info)


class _Rest:
    def __init__(self, face: Face) -> None:
        self.face = face
        self.host = face.host

    async def _body(self, request: Request, *, empty: Any = None) -> Any:
        return await read_json(request, self.face.limits.max_body_bytes, empty=empty)

    async def start(self, request: Request) -> Response:
        principal = principal_of(request)
        start: RunStart = _validate("run.start", await self._body(request))
        if start.subscribe is not None:
            # The answer is the run's event stream, and the stream is the connection
            # that owns the run: EventStream enters the source (which starts the run)
            # before it answers, so a refused start is an ordinary JSON error.
            return EventStream(self.face, principal, lambda: self._subscribed(principal, start))
        if start.on_disconnect == "cancel":
            raise HttpError(
                "invalid_request",
                "on_disconnect 'cancel' needs 'subscribe' over HTTP: the run's event"
                " stream answering this request is the connection whose drop cancels it",
            )
        run_id = await self._start_run(Origin(principal=principal), start)
        return JSONResponse(
            {"run_id": run_id},
            status_code=201,
            headers={"Location": f"/runs/{run_id}", "Cache-Control": "no-store"},
        )

    async def _start_run(self, origin: Origin, start: RunStart) -> str:
        return await self.host.start(
            origin,
            StartRequest(
                agent=start.agent,
                input=start.input,
                session_id=start.session_id,
                on_disconnect=start.on_disconnect,
                on_busy=start.on_busy,
                # The wire mapping: the host merges it with its max_run_limits first.
                limits=start.limits or None,
            ),
        )

    @asynccontextmanager
    async def _subscribed(
        self, principal: str, start: RunStart
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """Start the run owned by this stream, and stream it from seq 1 (as the
        websocket's ``run.start`` with ``subscribe``). When the stream ends — the run's
        terminal update sent, or the client gone (or cut for not reading within
        ``send_timeout``) — its owner is gone: the host applies ``on_disconnect``
        (nothing left to do for a run that ended, nor for a refused start, whose owner
        record the host may have made already)."""
        owner = _StreamOwner()
        try:
            run_id = await self._start_run(Origin(principal=principal, owner=owner), start)
            async with self.host.events(
                principal, run_id, from_seq=1, status_only=start.subscribe == "status"
            ) as events:
                yield _messages(events, tree=False)
        finally:
            self.host.disconnected(owner)

    async def list(self, request: Request) -> Response:
        runs = await self.host.list(principal_of(request), all=_flag(request, "all"))
        return _answer({"runs": [_info(info) for info in runs]})

    async def get(self, request: Request) -> Response:
        run_id = _path_id(request, "run_id")
        return _answer({"run": _info(await self.host.get(principal_of(request), run_id))})

    async def timeline(self, request: Request) -> Response:
        """``GET /runs/{id}/timeline``: the run's subtree as spans (DESIGN §23), derived
        from the events the host serves (:func:`~trio_agents.hosting.run_timeline`)."""
        run_id = _path_id(request, "run_id")
        found = await run_timeline(self.host, principal_of(request), run_id)
        return _answer({"timeline": found.to_json()})

    async def cancel(self, request: Request) -> Response:
        principal = principal_of(request)
        wait = _flag(request, "wait")
        cancel: RunCancel = _validate(
            "run.cancel", await self._body(request, empty={}), run_id=request.path_params["run_id"]
        )
        await self.host.cancel(principal, cancel.run_id, cancel.reason, cancel.mode)
        if not wait:
            return _answer({"run_id": cancel.run_id}, 202)
        return _answer({"run": _info(await self.host.wait_terminal(principal, cancel.run_id))})

    async def inject(self, request: Request) -> Response:
        inject: RunInject = _validate(
            "run.inject", await self._body(request), run_id=request.path_params["run_id"]
        )
        injection_id = await self.host.inject(
            principal_of(request), inject.run_id, inject.items, inject.when
        )
        return _answer({"injection_id": injection_id})

    async def withdraw(self, request: Request) -> Response:
        withdraw: RunWithdraw = _validate(
            "run.withdraw", await self._body(request), run_id=request.path_params["run_id"]
        )
        withdrawn = await self.host.withdraw(
            principal_of(request), withdraw.run_id, withdraw.injection_id
        )
        return _answer({"withdrawn": withdrawn})

    async def approve(self, request: Request) -> Response:
        approve: RunApprove = _validate(
            "run.approve", await self._body(request), run_id=request.path_params["run_id"]
        )
        await self.host.approve(
            principal_of(request), approve.run_id, approve.call_id, approve.content
        )
        return _answer({"run_id": approve.run_id})

    async def reject(self, request: Request) -> Response:
        reject: RunReject = _validate(
            "run.reject", await self._body(request), run_id=request.path_params["run_id"]
        )
        await self.host.reject(principal_of(request), reject.run_id, reject.call_id, reject.message)
        return _answer({"run_id": reject.run_id})

    async def cancel_session(self, request: Request) -> Response:
        principal = principal_of(request)
        wait = _flag(request, "wait")
        cancel: SessionCancel = _validate(
            "session.cancel",
            await self._body(request, empty={}),
            session_id=request.path_params["session_id"],
        )
        run_id = await self.host.cancel_session(
            principal, cancel.session_id, cancel.reason, cancel.mode
        )
        if not wait:
            return _answer({"run_id": run_id}, 202)
        return _answer({"run": _info(await self.host.wait_terminal(principal, run_id))})

    async def fork_session(self, request: Request) -> Response:
        """``POST /sessions/{id}/fork`` (DESIGN §23): ``{"new_session_id", "at"}``."""
        fork: SessionFork = _validate(
            "session.fork", await self._body(request), session_id=request.path_params["session_id"]
        )
        items = await self.host.fork_session(
            principal_of(request), fork.session_id, fork.new_session_id, fork.at
        )
        return _answer({"session_id": fork.new_session_id, "items": items}, 201)

    async def replay(self, request: Request) -> Response:
        """``POST /runs/{id}/replay`` (DESIGN §23): ``{"seq", "agent"}`` — the run's
        recorded ``model.request`` event at ``seq`` sent again to the model of the
        served agent named ``agent``; answers the response (``ta.replay``).

        The model is only ever a served agent's, chosen by name: a client never names
        a model string or a URL, which would let anyone holding a token make the server
        call any host. The request is the one the run recorded, never one from the
        body. Replays are rate-limited per principal (``HttpLimits.replay_rate`` and
        ``replay_burst``). While the model answers, the replay holds one of the principal's
        ``max_streams_per_principal`` (like an event stream, it is a request that
        lasts) and is cancelled when the client leaves or the server shuts down."""
        principal = principal_of(request)
        run_id = _path_id(request, "run_id")
        seq, name = _replay_body(await self._body(request))
        agent = self.host.agents.get(name)
        if agent is None:
            raise HttpError("not_found", f"no agent named {name[:64]!r} is served")
        uncount = self.face.open_stream(principal)
        try:
            recorded = await self._recorded_request(principal, run_id, seq)
            # A model call the server pays for: rate-limited (a refused request is not
            # counted: nothing was called).
            self.face.take_replay(principal)
            response = await _unless_disconnected(
                self.face, request.receive, lambda: replay_request(recorded, model=agent.model)
            )
        finally:
            uncount()
        if response is None:  # the client left: nobody reads this answer
            return Response(status_code=499)
        return _answer(
            {
                "run_id": run_id,
                "seq": seq,
                "turn": recorded.get("turn"),
                "recorded_model": recorded.get("model"),
                "agent": name,
                "model": model_name(agent.model),
                "response": response.to_json(),
            }
        )

    async def _recorded_request(self, principal: str, run_id: str, seq: int) -> dict[str, Any]:
        """The run's ``model.request`` event at ``seq``, with its request recorded."""
        info = await self.host.get(principal, run_id)  # not_found for another principal's
        if seq > info.seq:
            raise HttpError(
                "invalid_request", f"run {run_id} has no event {seq} (its latest is {info.seq})"
            )
        async with self.host.events(principal, run_id, from_seq=seq) as events:
            hosted = await anext(aiter(events), None)
        if hosted is None or hosted.seq != seq or hosted.event.get("type") == "events.dropped":
            raise HttpError("invalid_request", f"event {seq} of run {run_id} is no longer retained")
        event = dict(hosted.event)
        if event.get("type") != "model.request":
            raise HttpError(
                "invalid_request",
                f"event {seq} of run {run_id} is a {str(event.get('type'))[:64]!r} event, not a"
                " model.request (recorded with the run option record_requests=True)",
            )
        if event.get("request") is None:
            raise HttpError(
                "invalid_request",
                f"the request of event {seq} of run {run_id} was not recorded"
                f" ({event.get('omitted')}; {event.get('size')} bytes)",
            )
        return event

    async def events(self, request: Request) -> Response:
        principal = principal_of(request)
        run_id = _path_id(request, "run_id")
        tree = _flag(request, "tree")
        kind = request.query_params.get("events", "all")
        if kind not in ("all", "status"):
            raise HttpError("invalid_request", "?events= must be all or status")
        last = request.headers.get("last-event-id")
        if tree:
            if "from_seq" in request.query_params and last is None:
                raise HttpError(
                    "invalid_request",
                    "a tree stream has no ?from_seq= (seqs are per run): re-attach with"
                    " Last-Event-ID: <run_id>:<seq>",
                )
            after = None if last is None else _tree_id(last)
            return EventStream(
                self.face,
                principal,
                lambda: self._tree(principal, run_id, kind == "status", after),
            )
        from_seq = 1 if last is None else _seq(last, "Last-Event-ID") + 1
        if last is None and "from_seq" in request.query_params:
            from_seq = max(1, _seq(request.query_params["from_seq"], "?from_seq="))
        return EventStream(
            self.face, principal, lambda: self._run(principal, run_id, kind == "status", from_seq)
        )

    @asynccontextmanager
    async def _run(
        self, principal: str, run_id: str, status_only: bool, from_seq: int
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        async with self.host.events(
            principal, run_id, from_seq=from_seq, status_only=status_only
        ) as events:
            yield _messages(events, tree=False)

    @asynccontextmanager
    async def _tree(
        self, principal: str, run_id: str, status_only: bool, after: tuple[str, int] | None
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        if after is not None:
            await self._check_resume_point(principal, run_id, after)
        async with self.host.events(
            principal, run_id, tree=True, status_only=status_only
        ) as events:
            if after is None:
                yield _messages(events, tree=True)
            else:
                yield _messages(
                    _resume_tree(events, after, self.face.limits.max_tree_resume_events), tree=True
                )

    async def _check_resume_point(
        self, principal: str, run_id: str, after: tuple[str, int]
    ) -> None:
        """Refuse a tree stream's ``Last-Event-ID`` that names no event the tree has
        given (a run outside the subtree, or a seq past the run's latest): resuming
        would hold every live event back, looking for it, until the tree ended or
        ``max_tree_resume_events`` went by — a stream silent for no reason."""
        named, seq = after
        refused = HttpError(
            "invalid_request",
            f"Last-Event-ID names no event of the tree of {run_id!r}"
            " (expected <run_id>:<seq> of an event this stream gave)",
        )
        try:
            info = await self.host.get(principal, named)
        except HostError as exc:
            if exc.code != "not_found":
                raise
            raise refused from None
        if seq > info.seq:
            raise refused
        # Within the subtree: ``run_id`` is the named run or one of its ancestors.
        for _ in range(_MAX_TREE_DEPTH):
            if info.run_id == run_id:
                return
            if info.parent_id is None:
                break
            try:
                info = await self.host.get(principal, info.parent_id)
            except HostError as exc:
                if exc.code != "not_found":
                    raise
                break
        else:
            return  # deeper than looked: resumed as the module docstring says
        raise refused


# How far up a tree stream's resume point is looked for the stream's run (deeper, the
# resume point is taken unchecked).
_MAX_TREE_DEPTH: Final = 64


def _path_id(request: Request, name: str) -> str:
    """A run id from the path, checked as the request frames check one (routes with a
    body check theirs in :func:`_validate`): a NUL or a lone surrogate reached the
    cluster's PostgreSQL queries, which refuse them (a 500 for a GET)."""
    value = str(request.path_params[name])
    if not 0 < len(value) <= MAX_NAME_LENGTH or _UNSTORABLE.search(value):
        raise HttpError(
            "invalid_request",
            f"{name} must be 1 to {MAX_NAME_LENGTH} characters of Unicode text without NUL",
        )
    return value


def _replay_body(body: Any) -> tuple[int, str]:
    """``POST /runs/{id}/replay``'s body: ``{"seq": <int >= 1>, "agent": <name>}``."""
    if not isinstance(body, dict):
        raise HttpError("invalid_request", "the body must be a JSON object")
    unknown = sorted(set(body) - {"seq", "agent"})
    if unknown:
        shown = ", ".join(repr(name[:64]) for name in unknown[:5])
        raise HttpError("invalid_request", f"unknown field(s) for this route: {shown}")
    seq, agent = body.get("seq"), body.get("agent")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 1 <= seq < 2**53:
        raise HttpError(
            "invalid_request", "seq must be the seq of a model.request event (an integer >= 1)"
        )
    if not isinstance(agent, str) or not 0 < len(agent) <= MAX_NAME_LENGTH:
        raise HttpError(
            "invalid_request",
            f"agent must be the name of a served agent (1 to {MAX_NAME_LENGTH} characters)",
        )
    return seq, agent


async def _unless_disconnected(
    face: Face, receive: Receive, replayed: Callable[[], Awaitable[ModelResponse]]
) -> ModelResponse | None:
    """``replayed()``, cancelled if the client leaves meanwhile (None then) or the server
    begins to shut down (503, as a new event stream is refused then: a model that takes
    its time must not hold the shutdown). The body is read already, so the next ASGI
    message is ``http.disconnect``."""
    result: list[ModelResponse] = []
    failed: list[HttpError] = []

    async def watch(scope: trio.CancelScope) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        scope.cancel()

    async def closing(scope: trio.CancelScope) -> None:
        await face.wait_closing()
        failed.append(HttpError("internal", "the server is shutting down", status=503))
        scope.cancel()

    async def run(scope: trio.CancelScope) -> None:
        # The refusal is raised past the nursery, not from inside it (which would wrap
        # it in an exception group the error handler does not answer).
        try:
            result.append(await replayed())
        except ModelError as exc:
            failed.append(HttpError("internal", f"the model failed: {str(exc)[:500]}", status=502))
        except ValueError as exc:  # a recorded request ModelRequest.from_json refuses
            failed.append(HttpError("invalid_request", f"the recorded request: {str(exc)[:500]}"))
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        nursery.start_soon(closing, nursery.cancel_scope)
        nursery.start_soon(run, nursery.cancel_scope)
    if failed:
        raise failed[0]
    return result[0] if result else None


def _seq(text: str, name: str) -> int:
    digits = text.strip()
    # Plain ASCII digits only: int() also reads "1_0", "+3" and non-ASCII digits, which
    # no id this face sends looks like (a garbled id must not resume somewhere else).
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 16:
        raise HttpError("invalid_request", f"{name} must be a seq (an integer >= 0)")
    value = int(digits)
    if value >= 2**53:
        raise HttpError("invalid_request", f"{name} must be a seq (an integer >= 0)")
    return value


def _tree_id(text: str) -> tuple[str, int]:
    run_id, colon, seq = text.strip().rpartition(":")
    if not colon or not run_id or len(run_id) > 256:
        raise HttpError("invalid_request", "the Last-Event-ID of a tree stream is <run_id>:<seq>")
    return run_id, _seq(seq, "the seq of Last-Event-ID")


def _dropped(run_id: str) -> HostedEvent:
    return HostedEvent(
        run_id,
        0,
        {
            "type": "events.dropped",
            "run_id": run_id,
            "seq": 0,
            "first_missing_seq": None,
            "count": None,
        },
    )


async def _resume_tree(
    events: AsyncIterator[HostedEvent], after: tuple[str, int], bound: int
) -> AsyncIterator[HostedEvent]:
    """The tree's events after ``after`` (see the module docstring). The events read
    before it is found are held (at most ``bound`` of them: the host's replay of what
    it retains), so that if it is not retained they can still be given, after an
    ``events.dropped``."""
    run_id, seq = after
    held: list[HostedEvent] = []
    found = False
    async for event in events:
        if found:
            yield event
            continue
        if (
            event.run_id == run_id
            and event.seq >= seq
            and event.event.get("type") != "events.dropped"
        ):
            if event.seq == seq:  # the client's last event: resume right after it
                found = True
                held.clear()
                continue
            # A later event of that run, and not the one named: it is no longer retained.
            found = True
            yield _dropped(run_id)
            for old in held:
                yield old
            held.clear()
            yield event
            continue
        held.append(event)
        if len(held) > bound:
            found = True
            yield _dropped(run_id)
            for old in held:
                yield old
            held.clear()
    if not found:
        yield _dropped(run_id)
        for old in held:
            yield old


async def _messages(events: AsyncIterator[HostedEvent], *, tree: bool) -> AsyncIterator[bytes]:
    async for hosted in events:
        dropped = hosted.event.get("type") == "events.dropped"
        data = {"run_id": hosted.run_id, "seq": hosted.seq, "event": dict(hosted.event)}
        if dropped:
            yield sse_message(data)
        elif tree:
            yield sse_message(data, id=f"{hosted.run_id}:{hosted.seq}")
        else:
            yield sse_message(data, id=str(hosted.seq))


def routes(face: Face) -> Routes:
    """The REST + SSE routes (all authenticated)."""
    rest = _Rest(face)
    return Routes(
        routes=[
            Route("/runs", rest.start, methods=["POST"]),
            Route("/runs", rest.list, methods=["GET"]),
            Route("/runs/{run_id}", rest.get, methods=["GET"]),
            Route("/runs/{run_id}/cancel", rest.cancel, methods=["POST"]),
            Route("/runs/{run_id}/inject", rest.inject, methods=["POST"]),
            Route("/runs/{run_id}/withdraw", rest.withdraw, methods=["POST"]),
            Route("/runs/{run_id}/approve", rest.approve, methods=["POST"]),
            Route("/runs/{run_id}/reject", rest.reject, methods=["POST"]),
            Route("/runs/{run_id}/events", rest.events, methods=["GET"]),
            Route("/runs/{run_id}/timeline", rest.timeline, methods=["GET"]),
            Route("/runs/{run_id}/replay", rest.replay, methods=["POST"]),
            Route("/sessions/{session_id}/cancel", rest.cancel_session, methods=["POST"]),
            Route("/sessions/{session_id}/fork", rest.fork_session, methods=["POST"]),
        ]
    )
