"""The ``trio-agents`` command line: ``trio-agents demo`` tours the run lifecycle."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import TextIO

import trio

from ._agent import Agent
from ._events import (
    InboxDelivered,
    InboxInjected,
    ResponseTextDelta,
    RunUpdated,
    ToolFinished,
    ToolProgress,
    ToolStarted,
)
from ._items import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from ._model import Model
from ._run import Run, open_run
from ._tools import ToolContext, function_tool
from .sessions import Session

__all__ = ["main"]


@function_tool
async def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number.
        b: the second number.
    """
    return a + b


@function_tool
async def weather(city: str) -> str:
    """Look up today's weather in a city (canned data, offline).

    Args:
        city: the city name.
    """
    await trio.sleep(0.05)
    return f"{city}: 18 °C, light wind, no rain (demo data)"


@function_tool
async def search_archive(ctx: ToolContext, query: str) -> str:
    """Search the archive; slow, reports progress as it goes.

    Args:
        query: what to look for.
    """
    for page in range(1, 101):
        await trio.sleep(0.1)
        ctx.progress(f"scanned page {page}/100", page=page)
    return f"found 3 documents about {query}"


def demo_agent(model: Model) -> Agent:
    """The agent of the tour: three small tools, one of them slow."""
    return Agent(
        name="demo",
        instructions="You are a helpful assistant. Use the tools when they help.",
        model=model,
        tools=[add, weather, search_archive],
        max_turns=8,
    )


class _Printer:
    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.in_text = False

    def line(self, text: str) -> None:
        if self.in_text:
            self.out.write("\n")
            self.in_text = False
        self.out.write(text + "\n")
        self.out.flush()

    def text(self, fragment: str) -> None:
        if not self.in_text:
            self.out.write("  assistant> ")
            self.in_text = True
        self.out.write(fragment)
        self.out.flush()


async def _watch(run: Run, printer: _Printer, progress_seen: trio.Event | None = None) -> None:
    async for event in run.events():
        if isinstance(event, RunUpdated):
            extra = f" — {event.reason}" if event.reason else ""
            if event.detail.get("pending"):
                extra += f" pending={list(event.detail['pending'])}"
            printer.line(f"  [run.updated] {event.status.value} (turn {event.turn}){extra}")
        elif isinstance(event, ResponseTextDelta):
            printer.text(event.text)
        elif isinstance(event, ToolStarted):
            printer.line(f"  [tool.started] {event.name}({event.arguments})")
        elif isinstance(event, ToolProgress):
            printer.line(f"  [tool.progress] {event.name}: {event.message}")
            if progress_seen is not None and event.data.get("page") == 3:
                progress_seen.set()
        elif isinstance(event, ToolFinished):
            printer.line(f"  [tool.finished] {event.name} -> {event.status}: {event.output}")
        elif isinstance(event, InboxInjected):
            printer.line(f"  [inbox.injected] {event.injection_id} when={event.when}")
        elif isinstance(event, InboxDelivered):
            printer.line(f"  [inbox.delivered] {event.injection_id} into turn {event.turn}")


def _describe(item: Item) -> str:
    if isinstance(item, UserMessage):
        return f"user: {item.content}"
    if isinstance(item, AssistantMessage):
        suffix = " [incomplete]" if item.status == "incomplete" else ""
        return f"assistant{suffix}: {item.content}"
    if isinstance(item, ToolCall):
        return f"tool call {item.call_id}: {item.name}({item.arguments})"
    assert isinstance(item, ToolResult)
    return f"tool result {item.call_id} [{item.status}]: {item.output}"


async def run_demo(model: Model, session: Session, out: TextIO) -> None:
    """The lifecycle tour: stream, inject, cancel mid-tool, show the conversation."""
    printer = _Printer(out)
    agent = demo_agent(model)

    printer.line("== 1. A run that uses a tool; a follow-up is injected while it runs ==")
    async with (
        open_run(agent, "What is 21 + 21?", session=session) as run,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(_watch, run, printer)
        async for update in run.updated:
            if update.status == "running":
                injection = run.inject("And what is the weather in Paris?", when="when_idle")
                printer.line(f"  (injected a follow-up: {injection})")
                break
    assert run.result is not None
    printer.line(f"  => {run.result.status.value}, {run.result.turns} model turns")

    printer.line("")
    printer.line("== 2. A slow tool, cancelled mid-call ==")
    progress_seen = trio.Event()
    async with (
        open_run(agent, "Search the archive for structured concurrency", session=session) as run,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(_watch, run, printer, progress_seen)
        await progress_seen.wait()
        printer.line("  (pressing stop: run.cancel('user pressed stop'))")
        run.cancel("user pressed stop")
    assert run.result is not None
    printer.line(f"  => {run.result.status.value}: {run.result.reason}")

    printer.line("")
    printer.line("== 3. The conversation the session holds (valid model input) ==")
    for item in await session.get_items():
        printer.line(f"  {_describe(item)}")


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="trio-agents", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="a terminal tour of the run lifecycle (offline)")
    demo.add_argument(
        "--db",
        default=None,
        help="SQLite file for the demo's session (default: a fresh temporary file)",
    )
    demo.add_argument(
        "--model",
        default="demo",
        help="model to use, as for models.from_string (default: the offline DemoModel)",
    )
    demo.add_argument(
        "--delay",
        type=float,
        default=0.03,
        help="seconds between streamed chunks of the DemoModel (default 0.03)",
    )
    return parser.parse_args(argv)


def _demo(args: argparse.Namespace) -> int:
    from .models import DemoModel, from_string
    from .sessions import SQLiteSession

    if args.model == "demo":
        model: Model = DemoModel(delay=args.delay)
        print("trio_agents demo — offline, on the labelled DemoModel (not an LLM)")
    else:
        model = from_string(args.model)
        print(f"trio_agents demo — on {args.model}")
    with tempfile.TemporaryDirectory(prefix="trio-agents-demo-") as scratch:
        path = args.db or os.path.join(scratch, "demo.sqlite3")
        print(f"session: SQLite file {path}")
        print()

        async def tour() -> None:
            async with SQLiteSession(path, "demo") as session:
                await run_demo(model, session, sys.stdout)

        trio.run(tour)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trio-agents`` command."""
    args = _parse(argv)
    if args.command == "demo":
        return _demo(args)
    raise AssertionError(args.command)  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
