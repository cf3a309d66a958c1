"""A cluster node process for the tests while ``trio-agents serve`` has no ``--cluster``.

``python -m tests.cluster_node --cluster DSN --node-id ID --lease-ttl S --max-runs N
--port P --app MODULE:ATTR --token T`` does what ``serve --cluster`` is to do: a
:class:`~trio_agents.control.ControlServer` with a
:class:`~trio_agents.cluster.PostgresCluster`, a ``serving ... on ws://...`` line once it
listens, SIGTERM and SIGINT as a graceful shutdown (which hands the runs over), exit 0.
tests/process_cluster.py starts this only when the installed ``serve`` lacks
``--cluster``; the runtime's own command replaces it as soon as it exists.
"""

from __future__ import annotations

import argparse
import signal
import sys

import trio

from trio_agents._cli._serve import load_app


async def serve(args: argparse.Namespace) -> None:
    from trio_agents.cluster import PostgresCluster
    from trio_agents.control import ControlServer, Limits

    agents = load_app(args.app)
    cluster = PostgresCluster(
        args.cluster, node_id=args.node_id, lease_ttl=args.lease_ttl, max_runs=args.max_runs
    )
    server = ControlServer(
        agents,
        auth={args.token: "cli"},
        cluster=cluster,
        limits=Limits(shutdown_timeout=args.shutdown_timeout),
    )
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve, args.host, args.port)
            print(f"serving {', '.join(agents)} on ws://{args.host}:{port}/ (cluster)", flush=True)
            async for signum in signals:
                print(f"{signal.Signals(signum).name}: stopping", flush=True)
                nursery.cancel_scope.cancel()
                break
    print("stopped", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(prog="cluster_node")
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--lease-ttl", type=float, default=10.0)
    parser.add_argument("--max-runs", type=int, default=100)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--app", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--shutdown-timeout", type=float, default=10.0)
    trio.run(serve, parser.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
