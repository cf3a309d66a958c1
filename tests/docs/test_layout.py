"""The layout of tests/ (tests/README.md): folders by part, tests on
public names, and a test of a private module's own contract in an ``internals/`` folder
that says so. Read with ``ast``, nothing imported."""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path
from typing import Final

TESTS: Final = Path(__file__).resolve().parents[1]

# Support code that instruments a node from the inside (it freezes a node's event
# writer mid-flush, tests/support/cluster_app.py): the one reach into a private module
# outside an internals/ folder, named here so no other slips in beside it.
ALLOWED: Final = {("support/cluster_app.py", "trio_agents.cluster._eventlog")}


def python_files() -> list[Path]:
    return sorted(TESTS.rglob("*.py"))


def private_imports(path: Path) -> list[str]:
    """The private trio_agents modules (or private names of a public one) ``path``
    imports: any dotted part after ``trio_agents`` starting with ``_``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for module in modules:
            head, *rest = module.split(".")
            if head == "trio_agents" and any(part.startswith("_") for part in rest):
                found.append(module)
    return found


def test_only_internals_folders_import_private_modules() -> None:
    offenders = []
    for path in python_files():
        relative = path.relative_to(TESTS)
        if "internals" in relative.parts:
            continue
        for module in private_imports(path):
            if not any(
                str(relative) == file and (module == allowed or module.startswith(allowed + "."))
                for file, allowed in ALLOWED
            ):
                offenders.append(f"{relative}: {module}")
    assert offenders == [], (
        "a test outside an internals/ folder imports a private module; use the public"
        " name, or move the test of that module's own contract to <part>/internals/"
    )


def test_the_checker_sees_private_imports() -> None:
    """The rule above is not vacuous: the files it exempts do import private modules."""
    inside = [p for p in python_files() if "internals" in p.relative_to(TESTS).parts]
    assert inside
    assert all(private_imports(p) for p in inside if p.name.startswith("test_"))


def test_every_folder_is_a_package_and_tests_are_in_a_part() -> None:
    folders = {p.parent for p in python_files()}
    assert all((folder / "__init__.py").exists() for folder in folders), folders
    loose = [p.name for p in TESTS.glob("test_*.py")]
    assert loose == [], f"test files directly in tests/: {loose}"


def test_no_two_test_modules_share_a_name() -> None:
    """Package-qualified imports would keep them apart, but a reader and a traceback
    would not: every test module's file name is unique in tests/."""
    names = Counter(p.name for p in python_files() if p.name.startswith("test_"))
    assert [name for name, count in names.items() if count > 1] == []


def imported_test_modules(source: str) -> list[str]:
    """The test modules (``test_*``) ``source`` imports, absolutely or relatively."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            # ``from tests.faces import test_ui`` imports a test module by its name.
            names = [base + ("." if node.module else "") + alias.name for alias in node.names]
            modules = [base, *names] if node.module else names
        else:
            continue
        found += [m for m in modules if m.rpartition(".")[2].startswith("test_")]
    return found


def test_no_test_file_imports_another() -> None:
    """Shared code lives in tests/support/ or a conftest: a test module importing another
    runs the other's module code too, and ties together two files a reader expects to
    stand alone."""
    offenders = [
        f"{path.relative_to(TESTS)}: {module}"
        for path in python_files()
        for module in imported_test_modules(path.read_text())
    ]
    assert offenders == [], "move what the test files share to tests/support/"


def test_the_checker_sees_imports_of_test_files() -> None:
    source = (
        "from tests.core.test_run_faults import make_agent\n"
        "import tests.cluster.test_cluster_leases\n"
        "from . import test_inject\n"
        "from tests.support.core_runs import make_agent\n"
        "from tests.faces import test_ui as ui\n"
    )
    assert imported_test_modules(source) == [
        "tests.core.test_run_faults",
        "tests.cluster.test_cluster_leases",
        ".test_inject",
        "tests.faces.test_ui",
    ]
