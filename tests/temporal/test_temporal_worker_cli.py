"""``trio-agents worker``'s mistakes are one line and an exit status, never a traceback
(nor the abort temporalio's threads can cause at interpreter exit)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.temporal_support import REPO, free_port


def _worker(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trio_agents", "worker", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_unreachable_temporal_is_one_line() -> None:
    done = _worker(
        "--temporal", f"127.0.0.1:{free_port()}", "--app", "tests.support.temporal_app:AGENTS"
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("trio-agents: error: cannot reach Temporal at 127.0.0.1:")
    assert done.stderr.count("\n") == 1


def test_a_bad_app_is_one_line() -> None:
    done = _worker("--temporal", "127.0.0.1:7233", "--app", "nosuchmod:AGENTS")
    assert done.returncode == 1
    assert done.stderr == (
        "trio-agents: error: --app nosuchmod:AGENTS: no module named 'nosuchmod' (run from"
        " the directory that holds it, or add that directory to PYTHONPATH)\n"
    )


def test_temporal_is_required() -> None:
    done = _worker("--app", "tests.support.temporal_app:AGENTS")
    assert done.returncode == 2
    assert "--temporal" in done.stderr
