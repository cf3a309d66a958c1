"""What the run-core tests share: tools that fail or outlast any test, and a hook that
holds a run at its first model call."""

from __future__ import annotations

import trio
import trio.testing

import trio_agents as ta


def raising_tool(name: str, error: type[BaseException], *args: object) -> ta.Tool:
    """A tool called ``name`` whose every call raises a new ``error(*args)``."""

    async def fail() -> str:
        raise error(*args)

    return ta.function_tool(fail, name=name, description=f"Raise {error.__name__}.")


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
