"""docs/cluster.md's embedded node (issue 30, item 7): run as written in a real
process, SIGTERM hands its runs over at once, as ``trio-agents serve`` does.

The page's block is run as a script, after a prelude that defines the names it takes
from the reader's application (``agents``, ``tokens``, ``dsn``, ``host``, ``port``);
another node (a ``trio-agents serve`` process, tests/support/process_cluster.py) continues the
run. Without the block's signal receiver the process dies of the SIGTERM and its run
keeps its owner until the lease expires.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Final

import trio

from tests.support import cluster_app
from tests.support.cli_support import cli_env
from tests.support.process_cluster import open_cluster, poll_until, run_row
from trio_agents.control import ControlConnectionError, connect

ROOT: Final = Path(__file__).resolve().parents[2]
BOUND: Final = 60.0  # a hang guard
PRELUDE: Final = """\
import os

from tests.support import cluster_app

agents = cluster_app.app()
tokens = {os.environ["NODE_TOKEN"]: "cli"}
dsn = os.environ["NODE_DSN"]
host, port = "127.0.0.1", int(os.environ["NODE_PORT"])
"""


def embedded_block() -> str:
    page = (ROOT / "docs" / "cluster.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```python\n(.*?)^```", page, re.MULTILINE | re.DOTALL)
    (block,) = [b for b in blocks if "ControlServer(" in b and "open_signal_receiver" in b]
    return str(block)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_the_embedded_node_hands_its_runs_over_on_sigterm(pg_dsn: str) -> None:
    async with open_cluster(pg_dsn, 1, lease_ttl=60.0) as cluster:
        with trio.fail_after(BOUND):
            script = cluster.directory / "embedded.py"
            script.write_text(PRELUDE + embedded_block())
            port = free_port()
            env = cli_env(
                NODE_TOKEN=cluster.token,
                NODE_DSN=pg_dsn,
                NODE_PORT=str(port),
                **{cluster_app.DIR_ENV: str(cluster.directory), cluster_app.NODE_ENV: "node-a"},
            )
            stderr = (cluster.directory / "embedded.err").open("wb")
            process = await trio.lowlevel.open_process(
                [sys.executable, str(script)],
                env=env,
                cwd=ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
            try:
                url = f"ws://127.0.0.1:{port}/"
                while True:  # until it serves
                    try:
                        async with connect(url, token=cluster.token) as client:
                            run = await client.start("worker", "stream #emb")
                        break
                    except (ControlConnectionError, OSError):
                        assert process.returncode is None, (
                            script.parent / "embedded.err"
                        ).read_text()
                        await trio.sleep(0.05)
                await cluster.wait_executions(1, "model", "emb")
                assert cluster.owner_of_tag("emb") == "node-a"
                process.send_signal(signal.SIGTERM)
                assert await process.wait() == 0, (script.parent / "embedded.err").read_text()
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
                stderr.close()
            # Handed over: released (or already taken over), not left to its lease.
            row = await trio.to_thread.run_sync(run_row, pg_dsn, run.id)
            assert row["released"] or row["owner"] != "node-a", row
            (other,) = cluster.alive()
            await poll_until(lambda: cluster.owner_of_tag("emb") == other.node_id)
            cluster.open_gate("stream")
            async with cluster.client(other) as client:
                terminal = await client.attach(run.id).wait()
            assert terminal.status.value == "completed", terminal
