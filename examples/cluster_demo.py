"""Three ``trio-agents serve --cluster`` nodes on one PostgreSQL; one is killed mid-run.

What it shows (``make cluster-demo``): a throwaway PostgreSQL server starts (from the
machine's PostgreSQL, as the test suite starts one: tests/support/pg_support.py), then three
node processes. A run starts on node-1 while a client on node-2 prints its status
stream. In the middle of the run's second step node-1 gets SIGKILL; once its lease
expires, another node takes the run over (status ``running``, resumed, attempt 2), runs
the idempotent step again, and finishes. Offline: the model is a small scripted one
that decides from the conversation, so any node can continue it.

Run: ``make cluster-demo`` (installs PostgreSQL when missing, as root), or
``python examples/cluster_demo.py`` when PostgreSQL (``initdb``) is installed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final, final

import trio

import trio_agents as ta
from trio_agents.control import connect
from trio_agents.models import Finish, ModelEvent, ModelRequest, TextDelta, ToolCallDone, Usage

if TYPE_CHECKING:
    from tests.support.pg_support import PostgresServer

HERE: Final = Path(__file__).resolve().parent
ROOT: Final = HERE.parent
sys.path.insert(0, str(ROOT))  # the test suite's PostgreSQL helper: tests/support/pg_support.py
STEPS: Final = 3
LEASE_TTL: Final = 2.0
TOKEN: Final = "demo-token"

# -- the agent every node serves (`--app cluster_demo:app`) --------------------------------


@ta.function_tool(idempotent=True)
async def step(ctx: ta.ToolContext, number: int) -> str:
    """Do one step of the report (safe to run again: idempotent)."""
    for tick in range(4):
        ctx.progress(f"step {number}: {tick + 1}/4")
        await trio.sleep(0.25)
    return f"step {number} done"


@final
class _Events:
    def __init__(self, events: Sequence[ModelEvent]) -> None:
        self._events = list(events)

    def __aiter__(self) -> _Events:
        return self

    async def __anext__(self) -> ModelEvent:
        await trio.sleep(0.05)
        if not self._events:
            raise StopAsyncIteration
        return self._events.pop(0)


@final
class _Stream(AbstractAsyncContextManager[AsyncIterator[ModelEvent]]):
    def __init__(self, events: Sequence[ModelEvent]) -> None:
        self._events = _Events(events)

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        await trio.lowlevel.checkpoint()
        return self._events

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await trio.lowlevel.checkpoint()


@final
class StepModel:
    """Calls ``step`` 1, 2, 3, then answers: decided from the conversation alone."""

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        done = sum(isinstance(item, ta.ToolResult) for item in request.items)
        if done < STEPS:
            call = ta.ToolCall(f"step_{done + 1}", "step", f'{{"number": {done + 1}}}')
            events: list[ModelEvent] = [TextDelta(f"Working on step {done + 1}. ")]
            events += [ToolCallDone(call), Usage(1, 1), Finish("tool_calls")]
        else:
            events = [TextDelta("The report is ready."), Usage(1, 1), Finish("stop")]
        return _Stream(events)


def app() -> dict[str, ta.Agent]:
    return {
        "reporter": ta.Agent(
            name="reporter", instructions="Write the report.", model=StepModel(), tools=[step]
        )
    }


# -- the demo --------------------------------------------------------------------------------


def start_postgres() -> tuple[PostgresServer, str]:
    """A throwaway PostgreSQL server (the test suite's helper) and a database DSN."""
    from tests.support.pg_support import PostgresServer, PostgresUnavailable, find_bin_dir

    try:
        server = PostgresServer(find_bin_dir())
        server.start()
    except PostgresUnavailable as exc:
        raise SystemExit(f"cluster demo: {exc}") from None
    print(f"PostgreSQL started on 127.0.0.1:{server.port} in {server.started_in:.1f} s")
    return server, server.create_database()


@asynccontextmanager
async def node(dsn: str, node_id: str) -> AsyncIterator[tuple[trio.Process, str]]:
    """A node process; yields it and its URL once it serves."""
    argv = [sys.executable, "-m", "trio_agents", "serve", "--cluster", dsn]
    argv += ["--node-id", node_id, "--lease-ttl", str(LEASE_TTL), "--port", "0"]
    argv += ["--app", "cluster_demo:app", "--token", TOKEN]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = await trio.lowlevel.open_process(
        argv, cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdout is not None
    buffer = b""
    try:
        # The "serving ... on <url>" line comes last (the HTTP faces' lines before it).
        with trio.fail_after(60):
            while not any(line.startswith(b"serving ") for line in buffer.split(b"\n")[:-1]):
                chunk = await process.stdout.receive_some()
                if not chunk:
                    raise SystemExit(f"cluster demo: {node_id} exited before serving")
                buffer += chunk
        line = next(ln for ln in buffer.decode().splitlines() if ln.startswith("serving "))
        url = line.split(" on ", 1)[1].split()[0]
        print(f"{node_id} serving on {url}")
        yield process, url
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        with trio.CancelScope(shield=True), trio.move_on_after(15):
            await process.wait()
        if process.returncode is None:
            process.kill()
        await process.stdout.aclose()


def describe(event: ta.RunEvent, began: float) -> str | None:
    at = f"[{time.monotonic() - began:5.2f} s] seq {event.seq:>3}"
    if isinstance(event, ta.RunUpdated):
        extra = ""
        if event.detail.get("resumed"):
            extra = f" (resumed, attempt {event.detail['attempt']})"
        reason = f": {event.reason}" if event.reason else ""
        return f"{at} status {event.status}{extra}{reason}"
    if isinstance(event, ta.ToolStarted):
        return f"{at} tool {event.name}({event.arguments}) started"
    if isinstance(event, ta.ToolFinished):
        return f"{at} tool {event.name} {event.status}: {event.output}"
    if isinstance(event, ta.RunItemEvent) and isinstance(event.item, ta.AssistantMessage):
        return f"{at} assistant: {event.item.content.strip()}"
    return None


async def owner(dsn: str, run_id: str) -> str:
    import psycopg

    def read() -> str:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT owner FROM trio_agents_runs WHERE run_id = %s", (run_id,)
            ).fetchone()
        return str(row[0]) if row else "?"

    return await trio.to_thread.run_sync(read)


async def demo(dsn: str) -> None:
    async with (
        node(dsn, "node-1") as (one, url_1),
        node(dsn, "node-2") as (_, url_2),
        node(dsn, "node-3"),
    ):
        began = time.monotonic()
        async with connect(url_1, token=TOKEN) as client_1:
            run = await client_1.start("reporter", "Write the report.", subscribe=None)
        print(f"run {run.id} started on node-1 (owner: {await owner(dsn, run.id)})")
        print("status stream, read from node-2:")
        killed = False
        async with connect(url_2, token=TOKEN) as client_2:
            async for event in client_2.attach(run.id).events(1):
                line = describe(event, began)
                if line:
                    print("  " + line)
                if (
                    not killed
                    and isinstance(event, ta.ToolStarted)
                    and event.arguments == '{"number": 2}'
                ):
                    one.send_signal(signal.SIGKILL)
                    await one.wait()
                    killed = True
                    print(f"  *** killed node-1 (SIGKILL) during step 2; lease {LEASE_TTL} s")
                if isinstance(event, ta.RunUpdated) and event.status.is_terminal:
                    break
            info = await client_2.attach(run.id).get()
        print(f"run {info.status} on {await owner(dsn, run.id)} after a takeover")


def main() -> int:
    server, dsn = start_postgres()
    try:
        trio.run(demo, dsn)
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
