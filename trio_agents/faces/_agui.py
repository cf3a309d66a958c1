"""The AG-UI face (DESIGN §19): ``POST /ag-ui/{agent}`` takes a ``RunAgentInput`` and
answers with the run as AG-UI events over Server-Sent Events, encoded by the
``ag-ui-protocol`` package's encoder. What the input means and how the events map is
in ``_agui_map.py``; this module is the route: validate, start (or resume), stream
(with the shared :class:`~trio_agents.faces.EventStream`: keep-alives, bounded writes,
the principal's stream count).

**The stream owns the run.** AG-UI has no cancel request: a client stops a run by
dropping the connection. So a stream whose client goes away (or stops reading past
``send_timeout``) before its AG-UI run ended applies the run's ``on_disconnect``:
``"cancel"`` (the default) cancels the run's tree with reason ``"client
disconnected"``; ``"continue"`` lets it finish (its session keeps the outcome; the
other faces can follow it by the run id in ``RUN_STARTED``'s metadata). The route's
default is its query parameter ``?on_disconnect=continue``; a run's
``forwardedProps.onDisconnect`` overrides it. The face applies the choice itself
(with :meth:`~trio_agents.hosting.RunHost.cancel`), not through the host's owner
record: an AG-UI run that ends with an ``interrupt`` closes its stream while our run
waits on, so the end of a stream is not always the owner going away.

Refusals before the stream starts are plain HTTP errors with the JSON error body
(400 for a ``RunAgentInput`` that does not validate or asks for what is refused, 404
for an unknown agent or another principal's interrupted run, 409 for a busy thread or
an approval no longer waiting); once the stream has started, a failure is a
``RUN_ERROR`` event.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Final, Literal, final

import attrs
import trio
from ag_ui.core import BaseEvent, RunAgentInput, RunErrorEvent, RunFinishedEvent
from ag_ui.encoder import EventEncoder
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from .._model import Usage
from ..hosting import HostedEvent, HostError, Origin, RunHost, StartRequest
from ._agui_map import (
    AguiInputError,
    EventMapper,
    Resume,
    Start,
    parse_input,
    plan,
    usage_entries,
    with_usage,
)
from ._event_stream import EventStream
from ._face import Face, Routes
from ._http_errors import HttpError
from ._http_requests import principal_of, read_json

__all__ = ["DISCONNECT_REASON", "routes"]

logger = logging.getLogger("trio_agents.faces")

DISCONNECT_REASON: Final = "client disconnected"
"""The reason a run is cancelled with when its AG-UI client goes away."""

# How long cancelling a run whose client went away may take before the stream's task
# stops waiting (a local cancel is applied at once; a routed one is durable once sent).
_CANCEL_BOUND: Final = 10.0


def routes(face: Face) -> Routes:
    """The AG-UI route of ``face`` (authenticated, as every route with a run)."""

    async def run_agent(request: Request) -> Response:
        return await _run_agent(face, request)

    return Routes(routes=[Route("/ag-ui/{agent}", run_agent, methods=["POST"])])


def _default_on_disconnect(request: Request) -> Literal["cancel", "continue"]:
    value = request.query_params.get("on_disconnect", "cancel")
    if value == "cancel":
        return "cancel"
    if value == "continue":
        return "continue"
    raise HttpError("invalid_request", "?on_disconnect= must be cancel or continue")


async def _run_agent(face: Face, request: Request) -> Response:
    principal = principal_of(request)
    agent = request.path_params["agent"]
    default = _default_on_disconnect(request)
    body = await read_json(request, face.limits.max_body_bytes)
    try:
        run_input = parse_input(body)
        asked = plan(run_input, on_disconnect=default)
    except AguiInputError as exc:
        raise HttpError("invalid_request", str(exc)) from None
    if agent not in face.host.agents:
        raise HttpError("not_found", f"no agent {agent!r}")
    # The run starts (or resumes) only once the stream is counted and about to answer
    # (EventStream enters the source then): a refused stream starts nothing, and a
    # refused start is an ordinary JSON error.
    return EventStream(
        face, principal, lambda: _source(face.host, principal, agent, run_input, asked)
    )


@asynccontextmanager
async def _source(
    host: RunHost, principal: str, agent: str, run_input: RunAgentInput, asked: Start | Resume
) -> AsyncIterator[AsyncIterator[bytes]]:
    if isinstance(asked, Start):
        root = await host.start(
            Origin(principal=principal),
            # The client re-sends its whole message list: the user messages a run that
            # failed before answering stored are not new input again (docs/ag-ui.md).
            StartRequest(
                agent=agent,
                input=asked.input,
                session_id=run_input.thread_id,
                input_overlap="skip",
            ),
        )
        mapper = EventMapper(
            thread_id=run_input.thread_id,
            run_id=run_input.run_id,
            root=root,
            parent_run_id=run_input.parent_run_id,
        )
        before: dict[str, Usage] = {}
    else:
        # What the tree used before this AG-UI run: it reports only its own calls.
        before = await _tree_usage(host, principal, asked.root)
        root = await _answer(host, principal, run_input, asked)
        mapper = EventMapper(
            thread_id=run_input.thread_id,
            run_id=run_input.run_id,
            root=root,
            after=asked.seq,
            resolved=frozenset((a.run_id, a.call_id) for a in asked.approvals),
            parent_run_id=run_input.parent_run_id,
        )
    try:
        async with contextlib.AsyncExitStack() as stack:

            async def follow(from_seq: int) -> AsyncIterator[HostedEvent]:
                # The root's own events, from the host's log of it: where the tree is not
                # (a cluster node that does not run it), or no longer is (a takeover).
                return await stack.enter_async_context(
                    host.events(principal, root, from_seq=from_seq)
                )

            try:
                events = await stack.enter_async_context(host.events(principal, root, tree=True))
            except HostError as exc:
                if exc.code != "invalid_request":
                    raise
                events = await follow(1)
            usage = _UsageSince(host, principal, root, before)
            yield _Messages(mapper, root, events, follow, usage)
    finally:
        # Ended before its AG-UI run did: the client went away (or stopped reading).
        if not mapper.finished and asked.on_disconnect == "cancel":
            with trio.CancelScope(shield=True), trio.move_on_after(_CANCEL_BOUND):
                try:
                    await host.cancel(principal, root, DISCONNECT_REASON)
                except HostError as exc:  # it ended meanwhile: nothing to cancel
                    logger.debug("AG-UI run %s not cancelled on disconnect: %s", root, exc)


async def _tree_usage(host: RunHost, principal: str, root: str) -> dict[str, Usage]:
    """What each run of ``root``'s tree used so far (its record's ``usage``), by run id.
    A run whose record cannot be read (gone, or its node unreachable) counts nothing
    rather than failing the stream: usage is a report, not the run's outcome."""
    used: dict[str, Usage] = {}
    pending, seen = [root], set()
    while pending:
        run_id = pending.pop()
        if run_id in seen:
            continue
        seen.add(run_id)
        try:
            info = await host.get(principal, run_id)
        except HostError:
            continue
        if info.usage is not None:
            used[run_id] = info.usage
        pending.extend(info.children or ())
    return used


