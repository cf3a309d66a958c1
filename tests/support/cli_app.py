"""Agents for ``trio-agents serve --app tests.support.cli_app:AGENTS`` in the CLI tests."""

from __future__ import annotations

import gc

import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn


@ta.function_tool
async def wait_forever() -> str:
    """Wait until the run is cancelled."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def blocker() -> ta.Agent:
    """An agent whose every turn calls a tool that never returns."""
    model = ScriptedModel([], default=Turn(tool_calls=[("wait_forever", {})]))
    return ta.Agent(name="blocker", model=model, tools=[wait_forever])


AGENTS = {"blocker": blocker()}


@ta.function_tool
def frozen_objects() -> str:
    """How many objects the server process has moved out of the collector's passes."""
    return str(gc.get_freeze_count())


# One run per server (a ScriptedModel's script is used up by it): its tool.finished
# says what `serve` froze at start-up.
GC_PROBE = {
    "gc": ta.Agent(
        name="gc",
        model=ScriptedModel([Turn(tool_calls=[("frozen_objects", {})]), "counted"]),
        tools=[frozen_objects],
    )
}

NOT_AGENTS = {"blocker": "not an agent"}


def broken_factory() -> dict[str, ta.Agent]:
    """A factory that fails, as a user's might."""
    raise RuntimeError("the config file is missing")
