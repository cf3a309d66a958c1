"""A tree of agents: a lead fans out to three researcher sub-agents; the user stops one
branch, then the whole tree — from a UI thread.

The lead's ``research`` tool starts three child runs with ``ctx.open_run`` (parallel
branches). A plain thread stands in for a UI: once every branch is reading, it cancels
one branch (``run.find(id).cancel(...)``: that subtree only, the lead goes on), then a
moment later the whole tree (``run.cancel(...)``: every descendant ends ``cancelled`` /
``"parent cancelled"``, bottom-up, before the root's terminal update).

Run: ``python examples/research_tree.py`` (offline, on the DemoModel).
"""

from __future__ import annotations

import threading
import time

import trio

import trio_agents as ta


@ta.function_tool
async def read_sources(ctx: ta.ToolContext, topic: str) -> str:
    """Read the sources on a topic, page by page (slow).

    Args:
        topic: what to read about.
    """
    for page in range(1, 1001):
        await trio.sleep(0.02)
        ctx.progress(f"page {page}", page=page)
    return f"1000 pages on {topic}"


ANGLES = ("history", "practice", "pitfalls")
RESEARCHERS = {
    angle: ta.Agent(name=f"researcher-{angle}", tools=[read_sources]) for angle in ANGLES
}


@ta.function_tool
async def research(ctx: ta.ToolContext, topic: str) -> str:
    """Ask three researchers about a topic, in parallel.

    Args:
        topic: the topic.
    """
    findings: dict[str, str] = {}

    async def ask(angle: str) -> None:
        async with ctx.open_run(RESEARCHERS[angle], f"{topic}: {angle}") as child:
            pass
        result = child.result
        assert result is not None  # the block waited for the child to end
        findings[angle] = f"{result.status}: {result.reason}"

    async with trio.open_nursery() as nursery:
        for angle in ANGLES:
            nursery.start_soon(ask, angle)
    return "; ".join(f"{angle}: {findings[angle]}" for angle in ANGLES)


lead = ta.Agent(name="lead", tools=[research])  # DemoModel by default


def ui(run: ta.Run, reading: threading.Event) -> None:
    """The UI thread: stop one branch, then everything."""
    reading.wait()
    branch = next((c for c in run.children if c.agent.name == "researcher-pitfalls"), None)
    if branch is not None:
        print(f"[ui] stop the pitfalls branch ({branch.id})")
        branch.cancel("branch not needed")
    time.sleep(0.3)
    print("[ui] stop everything")
    run.cancel("user pressed stop")


async def main() -> None:
    reading = threading.Event()
    async with ta.open_run(lead, "Research structured concurrency") as run:
        thread = threading.Thread(target=ui, args=(run, reading))
        thread.start()
        readers: set[str] = set()
        async for event in run.events(tree=True):
            if isinstance(event, ta.RunChild):
                print(f"  {event.agent}: {event.status}")
            elif isinstance(event, ta.ToolProgress) and event.run_id != run.id:
                readers.add(event.run_id)
                if len(readers) == len(ANGLES):
                    reading.set()
        reading.set()  # the run ended first: the UI thread must not wait forever
        await trio.to_thread.run_sync(thread.join)
    result = run.result
    assert result is not None
    print(f"lead: {result.status} ({result.reason})")
    for child in run.children:
        assert child.result is not None
        print(f"  {child.agent.name}: {child.result.status} ({child.result.reason})")
    assert result.status == "cancelled"
    assert {c.result.reason for c in run.children if c.result} == {
        "branch not needed",
        "parent cancelled",
    }


if __name__ == "__main__":
    trio.run(main)