@final
@attrs.frozen
class _UsageSince:
    """How the AG-UI run's last event gets its usage: the tree's now, less what it
    had used when this AG-UI run was asked for."""

    host: RunHost
    principal: str
    root: str
    before: dict[str, Usage]

    async def add_to(self, events: list[BaseEvent]) -> list[BaseEvent]:
        now = await _tree_usage(self.host, self.principal, self.root)
        entries, cost = usage_entries(now, self.before)
        return [with_usage(event, entries, cost) for event in events]


async def _answer(host: RunHost, principal: str, run_input: RunAgentInput, asked: Resume) -> str:
    """Check the interrupted run is this thread's and that every resume entry answers
    a call waiting in its tree, then apply each entry's answer; returns the run to
    stream. (Not checked against ``agent``: after a handoff the run's current agent is
    another one, and the thread is what names the run.)

    Every entry is checked before any is applied, so a refused request changes nothing
    (the client sends it again, corrected, as a whole). Only another face answering one
    of the calls between the check and the apply can still refuse an entry after those
    before it were applied: the host has no batch of approvals to make that atomic."""
    info = await host.get(principal, asked.root)  # not_found: unknown, or another's
    if info.session_id != run_input.thread_id or info.parent_id:
        raise HttpError("not_found", "no interrupted run in this thread")
    for answer in asked.approvals:
        # not_found: no such run, or another principal's
        node = info if answer.run_id == asked.root else await host.get(principal, answer.run_id)
        if node.root_id != asked.root:
            raise HostError("not_found", f"no run {answer.run_id!r} in the interrupted run")
        # The codes the host's approve would answer: a closed run, an unknown call.
        if node.status.is_terminal:
            raise HostError("run_closed", f"run {answer.run_id} is closed (status {node.status})")
        if answer.call_id not in node.pending_approvals:
            raise HostError("not_found", f"no tool call {answer.call_id!r} is waiting for approval")
    for answer in asked.approvals:
        if answer.approved:
            await host.approve(principal, answer.run_id, answer.call_id, answer.content)
        else:
            await host.reject(principal, answer.run_id, answer.call_id, answer.message)
    return asked.root


