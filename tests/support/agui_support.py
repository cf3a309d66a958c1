"""Support for the AG-UI face's tests: a real server on loopback (a ``LocalHost`` served
by Hypercorn's Trio worker), an SSE reader that parses every ``data:`` line back with
the ``ag-ui-protocol`` models, and a checker of AG-UI's ordering rules."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio
import trio.testing
from ag_ui.core import Event
from pydantic import TypeAdapter

import trio_agents as ta
from trio_agents.faces import HttpApp, HttpLimits, http_app, serve_http
from trio_agents.hosting import LocalHost, RunHost
from trio_agents.models import ScriptedModel

AUTH = {"tok-alice": "alice", "tok-bob": "bob"}
ALICE = {"Authorization": "Bearer tok-alice"}
BOB = {"Authorization": "Bearer tok-bob"}

EVENT = TypeAdapter(Event)


@asynccontextmanager
async def agui_server(
    agents: Mapping[str, ta.Agent],
    *,
    limits: HttpLimits | None = None,
    wrap: Callable[[LocalHost], RunHost] | None = None,
) -> AsyncIterator[tuple[LocalHost, HttpApp, httpx.AsyncClient]]:
    """A host serving ``agents`` over HTTP on a free loopback port, and a client of it
    (``wrap``: the faces are given ``wrap(host)`` instead of the host itself)."""
    host = LocalHost(agents)
    async with host.running():
        app = http_app(host if wrap is None else wrap(host), auth=AUTH, limits=limits)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            timeout = httpx.Timeout(10.0, read=None)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", timeout=timeout
            ) as client:
                yield host, app, client
            nursery.cancel_scope.cancel()


def run_input(
    thread: str = "t1", run: str = "ag-1", text: str | None = "go", **extra: Any
) -> dict[str, Any]:
    """A ``RunAgentInput`` JSON body: one user message (unless ``text`` is None)."""
    messages = [] if text is None else [{"id": f"m-{run}", "role": "user", "content": text}]
    return {"threadId": thread, "runId": run, "messages": messages, **extra}


class AguiStream:
    """The events of one AG-UI response, read one at a time; each ``data:`` line is
    validated by the ag-ui-protocol models (a line that does not validate fails)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._body = response.aiter_bytes()
        self._buffer = b""
        self.events: list[dict[str, Any]] = []

    async def _line(self) -> bytes | None:
        while b"\n" not in self._buffer:
            try:
                self._buffer += await self._body.__anext__()
            except StopAsyncIteration:
                return None
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    async def next(self) -> dict[str, Any] | None:
        """The next event (None at the end of the stream)."""
        while True:
            line = await self._line()
            if line is None:
                return None
            if line.startswith(b"data: "):
                data = line[len(b"data: ") :]
                EVENT.validate_json(data)  # every event is a valid AG-UI event
                event: dict[str, Any] = json.loads(data)
                self.events.append(event)
                return event

    async def until(self, type_: str, **fields: Any) -> dict[str, Any]:
        """Read up to and including the first event of ``type_`` with ``fields``."""
        while True:
            event = await self.next()
            assert event is not None, f"the stream ended before a {type_} event"
            if event["type"] == type_ and all(event.get(k) == v for k, v in fields.items()):
                return event

    async def rest(self) -> list[dict[str, Any]]:
        """Every event left, to the end of the stream."""
        while (await self.next()) is not None:
            pass
        return self.events

    async def aclose(self) -> None:
        """Unwind httpx's chain of nested body generators: resumed under a cancelled
        scope, the next socket read raises at the bottom and every generator unwinds
        (closing only the outermost would leave the inner ones to the garbage
        collector, and Trio warns). As ``trio_agents.models`` does for model streams."""
        with trio.CancelScope(shield=True) as scope:
            scope.cancel()
            try:
                while True:
                    await self._body.__anext__()
            except (StopAsyncIteration, httpx.HTTPError):
                return


@asynccontextmanager
async def agui_stream(
    client: httpx.AsyncClient,
    agent: str,
    body: Mapping[str, Any],
    *,
    headers: Mapping[str, str] = ALICE,
    params: Mapping[str, str] | None = None,
) -> AsyncIterator[AguiStream]:
    """POST ``body`` to ``/ag-ui/<agent>`` and read the answer as an event stream."""
    async with client.stream(
        "POST", f"/ag-ui/{agent}", json=dict(body), headers=dict(headers), params=params
    ) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        assert response.headers["content-type"].startswith("text/event-stream")
        stream = AguiStream(response)
        try:
            yield stream
        finally:
            await stream.aclose()


