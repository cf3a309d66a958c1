"""``trio-agents eval`` as a real process: a YAML dataset, JSON out, --compare finding a
regression, --threshold gating the exit status, a JSON dataset, bad input, and Ctrl-C
writing the partial result. The agents: tests/support/evals_app.py (offline)."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import trio

from tests.support.cli_support import (
    ROOT,
    LineReader,
    assert_one_error_line,
    cli,
    cli_argv,
    cli_env,
)

APP = "tests.support.evals_app:AGENTS"

CASES = """\
name: calc
evaluators:
  - OutputMatches
cases:
  - name: add small
    inputs: add 2 3
    expected_output: It is 5.
    evaluators:
      - ToolTrajectory:
          calls: [{name: add, arguments: {a: 2, b: 3}}]
  - name: echo
    inputs: hello
    expected_output: echo hello
  - name: follow-ups
    inputs:
      input: hi
      follow_ups: [again]
    expected_output: echo hi
"""


def write_cases(tmp_path: Path, text: str = CASES, name: str = "cases.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_eval_reports_writes_json_and_compare_finds_the_regression(tmp_path: Path) -> None:
    cases = write_cases(tmp_path)
    good = tmp_path / "good.json"
    done = cli("eval", cases, "--app", APP, "--json", good, "--threshold", "1")
    assert done.returncode == 0, done.stderr
    assert "Evaluation Summary: calc" in done.stdout
    assert "3/3 passed (100.0%), 0 failed, 0 errors" in done.stdout
    # progress: one line per case on stderr when it is not a terminal
    progress = done.stderr.splitlines()
    assert [line.split("] ", 1)[0] for line in progress] == ["[1/3", "[2/3", "[3/3"]
    assert {line.split("] ", 1)[1] for line in progress} == {
        "add small: passed (run completed)",
        "echo: passed (run completed)",
        "follow-ups: passed (run completed)",
    }
    data = json.loads(good.read_text())
    assert data["format"] == "trio-agents-eval/1"
    assert data["summary"]["score"] == 1.0
    assert data["verdicts"] == {"add small": "passed", "echo": "passed", "follow-ups": "passed"}
    # every case's run is in the file: the conversation and every event
    run = data["runs"]["follow-ups"]
    assert [i["content"] for i in run["conversation"] if i.get("role") == "user"] == [
        "hi",
        "again",
    ]
    assert run["events"][-1]["type"] == "run.updated"
    assert run["events"][-1]["status"] == "completed"

    worse = tmp_path / "worse.json"
    done = cli(
        "eval",
        cases,
        "--app",
        APP,
        "--json",
        worse,
        "--compare",
        good,
        "--threshold",
        "0.9",
        env=cli_env(EVALS_APP_BROKEN="1"),
    )
    assert done.returncode == 1, done.stderr
    assert "Evaluation Diff: calc" in done.stdout
    assert "score: 100.0% -> 66.7%" in done.stdout
    assert "regression: add small: passed -> failed (OutputMatches: True -> False)" in done.stdout
    assert done.stderr.splitlines()[-1] == ("trio-agents: score 66.7% is below the threshold 90.0%")
    assert json.loads(worse.read_text())["verdicts"]["add small"] == "failed"


def test_eval_reads_json_datasets_and_refuses_bad_input(tmp_path: Path) -> None:
    dataset = {
        "name": "json",
        "cases": [{"name": "echo", "inputs": "yo", "expected_output": "echo yo"}],
        "evaluators": ["OutputMatches"],
    }
    path = write_cases(tmp_path, json.dumps(dataset), "cases.json")
    done = cli("eval", path, "--app", APP)
    assert done.returncode == 0, done.stderr
    assert "1/1 passed (100.0%)" in done.stdout

    bad = write_cases(tmp_path, "cases: [{inputs: x, evaluators: [NoSuchEvaluator]}]\n")
    line = assert_one_error_line(cli("eval", bad, "--app", APP), 2)
    assert "cannot read the cases" in line
    assert "NoSuchEvaluator" in line
    typo = write_cases(tmp_path, "cases: [{inputs: {input: x, follow_up: [y]}}]\n", "typo.yaml")
    line = assert_one_error_line(cli("eval", typo, "--app", APP), 2)
    assert "follow_up" in line
    line = assert_one_error_line(cli("eval", tmp_path / "missing.yaml", "--app", APP), 2)
    assert "cannot read the cases" in line
    line = assert_one_error_line(cli("eval", path, "--app", APP, "--compare", path), 2)
    assert "--compare" in line
    assert "not an eval result" in line
    done = cli("eval", path, "--app", APP, "--threshold", "7")
    assert done.returncode == 2
    assert "between 0 and 1" in done.stderr


async def test_ctrl_c_stops_every_run_and_writes_the_partial_result(tmp_path: Path) -> None:
    fast = [f"  - {{name: fast-{i}, inputs: w{i}, expected_output: echo w{i}}}" for i in range(3)]
    slow = [f"  - {{name: slow-{i}, inputs: slow}}" for i in range(2)]
    cases = write_cases(tmp_path, "name: half\ncases:\n" + "\n".join(fast + slow) + "\n")
    out = tmp_path / "partial.json"
    process = await trio.lowlevel.open_process(
        cli_argv("eval", cases, "--app", APP, "--json", out, "--concurrency", "8"),
        env=cli_env(),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    stdout = bytearray()
    try:
        async with trio.open_nursery() as nursery:

            async def collect() -> None:
                assert process.stdout is not None
                while chunk := await process.stdout.receive_some():
                    stdout.extend(chunk)

            nursery.start_soon(collect)
            progress = LineReader(process.stderr)
            with trio.fail_after(60):  # a hang guard only
                # the three fast cases finish; the two slow ones sit in their tool
                for _ in range(3):
                    await progress.until(lambda line: line.startswith("["))
                process.send_signal(signal.SIGINT)
                status = await process.wait()
                rest = await progress.rest()
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
            await process.stdout.aclose()
            await process.stderr.aclose()
    assert status == 130, rest
    assert rest[-1] == "trio-agents: interrupted; the partial result is above"
    assert "3/5 passed (60.0%), 0 failed, 2 errors" in stdout.decode()
    data = json.loads(out.read_text())
    assert data["complete"] is False
    assert data["verdicts"] == {
        "fast-0": "passed",
        "fast-1": "passed",
        "fast-2": "passed",
        "slow-0": "error",
        "slow-1": "error",
    }
    for name in ("slow-0", "slow-1"):
        run = data["runs"][name]
        assert (run["status"], run["reason"]) == ("cancelled", "parent cancelled")
        assert run["conversation"][-1]["output"] == "cancelled: parent cancelled"
