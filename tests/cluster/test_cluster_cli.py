"""``trio-agents serve --cluster``: two node processes; SIGTERM to the one running a
run hands it over to the other at once (DESIGN §12, issue 17 item 4)."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path
from typing import Any

import trio

from tests.support.cli_support import assert_one_error_line, cli, cli_process, serving_url
from tests.support.control_support import raw_client

HANG_GUARD = 60


async def _read_until(ws: Any, predicate: Any) -> dict[str, Any]:
    while True:
        frame = json.loads(await ws.get_message())
        if predicate(frame):
            return dict(frame)


def _event(frame: dict[str, Any], kind: str) -> bool:
    return bool(frame["type"] == "event" and frame["event"]["type"] == kind)


async def test_sigterm_hands_the_runs_of_a_node_over(tmp_path: Path, pg_dsn: str) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("tok-a alice\n")
    tokens.chmod(0o600)
    common: list[str | Path] = ["serve", "--app", "tests.support.cli_app:AGENTS", "--port", "0"]
    common += ["--tokens", tokens]
    common += ["--cluster", pg_dsn, "--lease-ttl", "3600"]  # only the hand-over can move it
    with trio.fail_after(HANG_GUARD):
        async with (
            cli_process(*common, "--node-id", "one") as one,
            cli_process(*common, "--node-id", "two", "--max-runs", "5") as two,
        ):
            url_one, url_two = await serving_url(one), await serving_url(two)
            async with raw_client(url_one, token="tok-a") as ws_one:
                start = {"id": "1", "op": "run.start", "agent": "blocker", "input": "go"}
                await ws_one.send_message(json.dumps({**start, "subscribe": "all"}))
                ack = await _read_until(ws_one, lambda f: f["type"] == "ack")
                run_id = ack["run_id"]
                await _read_until(ws_one, lambda f: _event(f, "tool.started"))
                async with raw_client(url_two, token="tok-a") as ws_two:
                    subscribe = {"id": "2", "op": "run.subscribe", "run_id": run_id}
                    await ws_two.send_message(json.dumps(subscribe))
                    await _read_until(ws_two, lambda f: _event(f, "tool.started"))
                    one.process.send_signal(signal.SIGTERM)
                    resumed = await _read_until(
                        ws_two,
                        lambda f: _event(f, "run.updated") and f["event"]["detail"].get("resumed"),
                    )
                    assert resumed["event"]["detail"] == {"resumed": True, "attempt": 2}
                    interrupted = await _read_until(ws_two, lambda f: _event(f, "tool.finished"))
                    assert interrupted["event"]["output"] == "interrupted: node one stopped"
                    # The run goes on, on node two: its next call starts there.
                    await _read_until(ws_two, lambda f: _event(f, "tool.started"))
                    status = await one.process.wait()
                    cancel = {"id": "3", "op": "run.cancel", "run_id": run_id, "reason": "enough"}
                    await ws_two.send_message(json.dumps(cancel))
                    done = await _read_until(
                        ws_two,
                        lambda f: (
                            _event(f, "run.updated")
                            and f["event"]["status"] not in ("running", "awaiting_approval")
                        ),
                    )
                    assert (done["event"]["status"], done["event"]["reason"]) == (
                        "cancelled",
                        "enough",
                    )
            rest = await one.stdout.rest()
            assert status == 0
            assert rest == ["SIGTERM: node stopped (1 run handed over to the other nodes)"]
            two.process.send_signal(signal.SIGTERM)
            assert await two.process.wait() == 0


def test_serve_with_an_unreachable_cluster_database_fails_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = cli(
        "serve", "--port", "0", "--token", "t",
        "--cluster", f"host=127.0.0.1 port={port} user=postgres dbname=x connect_timeout=2",
    )  # fmt: skip
    line = assert_one_error_line(done, 1)
    assert "--cluster: cannot reach the cluster database" in line


def test_serve_with_a_bad_cluster_dsn_fails_with_one_line() -> None:
    done = cli("serve", "--port", "0", "--token", "t", "--cluster", "not a = = dsn")
    line = assert_one_error_line(done, 1)
    assert "--cluster: not a valid connection string" in line
