"""A Trio app that embeds runs, with a "stop" button wired to another thread.

The button lives in a plain thread (as a GUI toolkit's or a web server's would) and
calls ``run.cancel()`` directly: it is sync, thread-safe and never blocks. The slow
tool is a sync function in a worker thread; it sees ``ctx.cancelled`` and the run does
not wait for it.

Run: ``python examples/cancel_button.py`` (offline, on the DemoModel).
"""

from __future__ import annotations

import threading
import time

import trio

import trio_agents as ta


@ta.function_tool
def search_archive(ctx: ta.ToolContext, query: str) -> str:
    """Search the archive, page by page (slow, in a worker thread)."""
    for page in range(1, 1001):
        if ctx.cancelled.wait(0.05):  # stop as soon as the run is cancelled
            return "stopped early"
        ctx.progress(f"page {page}", page=page)
    return f"nothing found for {query!r}"


agent = ta.Agent(name="archivist", tools=[search_archive])  # DemoModel by default


def stop_button(run: ta.Run, pressed: threading.Event) -> None:
    """The UI thread: the user presses stop a moment after the search starts."""
    pressed.wait()
    time.sleep(0.2)
    print("[ui] stop pressed")
    run.cancel("user pressed stop")


async def main() -> None:
    pressed = threading.Event()
    async with ta.open_run(agent, "Search the archive for trio") as run:
        ui = threading.Thread(target=stop_button, args=(run, pressed), daemon=True)
        ui.start()
        async for event in run.events():
            if isinstance(event, ta.ToolProgress):
                print(f"[run] {event.name}: {event.message}")
                pressed.set()
            elif isinstance(event, ta.RunUpdated):
                print(f"[run] status {event.status.value} {event.reason or ''}")
    result = run.result
    assert result is not None
    print(f"ended {result.status.value}: {result.reason}")
    print(f"last item: {result.conversation[-1]}")


if __name__ == "__main__":
    trio.run(main)
