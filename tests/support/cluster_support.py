"""Helpers for the cluster tests: nodes (ControlServers with a PostgresCluster) in one
Trio process on loopback, sharing one database, and a raw JSON client."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
from trio_websocket import ConnectionClosed

import trio_agents as ta
from tests.support.control_support import TOKENS, raw_client
from trio_agents.cluster import PostgresCluster
from trio_agents.control import ControlServer, Limits

__all__ = ["Client", "Node", "client", "node"]


@attrs.define(eq=False)
class Node:
    """One node: its server, cluster, URL and the scope it runs in."""

    server: ControlServer
    cluster: PostgresCluster
    url: str
    scope: trio.CancelScope
    stopped: trio.Event

    def crash(self) -> None:
        """Stop as a killed process would: nothing more reaches the database."""
        self.cluster._crash()
        self.scope.cancel()

    async def stop(self) -> None:
        """Graceful shutdown (hands the runs over) and wait for it."""
        self.scope.cancel()
        await self.stopped.wait()


@asynccontextmanager
async def node(
    nursery: trio.Nursery,
    agents: Mapping[str, ta.Agent],
    dsn: str,
    node_id: str,
    *,
    lease_ttl: float = 5.0,
    max_runs: int = 100,
    limits: Limits | None = None,
    context: Any = None,
) -> AsyncIterator[Node]:
    """Serve one node in ``nursery`` until the block ends (or it is stopped)."""
    cluster = PostgresCluster(dsn, node_id=node_id, lease_ttl=lease_ttl, max_runs=max_runs)
    server = ControlServer(
        agents,
        auth=TOKENS,
        cluster=cluster,
        limits=limits or Limits(ping_interval=None, shutdown_timeout=10.0),
        context=context,
    )
    scope = trio.CancelScope()
    stopped = trio.Event()

    async def serve(task_status: trio.TaskStatus[int]) -> None:
        try:
            with scope:
                await server.serve("127.0.0.1", 0, task_status=task_status)
        finally:
            stopped.set()

    port = await nursery.start(serve)
    the_node = Node(server, cluster, f"ws://127.0.0.1:{port}/", scope, stopped)
    try:
        yield the_node
    finally:
        scope.cancel()
        with trio.CancelScope(shield=True):
            await stopped.wait()


@attrs.define(eq=False)
class Client:
    """A raw JSON client: requests answered by id, events kept per run."""

    ws: Any
    answers: dict[Any, dict[str, Any]] = attrs.field(factory=dict)
    events: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict)
    order: list[tuple[str, int]] = attrs.field(factory=list)  # (run id, seq) as received
    changed: trio.Event = attrs.field(factory=trio.Event)
    closed: bool = False
    _next: int = 0

    def _wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def read(self) -> None:
        while True:
            try:
                message = await self.ws.get_message()
            except ConnectionClosed:
                self.closed = True
                self._wake()
                return
            frame = json.loads(message)
            if frame["type"] == "event":
                self.events.setdefault(frame["run_id"], []).append(frame)
                self.order.append((frame["run_id"], frame["seq"]))
            else:
                self.answers[frame["id"]] = frame
            self._wake()

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send a request and return its answer (an ack or an error frame)."""
        self._next += 1
        request_id = f"r{self._next}"
        await self.ws.send_message(json.dumps({"id": request_id, "op": op, **fields}))
        with trio.fail_after(60):
            while request_id not in self.answers:
                await self.changed.wait()
        return self.answers.pop(request_id)

    async def ok(self, op: str, **fields: Any) -> dict[str, Any]:
        """A request that must be acked."""
        answer = await self.request(op, **fields)
        assert answer["type"] == "ack", answer
        return answer

    async def start_run(self, **fields: Any) -> str:
        """A ``run.start`` that must be acked: the new run's id."""
        return str((await self.ok("run.start", **fields))["run_id"])

    async def start_until_tool(self, **fields: Any) -> str:
        """A ``run.start`` subscribed to all events that must be acked: the new run's
        id, once its first tool call has started."""
        run_id = await self.start_run(subscribe="all", **fields)
        await self.wait_event(run_id, lambda e: e["type"] == "tool.started")
        return run_id

    async def end(self, run_id: str, **fields: Any) -> dict[str, Any]:
        """A ``run.cancel`` that must be acked, then the run's terminal update."""
        await self.ok("run.cancel", run_id=run_id, **fields)
        return await self.wait_terminal(run_id)

    async def wait_event(self, run_id: str, predicate: Any) -> dict[str, Any]:
        """Wait (at most 60 s) for an event of ``run_id`` matching ``predicate(event_json)``."""
        with trio.fail_after(60):
            while True:
                for frame in self.events.get(run_id, []):
                    if predicate(frame["event"]):
                        return frame
                await self.changed.wait()

    async def wait_status(self, run_id: str, status: str) -> dict[str, Any]:
        return await self.wait_event(
            run_id, lambda e: e["type"] == "run.updated" and e["status"] == status
        )

    async def wait_terminal(self, run_id: str) -> dict[str, Any]:
        return await self.wait_event(
            run_id,
            lambda e: (
                e["type"] == "run.updated" and e["status"] in ("completed", "failed", "cancelled")
            ),
        )

    def seqs(self, run_id: str) -> list[int]:
        return [frame["seq"] for frame in self.events.get(run_id, [])]


@asynccontextmanager
async def client(url: str, token: str = "tok-alice") -> AsyncIterator[Client]:
    """A connected :class:`Client` (its reader runs for the block)."""
    async with raw_client(url, token=token) as ws, trio.open_nursery() as nursery:
        c = Client(ws)
        nursery.start_soon(c.read)
        try:
            yield c
        finally:
            nursery.cancel_scope.cancel()
