"""Support for the web UI's browser tests and its benchmark: a real HTTP face (the one
``trio-agents serve`` runs) over a :class:`~trio_agents.hosting.LocalHost`, with
scripted agents whose streams wait at named *gates*, run by ``trio.run`` in a thread of
its own, so Playwright's sync API can drive Chromium from the test's thread.

Gates make the tests deterministic without sleeping: a model stops at ``Gate("x")``
until the test calls ``server.open_gate("x")`` (thread-safe: it is handed to the
server's Trio thread through its token), so the test sees a run exactly mid-stream,
waiting, or mid-tree, for as long as it wants to look.
"""

from __future__ import annotations

import json
import queue
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from decimal import Decimal
from typing import Any, Final, final

import attrs
import httpx
import trio

import trio_agents as ta
from tests.support.faces_streams import EventStream
from trio_agents import Agent, ModelRequest, ToolCall, UserMessage
from trio_agents.control import Limits
from trio_agents.models import (
    FallbackModel,
    Finish,
    ModelEvent,
    RateLimit,
    ScriptedModel,
    TextDelta,
    ToolCallDone,
    Turn,
    Usage,
)

CHROMIUM: Final = "/usr/bin/chromium"

# The flags Chromium runs with in the tests: headless, no sandbox (CI runs as root), and
# nothing that would reach another host (updates, sync, QUIC probes).
CHROMIUM_ARGS: Final = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

TOKENS: Final = {"alice-token-7f3a": "alice", "bob-token-91c2": "bob"}
ALICE: Final = "alice-token-7f3a"
BOB: Final = "bob-token-91c2"


def chromium_available() -> bool:
    """Whether Debian's chromium (``.ci/chromium.sh``) is installed."""
    return shutil.which("chromium") is not None or _executable(CHROMIUM)


def _executable(path: str) -> bool:
    import os

    return os.access(path, os.X_OK)


# ------------------------------------------------------------------ gated scripted model


@attrs.frozen
class Gate:
    """A step that waits until the test opens the gate of this name."""

    name: str


@attrs.frozen
class Call:
    """A step that emits a tool call."""

    name: str
    arguments: Mapping[str, Any]


Echo = Callable[[ModelRequest], str]
"""A step whose text is computed from the request (what the model was sent)."""

Step = str | Gate | Call | Echo


@final
class Gates:
    """Named :class:`trio.Event` s, opened from any thread by :meth:`open`."""

    def __init__(self) -> None:
        self._events: dict[str, trio.Event] = {}
        self._opened: set[str] = set()
        self.token: trio.lowlevel.TrioToken | None = None

    def event(self, name: str) -> trio.Event:
        if name not in self._events:
            self._events[name] = trio.Event()
            if name in self._opened:
                self._events[name].set()
        return self._events[name]

    def open(self, name: str) -> None:
        """Open the gate (from the test's thread)."""
        assert self.token is not None, "the server is not running"

        def do() -> None:
            self._opened.add(name)
            self.event(name).set()

        self.token.run_sync_soon(do)


@final
class _Steps:
    """The events of one turn of a :class:`GatedModel`; an iterator class."""

    def __init__(self, model: GatedModel, request: ModelRequest, steps: Sequence[Step]) -> None:
        self._model = model
        self._request = request
        self._steps = list(steps)
        self._position = 0
        self._calls = 0
        self._tail = 0  # after the steps: Usage, then Finish, then the end

    def __aiter__(self) -> _Steps:
        return self

    async def __anext__(self) -> ModelEvent:
        while self._position < len(self._steps):
            step = self._steps[self._position]
            self._position += 1
            if isinstance(step, Gate):
                await self._model.gates.event(step.name).wait()
                continue
            if self._model.delay:
                await trio.sleep(self._model.delay)
            else:
                await trio.lowlevel.checkpoint()
            if isinstance(step, str):
                return TextDelta(step)
            if isinstance(step, Call):
                self._calls += 1
                call_id = f"call_{self._model.calls}_{self._calls}"
                return ToolCallDone(ToolCall(call_id, step.name, json.dumps(step.arguments)))
            return TextDelta(step(self._request))
        self._tail += 1
        if self._tail == 1:
            return Usage(input_tokens=10, output_tokens=5)
        if self._tail == 2:
            has_calls = any(isinstance(step, Call) for step in self._steps)
            return Finish("tool_calls" if has_calls else "stop")
        raise StopAsyncIteration


