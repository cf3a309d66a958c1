"""The pytest integration (``trio_agents.testing.eval_params``): one test per case of
a dataset file, run by a real pytest process on the offline agents of
tests/support/evals_app.py; a failing case's test says which assertion failed and why."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.cli_support import cli_env

CASES = """\
name: calc
evaluators:
  - OutputMatches
cases:
  - name: adds
    inputs: add 2 3
    expected_output: It is 5.
    evaluators:
      - ToolTrajectory: {calls: [add]}
  - name: echoes
    inputs: hello
    expected_output: echo hello
  - name: wrong
    inputs: hello
    expected_output: echo goodbye
"""

TEST = """\
import pytest

from tests.support.evals_app import AGENTS
from trio_agents.testing import eval_params


@pytest.mark.parametrize("case", eval_params("cases.yaml"))
async def test_agent(case):
    result = await case.check(AGENTS)
    assert result.runs[case.name].result.status == "completed"
"""


def test_one_test_per_case_and_a_failure_says_why(tmp_path: Path) -> None:
    (tmp_path / "cases.yaml").write_text(CASES)
    (tmp_path / "test_agent_cases.py").write_text(TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntrio_mode = true\nfilterwarnings = error\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rf"],
        cwd=tmp_path,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard only
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "test_agent_cases.py::test_agent[adds] PASSED" in out
    assert "test_agent_cases.py::test_agent[echoes] PASSED" in out
    assert "test_agent_cases.py::test_agent[wrong] FAILED" in out
    assert "eval case 'wrong': failed" in out
    assert "OutputMatches: FAILED (the output does not equal 'echo goodbye': 'echo hello')" in out
    assert "1 failed, 2 passed" in out
