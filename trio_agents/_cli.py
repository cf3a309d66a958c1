"""The ``trio-agents`` command line.

``trio-agents demo`` tours the run lifecycle; ``trio-agents serve`` runs a control
server (websocket, loopback by default); ``trio-agents ctl URL ...`` drives one.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import secrets
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import trio

from ._agent import Agent
from ._entry import open_run
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
from ._run import Run
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
    serve = commands.add_parser("serve", help="serve agents over the websocket control channel")
    serve.add_argument("--host", default="127.0.0.1", help="interface (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any)")
    serve.add_argument(
        "--db", default="trio-agents-sessions.sqlite3", help="SQLite file for sessions"
    )
    serve.add_argument(
        "--app",
        help="module:attr naming a mapping of agent name -> Agent (or a callable returning"
        " one); default: the demo agent on the offline DemoModel",
    )
    serve.add_argument(
        "--token",
        default=os.environ.get("TRIO_AGENTS_TOKEN"),
        help="the bearer token (default $TRIO_AGENTS_TOKEN, else a generated one, printed once)",
    )
    ctl = commands.add_parser("ctl", help="talk to a control server")
    ctl.add_argument("url", help="ws://host:port/")
    ctl.add_argument(
        "--token", default=os.environ.get("TRIO_AGENTS_TOKEN"), help="default $TRIO_AGENTS_TOKEN"
    )
    verbs = ctl.add_subparsers(dest="verb", required=True)
    verbs.add_parser("list", help="list your runs")
    watch = verbs.add_parser("watch", help="print a run's events until it ends")
    watch.add_argument("run_id")
    watch.add_argument("--from-seq", type=int, default=None)
    start = verbs.add_parser("start", help="start a run and print its events")
    start.add_argument("agent")
    start.add_argument("input")
    start.add_argument("--session", default=None)
    start.add_argument("--detach", action="store_true", help="print the run id and leave")
    cancel = verbs.add_parser("cancel", help="cancel a run")
    cancel.add_argument("run_id")
    cancel.add_argument("--reason", default=None)
    inject = verbs.add_parser("inject", help="inject a user message into a run")
    inject.add_argument("run_id")
    inject.add_argument("text")
    inject.add_argument("--when", default="next_turn", choices=["next_turn", "now", "when_idle"])
    approve = verbs.add_parser("approve", help="approve a tool call waiting for approval")
    approve.add_argument("run_id")
    approve.add_argument("call_id")
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


def _load_app(spec: str) -> Mapping[str, Agent]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"--app must look like module:attr, got {spec!r}")
    sys.path.insert(0, os.getcwd())
    value: Any = getattr(importlib.import_module(module_name), attr)
    if callable(value) and not isinstance(value, Mapping):
        value = value()
    if not isinstance(value, Mapping) or not all(isinstance(a, Agent) for a in value.values()):
        raise SystemExit(f"{spec} must be a mapping of name -> Agent (or return one)")
    return value


async def _serve(args: argparse.Namespace, agents: Mapping[str, Agent], token: str) -> None:
    from .control import ControlServer

    server = ControlServer(agents, auth={token: "cli"}, sessions=args.db)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, args.host, args.port)
        print(f"serving {', '.join(agents)} on ws://{args.host}:{port}/ (sessions in {args.db})")
        sys.stdout.flush()


def _event_line(event: Any) -> str:
    data = event.to_json()
    return json.dumps(data, ensure_ascii=False, default=repr)


async def _ctl(args: argparse.Namespace, out: TextIO) -> int:
    from .control import connect

    if not args.token:
        raise SystemExit("ctl needs --token or $TRIO_AGENTS_TOKEN")
    async with connect(args.url, token=args.token) as client:
        if args.verb == "list":
            for info in await client.list_runs():
                out.write(json.dumps(info.to_json()) + "\n")
        elif args.verb in ("watch", "start"):
            if args.verb == "start":
                run = await client.start(args.agent, args.input, session_id=args.session)
                out.write(f"run {run.id}\n")
                if args.detach:
                    return 0
                events = run.events(1)
            else:
                run = client.attach(args.run_id)
                events = run.events(args.from_seq)
            async for event in events:
                out.write(_event_line(event) + "\n")
                out.flush()
        elif args.verb == "cancel":
            await client.attach(args.run_id).cancel(args.reason)
        elif args.verb == "inject":
            injection = await client.attach(args.run_id).inject(args.text, when=args.when)
            out.write(f"{injection}\n")
        elif args.verb == "approve":
            await client.attach(args.run_id).approve(args.call_id)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trio-agents`` command."""
    args = _parse(argv)
    if args.command == "demo":
        return _demo(args)
    if args.command == "serve":
        from .models import DemoModel

        agents = _load_app(args.app) if args.app else {"demo": demo_agent(DemoModel())}
        token = args.token
        if not token:
            token = secrets.token_urlsafe(24)
            print(f"token (shown once): {token}")
        try:
            trio.run(_serve, args, agents, token)
        except KeyboardInterrupt:
            print("stopped")
        return 0
    if args.command == "ctl":
        from ._exceptions import TrioAgentsError

        try:
            return trio.run(_ctl, args, sys.stdout)
        except TrioAgentsError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    raise AssertionError(args.command)  # pragma: no cover


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
