"""Private reaches across modules stay few: ``x._y`` where ``x`` is a plain name other
than ``self``/``cls`` (another object's private member), counted with :mod:`ast` over
``trio_agents/``, leaving out the standard library's modules (``sys._getframe``,
``argparse._SubParsersAction``, ``os._exit``: documented or typeshed names with no public spelling,
not a reach between our modules). Issue 37 measured 135 (143 by this count with them)
and halved it; the ceiling keeps it from creeping back. A new reach needs a public (or package-level) name in the
module that owns the member instead, or a lower ceiling once one is removed.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path
from typing import Final

PACKAGE: Final = Path(__file__).resolve().parents[2] / "trio_agents"
CEILING: Final = 63
STDLIB: Final = frozenset({"argparse", "os", "sys"})


def reaches(tree: ast.AST) -> list[str]:
    """Every ``name._private`` attribute access in ``tree`` (dunders are not private)."""
    return [
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id not in ("self", "cls")
        and node.value.id not in STDLIB
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]


def test_the_counter_sees_reaches_and_leaves_self_and_dunders() -> None:
    code = "a._b\nself._c\ncls._d\nx.__class__\nx.y._z\nrun._state.items\nsys._getframe()"
    assert reaches(ast.parse(code)) == ["a._b", "run._state"]


def test_private_reaches_stay_under_the_ceiling() -> None:
    per_module = Counter(
        {
            str(path.relative_to(PACKAGE)): len(reaches(ast.parse(path.read_text("utf-8"))))
            for path in sorted(PACKAGE.rglob("*.py"))
        }
    )
    total = sum(per_module.values())
    worst = ", ".join(f"{m} {n}" for m, n in per_module.most_common(5))
    assert total <= CEILING, f"{total} private reaches (ceiling {CEILING}); most in: {worst}"
