"""One name per module: no two modules of the package share a file name, so a name in
a traceback, a profile or a review says which module it is (issue 31)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import trio_agents

PACKAGE = Path(trio_agents.__file__).parent


def test_no_two_modules_share_a_basename() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            where[path.name].append(str(path.relative_to(PACKAGE.parent)))
    shared = {name: sorted(paths) for name, paths in where.items() if len(paths) > 1}
    assert not shared, f"modules sharing a basename: {shared}"
