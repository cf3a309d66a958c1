"""``trio-agents eval``'s progress (``_cli/_eval.py``): a bar redrawn in place on a
terminal, one line per finished case otherwise."""

from __future__ import annotations

import io

from trio_agents._cli._eval import _progress
from trio_agents.evals import CaseOutcome


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_one_bar_redrawn_in_place() -> None:
    err = Terminal()
    show = _progress(err)
    show(CaseOutcome("first", "passed", "completed", 1, 3))
    show(CaseOutcome("second", "failed", "completed", 2, 3))
    show(CaseOutcome("third", "error", None, 3, 3))
    frames = err.getvalue().split("\r")[1:]
    assert [frame.split("]")[0] for frame in frames] == [
        "[" + "#" * 10 + "-" * 20,
        "[" + "#" * 20 + "-" * 10,
        "[" + "#" * 30,
    ]
    assert frames[0].rstrip() == "[" + "#" * 10 + "-" * 20 + "] 1/3 first"
    # only the last frame ends the line
    assert [frame.endswith("\n") for frame in frames] == [False, False, True]


def test_a_pipe_gets_one_line_per_case() -> None:
    err = io.StringIO()
    show = _progress(err)
    show(CaseOutcome("first", "passed", "completed", 1, 2))
    show(CaseOutcome("second", "error", None, 2, 2))
    assert err.getvalue().splitlines() == [
        "[1/2] first: passed (run completed)",
        "[2/2] second: error",
    ]
