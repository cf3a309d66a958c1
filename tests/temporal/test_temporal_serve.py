"""``trio-agents serve --temporal HOST:PORT``: the faces over a TemporalHost, as a real
process beside a real dev server and a real worker process; and its mistakes, each one
line and an exit status (DESIGN §20, docs/temporal.md)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.support.cli_support import (
    ROOT,
    assert_one_error_line,
    cli,
    cli_env,
    cli_process,
    serving_url,
)
from tests.support.http_support import Message, messages
from tests.support.temporal_support import Workers, free_port

# Leaving an SSE stream mid-way abandons httpx's nested body generators (CONVENTIONS,
# "httpx aiter_lines()"): exactly those warnings, nothing else.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)\._[^']*' was garbage collected:ResourceWarning"
)

HANG_GUARD = 120  # a loaded machine: the dev server, a worker and a server process
APP = "tests.support.temporal_app:AGENTS"
TOKEN = "tok-serve"


def _serve_args(group: Workers) -> list[str | Path]:
    return [
        "serve", "--temporal", group.target, "--task-queue", group.task_queue,
        "--db", group.db, "--app", APP, "--port", "0", "--token", TOKEN,
    ]  # fmt: skip


async def _follow(
    http: httpx.AsyncClient, run_id: str, until: Callable[[Message], bool], **headers: str
) -> list[Message]:
    """The run's SSE messages up to the first one ``until`` accepts."""
    seen: list[Message] = []
    async with http.stream("GET", f"/runs/{run_id}/events", headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async with aclosing(messages(response)) as reading:
            async for message in reading:
                seen.append(message)
                if until(message):
                    return seen
    raise AssertionError(f"the stream ended early: {[m.data for m in seen]}")


def _event(message: Message) -> dict[str, Any]:
    event: dict[str, Any] = message.data["event"]
    return event


async def test_serve_over_temporal_runs_on_the_workers_rest_and_sse(
    workers: Callable[[int], Workers],
) -> None:
    group = workers(1)
    with trio.fail_after(HANG_GUARD):
        async with cli_process(*_serve_args(group)) as served:
            ws_url = await serving_url(served)
            assert "runs on the Temporal workers of task queue" in served.stdout.lines[-1]
            http_line = next(line for line in served.stdout.lines if line.startswith("http: "))
            base = http_line.split()[1]
            assert ws_url.startswith("ws://127.0.0.1:")
            headers = {"Authorization": f"Bearer {TOKEN}"}
            async with httpx.AsyncClient(base_url=base, headers=headers, timeout=None) as http:
                # A run completes on the worker; its events reach this server's SSE.
                answer = await http.post("/runs", json={"agent": "rules", "input": "hello"})
                assert answer.status_code == 201, answer.text
                run_id = answer.json()["run_id"]
                seen = await _follow(http, run_id, lambda m: m.terminal)
                assert [m.id for m in seen] == [str(n) for n in range(1, len(seen) + 1)]
                assert _event(seen[-1])["status"] == "completed"
                items = [_event(m)["item"] for m in seen if m.type == "run.item"]
                assert items[-1]["content"] == "echo: hello"
                got = (await http.get(f"/runs/{run_id}")).json()["run"]
                assert (got["status"], got["agent"], got["seq"]) == (
                    "completed",
                    "rules",
                    len(seen),
                )

                # A run with a session blocks in its tool on the worker; a client
                # re-attaches with Last-Event-ID (no gap, no duplicate); the cancel from
                # REST answers once the repaired run ended on the worker.
                body = {"agent": "rules", "input": "block", "session_id": "s1"}
                blocked = (await http.post("/runs", json=body)).json()["run_id"]
                first = await _follow(http, blocked, lambda m: m.type == "tool.started")
                again = await _follow(
                    http,
                    blocked,
                    lambda m: m.type == "tool.started",
                    **{"Last-Event-ID": str(first[1].id)},
                )
                assert [m.id for m in again] == [m.id for m in first[2:]]
                cancelled = await http.post(
                    f"/runs/{blocked}/cancel?wait=1", json={"reason": "enough"}
                )
                assert cancelled.status_code == 200, cancelled.text
                run = cancelled.json()["run"]
                assert (run["status"], run["reason"]) == ("cancelled", "enough")
                tail = await _follow(
                    http, blocked, lambda m: m.terminal, **{"Last-Event-ID": str(first[-1].id)}
                )
                outputs = [_event(m)["item"] for m in tail if m.type == "run.item"]
                assert outputs == [
                    {
                        "type": "function_call_output",
                        "call_id": "call_block_0",
                        "output": "cancelled: enough",
                        "status": "cancelled",
                    }
                ]
                # The repaired conversation is in the workers' session, which this
                # server reads to fork it (serve gives the host the sessions of --db).
                forked = await http.post("/sessions/s1/fork", json={"new_session_id": "s2"})
                assert forked.status_code == 201, forked.text
                # the user message, the call, its repaired (cancelled) result
                assert forked.json() == {"session_id": "s2", "items": 3}
                # At an event position of the run, resolved from its run.item events in
                # the store (each says where its item is in the session): at its call,
                # rounded down (the result came later); past its end, all three.
                call_seq = [_event(m)["seq"] for m in first if m.type == "run.item"][-1]
                for new_id, seq, kept in (("s3", call_seq, 1), ("s4", 10_000, 3)):
                    at = {"run_id": blocked, "seq": seq}
                    forked = await http.post(
                        "/sessions/s1/fork", json={"new_session_id": new_id, "at": at}
                    )
                    assert forked.status_code == 201, forked.text
                    assert forked.json() == {"session_id": new_id, "items": kept}
                listed = (await http.get("/runs")).json()["runs"]
                assert {r["run_id"]: r["status"] for r in listed} == {
                    run_id: "completed",
                    blocked: "cancelled",
                }
            served.process.send_signal(signal.SIGTERM)
            assert await served.process.wait() == 0, served.stderr
            rest = await served.stdout.rest()
            assert rest == ["SIGTERM: server stopped (the runs go on on the Temporal workers)"]
            assert "Traceback" not in served.stderr, served.stderr


def test_temporal_and_cluster_are_exclusive() -> None:
    done = cli(
        "serve", "--port", "0", "--token", "t", "--temporal", "127.0.0.1:7233",
        "--cluster", "host=127.0.0.1 dbname=x",
    )  # fmt: skip
    line = assert_one_error_line(done, 2)
    assert "--temporal and --cluster are exclusive" in line


def test_an_unreachable_temporal_is_one_line(tmp_path: Path) -> None:
    port = free_port()  # nobody listens there
    done = cli(
        "serve", "--port", "0", "--token", "t", "--temporal", f"127.0.0.1:{port}",
        "--db", tmp_path / "sessions.sqlite3",
    )  # fmt: skip
    line = assert_one_error_line(done, 1)
    assert line.startswith(
        f"trio-agents: error: --temporal: cannot reach Temporal at 127.0.0.1:{port}:"
    )
    assert "is `temporal server start-dev` or your Temporal cluster running there?" in line


def test_a_malformed_target_is_a_usage_error() -> None:
    done = cli("serve", "--port", "0", "--token", "t", "--temporal", "localhost")
    line = assert_one_error_line(done, 2)
    assert "'localhost' is not HOST:PORT" in line


def test_without_the_temporal_extra_it_says_what_to_install(tmp_path: Path) -> None:
    # The extra missing, as the import system sees it: temporalio does not import.
    code = (
        "import sys; sys.modules['temporalio'] = None;"
        " from trio_agents._cli import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "serve", "--port", "0", "--token", "t",
         "--temporal", "127.0.0.1:7233", "--db", str(tmp_path / "s.sqlite3")],
        env=cli_env(), cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    line = assert_one_error_line(done, 1)
    assert line == (
        "trio-agents: error: --temporal needs the temporal extra:"
        " pip install 'trio-agents[temporal]'"
    )
