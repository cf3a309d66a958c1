"""What the tests on real node processes (tests/support/process_cluster.py) share: a
cluster opened with a nursery for followers under one hang guard, a run started on its
first node, and a :class:`~tests.support.process_cluster.Follower` started."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final

import trio

from tests.support.process_cluster import Cluster, Follower, Node, open_cluster
from trio_agents.control import RemoteRun

__all__ = ["BOUND", "LEASE", "STEP", "bounded_cluster", "follow", "start_on_first", "within"]

LEASE: Final = 1.0  # seconds: short, so that a takeover comes quickly
BOUND: Final = 90.0  # a hang guard per test (a busy 2-core machine is slow, never this slow)
STEP: Final = 30.0  # a hang guard for one awaited step of a test, well inside BOUND


@asynccontextmanager
async def bounded_cluster(
    dsn: str | None, nodes: int, *, bound: float = BOUND, **options: Any
) -> AsyncIterator[tuple[Cluster, trio.Nursery]]:
    """``open_cluster(dsn, nodes, **options)`` and a nursery (for followers) for the
    block, which must end within ``bound`` seconds (a hang guard, never a measure)."""
    async with open_cluster(dsn, nodes, **options) as cluster, trio.open_nursery() as nursery:
        with trio.fail_after(bound):
            yield cluster, nursery


async def start_on_first(cluster: Cluster, text: str, **fields: Any) -> RemoteRun:
    """Start a ``worker`` run with ``text`` through the first live node (then
    disconnect: the run goes on, followed by id)."""
    async with cluster.client(cluster.alive()[0]) as client:
        return await client.start("worker", text, **fields)


async def follow(
    nursery: trio.Nursery, cluster: Cluster, run_id: str, first: str | Node
) -> Follower:
    """A :class:`Follower` of the run, following it in ``nursery`` from node ``first``."""
    follower = Follower(cluster, run_id)
    nursery.start_soon(follower.follow, first)
    return follower


@contextmanager
def within(seconds: float, stalled: str) -> Iterator[None]:
    """A hang guard for one step of a test (never a measure): the block must end
    within ``seconds``, else the test fails saying ``stalled`` (which side did not
    do its part) rather than with the whole test's bare ``TooSlowError``."""
    with trio.move_on_after(seconds) as scope:
        yield
    if scope.cancelled_caught:
        raise AssertionError(f"stalled for {seconds:g} s: {stalled}")
