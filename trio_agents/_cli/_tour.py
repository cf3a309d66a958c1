"""``trio-agents demo``: a terminal tour of the run lifecycle, and of a small tree of
agents (a lead fanning out to three researcher sub-agents, one branch stopped).

Offline by default, on the labelled DemoModel. With ``--model`` naming a remote model,
the API key and the server are checked first, so a missing key or an unreachable
server is one clear line, not a failed run halfway through the tour. The tour never
waits for something a failed run would skip: each wait also ends when the run ends.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import tempfile
from collections.abc import Mapping
from typing import Final, TextIO

import httpx
import trio

from .. import (
    Agent,
    Model,
    Run,
    RunChild,
    RunClosedError,
    ToolContext,
    ToolProgress,
    function_tool,
    open_run,
)
from ..models import AnthropicModel, DemoModel, OpenAIChatModel
from ..models._anthropic import API_VERSION as ANTHROPIC_API_VERSION
from ..models._anthropic import DEFAULT_BASE_URL as ANTHROPIC_BASE_URL
from ..models._model_string import model_from_string
from ..models._openai import DEFAULT_BASE_URL as OPENAI_BASE_URL
from ..sessions import Session, SessionStorageError
from ._errors import EXIT_USAGE, CLIError
from ._format import Printer, describe_item, event_line

__all__ = ["check_remote_model", "demo_agent", "demo_command", "lead_agent", "run_demo"]

PREFLIGHT_TIMEOUT: Final = 10.0
"""Seconds the up-front reachability check of a remote model may take."""

PROGRESS_PAGE: Final = 3
"""The tour presses stop once the slow tool reports this page."""


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


@function_tool
async def read_sources(ctx: ToolContext, topic: str) -> str:
    """Read the sources on a topic (canned data, offline); reports each page.

    Args:
        topic: what to read about.
    """
    for page in range(1, 11):
        await trio.sleep(0.05)
        ctx.progress(f"read page {page}/10", page=page)
    return f"10 pages on {topic}, 2 useful quotes (demo data)"


ANGLES: Final = ("history", "practice", "pitfalls")
"""The three researcher sub-agents of the tree section, one per angle."""


def lead_agent(model: Model) -> Agent:
    """The root of the tour's tree: one tool that fans out to three researcher
    sub-agents in parallel (``ctx.open_run``), each a child run with a tool of its own."""
    researchers = {
        angle: Agent(
            name=f"researcher-{angle}",
            instructions=f"Research the {angle} of a topic. Use the tools when they help.",
            model=model,
            tools=[read_sources],
            max_turns=4,
        )
        for angle in ANGLES
    }

    @function_tool
    async def research(ctx: ToolContext, topic: str) -> str:
        """Ask three researcher sub-agents about a topic, in parallel.

        Args:
            topic: the topic to research.
        """
        findings: dict[str, str] = {}

        async def ask(angle: str) -> None:
            async with ctx.open_run(researchers[angle], f"{topic}: {angle}") as child:
                pass
            result = child.result
            assert result is not None
            if result.status == "completed":
                findings[angle] = str(result.final_output)
            else:
                findings[angle] = f"({result.status.value}: {result.reason})"

        async with trio.open_nursery() as nursery:
            for angle in ANGLES:
                nursery.start_soon(ask, angle)
        return "; ".join(f"{angle}: {findings[angle]}" for angle in ANGLES)

    return Agent(
        name="lead",
        instructions="You lead a research team. Use the tools when they help.",
        model=model,
        tools=[research],
        max_turns=4,
    )


def demo_agent(model: Model) -> Agent:
    """The agent of the tour: three small tools, one of them slow."""
    return Agent(
        name="demo",
        instructions="You are a helpful assistant. Use the tools when they help.",
        model=model,
        tools=[add, weather, search_archive],
        max_turns=8,
    )


async def _watch(run: Run, printer: Printer, progress: trio.Event | None = None) -> None:
    """Print the run's events. ``progress`` is set when the slow tool reaches
    :data:`PROGRESS_PAGE` — or when the run ends, so a waiter never hangs."""
    try:
        async for event in run.events():
            printer.event(event)
            if (
                progress is not None
                and isinstance(event, ToolProgress)
                and event.data.get("page") == PROGRESS_PAGE
            ):
                progress.set()
    finally:
        if progress is not None:
            progress.set()


async def run_demo(model: Model, session: Session, out: TextIO) -> str | None:
    """The lifecycle tour: stream, inject, cancel mid-tool, show the conversation.

    Returns None, or why the tour stopped early (a run failed: say, the model did).
    """
    printer = Printer(out, indent="  ")
    agent = demo_agent(model)

    printer.heading("== 1. A run that uses a tool; a follow-up is injected while it runs ==")
    async with (
        open_run(agent, "What is 21 + 21?", session=session) as run,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(_watch, run, printer)
        async for update in run.updated:
            if update.status == "running":
                try:
                    injection = run.inject("And what is the weather in Paris?", when="when_idle")
                except RunClosedError:
                    break  # the run ended first: its result says how
                printer.line(f"(injected a follow-up: {injection})")
                break
    result = await run.wait()
    printer.line(f"=> {result.status.value}, {result.turns} model turns")
    if result.status == "failed":
        return result.reason or "failed"

    printer.heading("")
    printer.heading("== 2. A slow tool, cancelled mid-call ==")
    progress = trio.Event()
    async with (
        open_run(agent, "Search the archive for structured concurrency", session=session) as run,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(_watch, run, printer, progress)
        await progress.wait()  # set by the progress event, or when the run ends
        if run.result is None:
            printer.line("(pressing stop: run.cancel('user pressed stop'))")
            run.cancel("user pressed stop")
    result = await run.wait()
    if result.status == "failed":
        printer.line(f"=> failed: {result.reason}")
        return result.reason or "failed"
    if result.status == "completed":
        printer.line("=> completed: the model answered without the slow tool; nothing to stop")
    else:
        printer.line(f"=> {result.status.value}: {result.reason}")

    printer.heading("")
    printer.heading("== 3. A tree of agents: three researchers in parallel, one branch stopped ==")
    reason = await _tree_section(model, session, printer)
    if reason is not None:
        return reason

    printer.heading("")
    printer.heading("== 4. The conversation the session holds (valid model input) ==")
    for item in await session.get_items():
        printer.line(describe_item(item))
    return None


async def _watch_tree(run: Run, printer: Printer, branch_busy: trio.Event) -> None:
    """Print the tree's events, each child's prefixed with its agent. ``branch_busy`` is
    set once the last researcher has read a few pages, or when the run ends."""
    names: dict[str, str] = {}
    try:
        async for event in run.events(tree=True):
            if isinstance(event, RunChild):
                names[event.child_id] = event.agent
            if event.run_id == run.id:
                printer.event(event)
                continue
            line = event_line(event)
            if line is not None:
                printer.line(f"  <{names.get(event.run_id, event.run_id)}> {line}")
            if (
                isinstance(event, ToolProgress)
                and names.get(event.run_id) == f"researcher-{ANGLES[-1]}"
                and event.data.get("page") == PROGRESS_PAGE
            ):
                branch_busy.set()
    finally:
        branch_busy.set()


async def _tree_section(model: Model, session: Session, printer: Printer) -> str | None:
    branch_busy = trio.Event()
    async with (
        open_run(lead_agent(model), "Research structured concurrency", session=session) as run,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(_watch_tree, run, printer, branch_busy)
        await branch_busy.wait()  # set by the branch's progress, or when the run ends
        branch = next((c for c in run.children if c.agent.name == f"researcher-{ANGLES[-1]}"), None)
        if branch is not None and branch.result is None:
            printer.line(f"(stopping one branch: run.find({branch.id!r}).cancel(...))")
            branch.cancel("branch not needed")
    result = await run.wait()
    if result.status == "failed":
        printer.line(f"=> failed: {result.reason}")
        return result.reason or "failed"
    printer.line(f"=> lead {result.status.value}; its sub-agents:")
    for child in run.children:
        assert child.result is not None
        why = f": {child.result.reason}" if child.result.reason else ""
        printer.line(f"   {child.agent.name} {child.result.status.value}{why}")
    return None


def _resolve(args: argparse.Namespace) -> Model:
    if args.model == "demo":
        return DemoModel(delay=args.delay)
    try:
        return model_from_string(args.model)
    except ValueError as exc:
        raise CLIError(f"--model: {exc}", status=EXIT_USAGE) from None


def _key_problem(model: Model, environ: Mapping[str, str]) -> str | None:
    """A remote model at its provider's own URL needs its key in the environment."""
    if isinstance(model, OpenAIChatModel) and model.base_url == OPENAI_BASE_URL:
        variable, spec = "OPENAI_API_KEY", f"openai:{model.model}"
    elif isinstance(model, AnthropicModel) and model.base_url == ANTHROPIC_BASE_URL:
        variable, spec = "ANTHROPIC_API_KEY", f"anthropic:{model.model}"
    else:
        return None
    if environ.get(variable):
        return None
    return (
        f"--model {spec} needs an API key: set ${variable}"
        " (or use a local OpenAI-compatible server: --model openai:NAME@http://127.0.0.1:11434/v1,"
        " or the offline default: --model demo)"
    )


