"""Drive a run over the websocket control channel: start, stream, inject, cancel.

A :class:`~trio_agents.control.ControlServer` and its client in one ``trio.run``: the
server listens on a free loopback port, the client connects with
``trio_agents.control.connect`` and uses the same verbs as a local run — as
coroutines, since each is a request and its answer. The run lives in the server: the
client starts it, watches its events, steers it, and finally cancels it while its slow
tool is still working; the server cancels the tool, repairs the conversation and
persists the session before the terminal ``cancelled`` event reaches the client.

Run: ``python examples/control_client.py`` (offline, on the DemoModel).
"""

from __future__ import annotations

import trio

import trio_agents as ta
from trio_agents.control import ControlServer, connect


@ta.function_tool
async def search_archive(ctx: ta.ToolContext, query: str) -> str:
    """Search the archive, page by page (slow)."""
    for page in range(1, 201):
        await trio.sleep(0.05)
        ctx.progress(f"page {page}", page=page)
    return f"nothing found for {query!r}"


TOKEN = "example-token"
server = ControlServer(
    {"archivist": ta.Agent(name="archivist", tools=[search_archive])},  # DemoModel
    auth={TOKEN: "alice"},  # bearer token -> principal
    sessions=None,  # in memory; a path keeps them in a SQLite file
)


async def client(url: str) -> None:
    async with connect(url, token=TOKEN) as remote:
        run = await remote.start("archivist", "Search the archive for trio", session_id="s1")
        print(f"[client] started {run.id}")
        async for event in run.events():
            if isinstance(event, ta.RunUpdated):
                print(f"[client] status {event.status.value} {event.reason or ''}".rstrip())
            elif isinstance(event, ta.ToolStarted):
                print(f"[client] tool {event.name} started")
            elif isinstance(event, ta.ToolProgress):
                print(f"[client] progress: {event.message}")
                if event.data.get("page") == 1:
                    injection = await run.inject("Only the last year, please.")
                    print(f"[client] injected {injection} (for the next turn)")
                elif event.data.get("page") == 3:
                    print("[client] cancelling")
                    await run.cancel("user pressed stop")
            elif isinstance(event, ta.ToolFinished):
                print(f"[client] tool {event.name} {event.status}: {event.output}")
            elif isinstance(event, ta.InboxInjected):
                print(f"[client] the server accepted {event.injection_id}")
        info = await run.get()  # what the server reports about the run
        print(f"[client] server says: {info.status.value} ({info.reason}), last seq {info.seq}")
        runs = await remote.list_runs()  # every run of this principal
        print(f"[client] my runs: {[r.run_id for r in runs]}")


async def main() -> None:
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, "127.0.0.1", 0)  # 0: any free port
        print(f"[server] listening on ws://127.0.0.1:{port}/")
        await client(f"ws://127.0.0.1:{port}/")
        nursery.cancel_scope.cancel()  # graceful shutdown: runs cancelled, sockets closed
    print("[server] stopped")


if __name__ == "__main__":
    trio.run(main)