@final
class GatedModel:
    """Plays ``turns`` (the last one again once they run out); a turn is a list of
    steps: text chunks, tool calls, gates and echoes."""

    def __init__(
        self, turns: Sequence[Sequence[Step]], gates: Gates, *, delay: float = 0.0
    ) -> None:
        self.turns = [list(turn) for turn in turns]
        self.gates = gates
        self.delay = delay
        self.calls = 0
        self.requests: list[ModelRequest] = []

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        self.calls += 1
        self.requests.append(request)
        turn = self.turns[min(self.calls, len(self.turns)) - 1]
        return EventStream(_Steps(self, request, turn))


def last_user_text(request: ModelRequest) -> str:
    """The last user message the model was sent."""
    for item in reversed(request.items):
        if isinstance(item, UserMessage):
            return str(item.content)
    return ""


def saw_user_messages(request: ModelRequest) -> str:
    """``"saw: "`` and every user message the model was sent, joined: an answer that
    shows which conversation a request carried (a fork's, its source's)."""
    return "saw: " + " | ".join(
        str(item.content) for item in request.items if isinstance(item, UserMessage)
    )


def tool_outputs(request: ModelRequest) -> str:
    """The outputs of the tool results the model was sent, joined."""
    return "; ".join(str(item.output) for item in request.items if isinstance(item, ta.ToolResult))


# ------------------------------------------------------------------ the agents

ESSAY: Final = tuple(f"line {i:03d} of a long answer\n" for i in range(1, 501))
"""What the ``essay`` agent streams: 14 KB, past the page's 4 KiB sealing point."""


def ui_agents(gates: Gates) -> dict[str, Agent]:
    """The agents the browser tests start runs of; each test uses its own agent and
    gates, so the tests are independent of their order."""

    @ta.function_tool(needs_approval=True)
    async def delete_file(path: str) -> str:
        """Delete a file (pretend).

        Args:
            path: the file.
        """
        return f"deleted {path}"

    branch_a = Agent(
        name="branch_a",
        instructions="Research one angle.",
        model=GatedModel([["Reading the archive", Gate("never")]], gates),
    )
    branch_b = Agent(
        name="branch_b",
        instructions="Research another angle.",
        model=GatedModel([["Reading sources", Gate("fanout_b"), " done."]], gates),
    )
    return {
        "writer": Agent(
            name="writer",
            instructions="Tells a story, streamed.",
            model=GatedModel(
                [
                    [
                        "Once ",
                        "upon ",
                        "a ",
                        "time",
                        Gate("write"),
                        ", a run ",
                        "streamed ",
                        "to the end.",
                    ]
                ],
                gates,
            ),
        ),
        "lead": Agent(
            name="lead",
            instructions="Fans out to two researcher sub-agents.",
            model=GatedModel(
                [
                    [
                        Call("branch_a", {"input": "history"}),
                        Call("branch_b", {"input": "practice"}),
                    ],
                    [lambda request: "Summary: " + tool_outputs(request)],
                ],
                gates,
            ),
            tools=[branch_a.as_tool(name="branch_a"), branch_b.as_tool(name="branch_b")],
        ),
        "careful": Agent(
            name="careful",
            instructions="Asks before deleting anything.",
            model=GatedModel(
                [[Call("delete_file", {"path": "notes.txt"})], ["Deleted notes.txt."]], gates
            ),
            tools=[delete_file],
        ),
        "chatty": Agent(
            name="chatty",
            instructions="Answers, and listens to what is injected.",
            model=GatedModel(
                [
                    ["Working on it", Gate("inject")],
                    [lambda request: "You asked: " + last_user_text(request)],
                ],
                gates,
            ),
        ),
        # counts to forty, stopping halfway at its gate
        **{
            name: Agent(
                name=name,
                instructions="Counts to forty.",
                model=GatedModel(
                    [
                        [
                            *(f"w{i:02d} " for i in range(1, 21)),
                            Gate(gate),
                            *(f"w{i:02d} " for i in range(21, 41)),
                        ]
                    ],
                    gates,
                ),
            )
            for name, gate in (("long", "reload"), ("long_drop", "drop"))
        },
        "triage": Agent(
            name="triage",
            instructions="Hands the conversation to a specialist.",
            model=GatedModel([[Call("transfer_to_specialist", {})]], gates),
            handoffs=[
                Agent(
                    name="specialist",
                    instructions="Answers what triage passes on.",
                    model=GatedModel([["Specialist here: ", "all sorted."]], gates),
                )
            ],
        ),
        "essay": Agent(
            name="essay",
            instructions="Writes a long answer.",
            # The gate holds the stream at 2.8 KB (under the 4 KiB sealing point), so the
            # page shows it live first and the rest arrives as appends it must seal.
            model=GatedModel([[*ESSAY[:100], Gate("essay"), *ESSAY[100:]]], gates),
        ),
        "quick": Agent(
            name="quick", instructions="Says hello.", model=GatedModel([["Hello."]], gates)
        ),
        "priced": priced_tree(),
        "timed": timed_tree(gates),
        **throttled_pair(),
        "fallback": Agent(
            name="fallback",
            instructions="Answers through a backup when the primary is overloaded.",
            # The backup answers; FallbackModel names it in the usage (Usage.model).
            model=FallbackModel(
                Named("primary-model", ScriptedModel([], default=Turn(fail=OVERLOADED))),
                Named(
                    "backup-model", ScriptedModel([], default=Turn("Answered.", usage=BACKUP_CALL))
                ),
            ),
        ),
    }


