"""Several in-process cluster nodes at once (each one ``cluster_support.node``) with a
client on each, the agent and tools the cluster tests serve, and the runs table read
directly: the pieces the in-process cluster tests share."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    aclosing,
    asynccontextmanager,
)
from typing import Any, Final, NoReturn

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_support import Client, Node, client, node
from trio_agents.control import Limits
from trio_agents.models import Finish, ModelRequest, ScriptedModel, TextDelta, Turn

__all__ = [
    "BOUND",
    "POLL",
    "GatedModel",
    "agents",
    "approval_tool",
    "clients",
    "dies_answering",
    "dies_recording",
    "local_entry",
    "nodes",
    "open_nodes",
    "poll_row",
    "query",
    "reply_of",
    "request_as_owner_dies",
    "row_of",
    "two_nodes",
    "waiting_agents",
    "waiting_tool",
]

BOUND: Final = 60.0  # a hang guard per test
POLL: Final = 0.02  # seconds between looks at a row another process changes


def agents(model: ta.Model, tools: list[ta.Tool] | None = None) -> dict[str, ta.Agent]:
    """The one agent ``"a"`` the cluster tests serve, on ``model`` with ``tools``."""
    return {"a": ta.Agent(name="a", instructions="", model=model, tools=tools or [])}


def waiting_tool(gate: trio.Event, started: list[str] | None = None) -> ta.Tool:
    """A tool ``wait`` (not idempotent) that records its call id in ``started`` (if
    given), then waits for ``gate`` and answers ``done``."""

    @ta.function_tool
    async def wait(ctx: ta.ToolContext) -> str:
        """Wait for the gate."""
        if started is not None:
            started.append(ctx.call_id)
        await gate.wait()
        return "done"

    return wait


def approval_tool(ran: list[str]) -> ta.Tool:
    """A tool ``delete`` that needs approval and, once approved, records its call id
    in ``ran`` (and answers ``deleted``)."""

    @ta.function_tool(needs_approval=True)
    async def delete(ctx: ta.ToolContext) -> str:
        """Delete something, once approved."""
        ran.append(ctx.call_id)
        return "deleted"

    return delete


def waiting_agents(
    gate: trio.Event, started: list[str] | None = None, *, every_turn: bool = False
) -> tuple[ScriptedModel, dict[str, ta.Agent]]:
    """The agent ``"a"`` with a :func:`waiting_tool` on ``gate``, on a scripted model
    whose first turn calls it and that answers ``ok`` after (with ``every_turn``: whose
    every turn calls it); the model, then the agents."""
    wait = Turn(tool_calls=[("wait", {})])
    model = ScriptedModel([], default=wait) if every_turn else ScriptedModel([wait], default="ok")
    return model, agents(model, [waiting_tool(gate, started)])


@asynccontextmanager
async def open_nodes(
    dsn: str,
    serving: Mapping[str, Mapping[str, ta.Agent]],
    *,
    lease_ttl: float = 5.0,
    max_runs: int | Mapping[str, int] = 100,
    limits: Limits | None = None,
) -> AsyncIterator[list[Node]]:
    """A node per id of ``serving`` (in its order) serving that id's agents on ``dsn``,
    for the block, all in a nursery of their own; ``max_runs`` is every node's, or
    by node id (100 for a node it does not name)."""
    async with trio.open_nursery() as nursery:
        async with AsyncExitStack() as stack:
            opened = []
            for node_id, its_agents in serving.items():
                room = max_runs if isinstance(max_runs, int) else max_runs.get(node_id, 100)
                opened.append(
                    await stack.enter_async_context(
                        node(
                            nursery,
                            its_agents,
                            dsn,
                            node_id,
                            lease_ttl=lease_ttl,
                            max_runs=room,
                            limits=limits,
                        )
                    )
                )
            yield opened
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def clients(*on: Node) -> AsyncIterator[list[Client]]:
    """A connected client (alice's) to each of the nodes ``on``, in that order."""
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(client(n.url)) for n in on]


def nodes(
    model: ta.Model, dsn: str, *ids: str, lease_ttl: float = 2.0
) -> AbstractAsyncContextManager[list[Any]]:
    """Nodes ``ids`` serving one agent on ``model`` for the block (typed ``Any``: the
    tests patch the nodes' internals)."""
    return open_nodes(dsn, dict.fromkeys(ids, agents(model)), lease_ttl=lease_ttl)


def two_nodes(
    dsn: str,
    a_agents: Mapping[str, ta.Agent],
    b_agents: Mapping[str, ta.Agent],
    *,
    limits: Limits | None = None,
) -> AbstractAsyncContextManager[list[Node]]:
    """Nodes ``A`` and ``B`` serving ``a_agents`` and ``b_agents``, with a short lease
    (0.5 s: a takeover comes quickly), for the block."""
    return open_nodes(dsn, {"A": a_agents, "B": b_agents}, lease_ttl=0.5, limits=limits)


def local_entry(on: Node, run_id: str) -> Any:
    """The node's own registry entry of a run it runs (``KeyError`` if none)."""
    return host_registry(on).runs[run_id]


# What tests of a node's internals look into, named once here: the run registry of the
# node's host, the websocket connections of its server, the runs a connection placed on
# other nodes. Private state of the host and the channel, never public API.


def host_registry(on: Node) -> Any:
    """The run registry of the node's host (``hosting/_registry.py``'s ``Registry``)."""
    return on.server.host._registry


def server_connections(on: Node) -> set[Any]:
    """The node's open websocket connections (``control/_connection.py``)."""
    connections: set[Any] = on.server._face._connections
    return connections


