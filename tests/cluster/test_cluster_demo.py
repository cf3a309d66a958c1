"""``make cluster-demo`` (examples/cluster_demo.py) runs and shows what it promises: a
run started on node-1, node-1 killed, the run resumed (attempt 2) and completed on
another node."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.support.pg_support import PostgresServer

ROOT = Path(__file__).resolve().parents[2]


def test_the_cluster_demo_finishes_the_run_on_another_node(
    postgres_server: PostgresServer,  # only to skip (or fail under CI) without PostgreSQL
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "cluster_demo.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,  # a hang guard
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    for node in ("node-1", "node-2", "node-3"):
        assert f"{node} serving on ws://" in out, out
    assert "started on node-1 (owner: node-1)" in out, out
    assert "killed node-1 (SIGKILL) during step 2" in out, out
    assert "status running (resumed, attempt 2)" in out, out
    assert "assistant: The report is ready." in out, out
    assert re.search(r"status completed\nrun completed on node-[23] after a takeover", out), out
    killed = out.index("killed node-1")
    assert out.index("status running (resumed, attempt 2)") > killed
    # The idempotent step that was running when node-1 died ran again.
    assert out.count('tool step({"number": 2}) started') == 2, out
