"""Several real ``trio-agents serve`` processes as one cluster, for the cluster tests.

:func:`open_cluster` starts node processes (``python -m trio_agents serve --cluster DSN
--node-id ID --lease-ttl S --max-runs N --port 0 --app tests.support.cluster_app:app``) in a
nursery of the test; a node is ready once it printed its ``serving ... on ws://...``
line (read from its stdout, bounded by :data:`STARTUP_TIMEOUT`; never a sleep). Each
node's stdout and stderr are read to the end in the background, so a chatty node never
blocks on a full pipe, and are printed when the cluster closes (pytest shows them for a
failed test). Leaving the block kills every node still running (SIGKILL).

:meth:`Cluster.kill` is ``kill -9``; :meth:`Cluster.terminate` is SIGTERM (a graceful
stop); :meth:`Cluster.client` connects a :class:`~trio_agents.control.ControlClient` to
one node. The agents and the cross-process gates and execution records are in
``tests/support/cluster_app.py``. Without ``dsn`` the nodes are plain single-process servers
(each its own SQLite file): the infrastructure's own tests use that.

Waits for something another process does (a record in the executions log, a status)
poll the observable fact every :data:`POLL` seconds under the caller's
``trio.fail_after``; they never assume that some time is enough.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import secrets
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final, TypeVar

import attrs
import trio

import trio_agents as ta
from tests.support import cluster_app
from tests.support.cli_support import cli_argv, cli_env
from trio_agents.control import (
    ControlClient,
    ControlConnectionError,
    ControlError,
    RemoteRun,
    connect,
)

__all__ = [
    "POLL",
    "STARTUP_TIMEOUT",
    "Cluster",
    "Node",
    "NodeFailed",
    "assert_contiguous",
    "open_cluster",
    "poll_until",
]

STARTUP_TIMEOUT: Final = 60.0  # a hang guard: a node starts in about 1 s when idle
POLL: Final = 0.02
HANDSHAKE_BOUND: Final = 10.0  # seconds (a hang guard: a handshake takes milliseconds)
APP: Final = "tests.support.cluster_app:app"
SERVING: Final = re.compile(r"^serving .* on (ws://\S+/)")
_node_numbers = itertools.count(1)


_T = TypeVar("_T")


async def first_match(
    items: list[_T],
    predicate: Callable[[_T], bool],
    changed: trio.lowlevel.ParkingLot,
    ended: Callable[[], Exception | None],
) -> _T:
    """The first of ``items`` (read so far, or appended later: ``changed`` is unparked
    then) that satisfies ``predicate``; once none will come, raises what ``ended()``
    returns (it returns ``None`` while more may come)."""
    seen = 0
    while True:
        for item in items[seen:]:
            if predicate(item):
                return item
        seen = len(items)
        if (error := ended()) is not None:
            raise error
        await changed.park()


class NodeFailed(Exception):
    """A node process exited before it was serving (the message has its stderr)."""


@attrs.define(eq=False)
class Node:
    """One node process."""

    node_id: str
    process: trio.Process
    url: str = ""
    stdout: list[str] = attrs.field(factory=list)
    stderr: list[str] = attrs.field(factory=list)
    _changed: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _stdout_done: bool = False

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def output(self) -> str:
        return "\n".join(
            [f"--- node {self.node_id} stdout", *self.stdout, "--- stderr", *self.stderr]
        )

    async def wait_line(self, predicate: Callable[[str], bool]) -> str:
        """Wait for a line of the node's stdout (the ones read so far count too)."""

        def ended() -> Exception | None:
            if not self._stdout_done:
                return None
            return NodeFailed(f"node {self.node_id} ended without the line\n{self.output()}")

        return await first_match(self.stdout, predicate, self._changed, ended)

    async def _pump(self, stream: trio.abc.ReceiveStream, lines: list[str], is_out: bool) -> None:
        buffer = b""
        try:
            while chunk := await stream.receive_some():
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for raw in complete:
                    line = raw.decode(errors="replace")
                    lines.append(line)
                    if is_out and not self.url and (match := SERVING.match(line)):
                        self.url = match.group(1)
                if complete:
                    self._changed.unpark_all()
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass
        finally:
            if buffer:
                lines.append(buffer.decode(errors="replace"))
            if is_out:
                self._stdout_done = True
            self._changed.unpark_all()

    async def _wait_serving(self) -> None:
        while not self.url:
            if self._stdout_done:
                await self.process.wait()
                raise NodeFailed(
                    f"node {self.node_id} exited ({self.process.returncode}) before"
                    f" serving\n{self.output()}"
                )
            await self._changed.park()