def placed_runs(on: Node, principal: str) -> set[str]:
    """The ids of the runs with ``on_disconnect="cancel"`` that ``principal``'s one
    connection to ``on`` started on other nodes (kept by the host: the connection's
    disconnect cancels them there)."""
    (connection,) = [c for c in server_connections(on) if c.principal == principal]
    record = on.server.host._owned_by(connection)
    return set() if record is None else set(record.placed)


def last_user_text(request: ModelRequest) -> str:
    for item in reversed(request.items):
        if isinstance(item, ta.UserMessage):
            content = item.content
            return content if isinstance(content, str) else json.dumps(content)
    return ""


class GatedModel:
    """Answers ``ok <input>`` at once, except: an input naming a gate in ``holds``
    waits for that event first (its first call only: a resumed call answers at once),
    and ``two deltas`` streams ``one``, waits for ``go``, streams ``two`` and stalls
    (first call), answering at once when called again (a resumed attempt).
    :meth:`wait_called` waits until a call for an input was made."""

    def __init__(self) -> None:
        self.holds: dict[str, trio.Event] = {}
        self.go = trio.Event()
        self.calls: list[str] = []
        self._called: dict[str, trio.Event] = {}

    def _called_event(self, text: str) -> trio.Event:
        return self._called.setdefault(text, trio.Event())

    async def wait_called(self, text: str) -> None:
        """Wait until the model was called for ``text`` (the run reached its model: a
        ``running`` status is persisted before that, so it does not tell)."""
        await self._called_event(text).wait()

    @asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[Any]]:
        text = last_user_text(request)
        first = text not in self.calls
        self.calls.append(text)
        self._called_event(text).set()

        async def events() -> AsyncGenerator[Any, None]:
            if first and text in self.holds:
                await self.holds[text].wait()
            if first and text == "two deltas":
                yield TextDelta("one")
                await self.go.wait()
                yield TextDelta("two")
                await trio.sleep_forever()
            yield TextDelta(f"ok {text}")
            yield Finish("stop")

        async with aclosing(events()) as stream:  # closed even when abandoned
            yield stream


def query(dsn: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run ``sql`` in a connection of its own (autocommit). Sync: call it in a thread."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


async def row_of(dsn: str, run_id: str) -> dict[str, Any]:
    """The run's status, owner, attempt, finished flag and session key (``active``)."""
    rows = await trio.to_thread.run_sync(
        query,
        dsn,
        "SELECT status, owner, attempt, finished, active_key FROM trio_agents_runs"
        " WHERE run_id = %s",
        run_id,
    )
    status, owner, attempt, finished, active = rows[0]
    return {
        "status": status,
        "owner": owner,
        "attempt": attempt,
        "finished": finished,
        "active": active,
    }


async def poll_row(dsn: str, run_id: str, condition: Callable[[dict[str, Any]], bool]) -> None:
    """Wait until the run's row (changed by other tasks' transactions) satisfies it."""
    while True:
        if condition(await row_of(dsn, run_id)):
            return
        await trio.sleep(POLL)


def reply_of(dsn: str, command_id: int) -> str | None:
    """The reply stored with a routed command (None: not answered yet). Sync: call it
    in a thread."""
    rows = query(dsn, "SELECT reply FROM trio_agents_commands WHERE command_id = %s", command_id)
    assert rows, f"no command {command_id}"
    return None if rows[0][0] is None else str(rows[0][0])


def dies_answering(
    owner: Node, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[trio.Event, list[str | None]]:
    """Make ``owner`` apply the next routed command, then hang before it could answer
    (as if it died): the event set once it applied it, and the replies stored with
    the commands by then (what a node taking over finds)."""
    applied = trio.Event()
    stored: list[str | None] = []
    execute = owner.cluster._node.router.execute
    assert execute is not None

    async def answered_by_a_dying_node(*args: Any) -> NoReturn:
        await execute(*args)  # applied (and durable with its answer)
        stored.append(await trio.to_thread.run_sync(reply_of, dsn, args[1].command))
        applied.set()
        await trio.sleep_forever()  # the owner dies before its answer is written

    monkeypatch.setattr(owner.cluster._node.router, "execute", answered_by_a_dying_node)
    return applied, stored


def dies_recording(owner: Node, method: str, monkeypatch: pytest.MonkeyPatch) -> trio.Event:
    """Make ``owner``'s node record the next decision through ``method``
    (``record_decision``, ``record_child_cancel``), then hang before it applies it (as
    if it died): the event set once it is recorded."""
    recorded = trio.Event()
    real = getattr(owner.cluster._node, method)

    async def record_then_die(*args: Any, **kwargs: Any) -> NoReturn:
        await real(*args, **kwargs)
        recorded.set()
        await trio.sleep_forever()

    monkeypatch.setattr(owner.cluster._node, method, record_then_die)
    return recorded


async def request_as_owner_dies(
    owner: Node, c: Client, op: str, *, once: Sequence[trio.Event], **fields: Any
) -> dict[str, Any]:
    """Send ``op`` from ``c`` and crash ``owner`` once every event of ``once`` is set
    (within 30 s): the answer ``c`` then gets."""
    answers: list[dict[str, Any]] = []
    async with trio.open_nursery() as waiting:

        async def send() -> None:
            answers.append(await c.request(op, **fields))

        waiting.start_soon(send)
        with trio.fail_after(30):
            for event in once:
                await event.wait()
        owner.crash()
    return answers[0]
