"""No function in trio_agents/ is over 100 lines (issue 31): a longer one does several
jobs, and a reader has to hold them all at once. Break it up by job instead (see
``_turns.model_turn``, or ``testing/_runner.py``'s ``_Example``: one method per job).

Length is counted as the issue measured it: from the ``def`` line to the function's last
line, nested functions included in their outer function (and also counted on their own).
"""

from __future__ import annotations

import ast
from pathlib import Path

import trio_agents

PACKAGE = Path(trio_agents.__file__).parent
LIMIT = 100

# Over the limit and allowed: none (r27h broke up the last four, in control/ and
# cluster/). Nothing may be added here.
ALLOWED: frozenset[str] = frozenset()


def long_functions(root: Path, limit: int = LIMIT) -> dict[str, int]:
    """``{"<path relative to root>:<qualified name>": lines}`` of every function in
    ``root``'s ``.py`` files that is longer than ``limit`` lines."""
    found: dict[str, int] = {}
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        where = path.relative_to(root).as_posix()
        _visit(tree, (), where, limit, found)
    return found


def _visit(
    node: ast.AST, scope: tuple[str, ...], where: str, limit: int, found: dict[str, int]
) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            inner = (*scope, child.name)
            if not isinstance(child, ast.ClassDef):
                assert child.end_lineno is not None
                lines = child.end_lineno - child.lineno + 1
                if lines > limit:
                    found[f"{where}:{'.'.join(inner)}"] = lines
            _visit(child, inner, where, limit, found)
        else:
            _visit(child, scope, where, limit, found)


def test_no_function_is_over_100_lines() -> None:
    too_long = {name: n for name, n in long_functions(PACKAGE).items() if name not in ALLOWED}
    assert too_long == {}, "functions over 100 lines (break them up by job): " + ", ".join(
        f"{name} ({n} lines)" for name, n in sorted(too_long.items())
    )


def test_the_allow_list_names_only_long_functions() -> None:
    # A fixed function leaves the list: an entry that no longer matches anything would
    # hide the next long function given that name.
    assert set(long_functions(PACKAGE)) >= ALLOWED


def test_the_measure_counts_nested_functions_and_methods(tmp_path: Path) -> None:
    def body(indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(99))

    (tmp_path / "m.py").write_text(
        f"def short():\n{body('    ')}\n"
        f"class C:\n    def long(self):\n{body('        ')}        pass\n\n"
        f"def outer():\n    def inner():\n{body('        ')}        pass\n",
        encoding="utf-8",
    )
    assert long_functions(tmp_path) == {
        "m.py:C.long": 101,
        "m.py:outer": 102,
        "m.py:outer.inner": 101,
    }
