"""``make temporal-demo`` (examples/temporal_demo.py) runs from a fresh clone and shows
what it promises: a worker killed mid-tool, the run resumed (attempt 2) and finished by
the other worker with seqs continuing; a run cancelled by ``temporal workflow cancel``
with its repaired conversation in the session; both workflows recorded by Temporal;
the UI's URL. The demo checks each of these itself (exit 1 otherwise); this test reads
its output too."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_temporal_demo_resumes_a_killed_workers_run_and_cancels_from_the_cli() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "temporal_demo.py")],
        env=env,
        stdin=subprocess.DEVNULL,  # not a terminal: the demo stops at its end
        capture_output=True,
        text=True,
        timeout=400,  # a hang guard: the demo bounds each of its own steps
        cwd=ROOT,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-4000:]
    killed = re.search(r"\*\*\* SIGKILL to (worker-[12]) \(pid \d+\), mid-tool", out)
    assert killed is not None, out
    other = "worker-2" if killed.group(1) == "worker-1" else "worker-1"
    after = out[killed.end() :]
    assert "status running (resumed, attempt 2)" in after, out
    assert "tool step error: interrupted:" in after, out
    assert f"({other})" in after.split("\n2. ")[0], out
    assert f"-> completed on {other} after the kill: attempt 2" in out, out
    assert "tool wait_for_signal cancelled: cancelled: workflow cancelled" in out, out
    assert "status cancelled: workflow cancelled" in out, out
    assert "'output': 'cancelled: workflow cancelled', 'status': 'cancelled'" in out, out
    assert re.search(r"run_\w+: COMPLETED\n   run_\w+: CANCELED\n", out), out
    assert re.search(r"Temporal UI: http://127\.0\.0\.1:\d+/namespaces/default/workflows", out)
    assert out.rstrip().endswith("stopped everything"), out
