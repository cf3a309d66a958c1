"""B10: the failure timeline of a cluster — how long until a run goes on elsewhere.

Real node processes on loopback (as B7: tests/support/process_cluster.py, serving
tests/support/cluster_app.py's agents) on a throwaway PostgreSQL server, with
``lease_ttl=3`` (as the chaos test: tests/cluster/test_cluster_chaos.py). A run blocks in an
idempotent tool on its owner; a client of another node subscribes to it; then the
owner:

- ``takeover_after_kill``: is killed (``kill -9``);
- ``takeover_after_freeze``: is paused (``SIGSTOP``, resumed with ``SIGCONT`` after the
  measurement): its sockets stay open, as a paused VM's or a partitioned host's;
- ``takeover_after_freeze_in_flush``: pauses itself inside a flush of the run's events,
  its transaction open, holding the run's row lock (tests/support/cluster_app.py's
  ``freeze-in-flush``): the server ends that transaction once it has been idle for half
  the lease (``idle_in_transaction_session_timeout``); until then no node can claim
  the run.

Each figure is the time from the fault to the resumed ``running`` update at the other
node's client (median and max of ``samples``). The bound it is checked against,
``lease_ttl + lease_ttl / 3`` plus the resumption, is in docs/cluster.md.
"""

from __future__ import annotations

import time
from typing import Any

import trio

import trio_agents as ta

from ._common import Baselines, Figure, median
from .cluster import NODE

__all__ = ["bench_b10"]

LEASE = 3.0


async def _one(cluster: Any, fault: str) -> float:
    owner, watcher = cluster.alive()[:2]
    async with cluster.client(owner) as starter:
        run = await starter.start("worker", "lookup", subscribe=None)
    elapsed = float("nan")
    async with cluster.client(watcher) as client, trio.open_nursery() as nursery:
        remote = client.attach(run.id)
        events = remote.events(1)
        async for event in events:
            if isinstance(event, ta.ToolStarted):
                break
        started = time.perf_counter()
        if fault == "kill":
            await cluster.kill(owner)
        elif fault == "freeze":
            cluster.freeze(owner)
        else:
            # The owner's next flush: the one of an injection's event (its ack never
            # comes: the owner is frozen before it answers).
            cluster.freeze_in_next_flush(owner)
            nursery.start_soon(_inject, cluster, owner, run.id)
        async for event in events:
            if isinstance(event, ta.RunUpdated) and event.detail.get("resumed"):
                elapsed = time.perf_counter() - started
                break
        nursery.cancel_scope.cancel()
        await remote.cancel("bench done")
    return elapsed


async def _inject(cluster: Any, node: Any, run_id: str) -> None:
    async with cluster.client(node) as client:
        await client.attach(run_id).inject("note freeze")


async def _figure(dsn: str, fault: str, samples: int) -> Figure:
    from tests.support.process_cluster import open_cluster

    seconds: list[float] = []
    for _ in range(samples):  # a fresh cluster per sample: one freeze record each
        async with open_cluster(dsn, 2, lease_ttl=LEASE, echo=False, node_command=NODE) as cluster:
            seconds.append(await _one(cluster, fault))
    seconds.sort()
    what = {
        "kill": "kill -9 of the owner",
        "freeze": "SIGSTOP of the owner (between transactions)",
        "freeze_in_flush": "the owner paused inside a flush (its row lock held, idle)",
    }[fault]
    return Figure(
        f"B10.takeover_after_{fault}",
        median(seconds),
        "s",
        note=f"{what} -> resumed running update at a client of another node,"
        f" lease_ttl={LEASE} s (median)",
        extra={"n": len(seconds), "max_s": round(seconds[-1], 3), "lease_ttl_s": LEASE},
    )


async def bench_b10(base: Baselines, *, samples: int = 5) -> list[Figure]:
    """B10 (see the module docstring). Needs PostgreSQL (``initdb``) on the machine."""
    del base
    from tests.support.pg_support import PostgresServer, find_bin_dir

    server = PostgresServer(find_bin_dir(), synchronous_commit=True)
    await trio.to_thread.run_sync(server.start)
    figures: list[Figure] = []
    try:
        for fault in ("kill", "freeze", "freeze_in_flush"):
            dsn = await trio.to_thread.run_sync(server.create_database)
            figures.append(await _figure(dsn, fault, samples))
    finally:
        await trio.to_thread.run_sync(server.stop)
    return figures
