"""What the run-core tests share: a run read to the end and checked, tools that fail,
wait for the test (in a task or a thread) or outlast any test, and a hook that holds a run at its first model call."""

from __future__ import annotations

import threading
from typing import Any, TypeVar

import trio
import trio.testing

import trio_agents as ta
from tests.support.helpers import collect
from trio_agents.testing import check_events


async def run_to_the_end(
    agent: ta.Agent, input: str | list[ta.Item], **options: Any
) -> tuple[ta.RunResult, list[ta.RunEvent]]:
    """Open a run and read its events to the end: its result and events, the events
    checked against the run's rules (``trio_agents.testing.check_events``)."""
    async with ta.open_run(agent, input, **options) as run:
        events = await collect(run)
    assert run.result is not None
    check_events(run.result, events).raise_for_violations()
    return run.result, events


def assert_ended(run: ta.Run, status: str, reason: str | None) -> ta.RunResult:
    """Assert the run has ended with ``status`` and ``reason``; its result."""
    result = run.result
    assert result is not None
    assert (result.status, result.reason) == (status, reason)
    return result


ErrorT = TypeVar("ErrorT", bound=BaseException)


def assert_failed_with(
    run: ta.Run, reason: str, error: type[ErrorT]
) -> tuple[ta.RunResult, ErrorT]:
    """Assert the run has failed with ``reason`` and an ``error`` as its error; its
    result and that error."""
    result = assert_ended(run, "failed", reason)
    assert isinstance(result.error, error)
    return result, result.error


def raising_tool(name: str, error: type[BaseException], *args: object) -> ta.Tool:
    """A tool called ``name`` whose every call raises a new ``error(*args)``."""

    async def fail() -> str:
        raise error(*args)

    return ta.function_tool(fail, name=name, description=f"Raise {error.__name__}.")


class GateTool:
    """An async tool called ``name`` that sets ``entered`` when called, then waits for
    the test to set ``release`` (forever if it never does) and returns ``output``."""

    def __init__(self, name: str, output: str = "released") -> None:
        self.entered = trio.Event()
        self.release = trio.Event()

        async def gate() -> str:
            self.entered.set()
            await self.release.wait()
            return output

        self.tool = ta.function_tool(gate, name=name, description="Wait for the test.")


class ThreadTool:
    """A sync tool, ``blocking``, that holds its worker thread until the test sets
    ``release`` (30 s at most), and sets ``saw_cancel`` if ``ctx.cancelled`` is set
    while it waits."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.saw_cancel = threading.Event()

    def tool(self) -> ta.Tool:
        def blocking(ctx: ta.ToolContext) -> str:
            self.entered.set()
            if ctx.cancelled.wait(timeout=30):
                self.saw_cancel.set()
            self.release.wait(timeout=30)
            return "late value, must be discarded"

        return ta.function_tool(blocking, description="Block in a thread until cancelled.")


@ta.function_tool
async def slow() -> str:
    """Wait an hour (the tests cancel it first)."""
    await trio.sleep(3600)
    return "never"


class HoldModelStart(ta.RunHooks):
    """Holds the first ``on_model_start`` until the test sets ``release`` (shielded, if
    asked: shielded work such as a span exporter's flush)."""

    def __init__(self, *, shield: bool = False) -> None:
        self.shield = shield
        self.entered = trio.Event()
        self.release = trio.Event()

    async def on_model_start(self, run: ta.Run, turn: int, request: ta.ModelRequest) -> None:
        if turn == 1:
            with trio.CancelScope(shield=self.shield):
                self.entered.set()
                await self.release.wait()


async def inject_now_during_model_start(agent: ta.Agent, *, shield: bool) -> ta.RunResult:
    """Run ``agent`` on "go", inject "actually, this" with ``when="now"`` while the
    first ``on_model_start`` is held, release it; the run's result."""
    hooks = HoldModelStart(shield=shield)
    async with ta.open_run(agent, "go", hooks=hooks) as run:
        await hooks.entered.wait()
        run.inject("actually, this", when="now")
        await trio.testing.wait_all_tasks_blocked()
        hooks.release.set()
    assert run.result is not None
    return run.result
