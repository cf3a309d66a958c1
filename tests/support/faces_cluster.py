"""Support for the faces' tests on a cluster of real ``trio-agents serve --cluster``
processes (tests/support/process_cluster.py): the nodes' HTTP addresses and the
cluster's bearer header, under one hang guard."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import attrs
import httpx
import trio

from tests.support.process_cluster import Cluster, Node, open_cluster

BOUND: Final = 90.0  # a hang guard (a busy 2-core machine is slow, never this slow)


@attrs.frozen
class FacesCluster:
    """A running cluster, each node's HTTP base URL (in node order) and the
    ``Authorization`` header of the cluster's token."""

    cluster: Cluster
    urls: list[str]
    auth: dict[str, str]

    def client(self) -> httpx.AsyncClient:
        """An httpx client sending the cluster's token, with :data:`BOUND` timeouts."""
        return httpx.AsyncClient(headers=self.auth, timeout=httpx.Timeout(BOUND))


async def http_url(node: Node) -> str:
    """The base URL of ``node``'s HTTP faces (the line the node prints when serving)."""
    line = await node.wait_line(lambda line: line.startswith("http: http://"))
    return line.split()[1].rstrip("/")


@asynccontextmanager
async def faces_cluster(dsn: str, nodes: int) -> AsyncIterator[FacesCluster]:
    """``nodes`` node processes on ``dsn``, serving the faces, within :data:`BOUND`."""
    with trio.fail_after(BOUND):
        async with open_cluster(dsn, nodes) as cluster:
            urls = [await http_url(node) for node in cluster.nodes.values()]
            yield FacesCluster(cluster, urls, {"Authorization": f"Bearer {cluster.token}"})
