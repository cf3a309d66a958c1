"""One name per module: no two modules of the package share a file name, so a name in
a traceback, a profile or a review says which module it is (issue 31)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import trio_agents

PACKAGE = Path(trio_agents.__file__).parent

# Collisions still to be renamed, each naming the modules sharing it: none left (the
# list only ever shrinks; nothing may join it).
PENDING: dict[str, str] = {}


def test_no_two_modules_share_a_basename() -> None:
    where: defaultdict[str, list[str]] = defaultdict(list)
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            where[path.name].append(str(path.relative_to(PACKAGE.parent)))
    shared = {name: sorted(paths) for name, paths in where.items() if len(paths) > 1}
    new = {name: paths for name, paths in shared.items() if name not in PENDING}
    assert not new, f"modules sharing a basename: {new}"
    # Once renamed, the entry goes: the list only ever shrinks.
    assert set(PENDING) <= set(shared), f"no longer shared: {set(PENDING) - set(shared)}"
