"""Run the benchmarks and print one line of JSON per figure."""

from __future__ import annotations

import json
import statistics
import time

import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn


async def channel_hop(n: int) -> float:
    """Seconds per send+receive over a bare memory channel (the baseline)."""
    send, receive = trio.open_memory_channel[int](1)
    start = time.perf_counter()
    async with send, receive:
        for i in range(n):
            await send.send(i)
            await receive.receive()
    return (time.perf_counter() - start) / n


async def stream_overhead(deltas: int) -> float:
    """B1: seconds per streamed delta for one run with one ``events()`` subscriber."""
    model = ScriptedModel([Turn(text=["x"] * deltas)])
    agent = ta.Agent(name="b1", model=model)
    start = time.perf_counter()
    async with ta.open_run(agent, "go") as run:
        async for _ in run.events():
            pass
    return (time.perf_counter() - start) / deltas


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def tool_turn(runs: int) -> float:
    """B2: seconds per 2-turn run (a tool call to ``add``, then the answer)."""
    total = 0.0
    for _ in range(runs):
        model = ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])
        agent = ta.Agent(name="b2", model=model, tools=[add])
        start = time.perf_counter()
        await ta.run(agent, "1 + 2?")
        total += time.perf_counter() - start
    return total / runs


async def main() -> None:
    hop = statistics.median([await channel_hop(20_000) for _ in range(5)])
    print(json.dumps({"bench": "baseline.channel_hop", "us": round(hop * 1e6, 3)}))
    b1 = statistics.median([await stream_overhead(2000) for _ in range(5)])
    print(
        json.dumps(
            {"bench": "B1.stream_per_delta", "us": round(b1 * 1e6, 3), "ratio": round(b1 / hop, 2)}
        )
    )
    b2 = statistics.median([await tool_turn(200) for _ in range(3)])
    print(
        json.dumps(
            {"bench": "B2.tool_turn_per_run", "ms": round(b2 * 1e3, 4), "ratio": round(b2 / hop, 1)}
        )
    )


if __name__ == "__main__":
    trio.run(main)
