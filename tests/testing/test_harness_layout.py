"""The shape of ``trio_agents/testing/`` (issue 37, item 6): modules split by job and
small enough to read, no import cycle among them (imports inside functions counted),
and no reach into another object's private names beyond the few named here. Read with
``ast``, nothing imported."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import trio_agents

HARNESS: Final = Path(trio_agents.__file__).parent / "testing"

MAX_LINES: Final = 500
# Older modules over the limit, each one job (the fake tools; the faults of models,
# hooks and sessions; the Hypothesis strategies): named so no other grows past it.
LONG: Final = {"_fakes.py": 700, "_faults.py": 700, "_strategies.py": 800}

# `x._y` where `x` is a plain name other than self/cls, per module: what is left has no
# public name to use instead (a run's own log, a tool context's lazy cancel event) or
# is the one way in to the recorder's private side (`book_of`).
ALLOWED_REACHES: Final = {
    "_clock.py": {"ctx._is_cancelled", "ctx._event"},
    "_fakes.py": {"recorder._book"},
    "_tree.py": {"root._log", "root._feed"},
}


def modules() -> list[Path]:
    return sorted(HARNESS.glob("*.py"))


def reaches(tree: ast.AST) -> set[str]:
    return {
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id not in ("self", "cls")
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    }


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for statement in node.body:
                skip.update(id(inner) for inner in ast.walk(statement))
    return skip


def harness_imports(source: str, name: str) -> set[str]:
    """The modules of ``trio_agents.testing`` that the module ``name`` imports (relative
    imports of this package, inside functions too, outside ``if TYPE_CHECKING:``), by
    file name."""
    tree = ast.parse(source, name)
    skip = _type_checking_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip or not isinstance(node, ast.ImportFrom) or node.level != 1:
            continue
        if node.module is not None:
            found.add(f"{node.module.split('.')[0]}.py")
        else:  # from . import _x
            found.update(f"{alias.name}.py" for alias in node.names)
    found.discard(name)
    return found


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = [stack.pop()]
            while component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_of_the_harness_is_over_its_length() -> None:
    over = {}
    for path in modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > LONG.get(path.name, MAX_LINES):
            over[path.name] = lines
    assert over == {}, f"split these by job (limit {MAX_LINES} lines): {over}"


def test_no_import_cycle_among_the_harness_modules() -> None:
    graph = {
        path.name: harness_imports(path.read_text(encoding="utf-8"), path.name)
        for path in modules()
    }
    assert cycles(graph) == []


def test_the_cycle_check_sees_imports_in_functions_and_cycles() -> None:
    # Probes: an import inside a function counts, a type-only one does not, and a
    # module importing back up closes a cycle.
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from ._checker import check_run\n"
        "def f():\n"
        "    from ._runner import run_example\n"
    )
    assert harness_imports(source, "_observation.py") == {"_runner.py"}
    graph = {"_a.py": {"_b.py"}, "_b.py": {"_c.py"}, "_c.py": {"_a.py"}, "_d.py": {"_a.py"}}
    assert cycles(graph) == [["_a.py", "_b.py", "_c.py"]]


def test_no_private_reach_but_the_named_ones() -> None:
    found = {}
    for path in modules():
        extra = reaches(ast.parse(path.read_text(encoding="utf-8"))) - ALLOWED_REACHES.get(
            path.name, set()
        )
        if extra:
            found[path.name] = sorted(extra)
    assert found == {}, (
        "give what these use a public-to-the-package name in the module that owns it"
    )