@attrs.define(eq=False)
class Cluster:
    """Node processes of one test; see :func:`open_cluster`."""

    dsn: str | None
    directory: Path
    nursery: trio.Nursery
    lease_ttl: float
    max_runs: int | None
    app: str = APP
    token: str = attrs.field(factory=lambda: secrets.token_urlsafe(16))
    nodes: dict[str, Node] = attrs.field(factory=dict)
    extra_args: Sequence[str] = ()
    node_command: Sequence[str] = ()
    """Instead of ``python -m trio_agents serve``: a command taking the same cluster
    options (the benchmarks' node without the start rate limit)."""
    final_records: list[dict[str, Any]] | None = None
    """The execution records as the cluster closed (its directory is gone then)."""

    def argv(self, node_id: str) -> list[str]:
        args: list[str] = ["--host", "127.0.0.1", "--port", "0"]
        # --token=T: a random token may start with "-", which argparse would take for
        # an option after a separate --token.
        args += ["--app", self.app, f"--token={self.token}", "--shutdown-timeout", "10"]
        if self.dsn is None:
            args += ["--db", str(self.directory / f"{node_id}.sqlite3")]
            return cli_argv("serve", *args, *self.extra_args)
        args += ["--cluster", self.dsn, "--node-id", node_id]
        args += ["--lease-ttl", str(self.lease_ttl)]
        if self.max_runs is not None:
            args += ["--max-runs", str(self.max_runs)]
        if self.node_command:
            return [*self.node_command, *args, *self.extra_args]
        return cli_argv("serve", *args, *self.extra_args)

    async def start_node(self, node_id: str | None = None) -> Node:
        """Start a node and wait until it serves (bounded by :data:`STARTUP_TIMEOUT`)."""
        node_id = node_id or f"n{next(_node_numbers)}"
        if node_id in self.nodes and self.nodes[node_id].running:
            raise ValueError(f"node {node_id} is already running")
        env = cli_env(**{cluster_app.DIR_ENV: str(self.directory), cluster_app.NODE_ENV: node_id})
        process = await trio.lowlevel.open_process(
            self.argv(node_id),
            env=env,
            cwd=self.directory,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert process.stdout is not None
        assert process.stderr is not None
        node = Node(node_id, process)
        self.nodes[node_id] = node
        self.nursery.start_soon(node._pump, process.stdout, node.stdout, True)
        self.nursery.start_soon(node._pump, process.stderr, node.stderr, False)
        with trio.fail_after(STARTUP_TIMEOUT):
            await node._wait_serving()
        return node

    async def start_nodes(self, count: int) -> list[Node]:
        """Start ``count`` nodes at once (their start-ups overlap)."""
        started: list[Node] = []

        async def one() -> None:
            started.append(await self.start_node())

        async with trio.open_nursery() as nursery:
            for _ in range(count):
                nursery.start_soon(one)
        return sorted(started, key=lambda node: int(node.node_id[1:]))

    def node(self, node: str | Node) -> Node:
        return node if isinstance(node, Node) else self.nodes[node]

    def alive(self) -> list[Node]:
        return [node for node in self.nodes.values() if node.running]

    async def kill(self, node: str | Node) -> None:
        """``kill -9`` the node and reap it."""
        target = self.node(node)
        if target.running:
            target.process.send_signal(signal.SIGKILL)
        await target.process.wait()

    async def terminate(self, node: str | Node) -> int:
        """SIGTERM (a graceful stop); wait for the process to exit, return its status."""
        target = self.node(node)
        if target.running:
            target.process.send_signal(signal.SIGTERM)
        return await target.process.wait()

    def freeze(self, node: str | Node) -> None:
        """``kill -STOP``: the node is paused, its sockets stay open."""
        target = self.node(node)
        if target.running:
            target.process.send_signal(signal.SIGSTOP)

    def thaw(self, node: str | Node) -> None:
        """``kill -CONT``: a paused node goes on."""
        target = self.node(node)
        if target.running:
            target.process.send_signal(signal.SIGCONT)

    def freeze_in_next_flush(self, node: str | Node) -> None:
        """Make the node pause itself inside its next flush, its transaction open
        (tests/support/cluster_app.py); :meth:`thaw` resumes it."""
        cluster_app.freeze_in_next_flush(self.directory, self.node(node).node_id)

    @asynccontextmanager
    async def client(self, node: str | Node) -> AsyncIterator[ControlClient]:
        """A control client connected to ``node``.

        The handshake is bounded by :data:`HANDSHAKE_BOUND`: ``connect()`` waits forever
        when the server dies during the handshake (a reported client bug, see
        test_process_cluster_support.py), which a node killed by a test can do; that counts as
        a failed connection (``ControlConnectionError``, code ``connect_failed``)."""
        with trio.CancelScope(deadline=trio.current_time() + HANDSHAKE_BOUND) as handshake:
            async with connect(self.node(node).url, token=self.token) as client:
                handshake.deadline = math.inf
                yield client
        if handshake.cancelled_caught:
            raise ControlConnectionError(
                "connect_failed", f"the handshake with {self.node(node).node_id} never ended"
            )

    # -- the app's gates and records ---------------------------------------------------

    def open_gate(self, name: str, key: str | None = None) -> None:
        cluster_app.open_gate(self.directory, name, key)

    def executions(
        self, tool: str | None = None, run_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Execution records (see tests/support/cluster_app.py), optionally of one tool/run."""
        records = self.final_records
        if records is None:
            records = cluster_app.execution_records(self.directory)
        return [
            record
            for record in records
            if (tool is None or record["tool"] == tool)
            and (run_id is None or record["run_id"] == run_id)
        ]

    async def wait_executions(
        self, count: int, tool: str, run_id: str | None = None
    ) -> list[dict[str, Any]]:
        """Wait until ``tool`` has at least ``count`` execution records."""
        await poll_until(lambda: len(self.executions(tool, run_id)) >= count)
        return self.executions(tool, run_id)

    def owner_of_tag(self, tag: str) -> str:
        """The node whose model last served the run tagged ``tag``."""
        records = self.executions("model", tag)
        assert records, f"no model call recorded for #{tag}"
        return str(records[-1]["node"])

    def output(self) -> str:
        return "\n".join(node.output() for node in self.nodes.values())


@asynccontextmanager
async def open_cluster(
    dsn: str | None,
    nodes: int = 0,
    *,
    lease_ttl: float = 1.0,
    max_runs: int | None = None,
    extra_args: Sequence[str] = (),
    echo: bool = True,
    node_command: Sequence[str] = (),
) -> AsyncIterator[Cluster]:
    """Start ``nodes`` node processes on ``dsn`` (None: no cluster, see the module
    doc); every node still running is killed when the block ends, and (``echo``) the
    nodes' output printed."""
    with tempfile.TemporaryDirectory(prefix="trio-agents-cluster-") as directory:
        os.chmod(directory, 0o755)
        async with trio.open_nursery() as nursery:
            cluster = Cluster(
                dsn,
                Path(directory),
                nursery,
                lease_ttl,
                max_runs,
                extra_args=extra_args,
                node_command=node_command,
            )
            try:
                if nodes:
                    await cluster.start_nodes(nodes)
                yield cluster
            finally:
                with trio.CancelScope(shield=True):
                    for node in cluster.nodes.values():
                        if node.running:
                            node.process.send_signal(signal.SIGKILL)
                    for node in cluster.nodes.values():
                        await node.process.wait()
                    cluster.final_records = cluster_app.execution_records(cluster.directory)
                    if echo:
                        print(cluster.output())  # shown by pytest when the test failed


async def poll_until(condition: Callable[[], bool]) -> None:
    """Wait (bounded by the caller's scope) until ``condition()`` holds: a fact another
    process changes (a file, a database row), which no Trio event of ours can signal."""
    while True:
        if condition():
            return
        await trio.sleep(POLL)


# -- what a client sees ------------------------------------------------------------------


def assert_contiguous(seqs: Iterable[int], first: int = 1) -> None:
    """``seqs`` are ``first, first+1, ...`` with no gap and no repeat."""
    seen = list(seqs)
    assert seen == list(range(first, first + len(seen))), seen


async def events_until_terminal(
    run: RemoteRun, from_seq: int, into: list[ta.RunEvent]
) -> ta.RunUpdated:
    """Append the run's events from ``from_seq`` to ``into`` until its terminal
    update; return that update."""
    async for event in run.events(from_seq):
        into.append(event)
        if isinstance(event, ta.RunUpdated) and event.status.is_terminal:
            return event
    raise AssertionError(f"{run.id}: the events ended without a terminal update")


async def wait_status(
    client: ControlClient,
    run_id: str,
    predicate: Callable[[Any], bool],
) -> Any:
    """Poll ``run.get`` on this node until the run's info satisfies ``predicate``
    (a ``not_found`` while the cluster has not caught up counts as not yet)."""
    run = client.attach(run_id)
    while True:
        try:
            info = await run.get()
        except ControlError as exc:
            if exc.code != "not_found":
                raise
        else:
            if predicate(info):
                return info
        await trio.sleep(POLL)


def items_of(events: Iterable[ta.RunEvent]) -> list[ta.Item]:
    """The conversation items the run's events carried, in order."""
    return [event.item for event in events if isinstance(event, ta.RunItemEvent)]


@attrs.define(eq=False)
class Follower:
    """A subscriber of one run that outlives nodes: it reads the run's events on one
    node and, when that node's connection dies, reconnects to another live node with
    ``from_seq`` = the last seq it saw + 1 (see :meth:`follow`)."""

    cluster: Cluster
    run_id: str
    events: list[ta.RunEvent] = attrs.field(factory=list)
    connections: list[tuple[str, int]] = attrs.field(factory=list)
    """(node id, from_seq) of each connection it subscribed on."""
    terminal: ta.RunUpdated | None = None
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    @property
    def next_seq(self) -> int:
        return self.events[-1].seq + 1 if self.events else 1

    async def follow(self, first: str | Node) -> None:
        """Follow until the terminal update (run it in a nursery)."""
        node = self.cluster.node(first)
        while True:
            try:
                async with self.cluster.client(node) as client:
                    self.connections.append((node.node_id, self.next_seq))
                    async for event in client.attach(self.run_id).events(self.next_seq):
                        self.events.append(event)
                        self._lot.unpark_all()
                        if isinstance(event, ta.RunUpdated) and event.status.is_terminal:
                            self.terminal = event
                            return
            except ControlConnectionError:
                pass
            # The node died (or refused us while dying): go on elsewhere.
            others = [n for n in self.cluster.alive() if n is not node and n.url]
            if others:
                node = others[0]
                await trio.lowlevel.checkpoint()
            else:  # no node at all for now: a test may start one
                await trio.sleep(POLL)

    async def wait_for(self, predicate: Callable[[ta.RunEvent], bool]) -> ta.RunEvent:
        """Wait until an event (seen already or to come) satisfies ``predicate``."""

        def ended() -> Exception | None:
            if self.terminal is None:
                return None
            return AssertionError(f"{self.run_id} ended without the awaited event")

        return await first_match(self.events, predicate, self._lot, ended)

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        """Wait until ``condition()`` holds, looking again at each event received."""
        while not condition():
            await self._lot.park()

    def check(self) -> None:
        """Every seq once, from 1 to the terminal update, nothing dropped."""
        assert self.terminal is not None, f"{self.run_id}: not finished"
        assert not [e for e in self.events if isinstance(e, ta.EventsDropped)], self.events
        assert_contiguous(event.seq for event in self.events)
        terminals = [
            e for e in self.events if isinstance(e, ta.RunUpdated) and e.status.is_terminal
        ]
        assert terminals == [self.terminal], terminals


def is_resumed(event: ta.RunEvent, attempt: int | None = None) -> bool:
    """A ``running`` update of a resumed attempt (of ``attempt``, when given)."""
    return (
        isinstance(event, ta.RunUpdated)
        and event.status is ta.RunStatus.RUNNING
        and event.detail.get("resumed") is True
        and (attempt is None or event.detail.get("attempt") == attempt)
    )


def has_status(status: ta.RunStatus) -> Callable[[ta.RunEvent], bool]:
    return lambda event: isinstance(event, ta.RunUpdated) and event.status is status


async def replay(cluster: Cluster, node: str | Node, run_id: str) -> list[ta.RunEvent]:
    """The run's whole persisted log, read from seq 1 on ``node``."""
    events: list[ta.RunEvent] = []
    async with cluster.client(node) as client:
        await events_until_terminal(client.attach(run_id), 1, events)
    return events


def assert_same_events(seen: Sequence[ta.RunEvent], log: Sequence[ta.RunEvent]) -> None:
    """Every event a subscriber saw is the log's event at that seq (a subscriber never
    saw an event the cluster then lost or rewrote)."""
    by_seq = {event.seq: event.to_json() for event in log}
    for event in seen:
        assert by_seq.get(event.seq) == event.to_json(), (event, by_seq.get(event.seq))


async def wait_persisted(cluster: Cluster, node: str | Node, run_id: str, seq: int) -> None:
    """Wait until ``node`` (not the run's owner: it reads the runs table) reports the
    run's events persisted up to ``seq``. A subscriber on the owner sees events before
    they are persisted; a test that kills the owner waits for this first, so the seqs
    that subscriber saw are the persisted ones (see trio_agents/cluster/__init__.py)."""
    async with cluster.client(node) as client:
        await wait_status(client, run_id, lambda info: info.seq >= seq)


def stored_items(dsn: str, session_id: str, principal: str = "cli") -> list[ta.Item]:
    """The conversation the cluster stored for ``session_id`` of ``principal``, read
    as stored (``PostgresSession.get_items`` would repair it first). Sync: call it
    in a thread. The cluster keys sessions by ``json.dumps([principal, session_id])``."""
    import json

    import psycopg

    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT data FROM trio_agents_session_items WHERE session_id = %s ORDER BY position",
            (json.dumps([principal, session_id]),),
        ).fetchall()
    return [ta.item_from_json(json.loads(row[0])) for row in rows]


def run_row(dsn: str, run_id: str) -> dict[str, Any]:
    """The run's row in the cluster's runs table (owner, attempt, status, ...). Sync:
    call it in a thread."""
    import psycopg
    import psycopg.rows

    with psycopg.connect(dsn, row_factory=psycopg.rows.dict_row) as conn:
        row = conn.execute("SELECT * FROM trio_agents_runs WHERE run_id = %s", (run_id,)).fetchone()
    assert row is not None, f"no row for {run_id}"
    return dict(row)


async def owner_of(cluster: Cluster, run_id: str) -> str:
    """The node that owns the run now, as the runs table says."""
    assert cluster.dsn is not None
    row = await trio.to_thread.run_sync(run_row, cluster.dsn, run_id)
    return str(row["owner"])
