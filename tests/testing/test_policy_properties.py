"""Run policies (DESIGN §18) under the property harness: guardrail and limit faults.

Guardrails that trip (before, during and after the model's stream, at the same moment
as a chunk, the final answer or a tool finishing), pass slowly, raise, hang, return
garbage, raise a stray ``trio.Cancelled`` or swallow one; streaming guardrails that
trip on chosen text; usage limits small enough to be crossed mid-stream, deadlines with
and without ``wrap_up`` — all under random scripts and schedules, checked against every
lifecycle invariant and the policy ones (``check_policies``): above all, "no released
delta was later withheld, no withheld delta was published".

The seeded "ci" profile runs a few dozen examples per property; ``make fuzz`` runs
over 20,000 (seven times FUZZ_EXAMPLES).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.helpers import count_example
from tests.support.testing_profiles import profile_settings
from trio_agents.testing import (
    FakeTools,
    GuardrailPlan,
    Op,
    PolicyFaults,
    Turn,
    check_policies,
    guardrail_plans,
    policy_faults,
    run_policy_schedule,
    schedules,
    scripts,
    standard_tools,
    usage_limits,
)

TOOLS = standard_tools()
CLEANUP = 1.0


def _subset(*names: str) -> FakeTools:
    kept = tuple(tool for tool in TOOLS.tools if tool.name in names)
    return FakeTools(kept, TOOLS.recorder, {name: TOOLS.arguments[name] for name in names})


TOOLSET = _subset("block", "sleep", "fail", "slow")


def _observe(
    script: Sequence[Turn | str],
    schedule: Sequence[Op] = (),
    policies: PolicyFaults | None = None,
    *,
    max_turns: int = 4,
    tools: FakeTools = TOOLSET,
    session: bool = False,
) -> Any:
    def factory(model: ta.Model) -> ta.Agent:
        return ta.Agent(name="p", model=model, tools=list(tools.tools), max_turns=max_turns)

    return run_policy_schedule(
        factory,
        script,
        schedule,
        policies,
        recorder=tools.recorder,
        run_options={"cleanup_timeout": CLEANUP},
        horizon=200.0,
        session=session,
    )


def _check(
    script: Sequence[Turn | str],
    schedule: Sequence[Op],
    policies: PolicyFaults,
    max_turns: int = 4,
    *,
    session: bool = False,
) -> Any:
    count_example()
    observation = _observe(script, schedule, policies, max_turns=max_turns, session=session)
    check_policies(observation).raise_for_violations()
    return observation


# ------------------------------------------------------------------ fixed examples

ANSWER = [Turn(["a ", "b ", "dd ", "c "], delay=0.25)]  # chunks at t=0.25, 0.5, 0.75, 1.0
TOOL_THEN_ANSWER = [
    Turn(["a "], tool_calls=[("sleep", {"seconds": 0.5})], delay=0.25),  # tool ends t=1.0
    Turn(["c "], delay=0.25),
]


def _one(name: str, kind: Any, behaviour: Any = "pass", **kw: Any) -> PolicyFaults:
    return PolicyFaults((GuardrailPlan(name, kind, behaviour, **kw),))


EXAMPLES: dict[str, tuple[list[Turn], PolicyFaults, str | None]] = {
    # A stream guardrail trips on the third chunk: "a b " is published, "dd " never.
    "stream trips on text": (ANSWER, _one("pii", "stream", trip_on="dd"), "guardrail pii"),
    "stream passes slowly": (ANSWER, _one("slow", "stream", delay=0.5), None),
    "stream trips mid-stream": (
        ANSWER,
        _one("g", "stream", "trip", delay=0.125, call=2),
        "guardrail g",
    ),
    "stream raises": (ANSWER, _one("g", "stream", "raise", call=2), "guardrail g raised"),
    # A plain-function stream guardrail: checked in the stream loop as each chunk comes.
    "sync stream trips on text": (
        ANSWER,
        _one("pii", "stream", trip_on="dd", sync=True),
        "guardrail pii",
    ),
    "sync stream trips mid-stream": (
        ANSWER,
        _one("g", "stream", "trip", call=2, sync=True),
        "guardrail g",
    ),
    "sync stream raises": (
        ANSWER,
        _one("g", "stream", "raise", call=3, sync=True),
        "guardrail g raised",
    ),
    "sync stream garbage": (
        ANSWER,
        _one("g", "stream", "garbage", sync=True),
        "guardrail g raised",
    ),
    "sync stream passes": (TOOL_THEN_ANSWER, _one("g", "stream", sync=True), None),
    "stream stray cancel": (ANSWER, _one("g", "stream", "stray_cancel"), "guardrail g raised"),
    "stream swallows the cancel": (
        ANSWER,
        PolicyFaults(
            (GuardrailPlan("g", "stream", "swallow_cancel", delay=0.5),),
            ta.UsageLimits(output_tokens=1),
        ),
        "usage limit: output_tokens",
    ),
    # The input guardrail answers at t=1.0: the moment the final chunk arrives.
    "input trips with the final answer": (
        ANSWER,
        _one("g", "input", "trip", delay=1.0),
        "guardrail g",
    ),
    "input trips as the tool finishes": (
        TOOL_THEN_ANSWER,
        _one("g", "input", "trip", delay=1.0),
        "guardrail g",
    ),
    "input trips after the answer": (ANSWER, _one("g", "input", "trip", delay=3.0), "guardrail g"),
    "blocking input trips": (ANSWER, _one("g", "input", "trip", blocking=True), "guardrail g"),
    "input hangs": (ANSWER, _one("g", "input", "hang"), "harness horizon"),
    "input garbage": (ANSWER, _one("g", "input", "garbage", delay=0.5), "guardrail g raised"),
    "input swallows the cancel": (
        ANSWER,
        PolicyFaults(
            (GuardrailPlan("g", "input", "swallow_cancel"),), ta.UsageLimits(deadline=2.0)
        ),
        "timeout",
    ),
    # Found by the fuzz profile: the answer waits 2 s for a slow output guardrail, which
    # the lifecycle checker alone took for a slow cleanup.
    "output passes slowly": ([Turn(["a "])], _one("g", "output", delay=2.0), None),
    "output trips": (TOOL_THEN_ANSWER, _one("g", "output", "trip", delay=0.25), "guardrail g"),
    "requests limit": (
        TOOL_THEN_ANSWER,
        PolicyFaults(limits=ta.UsageLimits(requests=1)),
        "usage limit: requests 2/1",
    ),
    "tool_calls limit": (
        TOOL_THEN_ANSWER,
        PolicyFaults(limits=ta.UsageLimits(tool_calls=0)),
        "usage limit: tool_calls 1/0",
    ),
    "output tokens mid-stream": (
        ANSWER,
        PolicyFaults(limits=ta.UsageLimits(output_tokens=2)),
        "usage limit: output_tokens 3/2",
    ),
    "deadline mid-stream": (ANSWER, PolicyFaults(limits=ta.UsageLimits(deadline=0.625)), "timeout"),
    "deadline with wrap_up": (
        [Turn(["a "], tool_calls=[("sleep", {"seconds": 2.0})], delay=0.25), Turn("ok")],
        PolicyFaults(limits=ta.UsageLimits(deadline=1.5, wrap_up=1.0)),
        None,
    ),
}


def test_an_injected_assistant_message_is_not_the_gated_turn() -> None:
    """Found by the fuzz profile: what the user injects is no text the gate released."""
    injected = Op(0.0, "inject", when="next_turn", items=(ta.AssistantMessage("also this"),))
    _check([Turn()], (injected,), _one("g", "stream"), max_turns=1)


def test_a_request_interrupted_before_it_is_sent_is_not_counted() -> None:
    """Found by the fuzz profile (model_turn counted a request before its blocking input
    guardrail and the when="now" check). The blocking guardrail holds turn 1 until t=0.25; a when="now" injection at
    t=0.125 then interrupts it before its request is sent. Turn 2's request is the
    first one sent: ``requests=1`` allows it; the run completes."""
    inject = Op(0.125, "inject", when="now", items=(ta.UserMessage("also this"),))
    policies = PolicyFaults(
        (GuardrailPlan("g", "input", delay=0.25, blocking=True),), ta.UsageLimits(requests=1)
    )
    observation = _check([Turn("ok")], (inject,), policies, max_turns=2)
    assert observation.observation.result.status is ta.RunStatus.COMPLETED


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_one_policy_fault(name: str) -> None:
    script, policies, reason = EXAMPLES[name]
    observation = _check(script, (), policies)
    result = observation.observation.result
    if reason is None:
        assert result.status is ta.RunStatus.COMPLETED, result.reason
    else:
        assert result.status is not ta.RunStatus.COMPLETED
        assert (result.reason or "").startswith(reason), result.reason


def test_a_streaming_trip_publishes_only_what_passed() -> None:
    observation = _check(ANSWER, (), _one("pii", "stream", trip_on="dd"))
    published = [
        e.text for e in observation.observation.events if isinstance(e, ta.ResponseTextDelta)
    ]
    assert published == ["a ", "b "]
    assert isinstance(observation.observation.result.error, ta.GuardrailTripped)


def test_a_sync_streaming_trip_publishes_only_what_passed() -> None:
    observation = _check(ANSWER, (), _one("pii", "stream", trip_on="dd", sync=True))
    published = [
        e.text for e in observation.observation.events if isinstance(e, ta.ResponseTextDelta)
    ]
    assert published == ["a ", "b "]
    # one call per chunk, each with the text so far, the last the one that tripped
    assert [c.value for c in observation.guardrail_calls] == ["a ", "a b ", "a b dd "]
    assert isinstance(observation.observation.result.error, ta.GuardrailTripped)


def test_a_sync_guardrail_plan_cannot_wait() -> None:
    for bad in (
        {"behaviour": "hang"},
        {"behaviour": "stray_cancel"},
        {"delay": 0.5},
        {"kind": "input"},
    ):
        kw: dict[str, Any] = {"kind": "stream", **bad}
        with pytest.raises(ValueError, match="cannot wait"):
            GuardrailPlan("g", sync=True, **kw)


def test_the_checker_catches_a_gate_that_publishes_unchecked_text() -> None:
    """The gate invariants are not vacuous: drop the guardrail's record of the calls
    that passed, and the published deltas have no pass to stand on."""
    observation = _observe(ANSWER, (), _one("slow", "stream", delay=0.5))
    assert check_policies(observation).ok
    forged = attrs.evolve(
        observation, guardrail_calls=tuple(c for c in observation.guardrail_calls if c.number < 2)
    )
    assert "gate-passed" in check_policies(forged).invariants


def test_the_checker_catches_a_run_that_completes_past_a_trip() -> None:
    observation = _observe(ANSWER, (), _one("g", "input", "pass", delay=0.5))
    assert observation.observation.result.status is ta.RunStatus.COMPLETED
    call = observation.guardrail_calls[0]
    forged_call = attrs.evolve(call, outcome="tripped")
    forged = attrs.evolve(observation, guardrail_calls=(forged_call,))
    assert {"guardrail-trip", "guardrail-input-pending"} <= set(check_policies(forged).invariants)


# ------------------------------------------------------------------ properties


@profile_settings(ci=0.4, fuzz=2)
@given(
    script=scripts(TOOLSET, failures=False),
    schedule=schedules(max_ops=4),
    plans=guardrail_plans(kinds=("stream",)),
    max_turns=st.integers(1, 4),
)
def test_streaming_guardrails_gate_the_stream(
    script: list[Turn], schedule: tuple[Op, ...], plans: tuple[GuardrailPlan, ...], max_turns: int
) -> None:
    """No released delta was later withheld, no withheld delta was published."""
    _check(script, schedule, PolicyFaults(plans), max_turns)


@profile_settings(ci=0.4, fuzz=1.5)
@given(
    script=scripts(TOOLSET, failures=False),
    schedule=schedules(max_ops=4),
    plans=guardrail_plans(kinds=("input", "output")),
    max_turns=st.integers(1, 4),
)
def test_input_and_output_guardrails_stop_the_run(
    script: list[Turn], schedule: tuple[Op, ...], plans: tuple[GuardrailPlan, ...], max_turns: int
) -> None:
    """A trip or a faulty guardrail fails the run and stops it; a run never completes
    while an input guardrail runs."""
    _check(script, schedule, PolicyFaults(plans), max_turns)


@pytest.mark.parametrize("kind", ["input", "output"])
def test_the_checker_catches_a_later_run_sent_a_rejected_item(kind: str) -> None:
    """The rejected-unsent invariant is not vacuous: the next run on the session is
    sent what a guardrail rejected (as it was before marks existed), and it says so."""
    observation = _observe(ANSWER, (), _one("g", kind, "trip"), session=True)
    fresh = observation.observation.fresh_run
    assert fresh is not None
    marked = [i for i in fresh.stored_before if i.rejected_by is not None]
    assert marked
    assert check_policies(observation).ok
    unmarked = tuple(attrs.evolve(i, rejected_by=None) for i in fresh.stored_before)
    leaky = attrs.evolve(fresh, request=(*unmarked, ta.UserMessage("fresh run input")))
    observation = attrs.evolve(
        observation, observation=attrs.evolve(observation.observation, fresh_run=leaky)
    )
    found = {v.invariant for v in check_policies(observation).violations}
    assert "rejected-unsent" in found


@profile_settings(ci=0.4, fuzz=1.5)
@given(
    script=scripts(TOOLSET, failures=False),
    schedule=schedules(max_ops=4),
    plans=guardrail_plans(kinds=("input", "output")),
    max_turns=st.integers(1, 4),
)
def test_what_guardrails_reject_never_reaches_the_next_run(
    script: list[Turn], schedule: tuple[Op, ...], plans: tuple[GuardrailPlan, ...], max_turns: int
) -> None:
    """With a session: whatever a trip, a fault or a cancel left unpassed is marked,
    stored valid, and never sent to the next run's model (``rejected-unsent``)."""
    _check(script, schedule, PolicyFaults(plans), max_turns, session=True)


@profile_settings(ci=0.4, fuzz=1.5)
@given(
    script=scripts(TOOLSET, failures=False),
    schedule=schedules(max_ops=4),
    limits=usage_limits(),
    max_turns=st.integers(1, 5),
)
def test_usage_limits_are_never_passed(
    script: list[Turn], schedule: tuple[Op, ...], limits: ta.UsageLimits | None, max_turns: int
) -> None:
    """The request or tool call past a limit never happens; a stream past a token
    limit is cut; the deadline ends the run."""
    _check(script, schedule, PolicyFaults(limits=limits), max_turns)


@profile_settings(ci=0.4, fuzz=2)
@given(
    script=scripts(TOOLSET),
    schedule=schedules(max_ops=4),
    policies=policy_faults(),
    max_turns=st.integers(1, 5),
)
def test_any_policy_fault_under_any_schedule(
    script: list[Turn], schedule: tuple[Op, ...], policies: PolicyFaults, max_turns: int
) -> None:
    _check(script, schedule, policies, max_turns)
