"""What the run machinery of a host needs of a cluster node: :class:`ClusterNode` (what
``trio_agents.cluster``'s ``PostgresCluster`` is to the registry and the run tasks) and
:class:`TakenOver` (a run the node took over, as ``cluster._takeover.Claimed`` reports
it), and :class:`NodeOfCluster` (what a server's faces are given: the cluster's
configuration, its :class:`ClusterStatistics`, a host for this node).

They are Protocols so that the hosting layer names no class of the cluster, which sits
above it (docs/architecture.md): the cluster's classes satisfy them structurally, and
mypy checks that they do where the cluster hands itself to a registry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from .._agent import Agent
    from .._items import Item, ToolCall
    from .._limits import UsageLimits
    from ._host import Origin
    from ._limits import Limits
    from ._local import LocalHost
    from ._policies import ContextHook
    from ._requests import RunCancel

__all__ = ["ClusterNode", "ClusterStatistics", "NodeOfCluster", "TakenOver"]


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


class ClusterNode(Protocol):
    """A node of a cluster, as the registry and the run tasks use it.

    A session is the cluster's session of one run (``cluster._session.ClusterSession``:
    a :class:`~trio_agents.sessions.Session` with its ``fence`` and ``attempt``); a
    fence and a run's log are the cluster's own objects, opaque here.
    """

    @property
    def node_id(self) -> str: ...

    def _room_freed(self) -> None: ...

    def _session(self, principal: str, session_id: str | None, run_id: str) -> Any: ...

    async def _claim(
        self,
        *,
        run_id: str,
        principal: str,
        session_id: str | None,
        agent: str,
        on_busy: str,
        cancel_holder: Callable[[str, str | None], Awaitable[None]],
        items: Sequence[Item] = (),
        client_node: str | None = None,
        command: int | None = None,
        limits: UsageLimits | None = None,
    ) -> str | None: ...

    async def _claim_queued(
        self,
        *,
        run_id: str,
        principal: str,
        session_id: str | None,
        on_busy: str,
        waiting: Callable[[], bool],
        cancel_holder: Callable[[str, str | None], Awaitable[None]],
        interrupted: str | None = None,
    ) -> bool: ...

    async def _forget(self, run_id: str) -> None: ...

    def _track(
        self,
        run: Any,
        run_id: str,
        attempt: int,
        start_seq: int,
        fence: Any,
        client_node: str | None = None,
    ) -> Any: ...

    def _before_tool(self, run_id: str, attempt: int, fence: Any) -> Callable[[ToolCall], Any]: ...

    async def _unfinished(self, principal: str, run_ids: Iterable[str]) -> set[str]: ...

    async def _route(self, principal: str, request: RunCancel, run_id: str) -> Any: ...

    async def _record_cancel(
        self, run_id: str, reason: str | None, mode: str, origin: Origin | None = None
    ) -> bool: ...


class TakenOver(Protocol):
    """A run a node took over from another, with what resuming it needs."""

    @property
    def run_id(self) -> str: ...
    @property
    def principal(self) -> str: ...
    @property
    def session_id(self) -> str | None: ...
    @property
    def agent(self) -> str: ...
    @property
    def input(self) -> tuple[Item, ...]: ...
    @property
    def queued(self) -> bool: ...
    @property
    def client_node(self) -> str | None: ...
    @property
    def client_gone(self) -> bool: ...
    @property
    def limits(self) -> UsageLimits | None: ...
