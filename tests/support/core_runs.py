"""What the run-core tests share: a run read to the end and checked, tools that fail,
wait for the test (in a task or a thread) or outlast any test, a hook that holds a run at its
first model call, a plain agent, a model that streams given events, and the tools and agent
of the resume tests (an idempotent call, one never run twice, one that needs approval)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
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


def make_agent(model: ta.Model, tools: Sequence[ta.Tool] = (), **kw: Any) -> ta.Agent:
    """An agent ``t`` on ``model`` with ``tools``, no instructions; ``kw`` are more
    ``Agent`` fields."""
    return ta.Agent(name="t", instructions="", model=model, tools=list(tools), **kw)


class EventsModel:
    """Yields the given events per call (the last list repeats); records requests."""

    def __init__(self, *turns: Sequence[object], block: bool = False) -> None:
        self.turns = list(turns)
        self.requests: list[ta.ModelRequest] = []
        self.block = block

    @asynccontextmanager
    async def stream(self, request: ta.ModelRequest) -> AsyncIterator[AsyncIterator[Any]]:
        self.requests.append(request)
        events = self.turns[min(len(self.requests), len(self.turns)) - 1]

        async def gen() -> AsyncIterator[Any]:
            for event in events:
                await trio.lowlevel.checkpoint()
                yield event
            if self.block:
                await trio.sleep_forever()

        yield gen()


def resume_tools(ran: list[str]) -> list[ta.Tool]:
    """``lookup`` (idempotent), ``charge`` (never run twice), ``delete`` (needs
    approval); each records its call id in ``ran``."""

    @ta.function_tool(idempotent=True)
    async def lookup(ctx: ta.ToolContext) -> str:
        """Read something (safe to repeat)."""
        ran.append(ctx.call_id)
        return "looked up"

    @ta.function_tool
    async def charge(ctx: ta.ToolContext) -> str:
        """Charge a card (never twice)."""
        ran.append(ctx.call_id)
        return "charged"

    @ta.function_tool(needs_approval=True)
    async def delete(ctx: ta.ToolContext) -> str:
        """Delete a file, once approved."""
        ran.append(ctx.call_id)
        return "deleted"

    return [lookup, charge, delete]


def resume_agent(model: ta.Model, ran: list[str]) -> ta.Agent:
    """An agent on ``model`` with :func:`resume_tools`."""
    return make_agent(model, resume_tools(ran))


def by_call(items: Any) -> dict[str, ta.ToolResult]:
    """The tool results among ``items``, by call id."""
    return {item.call_id: item for item in items if isinstance(item, ta.ToolResult)}


def fast_and_slow(release: trio.Event) -> list[ta.Tool]:
    """``fast`` answers "fast done" at once, ``slow`` answers "slow done" once
    ``release`` is set: a turn's results finishing apart."""

    @ta.function_tool
    async def fast() -> str:
        """Answers at once."""
        return "fast done"

    @ta.function_tool
    async def slow() -> str:
        """Answers when the test says so."""
        await release.wait()
        return "slow done"

    return [fast, slow]
