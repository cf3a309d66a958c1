"""The import contracts of ``make lint`` (pyproject's ``[tool.importlinter]``) catch
what they forbid: each probe adds one forbidden import to a copy of the package and runs
``lint-imports`` on that copy, which must report exactly that contract broken. The
unmodified copy keeps every contract, so a probe's failure is the probe's doing.

A contract added to pyproject gets its probes here (``PROBES``); a contract no probe
breaks is reported by :func:`test_every_contract_has_a_probe`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
LINT_IMPORTS: Final = Path(sys.executable).with_name("lint-imports")

# (contract id, module file, the forbidden import appended to it)
PROBES: Final = [
    # the hosts and faces are siblings: no face imports a host or another face's package
    ("siblings", "faces/_rest.py", "from ..cluster._routing import Router"),
    ("siblings", "control/_ops.py", "from .. import faces"),
    ("siblings", "cluster/_cluster.py", "from ..control import _protocol"),
    ("siblings", "faces/_a2a.py", "from ..control._connection import Connection"),
    # ... over hosting, which imports none of them
    ("siblings", "hosting/_local.py", "from ..cluster import _claims"),
    # the Temporal host is a sibling too: it imports no face and no other host
    ("siblings", "temporal/_activity.py", "from ..cluster import _claims"),
    ("siblings", "faces/_rest.py", "from ..temporal import _run_client"),
    # inside faces: the plumbing is below the faces, the faces below the app
    ("faces", "faces/_event_stream.py", "from . import _rest"),
    ("faces", "faces/_http_errors.py", "from ._app import FACES"),
    # no face imports another, nor another's helpers
    ("face-families", "faces/_ui.py", "from . import _agui"),
    ("face-families", "faces/_rest.py", "from ._a2a_tasks import TaskView"),
    ("face-families", "faces/_agui_map.py", "from . import _a2a_v03"),
    # the libraries of the run core import no server layer
    ("libraries", "models/_http.py", "from ..hosting import _host"),
    ("libraries", "sessions/_sqlite.py", "from .. import cluster"),
    ("libraries", "mcp/_servers.py", "from ..faces import _face"),
    ("libraries", "tracing/_otel.py", "from ..control import _client"),
    ("libraries", "sessions/_memory.py", "from ..temporal import _types"),
    # the evals run agents in process: no host, no face
    ("libraries", "evals/_eval_runner.py", "from ..hosting import _host"),
    ("libraries", "evals/_judge.py", "def _probe() -> None:\n    from ..faces import _face"),
    # the run core imports no server layer and no models, not even inside a function
    ("core", "_tools.py", "def _probe() -> None:\n    from .hosting import _host"),
    ("core", "_run.py", "from .control import _protocol"),
    ("core", "_agent.py", "def _probe() -> None:\n    from .models import _demo"),
    ("core", "_serving.py", "from . import cluster"),
    # below the run trees, the core starts no runs: the two imports that once closed the
    # core's cycle, and two more
    ("core-chain", "_tools.py", "def _probe() -> None:\n    from ._children import make_child"),
    ("core-chain", "_agent.py", "from ._children import CHILDREN"),
    ("core-chain", "_run.py", "from ._hold import hold"),
    ("core-chain", "_state.py", "from ._entry import open_run"),
]


def _contract_ids() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [c["id"] for c in config["tool"]["importlinter"]["contracts"]]


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    """A copy of the package's source and of pyproject.toml (the contracts)."""
    shutil.copytree(
        ROOT / "trio_agents",
        tmp_path / "trio_agents",
        ignore=shutil.ignore_patterns("__pycache__", "ui"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _lint(root: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    selected = [arg for contract in contracts for arg in ("--contract", contract)]
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-logo", "--no-cache", *selected],
        cwd=root,
        # the copy, not the checkout, is the trio_agents lint-imports analyses
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_unmodified_package_keeps_every_contract(package_copy: Path) -> None:
    done = _lint(package_copy)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Contracts: {len(_contract_ids())} kept, 0 broken." in done.stdout


@pytest.mark.parametrize(
    ("contract", "module", "line"), PROBES, ids=[f"{c}:{m}" for c, m, _ in PROBES]
)
def test_a_forbidden_import_breaks_its_contract(
    package_copy: Path, contract: str, module: str, line: str
) -> None:
    path = package_copy / "trio_agents" / module
    path.write_text(path.read_text() + f"\n{line}  # the probe\n")
    done = _lint(package_copy, contract)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "0 kept, 1 broken" in done.stdout, done.stdout
    # the report names the probe's module as an importer
    importer = "trio_agents." + module.removesuffix(".py").replace("/", ".")
    assert importer in done.stdout, done.stdout


def test_every_contract_has_a_probe() -> None:
    assert sorted({contract for contract, _, _ in PROBES}) == sorted(_contract_ids())