@final
class _Messages:
    """The SSE messages of one AG-UI run: the mapper's events for each of the host's,
    until the mapper made the AG-UI run's last event (a class, not an async generator:
    the stream's pump may abandon it at any await).

    A tree subscription that ends before the run did (the run's tree went to another
    node of a cluster) is followed on from the root's own log, from the seq after the
    last root event given; the children's own events are then not streamed (they stay
    on the node running the tree), their steps are.
    """

    _MAX_FOLLOWS: Final = 16

    def __init__(
        self,
        mapper: EventMapper,
        root: str,
        events: AsyncIterator[HostedEvent],
        follow: Callable[[int], Awaitable[AsyncIterator[HostedEvent]]],
        usage: _UsageSince,
    ) -> None:
        self._mapper = mapper
        self._usage = usage
        self._root = root
        self._events = events
        self._follow = follow
        self._follows = 0
        self._root_seq = 0
        self._encoder = EventEncoder()
        self._ready: list[BaseEvent] = mapper.started()

    def __aiter__(self) -> _Messages:
        return self

    async def __anext__(self) -> bytes:
        mapper = self._mapper
        while not self._ready:
            if mapper.finished:
                raise StopAsyncIteration
            try:
                hosted = await self._events.__anext__()
            except StopAsyncIteration:
                if self._follows < self._MAX_FOLLOWS:
                    self._follows += 1
                    self._events = await self._follow(self._root_seq + 1)
                    continue
                # Never end the stream as if the run had ended.
                mapper.finished = True
                self._ready = [
                    RunErrorEvent(
                        message="the run's event stream ended before the run did",
                        code="stream_ended",
                    )
                ]
                break
            except HostError as exc:
                mapper.finished = True
                self._ready = [RunErrorEvent(message=exc.message, code=exc.code)]
                break
            if hosted.run_id == self._root:
                if hosted.seq <= self._root_seq:
                    continue  # given already (a follow overlapping what the tree gave)
                self._root_seq = hosted.seq
            self._ready = mapper.feed(hosted.run_id, hosted.seq, hosted.event)
            if self._ready and isinstance(self._ready[-1], RunFinishedEvent | RunErrorEvent):
                # The AG-UI run's last event: with what it used.
                self._ready = await self._usage.add_to(self._ready)
        ready, self._ready = self._ready, []
        return "".join(self._encoder.encode(event) for event in ready).encode("utf-8")
