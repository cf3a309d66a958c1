"""Testing your agent with the lifecycle harness (``trio_agents.testing``).

Three steps, each something you would put in your own test suite:

1. Run one hand-written schedule — a script for the model, operations at virtual
   times — and check every lifecycle invariant with ``check_run``.
2. Let Hypothesis search scripts and schedules for a broken invariant
   (``LifecycleProperty.run``, what a test would call). The tool below returns from a
   ``finally`` block, which swallows ``trio.Cancelled``: a cancelled run would record a
   normal result for a call that was stopped. The harness finds it and shrinks it to
   one model turn and one cancel; the violation is an ``AssertionError``.
3. Check the fixed tool the same way: no violation.

Everything runs on ``trio.testing.MockClock(autojump_threshold=0)``: the tools'
sleeps cost no real time, and each example replays exactly.
Needs the ``testing`` extra: ``pip install 'trio-agents[testing]'``.

Run: ``python examples/testing_with_harness.py`` (offline, a few seconds).
"""

from __future__ import annotations

import hypothesis
import trio

import trio_agents as ta
from trio_agents.testing import (
    LifecycleProperty,
    LifecycleViolation,
    Op,
    Turn,
    check_run,
    run_schedule,
    schedules,
    scripts,
)

# What a test suite would register as a profile: seeded, no timing-based checks.
SETTINGS = hypothesis.settings(
    max_examples=600,
    derandomize=True,  # the same examples every time
    database=None,
    deadline=None,
    verbosity=hypothesis.Verbosity.quiet,  # the violation below says it all
    # generate and shrink; Hypothesis' "explain" phase (it re-runs variants of the
    # shrunk example to annotate it) is slow here and adds nothing to the violation
    phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate, hypothesis.Phase.shrink],
)


@ta.function_tool
async def summarize(url: str) -> str:
    """Summarize a web page, section by section."""
    sections: list[str] = []
    try:
        for number in range(3):
            await trio.sleep(0.5)  # fetch and summarize one section
            sections.append(f"section {number} of {url}")
    finally:
        return "; ".join(sections) or "nothing yet"  # noqa: B012 - the bug this example finds


@ta.function_tool(name="summarize")
async def fixed_summarize(url: str) -> str:
    """Summarize a web page, section by section."""
    sections: list[str] = []
    for number in range(3):
        await trio.sleep(0.5)
        sections.append(f"section {number} of {url}")
    return "; ".join(sections)


def agent_with(tool: ta.Tool) -> LifecycleProperty:
    """The property of an agent built around the harness's model, with ``tool``."""
    return LifecycleProperty(
        lambda model: ta.Agent(name="reader", model=model, tools=[tool]),
        script_strategy=scripts([tool], max_turns=2),
        schedule_strategy=schedules(kinds=["cancel", "inject", "subscribe"], max_ops=3),
    )


def main() -> None:
    # 1. One schedule by hand: the model calls the tool, the user injects a message
    #    at t=0.25 and cancels at t=0.75 (virtual seconds), mid-call.
    observation = run_schedule(
        lambda model: ta.Agent(name="reader", model=model, tools=[fixed_summarize]),
        [Turn(tool_calls=[("summarize", {"url": "https://example.org"})]), "Here it is."],
        [Op(0.25, "inject", when="next_turn"), Op(0.75, "cancel", reason="user pressed stop")],
    )
    report = check_run(observation)
    assert report.ok, report
    result = observation.result
    print(f"1. by hand: {result.status.value} ({result.reason}); every invariant holds")
    print(f"   last item: {result.conversation[-1]}")
    print(f"   unconsumed injection: {[str(item) for item in result.unconsumed]}")

    # 2. Let the harness search: it finds the swallowed cancellation, shrunk.
    try:
        agent_with(summarize).run(SETTINGS)
    except LifecycleViolation as violation:
        print("2. search, with the buggy tool:")
        print("   " + str(violation).replace("\n", "\n   "))
    else:
        raise AssertionError("the harness should have found the swallowed cancellation")

    # 3. The fixed tool passes the same search.
    agent_with(fixed_summarize).run(hypothesis.settings(SETTINGS, max_examples=100))
    print("3. search, with the fixed tool: no violation in 100 examples")


if __name__ == "__main__":
    main()