OVERLOADED: Final = ta.ModelError("overloaded", status_code=529, retryable=True)
BACKUP_CALL: Final = Usage(60, 9, cost=Decimal("0.00005"))


@final
class Named:
    """A scripted model under a name of its own: its ``model``, the name a
    ``FallbackModel`` records in the ``Usage`` of what it answered."""

    def __init__(self, model: str, inner: ScriptedModel) -> None:
        self.model = model
        self._inner = inner

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        return self._inner.stream(request)


def throttled_pair() -> dict[str, Agent]:
    """Two agents sharing one account's ``RateLimit(concurrency=1)``, each holding its
    slot for an hour once it has it (until its run is cancelled): while a ``hog`` run
    holds it, a ``metered`` run's request waits — throttled — and then goes out."""
    account = RateLimit(concurrency=1)
    return {
        name: Agent(
            name=name,
            instructions="Holds the account's one slot once it has it.",
            model=ScriptedModel([], default=Turn(text, delay=3600.0), rate_limit=account),
        )
        for name, text in (("hog", "never"), ("metered", "later"))
    }


PRICED_CALLS: Final = {
    # per model call of each agent; costs no float holds exactly, one past 1e-6 (its
    # str() is "7E-7"): a sum through floats, or a parse that misses the exponent, shows
    "priced": Usage(120, 30, cost=Decimal("0.00012")),
    "pricey_a": Usage(40, 10, cost=Decimal("0.0000333")),
    "pricey_b": Usage(5, 2, cost=Decimal("7E-7")),
}


def priced_tree() -> Agent:
    """A root that fans out to two sub-agents; each model call is priced
    (:data:`PRICED_CALLS`); the root makes two calls, each sub-agent one."""
    children = [
        Agent(
            name=name,
            instructions="Answers one part.",
            model=ScriptedModel([Turn(text=f"{name} done", usage=PRICED_CALLS[name])]),
        )
        for name in ("pricey_a", "pricey_b")
    ]
    root_call = PRICED_CALLS["priced"]
    return Agent(
        name="priced",
        instructions="Fans out to two priced sub-agents.",
        model=ScriptedModel(
            [
                Turn(
                    tool_calls=[("pricey_a", {"input": "a"}), ("pricey_b", {"input": "b"})],
                    usage=root_call,
                ),
                Turn(text="All parts answered.", usage=root_call),
            ]
        ),
        tools=[child.as_tool(name=child.name) for child in children],
    )


def timed_tree(gates: Gates) -> Agent:
    """For the timeline view: a priced root that calls a sub-agent (which streams until
    the ``timed`` gate opens) and a tool, then answers; one run per test module."""

    @ta.function_tool
    async def lookup(topic: str) -> str:
        """Look a topic up.

        Args:
            topic: what to look up.
        """
        return f"notes on {topic}"

    child = Agent(
        name="timed_child",
        instructions="Streams until its gate opens.",
        model=GatedModel([["Looking it up", Gate("timed"), " — found it."]], gates),
    )
    root_call = PRICED_CALLS["priced"]
    return Agent(
        name="timed",
        instructions="Delegates, looks up, answers.",
        model=ScriptedModel(
            [
                Turn(
                    tool_calls=[("timed_child", {"input": "dig"}), ("lookup", {"topic": "trio"})],
                    usage=root_call,
                ),
                Turn(text="Both answered.", usage=root_call),
            ]
        ),
        tools=[child.as_tool(name="timed_child"), lookup],
    )


# ------------------------------------------------------------------ the server, in a thread


