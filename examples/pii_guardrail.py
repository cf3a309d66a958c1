"""A streaming guardrail that cuts an answer before a leak is published.

The (scripted, offline) model is about to stream a phone number. The streaming output
guardrail sees the text as it streams and holds each delta until it has passed the text
holding it: subscribers get "Bob's number is " and nothing after it; the run ends
``failed`` with the guardrail's reason, and the session keeps only what was released.

Run: ``python examples/pii_guardrail.py`` (offline).
"""

from __future__ import annotations

import re

import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn

# Three digits in a row: the start of a number is already too much.
PHONE = re.compile(r"\d{3}")


@ta.output_guardrail(stream=True)
async def no_phone_numbers(run: ta.Run, text: str) -> ta.GuardrailResult:
    """Trip on anything that looks like a phone number."""
    found = PHONE.search(text)
    return ta.GuardrailResult(found is not None, info="a phone number in the answer")


model = ScriptedModel(
    [Turn(["Bob's ", "number ", "is ", "555-", "0199, ", "call ", "him."], delay=0.05)]
)
agent = ta.Agent(name="assistant", model=model, output_guardrails=[no_phone_numbers])


async def main() -> None:
    session = ta.sessions.MemorySession("pii-demo")
    async with ta.open_run(agent, "What is Bob's number?", session=session) as run:
        async for event in run.events():
            if isinstance(event, ta.ResponseTextDelta):
                print(f"published: {event.text!r}")
    result = run.result
    assert result is not None
    print(f"=> {result.status}: {result.reason}")
    stored = await session.get_items()
    print("stored:", stored)
    assert result.status == "failed"
    assert isinstance(result.error, ta.GuardrailTripped)
    assert not any(PHONE.search(str(item)) for item in stored)


if __name__ == "__main__":
    trio.run(main)
