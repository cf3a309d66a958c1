"""One name per module: no two modules of the package share a file name, so a name in
a traceback, a profile or a review says which module it is (issue 31)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import trio_agents

PACKAGE = Path(trio_agents.__file__).parent

# Being split into modules named by job on another branch (issue 31: the core's
# _schema.py, validator + type compiler + docstring parser); remove once it has landed.
PENDING: frozenset[str] = frozenset({"_schema.py"})


def test_no_two_modules_share_a_basename() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            where[path.name].append(str(path.relative_to(PACKAGE.parent)))
    shared = {
        name: sorted(paths)
        for name, paths in where.items()
        if len(paths) > 1 and name not in PENDING
    }
    assert not shared, f"modules sharing a basename: {shared}"
