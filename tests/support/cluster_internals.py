"""Helpers of the in-process cluster tests in tests/cluster/internals/ that the cluster
tests beside them do not use (those share tests/support/cluster_nodes.py, which these
tests use too): a node with a short lease, an idempotent tool whose calls a test holds
and counts, and a bounded poll."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager

import trio

import trio_agents as ta
from tests.support.cluster_support import Node, node
from trio_agents.control import Limits

__all__ = ["fetch_tool", "short_lease_node", "until"]


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
