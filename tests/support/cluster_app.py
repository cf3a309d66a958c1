"""The agents the cluster tests serve: ``trio-agents serve --app tests.support.cluster_app:app``.

Every node process of a test cluster imports this module. What a run does is decided
by its last user message that is not an injection (a *scenario*: space-separated
words; injections start with ``note``), so that whichever
node continues a run after a takeover makes the same decisions from the persisted
conversation alone — the model keeps no state of its own:

- ``charge``: call the non-idempotent tool ``charge`` (records each execution, then
  blocks until its gate is opened); ``lookup``: the same with the idempotent
  ``lookup``; ``delete``: call ``delete``, which needs approval. Several words: one
  turn calling each of those tools, in parallel.
- ``stream``: stream ``alpha``, ``beta``, then block until the ``stream`` gate is
  opened, then ``gamma`` and finish (no tool).
- ``hold stream``: the same, but the first delta waits for the ``hold`` gate.
- ``unique``: the call ids end with ``_TAG`` (several runs calling tools in one
  session; otherwise a run's ids are ``call_NAME_N``, the same in every run).
- a word ``#TAG``: the run's tag. The model does not know the run's id, so its gate
  and its records use the tag (``gates/stream.TAG``).
- ``delegate``: call the ``helper`` sub-agent (``as_tool``) with the rest of the
  scenario as its input: a run tree whose child run does the rest.
- anything else: answer at once.

After the tool results are in, the model answers ``done`` plus each result of this
run, and the number of user messages it has seen (the session's earlier runs and
injections included).

Cross-process control and observation go through a directory named by the
``CLUSTER_TEST_DIR`` environment variable (the node's id is in ``CLUSTER_NODE``):

- ``executions.log``: one JSON line per tool execution start (``tool``, ``run_id``,
  ``call_id``, ``node``, ``pid``) and per model stream opened (``tool: "model"``, the
  run's tag in ``run_id``),
  appended with one ``write`` (atomic for lines this short), so a ``kill -9`` right
  after never loses an execution that happened.
- ``gates/NAME`` or ``gates/NAME.KEY``: a gate is open once that file exists (for
  every run, or for one run: KEY is the run's id for a tool, its tag for the model). Tools and the model poll for their gate; a test opens it
  with :func:`open_gate`.
- ``freeze-in-flush.NODE``: once that file exists, node NODE freezes itself
  (``SIGSTOP``) in its next flush of run events, after the flush's statements and
  before its commit: its transaction holds the runs' row locks, idle, as a node paused
  mid-flush would (a paused VM, a partition that leaves its socket open). The file is
  removed and a ``freeze`` record (the flushed run ids) written first; the test sends
  ``SIGCONT`` (:func:`freeze_in_next_flush`).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Final, final

import trio

import trio_agents as ta
from tests.support.faces_streams import EventStream
from trio_agents.models import Finish, ModelEvent, ModelRequest, TextDelta, ToolCallDone, Usage

__all__ = [
    "ClusterModel",
    "app",
    "execution_records",
    "freeze_in_next_flush",
    "gate_is_open",
    "open_gate",
]

DIR_ENV: Final = "CLUSTER_TEST_DIR"
NODE_ENV: Final = "CLUSTER_NODE"
_POLL: Final = 0.01  # seconds between looks at a gate file (inside the node only)
TOOLS: Final = ("charge", "lookup", "delete")
INJECTED: Final = "note"
"""Injected user messages start with this word; they are not a scenario."""


def _directory() -> Path:
    return Path(os.environ.get(DIR_ENV, "."))


def record(tool: str, run_id: str, call_id: str, directory: Path | None = None) -> None:
    """Append one execution record (one ``os.write`` of one line, ``O_APPEND``)."""
    line = json.dumps(
        {
            "tool": tool,
            "run_id": run_id,
            "call_id": call_id,
            "node": os.environ.get(NODE_ENV, "?"),
            "pid": os.getpid(),
        }
    )
    path = (directory or _directory()) / "executions.log"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def execution_records(directory: Path) -> list[dict[str, Any]]:
    """Every record written so far (for the tests)."""
    try:
        text = (directory / "executions.log").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def gate_is_open(name: str, key: str, directory: Path | None = None) -> bool:
    gates = (directory or _directory()) / "gates"
    return (gates / name).exists() or (gates / f"{name}.{key}").exists()


def open_gate(directory: Path, name: str, key: str | None = None) -> None:
    """Open gate ``name`` for every run, or for one (``key``: a run id for a tool's
    gate, a tag for the model's)."""
    gates = directory / "gates"
    gates.mkdir(exist_ok=True)
    (gates / (name if key is None else f"{name}.{key}")).touch()


async def wait_gate(name: str, key: str) -> None:
    """Poll until the gate is open (cancellable at every poll)."""
    while True:
        if gate_is_open(name, key):
            return
        await trio.sleep(_POLL)


# ------------------------------------------------------------------------- tools


@ta.function_tool
async def charge(ctx: ta.ToolContext) -> str:
    """Charge a card: never to be executed twice (not idempotent)."""
    record("charge", ctx.run_id, ctx.call_id)
    await wait_gate("charge", ctx.run_id)
    return "charged"


@ta.function_tool(idempotent=True)
async def lookup(ctx: ta.ToolContext) -> str:
    """Look something up: safe to run again."""
    record("lookup", ctx.run_id, ctx.call_id)
    await wait_gate("lookup", ctx.run_id)
    return "looked up"


@ta.function_tool(needs_approval=True)
async def delete(ctx: ta.ToolContext) -> str:
    """Delete something, once a person approved it."""
    record("delete", ctx.run_id, ctx.call_id)
    return "deleted"


# ------------------------------------------------------------------------- model


def _split(items: Sequence[ta.Item]) -> tuple[list[str], list[ta.Item]]:
    """The scenario (the words of the last user message that is not an injection,
    ``note ...``) and the items after it (this run's, the session's earlier runs
    before it)."""
    for index in range(len(items) - 1, -1, -1):
        item = items[index]
        if isinstance(item, ta.UserMessage) and not item.content.startswith(INJECTED):
            return item.content.split(), list(items[index + 1 :])
    return [], list(items)


@final
class _Steps:
    """The events of one model response; an iterator class (no async generator)."""

    def __init__(self, key: str, events: Sequence[ModelEvent | str]) -> None:
        self._key = key
        self._events = list(events)
        self._position = 0

    def __aiter__(self) -> _Steps:
        return self

    async def __anext__(self) -> ModelEvent:
        while self._position < len(self._events):
            step = self._events[self._position]
            if isinstance(step, str):  # a gate to wait for
                record(f"gate-{step}", self._key, "", None)  # the model reached it
                await wait_gate(step, self._key)
                self._position += 1
                continue
            await trio.lowlevel.checkpoint()
            self._position += 1
            return step
        raise StopAsyncIteration


@final
class ClusterModel:
    """A model whose answer is a function of the conversation (see the module doc)."""

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        scenario, tail = _split(request.items)
        tag = next((word[1:] for word in scenario if word.startswith("#")), "")
        record("model", tag, "", None)
        results = [item for item in tail if isinstance(item, ta.ToolResult)]
        calls = [item for item in tail if isinstance(item, ta.ToolCall)]
        users = sum(isinstance(item, ta.UserMessage) for item in request.items)
        events: list[ModelEvent | str] = []
        wanted = [word for word in scenario if word in TOOLS]
        # "unique": call ids carry the tag (several runs' calls in one session).
        suffix = f"_{tag}" if "unique" in scenario else ""
        if "delegate" in scenario and not calls:
            # A run tree: the rest of the scenario is a child run's (an as_tool call).
            rest = " ".join(word for word in scenario if word != "delegate")
            arguments = json.dumps({"input": rest})
            events += [ToolCallDone(ta.ToolCall("call_helper_1", "helper", arguments))]
            events += [Usage(1, 1), Finish("tool_calls")]
        elif wanted and not calls:
            for number, name in enumerate(wanted, 1):
                call_id = f"call_{name}_{number}{suffix}"
                events.append(ToolCallDone(ta.ToolCall(call_id, name, "{}")))
            events += [Usage(1, 1), Finish("tool_calls")]
        elif "stream" in scenario and not calls:
            if "hold" in scenario:  # the first delta waits for the "hold" gate
                events.append("hold")
            events += [TextDelta("alpha "), TextDelta("beta "), "stream", TextDelta("gamma")]
            events += [Usage(1, 1), Finish("stop")]
        else:
            # In the order of the calls: results come in the order tools finish.
            outputs = {result.call_id: result.output for result in results}
            parts = [f"{c.name}={outputs[c.call_id]}" for c in calls if c.call_id in outputs]
            events += [TextDelta(" ".join(["done", *parts, f"users={users}"]))]
            events += [Usage(1, 1), Finish("stop")]
        return EventStream(_Steps(tag, events))


def app() -> dict[str, ta.Agent]:
    """The agents every node serves. ``worker`` can also delegate (the scenario word
    ``delegate``) to a ``helper`` sub-agent: a run tree whose child does the rest of
    the scenario."""
    helper = ta.Agent(
        name="helper",
        instructions="Do what the first message says.",
        model=ClusterModel(),
        tools=[charge, lookup, delete],
    )
    return {
        "worker": ta.Agent(
            name="worker",
            instructions="Do what the first message says.",
            model=ClusterModel(),
            tools=[charge, lookup, delete, helper.as_tool()],
        )
    }


# ------------------------------------------------------------------ a frozen node


def freeze_in_next_flush(directory: Path, node: str) -> None:
    """Make ``node`` freeze itself inside its next flush (see the module doc)."""
    (directory / f"freeze-in-flush.{node}").touch()


def _install_freeze_in_flush() -> None:
    """Wrap the node's flush statements (fault injection for the frozen-node tests;
    inert while no ``freeze-in-flush.NODE`` file exists)."""
    from trio_agents.cluster._eventlog import EventWriter

    write = EventWriter._write

    def frozen_write(self: EventWriter, conn: Any, events: Any, rows: Any, *args: Any) -> Any:
        lost = write(self, conn, events, rows, *args)
        trigger = _directory() / f"freeze-in-flush.{os.environ.get(NODE_ENV, '?')}"
        written = [run_id for run_id in rows if run_id not in lost]
        if written and trigger.exists():
            trigger.unlink()
            record("freeze", ",".join(written), "")
            os.kill(os.getpid(), signal.SIGSTOP)  # the transaction stays open, idle
        return lost

    EventWriter._write = frozen_write  # type: ignore[method-assign,assignment]


if os.environ.get(DIR_ENV):  # a node process of a test cluster
    _install_freeze_in_flush()