@final
class _Proxy:
    """A loopback TCP proxy in front of the server whose connections the test can cut
    (:meth:`sever`): a dropped connection, for real, under an open event stream."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.streams: set[trio.SocketStream] = set()

    async def serve(self, *, task_status: trio.TaskStatus[int]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        async with trio.open_nursery() as nursery:
            task_status.started(listeners[0].socket.getsockname()[1])
            await trio.serve_listeners(self._handle, listeners, handler_nursery=nursery)

    async def _handle(self, client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream("127.0.0.1", self.target)
        self.streams |= {client, server}
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, client, server, nursery.cancel_scope)
                nursery.start_soon(self._pump, server, client, nursery.cancel_scope)
        finally:
            self.streams -= {client, server}
            with trio.CancelScope(shield=True):
                await client.aclose()
                await server.aclose()

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        try:
            async for data in source:
                await sink.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        scope.cancel()

    def sever(self) -> None:
        """Cut every connection through the proxy (on the server's Trio thread)."""
        for stream in list(self.streams):
            stream.socket.close()  # an abrupt close: the peer sees the connection drop


@final
class UiServer:
    """A running server (see :func:`running_ui_server`); ``proxy_url`` reaches it
    through a proxy whose connections :meth:`sever` cuts."""

    def __init__(self, url: str, proxy_url: str, gates: Gates, proxy: _Proxy) -> None:
        self.url = url
        self.proxy_url = proxy_url
        self.gates = gates
        self._proxy = proxy
        self.host = "local"
        """The kind of host the faces are over (``"local"``, ``"temporal"``): the guide's
        pictures are taken over the local one only."""

    def open_gate(self, name: str) -> None:
        self.gates.open(name)

    def sever(self) -> None:
        """Drop every connection made through ``proxy_url``."""
        assert self.gates.token is not None
        self.gates.token.run_sync_soon(self._proxy.sever)

    def _client(self, token: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=10.0
        )

    def start(self, token: str, agent: str, text: str) -> str:
        """Start a run over REST; its id."""
        with self._client(token) as client:
            answer = client.post("/runs", json={"agent": agent, "input": text})
            answer.raise_for_status()
            run_id: str = answer.json()["run_id"]
            return run_id

    def cancel(self, token: str, run_id: str) -> None:
        """Cancel a run over REST (``?wait=1``: answered once it is terminal)."""
        with self._client(token) as client:
            client.post(f"/runs/{run_id}/cancel?wait=1", json={}).raise_for_status()

    def get(self, token: str, run_id: str) -> dict[str, Any]:
        """``GET /runs/{id}``'s run."""
        with self._client(token) as client:
            answer = client.get(f"/runs/{run_id}")
            answer.raise_for_status()
            run: dict[str, Any] = answer.json()["run"]
            return run


def _local_host(agents: Mapping[str, Agent], limits: Limits) -> AbstractAsyncContextManager[Any]:
    from trio_agents.hosting import LocalHost

    return LocalHost(agents, limits=limits).running()


@contextmanager
def running_ui_server(
    agents: Callable[[Gates], Mapping[str, Agent]] = ui_agents,
    host: Callable[[Mapping[str, Agent], Limits], AbstractAsyncContextManager[Any]] = _local_host,
) -> Iterator[UiServer]:
    """Serve the HTTP faces (REST + the UI) on a free loopback port, in a thread running
    its own ``trio.run``; stopped (the host shut down, every run cancelled) on exit.
    ``host(agents, limits)`` serves the host the faces are over for its block (a
    ``LocalHost`` by default)."""
    from trio_agents.faces import http_app, serve_http

    gates = Gates()
    ready: queue.Queue[tuple[int, int, _Proxy] | BaseException] = queue.Queue()
    stop: list[Callable[[], None]] = []

    async def main() -> None:
        gates.token = trio.lowlevel.current_trio_token()
        # Room for the browser benchmark's 100 listed runs, started back to back (the
        # default start rate and per-principal bound are a server's, not this harness's).
        limits = Limits(start_rate=1000.0, start_burst=1000, max_runs_per_principal=1000)
        async with host(agents(gates), limits) as served, trio.open_nursery() as nursery:
            app = http_app(served, auth=TOKENS)
            port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            proxy = _Proxy(port)
            proxied = await nursery.start(proxy.serve)
            stop.append(nursery.cancel_scope.cancel)
            ready.put((port, proxied, proxy))

    def thread() -> None:
        try:
            trio.run(main)
        except BaseException as exc:  # handed to the test's thread
            ready.put(exc)

    worker = threading.Thread(target=thread, name="ui-server", daemon=True)
    worker.start()
    got = ready.get(timeout=60)
    if isinstance(got, BaseException):
        raise RuntimeError("the UI's test server did not start") from got
    try:
        port, proxied, proxy = got
        yield UiServer(f"http://127.0.0.1:{port}", f"http://127.0.0.1:{proxied}", gates, proxy)
    finally:
        assert gates.token is not None
        gates.token.run_sync_soon(stop[0])
        worker.join(timeout=60)
        assert not worker.is_alive(), "the UI's test server did not stop"
