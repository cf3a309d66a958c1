"""Lifecycle hooks: observe a run's start/end, model calls and tool calls.

Subclass :class:`RunHooks` and override what you need. Every ``*_start`` that was
called is matched by exactly one ``*_end`` on every path — completion, failure, ``max_turns``
and cancellation (where the end calls run during the shielded, bounded repair) — so
tracing spans opened in a start hook can always be closed in the end hook. (A start
hook interrupted by a cancellation still gets its end call; write end hooks to
tolerate a start that did not finish.)

An exception raised by a hook during the run fails the run (``reason`` names the hook);
one raised by an end hook during the repair of a cancelled or failed run is logged and
ignored, so the remaining end hooks still run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._items import ToolCall, ToolResult
from ._model import ModelRequest

if TYPE_CHECKING:
    from ._result import RunResult
    from ._run import Run

__all__ = ["RunHooks"]


class RunHooks:
    """Base class for run lifecycle hooks; every method is a no-op by default."""

    async def on_run_start(self, run: Run) -> None:
        """The run started (status ``running``), before the session is loaded."""

    async def on_run_end(self, run: Run, result: RunResult) -> None:
        """The run ended; called before the terminal ``run.updated`` is emitted."""

    async def on_model_start(self, run: Run, turn: int, request: ModelRequest) -> None:
        """A model call (turn ``turn``, counting from 1) is about to start."""

    async def on_model_end(self, run: Run, turn: int, outcome: str) -> None:
        """The model call of ``turn`` ended.

        ``outcome`` is ``"completed"``, ``"interrupted"`` (a ``when="now"`` injection),
        ``"failed"`` or ``"cancelled"``. ``run.turn_usage`` is this call's usage
        (None if it reported none), ``run.usage`` the run's so far.
        """

    async def on_tool_start(self, run: Run, call: ToolCall) -> None:
        """A tool call is about to run."""

    async def on_tool_end(self, run: Run, call: ToolCall, result: ToolResult) -> None:
        """A tool call ended with ``result`` (status ``cancelled`` if the run was)."""
