"""Steering a running run with ``inject``: a correction and a follow-up question.

``when="next_turn"`` items enter the conversation before the next model call (never
between a tool call and its result); ``when="when_idle"`` items wait for the final
answer and then start one more turn. Nothing injected is lost: what no turn consumed
is in ``result.unconsumed``.

Run: ``python examples/steering.py`` (offline, on the DemoModel).
"""

from __future__ import annotations

import trio

import trio_agents as ta


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    await trio.sleep(0.1)
    return a + b


agent = ta.Agent(name="calc", tools=[add])


async def main() -> None:
    steered = False
    async with ta.open_run(agent, "What is 2 + 3?") as run:
        async for event in run.events():
            if isinstance(event, ta.ToolStarted) and not steered:
                steered = True  # steer once, while the first tool call runs
                steer = run.inject("Please answer in one sentence.")
                follow = run.inject("And what is 10 + 20?", when="when_idle")
                print(f"injected {steer} (next_turn) and {follow} (when_idle)")
            elif isinstance(event, ta.InboxDelivered):
                print(f"delivered {event.injection_id} into turn {event.turn}")
            elif isinstance(event, ta.RunUpdated) and event.status.is_terminal:
                print(f"run {event.status.value} after {event.turn} model turns")
    result = run.result
    assert result is not None
    for item in result.new_items:
        print(f"  {item}")
    print(f"unconsumed: {list(result.unconsumed)}")


if __name__ == "__main__":
    trio.run(main)