def check_order(events: list[dict[str, Any]]) -> None:
    """AG-UI's ordering rules over one stream (one AG-UI run): it opens with
    ``RUN_STARTED`` and ends with exactly one ``RUN_FINISHED`` or ``RUN_ERROR``; text
    messages are opened before content and closed before the run ends (a closed one
    may be reopened); tool calls go START → ARGS* → END, a result after its END;
    steps are balanced by name."""
    assert events, "no events"
    assert events[0]["type"] == "RUN_STARTED", events[0]
    assert events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR"), events[-1]
    assert [e["type"] for e in events].count("RUN_STARTED") == 1
    assert sum(e["type"] in ("RUN_FINISHED", "RUN_ERROR") for e in events) == 1
    open_messages: set[str] = set()
    calls: dict[str, str] = {}  # id -> "open" | "ended"
    steps: set[str] = set()
    for event in events[1:-1]:
        kind = event["type"]
        if kind == "TEXT_MESSAGE_START":
            assert event["messageId"] not in open_messages, event
            open_messages.add(event["messageId"])
        elif kind == "TEXT_MESSAGE_CONTENT":
            assert event["messageId"] in open_messages, event
        elif kind == "TEXT_MESSAGE_END":
            assert event["messageId"] in open_messages, event
            open_messages.discard(event["messageId"])
        elif kind == "TOOL_CALL_START":
            assert event["toolCallId"] not in calls, event
            calls[event["toolCallId"]] = "open"
        elif kind == "TOOL_CALL_ARGS":
            assert calls.get(event["toolCallId"]) == "open", event
        elif kind == "TOOL_CALL_END":
            assert calls.get(event["toolCallId"]) == "open", event
            calls[event["toolCallId"]] = "ended"
        elif kind == "TOOL_CALL_RESULT":
            # A call made by an earlier AG-UI run (before an interrupt) is answered
            # in the run that resumes it: not in ``calls`` then.
            assert calls.get(event["toolCallId"], "ended") == "ended", event
        elif kind == "STEP_STARTED":
            assert event["stepName"] not in steps, event
            steps.add(event["stepName"])
        elif kind == "STEP_FINISHED":
            assert event["stepName"] in steps, event
            steps.discard(event["stepName"])
        else:
            assert kind == "CUSTOM", event
    assert not open_messages, f"messages left open: {open_messages}"
    assert "open" not in calls.values(), calls
    assert not steps, f"steps left open: {steps}"


async def wait_streams_closed(app: HttpApp) -> None:
    """Wait until the server has finished every event stream (what a stream does when
    its client goes away is decided by then)."""
    while app.statistics().streams:
        await trio.testing.wait_all_tasks_blocked()


# ------------------------------------------------------- agents, tools and interrupts


def scripted(name: str, turns: list[Any], *tools: ta.Tool, default: Any = None) -> ta.Agent:
    """An agent of ``name`` playing ``turns`` (then ``default``) with ``tools``."""
    return ta.Agent(
        name=name,
        instructions="test",
        model=ScriptedModel(turns, default=default),
        tools=list(tools),
    )


@ta.function_tool(needs_approval=True)
async def launch() -> str:
    """Launch, once approved."""
    return "launched"


_gate: trio.Event | None = None


def new_gate() -> trio.Event:
    """A fresh, closed gate for :func:`gated` (the test sets it to let the tool end)."""
    global _gate
    _gate = trio.Event()
    return _gate


@ta.function_tool
async def gated() -> str:
    """Wait until the test opens the gate."""
    assert _gate is not None, "call new_gate() first"
    await _gate.wait()
    return "through"


def ours(event: Mapping[str, Any]) -> dict[str, Any]:
    """The ``trio-agents`` metadata of an AG-UI event (our run id, status, ...)."""
    meta: dict[str, Any] = event["metadata"]["trio-agents"]
    return meta


def approve(interrupt: Mapping[str, Any], thread: str = "t1", run: str = "ag-2") -> dict[str, Any]:
    """A ``RunAgentInput`` resuming ``interrupt`` with the approval granted."""
    body = run_input(thread=thread, run=run)
    body["resume"] = [
        {"interruptId": interrupt["id"], "status": "resolved", "payload": {"approved": True}}
    ]
    return body


async def until_interrupt(
    client: httpx.AsyncClient,
    agent: str,
    body: Mapping[str, Any] | None = None,
    *,
    headers: Mapping[str, str] = ALICE,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run ``agent`` until its AG-UI run ends on one interrupt (checked for AG-UI's
    ordering): the events and the interrupt."""
    async with agui_stream(client, agent, body or run_input(), headers=headers) as stream:
        events = await stream.rest()
    check_order(events)
    assert events[-1]["outcome"]["type"] == "interrupt", events[-1]
    (interrupt,) = events[-1]["outcome"]["interrupts"]
    return events, interrupt


async def whole_run(
    agents: Mapping[str, ta.Agent],
    agent: str,
    *,
    wrap: Callable[[LocalHost], RunHost] | None = None,
) -> tuple[list[dict[str, Any]], LocalHost]:
    """Serve ``agents`` and stream one AG-UI run of ``agent`` to its end (checked for
    AG-UI's ordering; a 30 s hang guard): the events, and the host."""
    with trio.fail_after(30):
        async with (
            agui_server(agents, wrap=wrap) as (host, _, client),
            agui_stream(client, agent, run_input()) as stream,
        ):
            events = await stream.rest()
    check_order(events)
    return events, host
