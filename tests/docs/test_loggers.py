"""Every module logs under its own package's logger (``trio_agents.<package>``, the run
core under ``trio_agents``), so a user who turns one layer's logging up or down gets
that layer: a hosting module logging as ``trio_agents.control`` would be silenced with
the websocket channel. Read with ``ast``, nothing imported."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Final

PACKAGE: Final = Path(__file__).resolve().parents[2] / "trio_agents"

# Loggers named for what they log rather than where: the admission of connections is
# shared by every listening face (the websocket channel's and Hypercorn's accept loops).
ELSEWHERE: Final = {("hosting/_admission.py", "trio_agents.connections")}


def logger_names(path: Path) -> list[str]:
    """The literal names ``path`` passes to ``logging.getLogger``."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "getLogger"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.append(node.args[0].value)
    return names


def test_every_module_logs_under_its_own_package() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        own = "trio_agents" if len(relative.parts) == 1 else f"trio_agents.{relative.parts[0]}"
        for name in logger_names(path):
            if (relative.as_posix(), name) in ELSEWHERE:
                continue
            if name != own and not name.startswith(own + "."):
                offenders.append(f"{relative}: {name!r} (its package's is {own!r})")
    assert offenders == []


def test_the_checker_reads_logger_names() -> None:
    assert logger_names(PACKAGE / "hosting" / "_local.py") == ["trio_agents.hosting"]
    assert "trio_agents.faces.hypercorn" in logger_names(PACKAGE / "faces" / "_hypercorn.py")
