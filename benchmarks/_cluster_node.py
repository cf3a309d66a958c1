"""A cluster node for B7: ``trio-agents serve --cluster`` without the per-principal
``run.start`` rate limit (``Limits(start_rate=...)``, 10/s by default, which the
command line does not set), so that runs/s measures the cluster, not the limiter.

``python -m benchmarks._cluster_node`` takes ``serve``'s options that B7 uses and
prints the same ``serving ... on ws://...`` line.
"""

from __future__ import annotations

import argparse
import signal

import trio

from trio_agents._cli._serve import load_app


async def _serve(args: argparse.Namespace) -> None:
    from trio_agents.cluster import PostgresCluster
    from trio_agents.control import ControlServer, Limits

    agents = load_app(args.app)
    cluster = PostgresCluster(
        args.cluster, node_id=args.node_id, lease_ttl=args.lease_ttl, max_runs=args.max_runs
    )
    limits = Limits(
        shutdown_timeout=args.shutdown_timeout,
        start_rate=1e9,
        start_burst=10**9,
        max_runs_per_principal=10**6,
        max_retained_bytes_per_principal=1 << 40,
        max_subscriptions_per_connection=10_000,
    )
    server = ControlServer(agents, auth={args.token: "bench"}, cluster=cluster, limits=limits)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve, args.host, args.port)
            print(f"serving {', '.join(agents)} on ws://{args.host}:{port}/ (B7)", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._cluster_node")
    parser.add_argument("--host", default="127.0.0.1")
    for name in ("--app", "--token", "--cluster", "--node-id"):
        parser.add_argument(name, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    parser.add_argument("--max-runs", type=int, default=100)
    parser.add_argument("--shutdown-timeout", type=float, default=10.0)
    trio.run(_serve, parser.parse_args())


if __name__ == "__main__":
    main()
