"""What a server is given for a cluster: :class:`NodeOfCluster` (the cluster's
configuration, its :class:`ClusterStatistics`, the host of this node its faces talk to).

A Protocol of public members only, so that the hosting layer names no class of the
cluster, which sits above it (docs/architecture.md). What the run machinery asks of
where runs live is :class:`~._placement.RunPlacement`, not this.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from .._agent import Agent
    from ._local import LocalHost
    from ._policies import ContextHook
    from ._server_limits import Limits

__all__ = ["ClusterStatistics", "NodeOfCluster"]


@attrs.frozen
class ClusterStatistics:
    """What :meth:`PostgresCluster.statistics` reports about this node.

    Attributes:
        node_id: this node.
        owned_runs: unfinished runs this node runs.
        takeovers: runs this node took over from other nodes.
        routed: ops this node sent to other nodes.
        served: ops other nodes sent to this one.
        statements: database transactions this node ran (sessions excluded).
        flushes: event-log flushes.
        reconnects: LISTEN reconnections after a lost connection.
    """

    node_id: str
    owned_runs: int
    takeovers: int
    routed: int
    served: int
    statements: int
    flushes: int
    reconnects: int


class NodeOfCluster(Protocol):
    """A cluster as a server is given it (``ControlServer(cluster=...)``, a
    ``PostgresCluster``): its configuration, its statistics, and the host of this node
    its faces talk to."""

    @property
    def dsn(self) -> str: ...
    @property
    def node_id(self) -> str: ...
    @property
    def lease_ttl(self) -> float: ...
    @property
    def max_runs(self) -> int: ...

    def statistics(self) -> ClusterStatistics: ...

    def host(
        self,
        agents: Mapping[str, Agent],
        *,
        limits: Limits | None = None,
        run_options: Mapping[str, Any] | None = None,
        context: ContextHook | None = None,
    ) -> LocalHost: ...
