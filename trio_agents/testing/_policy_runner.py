"""Run one schedule with policy faults: :func:`run_schedule` plus guardrails and limits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, final

import attrs

from .. import Agent, Model
from ..models import Turn
from ._observation import Observation
from ._policy_faults import GuardrailCall, PolicyFaults, WatchedGuardrails
from ._runner import run_schedule
from ._strategies import Op

__all__ = ["PolicyObservation", "run_policy_schedule"]


@final
@attrs.frozen(eq=False)
class PolicyObservation:
    """What :func:`run_policy_schedule` saw: the lifecycle :class:`Observation` and
    every guardrail call; input to :func:`~trio_agents.testing.check_policies`.

    Attributes:
        observation: everything :func:`~trio_agents.testing.run_schedule` saw.
        policies: the guardrails and limits of the example.
        guardrail_calls: every guardrail call, in order.
        default_turn: what the model answers once its script is played out.
    """

    observation: Observation
    policies: PolicyFaults
    guardrail_calls: tuple[GuardrailCall, ...]
    default_turn: Turn | str | None = "the end"

    def describe(self) -> str:
        """The example, readably: the observation's description, the policies and
        every guardrail call."""
        lines = [self.observation.describe()]
        if self.policies:
            lines.append("policies:")
            lines += [f"  {text}" for text in self.policies.describe()]
        if self.guardrail_calls:
            lines.append("guardrail calls:")
        for call in self.guardrail_calls:
            end = "running" if call.ended_at is None else f"{call.outcome} t={call.ended_at:g}"
            swallowed = " (swallowed a Cancelled)" if call.swallowed else ""
            lines.append(
                f"  t={call.at:g}: {call.name} #{call.number} (model call {call.model_call})"
                f" on {call.value[:60]!r} -> {end}{swallowed}"
            )
        return "\n".join(lines)


def run_policy_schedule(
    agent_factory: Callable[[Model], Agent],
    script: Sequence[Turn | str],
    schedule: Sequence[Op] = (),
    policies: PolicyFaults | None = None,
    **options: Any,
) -> PolicyObservation:
    """:func:`~trio_agents.testing.run_schedule` with run policies: the agent
    ``agent_factory`` builds gets the watched guardrails of ``policies`` (after its
    own), and the run gets its ``limits`` (``run_options`` may not hold ``limits``
    too). Every other keyword goes to ``run_schedule``."""
    policies = policies or PolicyFaults()
    holder: list[WatchedGuardrails] = []

    def factory(model: Model) -> Agent:
        # The watched model counts its streams: a guardrail call records how many
        # were opened, so a stream guardrail's call names the turn it checks.
        streams = getattr(model, "streams", ())
        watched = WatchedGuardrails(policies.guardrails, lambda: len(streams))
        holder.append(watched)
        agent = agent_factory(model)
        return attrs.evolve(
            agent,
            input_guardrails=(*agent.input_guardrails, *watched.input),
            output_guardrails=(*agent.output_guardrails, *watched.output),
        )

    run_options = dict(options.pop("run_options", None) or {})
    if policies.limits is not None:
        if "limits" in run_options:
            raise TypeError("pass the limits in policies, not in run_options")
        run_options["limits"] = policies.limits
    default_turn = options.get("default_turn", "the end")
    observation = run_schedule(factory, script, schedule, run_options=run_options, **options)
    calls = tuple(holder[0].calls) if holder else ()
    return PolicyObservation(observation, policies, calls, default_turn)
