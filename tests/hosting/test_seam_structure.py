"""The hosting ↔ cluster seam, measured (issue 37, CONVENTIONS "Layers"): the hosting
layer never asks whether there is a cluster, names no private method of another
package in a Protocol, and the cluster's modules neither reach into each other's
privates nor import each other in a circle (counting imports inside functions)."""

from __future__ import annotations

import ast
from pathlib import Path

import trio_agents

PACKAGE = Path(trio_agents.__file__).parent


def _modules(package: str) -> dict[str, ast.Module]:
    return {
        f"trio_agents.{package}.{path.stem}": ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted((PACKAGE / package).glob("*.py"))
    }


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    return skipped


def _imports(package: str, module: str, tree: ast.Module) -> set[str]:
    """The modules of ``package`` that ``module`` imports anywhere (inside functions
    too), except under ``if TYPE_CHECKING:``."""
    skipped = _type_checking_nodes(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.ImportFrom):
            continue
        if node.level == 1 and node.module is not None:
            found.add(f"trio_agents.{package}.{node.module}")
        elif node.level == 1:
            found.update(f"trio_agents.{package}.{alias.name}" for alias in node.names)
        elif node.module is not None and node.module.startswith(f"trio_agents.{package}."):
            found.add(node.module)
    found.discard(module)
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph``, if it has one (depth first)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_no_hosting_module_asks_whether_there_is_a_cluster() -> None:
    for path in sorted((PACKAGE / "hosting").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        assert "cluster is" not in source, path.name
        assert ".cluster" not in source.replace("trio_agents.cluster", ""), path.name


def test_no_protocol_of_the_hosting_layer_names_a_private_member() -> None:
    for module, tree in _modules("hosting").items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            if not any(ast.unparse(base).endswith("Protocol") for base in node.bases):
                continue
            for member in node.body:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = member.name
                elif isinstance(member, ast.AnnAssign) and isinstance(member.target, ast.Name):
                    name = member.target.id
                else:
                    continue
                private = name.startswith("_") and not name.startswith("__")
                assert not private, f"{module}.{node.name}.{name}"


def test_the_cluster_and_hosting_modules_import_each_other_in_no_circle() -> None:
    for package in ("cluster", "hosting"):
        modules = _modules(package)
        graph = {name: _imports(package, name, tree) for name, tree in modules.items()}
        assert _cycle(graph) is None, _cycle(graph)


def test_no_cluster_module_reaches_into_another_cluster_or_hosting_objects_privates() -> None:
    # x._y with x a plain name other than self/cls. What is left reaches into the
    # sessions package's PostgresSession (wrapped by ClusterSession) and the run core's
    # Run (its state and options, read by the event writer): neither is the seam's.
    allowed = {"inner._call", "inner._add_items_sync", "inner._read_sync", "run._state"}
    allowed |= {"child._options"}
    reaches: list[str] = []
    for module, tree in _modules("cluster").items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id not in ("self", "cls")
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                reach = f"{node.value.id}.{node.attr}"
                if reach not in allowed:
                    reaches.append(f"{module}: {reach}")
    assert reaches == []
