"""The README's "Layout" section names every package of ``trio_agents/`` (by its folder,
``name/``), so a reader finds each layer docs/architecture.md draws."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[2]


def layout_section() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    assert match is not None, "README.md has no '## Layout' section"
    return match.group(1)


def test_the_readme_layout_names_every_package() -> None:
    packages = sorted(p.parent.name for p in (ROOT / "trio_agents").glob("*/__init__.py"))
    assert "hosting" in packages  # the glob sees the packages
    section = layout_section()
    assert [p for p in packages if f"`{p}/`" not in section] == []
    # and the run core, which is no folder
    assert "`trio_agents/_*.py`" in section
