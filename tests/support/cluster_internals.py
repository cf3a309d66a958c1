"""Helpers shared by the in-process cluster tests (tests/cluster/internals/ and the
cluster tests beside it): the one-agent table, the tools whose calls a test holds and
counts, a bounded poll, and a routed op whose owner dies before it answers."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_support import Client, Node

__all__ = [
    "agent",
    "answered_by_a_dying_owner",
    "approval_tool",
    "command_reply",
    "fetch_tool",
    "gated_tool",
    "until",
]


def agent(model: ta.Model, tools: Sequence[ta.Tool] = ()) -> dict[str, ta.Agent]:
    """The agent table of a node: agent ``a`` with ``model`` and ``tools``."""
    return {"a": ta.Agent(name="a", instructions="", model=model, tools=list(tools))}


def approval_tool(ran: list[str]) -> ta.Tool:
    """A ``delete`` tool that needs approval and records the call id of each run of it."""

    @ta.function_tool(needs_approval=True)
    async def delete(ctx: ta.ToolContext) -> str:
        """Delete a file, once approved."""
        ran.append(ctx.call_id)
        return "deleted"

    return delete


def gated_tool(gate: trio.Event, name: str = "wait", output: str = "done") -> ta.Tool:
    """A tool called ``name`` (not idempotent) that waits for ``gate``, then returns
    ``output``."""

    async def wait() -> str:
        await gate.wait()
        return output

    return ta.function_tool(wait, name=name, description="Wait for the test's gate.")


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


def command_reply(dsn: str, command_id: int) -> str | None:
    """The reply stored with a routed command (``None`` while it has none). Sync: call
    it in a thread."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT reply FROM trio_agents_commands WHERE command_id = %s", (command_id,)
        ).fetchone()
    assert row is not None
    return None if row[0] is None else str(row[0])


async def answered_by_a_dying_owner(
    owner: Node,
    sender: Client,
    dsn: str,
    monkeypatch: pytest.MonkeyPatch,
    op: str,
    fields: Mapping[str, Any],
    *,
    also: trio.Event | None = None,
) -> tuple[str | None, dict[str, Any]]:
    """Send ``op`` (with ``fields``, its run's id among them) from ``sender`` for a run
    ``owner`` runs: ``owner`` applies it, makes it durable with its reply, and dies
    (crashed once it applied it and ``also`` is set) before it could answer. Returns
    the reply ``owner`` stored and the answer ``sender`` got (from the node that took
    the run over meanwhile)."""
    applied = trio.Event()
    stored: list[str | None] = []
    execute = owner.cluster._router.execute
    assert execute is not None

    async def answer_then_hang(*args: Any) -> NoReturn:
        await execute(*args)  # applied, and durable (acked only then)
        stored.append(await trio.to_thread.run_sync(command_reply, dsn, args[2]))
        applied.set()
        await trio.sleep_forever()  # the owner dies before its answer is written

    monkeypatch.setattr(owner.cluster._router, "execute", answer_then_hang)
    answers: list[dict[str, Any]] = []
    async with trio.open_nursery() as waiting:

        async def send() -> None:
            answers.append(await sender.request(op, **fields))

        waiting.start_soon(send)
        with trio.fail_after(30):
            await applied.wait()
            if also is not None:
                await also.wait()
        owner.crash()
    return stored[0], answers[0]
