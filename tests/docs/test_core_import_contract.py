"""The import contracts of the run core (``pyproject.toml``: "the run core imports no
server layer and no models", "below the run trees, the core starts no runs") hold, and
catch what they forbid.

Each probe copies the package to a temporary directory, adds one forbidden import to a
core module (inside a function: such an import runs too) and runs ``lint-imports`` on
the copy with the project's own configuration: the contract must break, naming the
import, while the tree as it is keeps it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

ROOT: Final = Path(__file__).resolve().parents[2]
CONTRACT: Final = "the run core imports no server layer and no models"
CHAIN: Final = "below the run trees, the core starts no runs"
LINT_IMPORTS: Final = Path(sys.executable).parent / "lint-imports"


def lint_imports(root: Path) -> str:
    """``lint-imports`` run on the package under ``root``, with the project's
    contracts: its report, where each contract is KEPT or BROKEN."""
    done = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(root / "pyproject.toml")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout + done.stderr


def copy_of_the_package(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "trio_agents",
        tmp_path / "trio_agents",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_the_contracts(tmp_path: Path) -> None:
    report = lint_imports(copy_of_the_package(tmp_path))
    assert f"{CONTRACT} KEPT" in report, report
    assert f"{CHAIN} KEPT" in report, report


def probe(tmp_path: Path, module: str, line: str) -> str:
    """``lint-imports``' report on a copy of the package whose ``module`` has ``line``
    added, inside a function."""
    root = copy_of_the_package(tmp_path)
    path = root / "trio_agents" / f"{module}.py"
    with path.open("a", encoding="utf-8") as file:
        file.write(f"\n\ndef _probe() -> None:\n    {line}  # noqa\n")
    return lint_imports(root)


@pytest.mark.parametrize(
    ("module", "forbidden"),
    [
        ("_tools", "trio_agents.hosting"),
        ("_run", "trio_agents.control"),
        ("_agent", "trio_agents.models"),
        ("_serving", "trio_agents.cluster"),
    ],
)
def test_the_contract_catches_a_forbidden_import(
    tmp_path: Path, module: str, forbidden: str
) -> None:
    report = probe(tmp_path, module, f"import {forbidden}")
    assert f"{CONTRACT} BROKEN" in report, report
    assert f"trio_agents.{module} -> {forbidden}" in report, report


@pytest.mark.parametrize(
    ("module", "target", "name"),
    [
        # What closed the core's cycle before (issue 37): a tool's context importing
        # what starts child runs, an agent building its tool from there.
        ("_tools", "_children", "make_child"),
        ("_agent", "_children", "CHILDREN"),
        ("_run", "_hold", "hold"),
        ("_state", "_entry", "open_run"),
    ],
)
def test_the_chain_contract_catches_a_module_starting_runs(
    tmp_path: Path, module: str, target: str, name: str
) -> None:
    report = probe(tmp_path, module, f"from trio_agents.{target} import {name}")
    assert f"{CHAIN} BROKEN" in report, report
    assert f"trio_agents.{module} -> trio_agents.{target}" in report, report
