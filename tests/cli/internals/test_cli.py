"""``trio-agents`` as a user meets it: real processes, no traceback for a mistake or a
signal — one line on stderr and a non-zero exit status (0 after a graceful shutdown).

Processes are waited on through their output (the "serving ... on ws://" line, an
event line); ``trio.fail_after`` bounds are hang guards only.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from trio_websocket import ConnectionClosed, WebSocketConnection

import trio_agents as ta
from tests.support.cli_app import blocker
from tests.support.cli_support import (
    acli,
    assert_one_error_line,
    cli,
    cli_env,
    cli_process,
    serving_url,
)
from tests.support.control_support import raw_client, serving
from trio_agents._cli import CLIError, build_parser, main
from trio_agents._cli._errors import explain
from trio_agents._cli._serve import read_tokens
from trio_agents._cli._tour import run_demo
from trio_agents.control import connect
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import MemorySession, SQLiteSession

HANG_GUARD = 60  # seconds; a bound against hangs, never a wait


def _free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def _tokens_file(path: Path, text: str = "tok-a alice\n", mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


# ------------------------------------------------------------------- basics


def test_version() -> None:
    done = cli("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"trio-agents {ta.__version__}"


def _walk(parser: argparse.ArgumentParser, prog: str) -> list[tuple[str, argparse.Action]]:
    found: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:
        found.append((prog, action))
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found.extend(_walk(sub, f"{prog} {name}"))
    return found


def test_every_argument_of_every_subcommand_has_help() -> None:
    actions = _walk(build_parser(), "trio-agents")
    assert {prog for prog, _ in actions} >= {
        "trio-agents demo",
        "trio-agents serve",
        "trio-agents ctl",
        *(
            f"trio-agents ctl {verb}"
            for verb in ("list", "get", "watch", "start", "cancel", "inject")
        ),
        *(f"trio-agents ctl {verb}" for verb in ("withdraw", "approve", "reject")),
    }
    missing = [
        f"{prog}: {action.dest}"
        for prog, action in actions
        if not action.help or action.help == argparse.SUPPRESS
    ]
    assert missing == []


def test_a_usage_mistake_is_one_line_and_status_2() -> None:
    line = assert_one_error_line(cli("ctl", "ws://127.0.0.1:1/", "frobnicate"), 2)
    assert "invalid choice: 'frobnicate'" in line
    assert "--help" in line


@pytest.mark.skipif(
    shutil.which("trio-agents", path=os.path.dirname(sys.executable)) is None,
    reason="the console script is not installed next to this Python",
)
def test_the_console_script_is_the_same_command() -> None:
    script = shutil.which("trio-agents", path=os.path.dirname(sys.executable))
    assert script is not None
    done = subprocess.run(
        [script, "--version"], capture_output=True, text=True, env=cli_env(), check=False
    )
    assert done.returncode == 0
    assert done.stdout.startswith("trio-agents ")


# ------------------------------------------------------------------- ctl mistakes


def test_ctl_with_an_http_url() -> None:
    line = assert_one_error_line(cli("ctl", "http://127.0.0.1:8765/", "list"), 2)
    assert "use ws://127.0.0.1:8765/" in line


def test_ctl_without_a_token() -> None:
    line = assert_one_error_line(cli("ctl", "ws://127.0.0.1:8765/", "list"), 2)
    assert "$TRIO_AGENTS_TOKEN" in line


def test_ctl_with_no_server_listening() -> None:
    url = f"ws://127.0.0.1:{_free_port()}/"
    line = assert_one_error_line(cli("ctl", url, "--token", "t", "list"), 1)
    assert "could not connect" in line


async def test_ctl_with_a_wrong_token() -> None:
    with trio.fail_after(HANG_GUARD):
        async with serving({"blocker": blocker()}) as (_, url):
            done = await acli("ctl", url, "--token", "nope", "list")
    assert "refused the token (HTTP 401)" in assert_one_error_line(done, 1)


async def test_ctl_on_an_unknown_run() -> None:
    with trio.fail_after(HANG_GUARD):
        async with serving({"blocker": blocker()}) as (_, url):
            done = await acli("ctl", url, "--token", "tok-alice", "cancel", "r_nope")
    assert "not_found" in assert_one_error_line(done, 1)


# ------------------------------------------------------------------- serve mistakes


def test_serve_with_an_app_module_that_does_not_exist(tmp_path: Path) -> None:
    done = cli("serve", "--app", "nosuchmod:X", "--db", tmp_path / "s.db", "--token", "t")
    line = assert_one_error_line(done, 1)
    assert "no module named 'nosuchmod'" in line


@pytest.mark.parametrize(
    ("app", "expected"),
    [
        ("tests.support.cli_app", "must look like MODULE:ATTR"),
        ("tests.support.cli_app:NOPE", "has no 'NOPE'"),
        ("tests.support.cli_app:NOT_AGENTS", "maps to str"),
        ("tests.support.cli_app:broken_factory", "RuntimeError: the config file is missing"),
    ],
)
def test_serve_with_a_bad_app(tmp_path: Path, app: str, expected: str) -> None:
    done = cli("serve", "--app", app, "--db", tmp_path / "s.db", "--token", "t")
    assert expected in assert_one_error_line(done, 2 if ":" not in app else 1)


async def test_serve_on_a_port_already_in_use(tmp_path: Path) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    try:
        with trio.fail_after(HANG_GUARD):
            done = await acli(
                "serve", "--port", str(port), "--db", tmp_path / "s.db", "--token", "t"
            )
    finally:
        for listener in listeners:
            await listener.aclose()
    assert "already in use" in assert_one_error_line(done, 1)


def test_serve_refuses_a_tokens_file_others_can_read(tmp_path: Path) -> None:
    tokens = _tokens_file(tmp_path / "tokens", mode=0o644)
    done = cli("serve", "--tokens", tokens, "--db", tmp_path / "s.db", "--port", "0")
    assert f"chmod 600 {tokens}" in assert_one_error_line(done, 1)


def test_serve_token_and_tokens_exclude_each_other(tmp_path: Path) -> None:
    tokens = _tokens_file(tmp_path / "tokens")
    done = cli("serve", "--tokens", tokens, "--token", "t", "--port", "0")
    assert "not allowed with argument" in assert_one_error_line(done, 2)


def test_tokens_file_format(tmp_path: Path) -> None:
    text = "# token principal\n\ntok-a alice\n  tok-b   Bob Smith  \n"
    assert read_tokens(str(_tokens_file(tmp_path / "ok", text))) == {
        "tok-a": "alice",
        "tok-b": "Bob Smith",
    }
    for bad, expected in [
        ("tok-a\n", "line 1: expected 'TOKEN PRINCIPAL'"),
        ("tok-a alice\ntok-a bob\n", "line 2: this token is already on a line"),
        ("# nothing\n", "no 'TOKEN PRINCIPAL' lines"),
    ]:
        with pytest.raises(CLIError, match=expected):
            read_tokens(str(_tokens_file(tmp_path / "bad", bad)))
    with pytest.raises(CLIError, match="cannot read it"):
        read_tokens(str(tmp_path / "missing"))


# ------------------------------------------------------------------- serve signals


async def _read_until(
    ws: WebSocketConnection, predicate: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    while True:
        frame = json.loads(await ws.get_message())
        assert isinstance(frame, dict)
        if predicate(frame):
            return frame


async def _read_to_the_close(ws: WebSocketConnection) -> int:
    """Read frames until the server closes; return the close code."""
    with pytest.raises(ConnectionClosed) as closed:
        await _read_forever(ws)
    assert closed.value.reason is not None
    code: int = closed.value.reason.code
    return code


async def _read_forever(ws: WebSocketConnection) -> None:
    while True:
        await ws.get_message()


def _event_type(frame: dict[str, Any]) -> str | None:
    return str(frame["event"]["type"]) if frame["type"] == "event" else None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_serve_shuts_down_gracefully_on_a_signal(
    tmp_path: Path, signum: signal.Signals
) -> None:
    db = tmp_path / "sessions.sqlite3"
    tokens = _tokens_file(tmp_path / "tokens", "tok-a alice\ntok-b bob\n")
    with trio.fail_after(HANG_GUARD):
        async with cli_process(
            "serve", "--app", "tests.support.cli_app:AGENTS", "--port", "0", "--db", db,
            "--tokens", tokens,
        ) as server:  # fmt: skip
            url = await serving_url(server)
            async with raw_client(url, token="tok-a") as ws:
                start = {"id": "1", "op": "run.start", "agent": "blocker", "input": "go"}
                await ws.send_message(json.dumps({**start, "session_id": "s1", "subscribe": "all"}))

                await _read_until(ws, lambda f: _event_type(f) == "tool.started")
                server.process.send_signal(signum)
                terminal = await _read_until(
                    ws,
                    lambda f: _event_type(f) == "run.updated" and f["event"]["status"] != "running",
                )
                close_code = await _read_to_the_close(ws)
            status = await server.process.wait()
            rest = await server.stdout.rest()
    event = terminal["event"]
    assert isinstance(event, dict)
    assert (event["status"], event["reason"]) == ("cancelled", "server shutdown")
    assert close_code == 1001
    assert status == 0
    assert rest == [
        f"{signum.name}: server stopped (1 run cancelled with reason 'server shutdown')"
    ]
    assert server.stderr == ""
    # the repair was persisted: the session holds the cancelled call's result
    async with SQLiteSession(db, json.dumps(["alice", "s1"])) as session:
        items = await session.get_items()
    assert [type(i).__name__ for i in items] == ["UserMessage", "ToolCall", "ToolResult"]
    assert isinstance(items[-1], ta.ToolResult)
    assert (items[-1].status, items[-1].output) == ("cancelled", "cancelled: server shutdown")


@pytest.mark.parametrize(("flags", "frozen"), [((), True), (("--no-gc-freeze",), False)])
async def test_serve_freezes_what_start_up_made(
    tmp_path: Path, flags: tuple[str, ...], frozen: bool
) -> None:
    # Issue 43: a full collection walks every tracked object; the ~120,000 made at
    # start-up (modules, app, host, faces) are moved out of those passes once the
    # server listens, unless --no-gc-freeze. A tool of the served app reports the
    # server process's gc.get_freeze_count().
    with trio.fail_after(HANG_GUARD):
        async with cli_process(
            "serve", "--app", "tests.support.cli_app:GC_PROBE", "--port", "0",
            "--db", tmp_path / "s.db", "--token", "t", *flags,
        ) as server:  # fmt: skip
            url = await serving_url(server)
            async with raw_client(url, token="t") as ws:
                start = {"id": "1", "op": "run.start", "agent": "gc", "input": "count"}
                await ws.send_message(json.dumps({**start, "subscribe": "all"}))
                finished = await _read_until(ws, lambda f: _event_type(f) == "tool.finished")
            server.process.send_signal(signal.SIGTERM)
            assert await server.process.wait() == 0
    count = int(finished["event"]["output"])
    if frozen:
        assert count > 10_000, f"{count} objects frozen at start-up"
    else:
        assert count == 0


async def test_ctl_watch_interrupted_by_ctrl_c() -> None:
    with trio.fail_after(HANG_GUARD):
        async with (
            serving({"blocker": blocker()}) as (_, url),
            connect(url, token="tok-alice") as client,
        ):
            run = await client.start("blocker", "go")
            async with cli_process("ctl", url, "--token", "tok-alice", "watch", run.id) as ctl:
                await ctl.stdout.until(lambda line: line.startswith("[tool.started]"))
                ctl.process.send_signal(signal.SIGINT)
                status = await ctl.process.wait()
                await ctl.stdout.rest()
            # the run goes on (on_disconnect="continue"); stop it
            await run.cancel("test over")
    assert status == 130
    assert "Traceback" not in ctl.stderr
    assert ctl.stderr.splitlines() == [
        f"trio-agents: interrupted (the run goes on; follow it with: trio-agents ctl {url}"
        f" watch {run.id})"
    ]


# ------------------------------------------------------------------- ctl verbs


async def test_ctl_start_detach_prints_the_bare_run_id_for_the_shell() -> None:
    """``RID=$(trio-agents ctl URL start AGENT TEXT --detach)``, then ``cancel $RID``."""
    script = shutil.which("trio-agents", path=os.path.dirname(sys.executable))
    command = f"'{script}'" if script else f"'{sys.executable}' -m trio_agents"
    shell = (
        f'RID=$({command} ctl "$URL" start blocker hi --detach) &&'
        f' {command} ctl "$URL" cancel "$RID" --reason "from the shell" &&'
        ' echo "rid=$RID"'
    )
    with trio.fail_after(HANG_GUARD):
        async with serving({"blocker": blocker()}) as (_, url):
            env = cli_env(URL=url, TRIO_AGENTS_TOKEN="tok-alice")
            done = await trio.run_process(
                ["sh", "-c", shell], env=env, capture_stdout=True, capture_stderr=True, check=False
            )
            assert done.returncode == 0, done.stderr.decode()
            lines = done.stdout.decode().splitlines()
            rid = lines[-1].removeprefix("rid=")
            assert lines == [f"run {rid}: cancel requested", f"rid={rid}"]
            async with connect(url, token="tok-alice") as client:
                terminal = await client.attach(rid).wait()
    assert (terminal.status, terminal.reason) == ("cancelled", "from the shell")
    assert b"Traceback" not in done.stderr


async def test_ctl_cancel_of_a_finished_run() -> None:
    agent = ta.Agent(name="a", model=ScriptedModel(["done"]))
    with trio.fail_after(HANG_GUARD):
        async with serving({"a": agent}) as (_, url):
            async with connect(url, token="tok-alice") as client:
                run = await client.start("a", "hi")
                await run.wait()
            done = await acli("ctl", url, "--token", "tok-alice", "cancel", run.id)
    line = assert_one_error_line(done, 1)
    assert (
        line == f"trio-agents: error: cannot cancel run {run.id}: it has already ended (completed)"
    )


# ------------------------------------------------------------------- demo


def test_demo_runs_offline() -> None:
    done = cli("demo", "--delay", "0")
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    assert "=> cancelled: user pressed stop" in done.stdout
    # the tree section: three researcher sub-agents, one branch stopped, the lead goes on
    assert "=> lead completed; its sub-agents:" in done.stdout
    assert "researcher-pitfalls cancelled: branch not needed" in done.stdout
    assert "researcher-history completed" in done.stdout
    assert re.search(r"tool result \S+ \[cancelled\]: cancelled: user pressed stop", done.stdout), (
        done.stdout
    )


def test_demo_with_a_model_without_provider_prefix() -> None:
    line = assert_one_error_line(cli("demo", "--model", "gpt-4o"), 2)
    assert "'gpt-4o' has no provider prefix" in line
    assert "Did you mean 'openai:gpt-4o'?" in line


@pytest.mark.parametrize(
    ("spec", "variable"),
    [
        ("openai:gpt-4o-mini", "OPENAI_API_KEY"),
        ("anthropic:claude-3-5-haiku-latest", "ANTHROPIC_API_KEY"),
    ],
)
def test_demo_with_a_remote_model_and_no_key(spec: str, variable: str) -> None:
    line = assert_one_error_line(cli("demo", "--model", spec), 1)
    assert f"needs an API key: set ${variable}" in line


def test_demo_with_an_unreachable_model_server() -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
    line = assert_one_error_line(cli("demo", "--model", f"openai:x@{url}"), 1)
    assert f"cannot reach the model server at {url}" in line


async def _refuse_every_request(stream: trio.SocketStream) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        if not chunk:
            return
        data += chunk
    await stream.send_all(
        b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    await stream.aclose()


async def test_demo_with_a_model_server_that_refuses_the_key() -> None:
    with trio.fail_after(HANG_GUARD):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, _refuse_every_request, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            url = f"http://127.0.0.1:{port}/v1"
            done = await acli(
                "demo", "--model", f"openai:x@{url}", env=cli_env(OPENAI_API_KEY="sk-wrong")
            )
            nursery.cancel_scope.cancel()
    line = assert_one_error_line(done, 1)
    assert f"the model server at {url} refused the key in $OPENAI_API_KEY (HTTP 401" in line


@pytest.mark.parametrize(
    ("second", "expected"),
    [
        (Turn(fail="the model server went away"), "went away"),
        (Turn(text="I will not search."), None),
    ],
    ids=["section-2-fails", "section-2-skips-the-tool"],
)
async def test_demo_tour_never_waits_for_a_progress_event_that_cannot_come(
    autojump_clock: trio.testing.MockClock, second: Turn, expected: str | None
) -> None:
    # Section 1: one slow turn (so the tour sees "running" and injects), one for the
    # injected follow-up; section 2: the model fails, or answers without the slow tool.
    # Section 3 (the tree): the lead answers without its research tool.
    model = ScriptedModel(
        [Turn(text="42", delay=1.0), Turn(text="sunny"), second], default=Turn(text="no research")
    )
    out = io.StringIO()
    with trio.fail_after(HANG_GUARD):
        reason = await run_demo(model, MemorySession(), out)
    if expected is None:
        assert reason is None
        assert "=> completed: the model answered without the slow tool" in out.getvalue()
    else:
        assert reason is not None
        assert expected in reason
        assert "=> failed:" in out.getvalue()


async def test_demo_tour_stops_when_the_model_fails_in_section_1(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([Turn(text="4", delay=1.0, fail="no such model", fail_after=1)])
    out = io.StringIO()
    with trio.fail_after(HANG_GUARD):
        reason = await run_demo(model, MemorySession(), out)
    assert reason is not None
    assert "no such model" in reason
    assert "== 2." not in out.getvalue()
    assert model.calls == 1


def test_main_returns_the_status(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRIO_AGENTS_TOKEN", raising=False)
    assert main(["ctl", "ws://127.0.0.1:1/", "list"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_explain_looks_inside_groups_but_never_unwraps_several_errors() -> None:
    cancelled = trio.Cancelled._create()  # what a nursery holds beside the real error
    one = BaseExceptionGroup("nursery", [CLIError("bad thing"), cancelled])
    assert explain(BaseExceptionGroup("outer", [one])) == ("bad thing", 1)
    interrupted = BaseExceptionGroup("nursery", [KeyboardInterrupt(), ValueError("x")])
    assert explain(interrupted) == ("interrupted", 130)
    assert explain(ExceptionGroup("nursery", [ValueError("a"), ValueError("b")])) is None
    assert explain(ValueError("a bug")) is None
    assert explain(BrokenPipeError()) == ("", 141)


def test_serve_max_run_limits() -> None:
    from trio_agents._cli._args import parse

    args = parse(["serve", "--max-run-limits", "requests=50,deadline=300,wrap_up=2.5"])
    assert args.max_run_limits == ta.UsageLimits(requests=50, deadline=300, wrap_up=2.5)
    assert parse(["serve"]).max_run_limits is None
    assert parse(["serve", "--max-run-limits", "cost=1.5"]).max_run_limits == ta.UsageLimits(
        cost="1.5"
    )
    for bad, expected in [
        ("requests", "expected NAME=NUMBER, not 'requests'"),
        ("requests=x", "expected NAME=NUMBER, not 'requests=x'"),
        ("budget=1", "unknown field(s) in --max-run-limits: 'budget'"),
        ("tool_calls=-1", "--max-run-limits.tool_calls must be an integer >= 0"),
        ("wrap_up=5", "wrap_up needs a deadline"),
    ]:
        done = cli("serve", "--max-run-limits", bad, "--port", "0")
        assert expected in assert_one_error_line(done, 2), bad
