"""Every ``python`` block in README.md and docs/ runs, and every example script runs.

Blocks of one file run in order in one namespace (so a later block can use an earlier
one's names), the way a reader follows the page. A block whose first line is
``# not run: <why>`` is skipped: only docs/sessions.md's PostgresSession example, which
tests/sessions/internals/test_postgres_session.py runs against the test suite's PostgreSQL server.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# docs/testing.md has its own test (tests/docs/test_docs_testing_guide.py): its blocks are
# pytest tests that need the harness's fixtures.
PAGES = sorted(
    [ROOT / "README.md", *(p for p in (ROOT / "docs").glob("*.md") if p.name != "testing.md")]
)
# cluster_demo.py needs PostgreSQL and starts processes: tests/cluster/test_cluster_demo.py;
# temporal_demo.py starts a Temporal dev server and processes: tests/temporal/test_temporal_demo.py.
DEMOS = ("cluster_demo.py", "temporal_demo.py")
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if p.name not in DEMOS)
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(page: Path) -> list[str]:
    blocks = BLOCK.findall(page.read_text(encoding="utf-8"))
    return [b for b in blocks if not b.startswith("# not run:")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_python_blocks_run(page: Path, capsys: pytest.CaptureFixture[str]) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem}"}
    for number, block in enumerate(python_blocks(page), 1):
        code = compile(block, f"{page.name} block {number}", "exec")
        exec(code, namespace)
    capsys.readouterr()


def test_pages_with_code_have_runnable_blocks() -> None:
    assert python_blocks(ROOT / "README.md")
    assert python_blocks(ROOT / "docs" / "quickstart.md")


def test_readme_links_every_guide() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    guides = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "index.md")
    assert [g for g in guides if f"(docs/{g})" not in readme] == []


def test_every_guide_is_in_the_docs_index() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    guides = sorted(p.stem for p in (ROOT / "docs").glob("*.md") if p.name != "index.md")
    assert [g for g in guides if f"\n{g}\n" not in index] == []


def test_there_are_at_least_five_examples() -> None:
    assert len(EXAMPLES) >= 5, [p.name for p in EXAMPLES]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_run(example: Path) -> None:
    # Offline by construction: no real provider settings leak in from the environment.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    done = subprocess.run(
        [sys.executable, str(example)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.strip(), "an example says what it did"
