"""Every ``python`` block of docs/testing.md runs, in order, in one namespace."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"
BLOCK = re.compile(r"^```python\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def test_every_python_block_of_the_testing_guide_runs(
    lifecycle_check: Callable[..., None],
    scripted_model: Callable[..., Any],
    capsys: Any,
) -> None:
    text = DOC.read_text()
    blocks = BLOCK.findall(text)
    assert len(blocks) >= 5
    assert text.count("```python") == len(blocks)
    namespace: dict[str, Any] = {"__name__": "docs_testing"}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"{DOC.name}:block{number}", "exec"), namespace)
    fixtures = {"lifecycle_check": lifecycle_check, "scripted_model": scripted_model}
    tests = [v for k, v in namespace.items() if k.startswith("test_") and callable(v)]
    assert len(tests) == 2
    for test in tests:
        parameters = inspect.signature(test).parameters
        test(**{name: fixtures[name] for name in parameters})
    printed = capsys.readouterr().out
    assert "[tool-cancellation] tool 'fetch'" in printed
    assert "0.125: cancel('r1')" in printed
