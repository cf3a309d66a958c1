"""B7: a cluster of ``trio-agents serve --cluster`` processes on one PostgreSQL.

Real node processes on loopback (tests/support/process_cluster.py starts them: ``serve
--cluster`` as benchmarks/_cluster_node.py, without the start rate limit; serving
tests/support/cluster_app.py's agents) on a throwaway PostgreSQL server (tests/support/pg_support.py,
``fsync=off`` but ``synchronous_commit=on``: a commit waits for its WAL write, not for
the disk), on the same machine as the client:

- ``runs_per_s.nodesN``: runs that answer at once, started back to back on
  ``connections`` client connections spread over the N nodes, each start waiting for
  its terminal event; runs per second of wall time.
- ``statements_per_run.nodesN``: PostgreSQL transactions (``pg_stat_database``
  ``xact_commit + xact_rollback`` of the cluster's database) during that workload, per
  run, minus the idle rate (heartbeats, measured alone) — every transaction a run
  costs, its session's included. Approximate: PostgreSQL 15 publishes a backend's
  counts at most once a second (an idle one's after 10 s), so each reading waits 11 s.
- ``cancel_to_terminal.same_node.nodesN`` / ``.routed``: a run blocked in a tool on
  node A; ``run.cancel`` sent by a client of A (same node) or of B (routed: the op goes
  to A through the commands table, the terminal event comes back to B through the
  event log and NOTIFY) → the terminal ``run.updated`` received by that client.
  Target (issue 17): routed ≤ 20 ms p99 on loopback.
- ``takeover_after_kill``: ``kill -9`` of a run's owner → the ``running`` (resumed)
  update received by a client of another node; bounded below by ``lease_ttl``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

import trio

import trio_agents as ta
from trio_agents.control import ControlClient

from ._common import Baselines, Figure, median, percentile

__all__ = ["bench_b7"]

TARGET_ROUTED_CANCEL_MS = 20.0
# serve --cluster without the per-principal start rate limit (see _cluster_node.py)
NODE = (sys.executable, "-m", "benchmarks._cluster_node")


def _xacts(dsn: str) -> int:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database"
            " WHERE datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def _xacts_now(dsn: str) -> int:
    return await trio.to_thread.run_sync(_xacts, dsn)


async def _runs_per_s(clients: Sequence[ControlClient], runs: int) -> tuple[float, int]:
    per_client = max(1, runs // len(clients))
    done = 0

    async def worker(client: ControlClient) -> None:
        nonlocal done
        for _ in range(per_client):
            run = await client.start("worker", "hello")
            update = await run.wait()
            assert update.status is ta.RunStatus.COMPLETED, update
            done += 1

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for client in clients:
            nursery.start_soon(worker, client)
    return time.perf_counter() - start, done


async def _cancel_latency(
    starter: ControlClient, canceller: ControlClient, count: int
) -> list[float]:
    """Seconds from ``run.cancel`` sent (by ``canceller``) to its terminal event
    received (by ``canceller``, subscribed to the run)."""
    samples: list[float] = []
    for _ in range(count):
        run = await starter.start("worker", "lookup", subscribe=None)
        remote = canceller.attach(run.id)
        async for event in remote.events(1):
            if isinstance(event, ta.ToolStarted):
                break
        begun = time.perf_counter()
        await remote.cancel("bench")
        terminal = await remote.wait()
        samples.append(time.perf_counter() - begun)
        assert terminal.status is ta.RunStatus.CANCELLED, terminal
    return samples


def _latency_figure(name: str, samples: list[float], note: str, **extra: Any) -> Figure:
    ms = sorted(s * 1000 for s in samples)
    routed = name.endswith("routed")
    return Figure(
        f"B7.{name}",
        percentile(ms, 99),
        "ms p99",
        target=TARGET_ROUTED_CANCEL_MS if routed else None,
        note=note,
        extra={
            "n": len(ms),
            "p50_ms": round(median(ms), 3),
            "max_ms": round(ms[-1], 3),
            **extra,
        },
    )


async def _one_cluster(
    dsn: str, nodes: int, *, runs: int, cancels: int, connections: int, flush_wait: float
) -> list[Figure]:
    from tests.support.process_cluster import open_cluster

    figures: list[Figure] = []
    async with open_cluster(dsn, nodes, lease_ttl=10.0, echo=False, node_command=NODE) as cluster:
        alive = cluster.alive()
        async with trio.open_nursery() as nursery:
            clients: list[ControlClient] = []

            async def connect_to(index: int, task_status: trio.TaskStatus[None]) -> None:
                async with cluster.client(alive[index % len(alive)]) as client:
                    clients.append(client)
                    task_status.started()
                    await trio.sleep_forever()

            for index in range(connections):
                await nursery.start(connect_to, index)
            await _runs_per_s(clients, max(len(clients), runs // 10))  # warm up
            # PostgreSQL 15 backends publish their counts when a transaction ends, at
            # most once a second, and an idle one after 10 s: wait that out before
            # each reading, and subtract the idle rate (heartbeats) over the window.
            await trio.sleep(flush_wait)
            idle_before = await _xacts_now(dsn)
            idle_began = time.perf_counter()
            await trio.sleep(flush_wait)
            idle_rate = (await _xacts_now(dsn) - idle_before) / (time.perf_counter() - idle_began)
            before = await _xacts_now(dsn)
            began = time.perf_counter()
            wall, done = await _runs_per_s(clients, runs)
            await trio.sleep(flush_wait)
            after = await _xacts_now(dsn)
            window = time.perf_counter() - began
            per_run = (after - before - idle_rate * window) / done
            figures.append(
                Figure(
                    f"B7.runs_per_s.nodes{nodes}",
                    done / wall,
                    "runs/s",
                    note=f"{connections} connections over {nodes} node(s), runs back to back",
                    extra={"n": done},
                )
            )
            figures.append(
                Figure(
                    f"B7.statements_per_run.nodes{nodes}",
                    per_run,
                    "xacts",
                    note="PostgreSQL transactions per run (pg_stat_database), idle rate subtracted",
                    extra={"idle_xacts_per_s": round(idle_rate, 1)},
                )
            )
            same = await _cancel_latency(clients[0], clients[0], cancels)
            figures.append(
                _latency_figure(
                    f"cancel_to_terminal.same_node.nodes{nodes}",
                    same,
                    "run.cancel sent -> terminal event received, client on the owner",
                )
            )
            if nodes > 1:
                routed = await _cancel_latency(clients[0], clients[1], cancels)
                figures.append(
                    _latency_figure(
                        "cancel_to_terminal.routed",
                        routed,
                        "run.cancel sent to node B -> terminal event received on B;"
                        " run owned by node A",
                    )
                )
            nursery.cancel_scope.cancel()
    return figures


async def _takeover(dsn: str, kills: int, lease_ttl: float) -> Figure:
    from tests.support.process_cluster import open_cluster

    samples: list[float] = []
    async with open_cluster(dsn, 0, lease_ttl=lease_ttl, echo=False, node_command=NODE) as cluster:
        await cluster.start_nodes(kills + 1)
        for _ in range(kills):
            owner, watcher = cluster.alive()[:2]
            async with cluster.client(owner) as starter:
                run = await starter.start("worker", "lookup", subscribe=None)
            async with cluster.client(watcher) as client:
                remote = client.attach(run.id)
                events = remote.events(1)
                async for event in events:
                    if isinstance(event, ta.ToolStarted):
                        break
                killed = time.perf_counter()
                await cluster.kill(owner)
                async for event in events:
                    if isinstance(event, ta.RunUpdated) and event.detail.get("resumed"):
                        samples.append(time.perf_counter() - killed)
                        break
                await remote.cancel("bench done")
    seconds = sorted(samples)
    return Figure(
        "B7.takeover_after_kill",
        median(seconds),
        "s",
        note=f"kill -9 of the owner -> resumed running update at a client of another"
        f" node, lease_ttl={lease_ttl} s (median)",
        extra={"n": len(seconds), "max_s": round(seconds[-1], 3), "lease_ttl_s": lease_ttl},
    )


async def bench_b7(
    base: Baselines,
    *,
    runs: int = 600,
    cancels: int = 300,
    connections: int = 6,
    kills: int = 3,
    flush_wait: float = 11.0,
) -> list[Figure]:
    """B7 (see the module docstring). Needs PostgreSQL (``initdb``) on the machine."""
    del base  # process-to-process figures: hop ratios would mean nothing here
    from tests.support.pg_support import PostgresServer, find_bin_dir

    server = PostgresServer(find_bin_dir(), synchronous_commit=True)
    await trio.to_thread.run_sync(server.start)
    figures: list[Figure] = []
    try:
        for nodes in (1, 3):
            dsn = await trio.to_thread.run_sync(server.create_database)
            figures += await _one_cluster(
                dsn,
                nodes,
                runs=runs,
                cancels=cancels,
                connections=connections,
                flush_wait=flush_wait,
            )
        dsn = await trio.to_thread.run_sync(server.create_database)
        figures.append(await _takeover(dsn, kills, lease_ttl=1.0))
    finally:
        await trio.to_thread.run_sync(server.stop)
    return figures
