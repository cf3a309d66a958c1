"""Helpers shared by the in-process cluster tests (tests/cluster/internals/ and the
cluster tests beside it): the one-agent table, two short-lease nodes, the tools whose
calls a test holds and counts, a bounded poll, and a routed op whose owner dies before
it answers."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, NoReturn

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_support import Client, Node, node
from trio_agents.control import Limits

__all__ = [
    "agents",
    "approval_tool",
    "dies_answering",
    "fetch_tool",
    "local_entry",
    "reply_of",
    "request_as_owner_dies",
    "short_lease_node",
    "two_nodes",
    "until",
    "waiting_tool",
]


def agents(model: ta.Model, tools: list[ta.Tool] | None = None) -> dict[str, ta.Agent]:
    """The one agent ``"a"`` the cluster tests serve, on ``model`` with ``tools``."""
    return {"a": ta.Agent(name="a", instructions="", model=model, tools=tools or [])}


def short_lease_node(
    nursery: trio.Nursery,
    served: Mapping[str, ta.Agent],
    dsn: str,
    node_id: str,
    *,
    lease_ttl: float = 0.5,
    limits: Limits | None = None,
) -> AbstractAsyncContextManager[Node]:
    """``cluster_support.node`` with a short lease (a lost lease is noticed at once)."""
    return node(nursery, served, dsn, node_id, lease_ttl=lease_ttl, limits=limits)


@asynccontextmanager
async def two_nodes(
    dsn: str,
    a_agents: Mapping[str, ta.Agent],
    b_agents: Mapping[str, ta.Agent],
    *,
    limits: Limits | None = None,
) -> AsyncIterator[tuple[Node, Node]]:
    """Nodes A and B (``short_lease_node``) serving ``a_agents`` and ``b_agents``."""
    async with trio.open_nursery() as nursery:
        async with (
            short_lease_node(nursery, a_agents, dsn, "A", limits=limits) as a,
            short_lease_node(nursery, b_agents, dsn, "B", limits=limits) as b,
        ):
            yield a, b
        nursery.cancel_scope.cancel()


def local_entry(node: Node, run_id: str) -> Any:
    """The node's own registry entry of a run it runs (its fence, its ``Run``)."""
    return node.server._registry.runs[run_id]


def approval_tool(ran: list[str]) -> ta.Tool:
    """A ``delete`` tool that needs approval and records the call id of each run of it."""

    @ta.function_tool(needs_approval=True)
    async def delete(ctx: ta.ToolContext) -> str:
        """Delete a file, once approved."""
        ran.append(ctx.call_id)
        return "deleted"

    return delete


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


def fetch_tool(started: list[str], gate: trio.Event, *, first_only: bool = False) -> ta.Tool:
    """An idempotent ``fetch`` tool that records each call id it starts and then waits
    for ``gate`` (on its first start only, with ``first_only``: a resumed call ends)."""

    @ta.function_tool(idempotent=True)
    async def fetch(ctx: ta.ToolContext) -> str:
        """Fetch (safe to repeat)."""
        started.append(ctx.call_id)
        if not first_only or len(started) == 1:
            await gate.wait()
        return "fetched"

    return fetch


async def until(predicate: Callable[[], bool], limit: float = 10.0) -> None:
    """Poll a condition on state nothing signals (database rows, server internals),
    bounded by ``limit`` seconds."""
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 (no event to wait for)
            await trio.sleep(0.05)


def reply_of(dsn: str, command_id: int) -> str | None:
    """The reply stored with a routed command (None: not answered yet). Sync: call it
    in a thread."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT reply FROM trio_agents_commands WHERE command_id = %s", (command_id,)
        ).fetchone()
    assert row is not None, f"no command {command_id}"
    return None if row[0] is None else str(row[0])


def dies_answering(
    owner: Node, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[trio.Event, list[str | None]]:
    """Make ``owner`` apply the next routed command, then hang before it could answer
    (as if it died): the event set once it applied it, and the replies stored with
    the commands by then (what a node taking over finds)."""
    applied = trio.Event()
    stored: list[str | None] = []
    execute = owner.cluster._router.execute
    assert execute is not None

    async def answered_by_a_dying_node(*args: Any) -> NoReturn:
        await execute(*args)  # applied, and durable (acked only then)
        stored.append(await trio.to_thread.run_sync(reply_of, dsn, args[2]))
        applied.set()
        await trio.sleep_forever()  # the owner dies before its answer is written

    monkeypatch.setattr(owner.cluster._router, "execute", answered_by_a_dying_node)
    return applied, stored


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
