"""Structured output: ``Agent(output_type=...)`` makes the final answer a typed value.

The agent looks the weather up with a tool, then answers with a ``Forecast``: the model
is asked for JSON matching the class (natively on the OpenAI providers, through a
``final_answer`` tool elsewhere), the answer is validated (an invalid one goes back to
the model, at most ``output_retries`` times) and ``result.final_output`` is a
``Forecast``. A run that is cancelled while it answers keeps a valid conversation.

Run: ``python examples/structured_output.py`` (offline, on the DemoModel; pass
``model="openai:gpt-4o-mini"`` to the Agent for a real one).
"""

from __future__ import annotations

import dataclasses

import trio

import trio_agents as ta


@dataclasses.dataclass
class Forecast:
    """A weather forecast for one city."""

    city: str
    celsius: float
    summary: str = ""


@ta.function_tool
async def weather(city: str) -> str:
    """Look up the current weather of a city."""
    await trio.sleep(0.05)
    return f"{city}: 21 degrees, sunny"


agent = ta.Agent(
    name="forecaster",
    instructions="Look the weather up, then answer with a forecast.",
    tools=[weather],
    output_type=Forecast,
)


async def main() -> None:
    result = await ta.run(agent, "What is the weather in Paris?")
    forecast: Forecast = result.final_output
    print(f"{result.status}: {forecast!r}")
    for item in result.new_items:
        print("  ", item)

    # Cancelled mid-run: no final output, and the conversation is still valid input.
    async with ta.open_run(agent, "And in Rome?") as run:
        await trio.sleep(0.03)
        run.cancel("changed my mind")
    assert run.result is not None
    print(f"{run.result.status} ({run.result.reason}): final_output={run.result.final_output}")
    assert ta.conversation_problems(run.result.conversation) == []


if __name__ == "__main__":
    trio.run(main)
