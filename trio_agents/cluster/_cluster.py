""":class:`PostgresCluster`: the public configuration of one node of a cluster.

Its public face is its configuration (``dsn``, ``node_id``, ``lease_ttl``,
``max_runs``), :meth:`~PostgresCluster.statistics` (issue 31) and
:meth:`~PostgresCluster.host`, the run host a server's faces talk to. The node itself
— its database, listener, event writer, router, leases, and the run placement of its
host — is an internal object, ``_node.ClusterNode``.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, final

from ..hosting._node_of_cluster import ClusterStatistics
from ._cluster_host import ClusterHost
from ._cluster_node import ClusterNode

if TYPE_CHECKING:
    from .._agent import Agent
    from ..hosting._policies import ContextHook
    from ..hosting._server_limits import Limits

__all__ = ["ClusterStatistics", "PostgresCluster"]


def _default_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@final
class PostgresCluster:
    """Makes N :class:`~trio_agents.control.ControlServer` processes on one PostgreSQL
    database act as one server (DESIGN §12; the tables are described in
    :mod:`trio_agents.cluster`).

    Args:
        dsn: a libpq connection string or URI of the database every node shares. The
            tables are created (or migrated) on first use.
        node_id: this node's name, unique in the cluster (default: host, pid and a
            random suffix). A node restarted with the same id takes its old runs back
            once their leases expire, like any other node.
        lease_ttl: seconds a node's runs stay its own without a heartbeat (renewed
            every ``lease_ttl / 3``): how long after a crash another node takes them
            over.
        max_runs: unfinished runs this node runs at most; a ``run.start`` beyond it is
            placed on a node with room, or, when none has, queued until one has
            (``limit_exceeded`` past the principal's active-run limit of such runs).

    Give it to ``ControlServer(agents, auth=..., cluster=cluster)`` (one cluster object
    per server); ``sessions`` must then be None: runs' sessions are PostgreSQL sessions
    in the cluster's database.
    """

    def __init__(
        self,
        dsn: str,
        *,
        node_id: str | None = None,
        lease_ttl: float = 10.0,
        max_runs: int = 100,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise TypeError("dsn must be a non-empty str")
        if node_id is not None and (not isinstance(node_id, str) or not node_id):
            raise TypeError("node_id must be a non-empty str or None")
        if isinstance(lease_ttl, bool) or not isinstance(lease_ttl, int | float):
            raise TypeError("lease_ttl must be a number")
        if not lease_ttl > 0:
            raise ValueError(f"lease_ttl must be > 0, got {lease_ttl!r}")
        if isinstance(max_runs, bool) or not isinstance(max_runs, int):
            raise TypeError("max_runs must be an int")
        if max_runs < 1:
            raise ValueError(f"max_runs must be >= 1, got {max_runs!r}")
        self._node = ClusterNode(
            dsn,
            node_id if node_id is not None else _default_node_id(),
            float(lease_ttl),
            max_runs,
        )

    def __repr__(self) -> str:
        return f"<PostgresCluster node_id={self.node_id!r} lease_ttl={self.lease_ttl}>"

    @property
    def dsn(self) -> str:
        """The database's connection string."""
        return self._node.dsn

    @property
    def node_id(self) -> str:
        """This node's id."""
        return self._node.node_id

    @property
    def lease_ttl(self) -> float:
        """Seconds this node's runs stay its own without a heartbeat."""
        return self._node.lease_ttl

    @property
    def max_runs(self) -> int:
        """Unfinished runs this node runs at most."""
        return self._node.max_runs

    def statistics(self) -> ClusterStatistics:
        """Counts for monitoring (see :class:`ClusterStatistics`)."""
        return self._node.statistics()

    def host(
        self,
        agents: Mapping[str, Agent],
        *,
        limits: Limits | None = None,
        run_options: Mapping[str, Any] | None = None,
        context: ContextHook | None = None,
    ) -> ClusterHost:
        """This node as the run host (a :class:`~trio_agents.hosting.RunHost`) that a
        server's faces talk to: its runs, and every other node's through the cluster's
        tables. ``agents``, ``limits``, ``run_options`` and ``context`` are as for
        :class:`~trio_agents.hosting.LocalHost`; sessions are the cluster's. One host
        per cluster object, served once."""
        return ClusterHost(
            self._node, agents, limits=limits, run_options=run_options, context=context
        )

    def _crash(self) -> None:
        """Stop talking to the database at once, as a killed process would (tests)."""
        self._node.crash()