async def check_remote_model(model: Model) -> None:
    """Check up front that a remote model's server answers and takes the key.

    Sends ``GET {base_url}/models`` (OpenAI-compatible servers, Anthropic's
    ``/v1/models``) within :data:`PREFLIGHT_TIMEOUT`. Raises :class:`CLIError` when the
    server cannot be reached or refuses the key (401/403); any other answer counts
    as reachable. Other models are not checked.
    """
    if isinstance(model, OpenAIChatModel):
        url, variable = f"{model.base_url}/models", "OPENAI_API_KEY"
        key = os.environ.get(variable)
        headers = {"authorization": f"Bearer {key}"} if key else {}
    elif isinstance(model, AnthropicModel):
        url, variable = f"{model.base_url}/v1/models", "ANTHROPIC_API_KEY"
        key = os.environ.get(variable)
        headers = {"anthropic-version": ANTHROPIC_API_VERSION}
        if key:
            headers["x-api-key"] = key
    else:
        await trio.lowlevel.checkpoint()
        return
    timeout = httpx.Timeout(PREFLIGHT_TIMEOUT)
    with trio.move_on_after(PREFLIGHT_TIMEOUT) as deadline:
        async with httpx.AsyncClient(timeout=timeout) as client:
            try:
                response = await client.get(url, headers=headers)
            except httpx.HTTPError as exc:
                detail = str(exc) or type(exc).__name__
                raise CLIError(
                    f"cannot reach the model server at {model.base_url}: {detail}"
                ) from None
    if deadline.cancelled_caught:
        raise CLIError(
            f"the model server at {model.base_url} did not answer within {PREFLIGHT_TIMEOUT:g} s"
        )
    if response.status_code in (401, 403):
        sent = f"the key in ${variable}" if key else f"no API key (${variable} is not set)"
        raise CLIError(
            f"the model server at {model.base_url} refused {sent}"
            f" (HTTP {response.status_code} from GET {url})"
        )


def demo_command(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``trio-agents demo``."""
    model = _resolve(args)
    problem = _key_problem(model, os.environ)
    if problem is not None:
        raise CLIError(problem)
    if args.model == "demo":
        out.write("trio_agents demo — offline, on the labelled DemoModel (not an LLM)\n")
    else:
        trio.run(check_remote_model, model)
        out.write(f"trio_agents demo — on {args.model}\n")
    with tempfile.TemporaryDirectory(prefix="trio-agents-demo-") as scratch:
        path = args.db or os.path.join(scratch, "demo.sqlite3")
        out.write(f"session: SQLite file {path}\n\n")
        out.flush()

        async def tour() -> str | None:
            from ..sessions import SQLiteSession

            try:
                session = SQLiteSession(path, "demo")
                await session.__aenter__()
            except (OSError, sqlite3.Error, SessionStorageError) as exc:
                raise CLIError(f"cannot open the session database {path}: {exc}") from None
            try:
                return await run_demo(model, session, out)
            finally:
                with trio.CancelScope(shield=True):
                    await session.aclose()

        reason = trio.run(tour)
    if reason is not None:
        raise CLIError(f"the demo stopped: a run failed: {reason}")
    return 0
