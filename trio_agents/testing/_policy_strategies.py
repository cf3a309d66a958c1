"""Hypothesis strategies for run policies: guardrail plans and usage limits.

Delays are on the scripts' 1/8 s grid (:mod:`._strategies`), so a guardrail answers at
the same virtual moment as a chunk, the final answer or a tool finishing as often as
not: the races of DESIGN §18 are drawn, not hoped for.
"""

from __future__ import annotations

from hypothesis import strategies as st

from .. import UsageLimits
from ._policy_faults import GUARDRAIL_BEHAVIOURS, GuardrailKind, GuardrailPlan, PolicyFaults

__all__ = ["guardrail_plans", "policy_faults", "usage_limits"]

_GUARDRAIL_DELAYS = st.sampled_from([0.0, 0.125, 0.25, 0.5, 1.0, 2.0, 3.0])
# The chunk texts scripts() streams: a stream guardrail trips on one of them.
_TRIGGERS = st.sampled_from(["a", "b", "c", "dd"])


@st.composite
def _plan(
    draw: st.DrawFn, name: str, kinds: tuple[GuardrailKind, ...], faults: bool
) -> GuardrailPlan:
    kind = draw(st.sampled_from(kinds))
    # A stream guardrail may be a plain function: checked in the stream loop, at once.
    sync = kind == "stream" and draw(st.booleans())
    behaviours = GUARDRAIL_BEHAVIOURS if faults else ("pass", "trip")
    if sync:
        behaviours = tuple(b for b in behaviours if b in ("pass", "trip", "raise", "garbage"))
    behaviour = draw(st.sampled_from(behaviours))
    return GuardrailPlan(
        name=name,
        kind=kind,
        behaviour=behaviour,
        delay=0.0 if sync else draw(_GUARDRAIL_DELAYS),
        call=draw(st.integers(1, 3)),
        blocking=kind == "input" and draw(st.booleans()),
        trip_on=draw(st.none() | _TRIGGERS) if kind == "stream" else None,
        sync=sync,
    )


def guardrail_plans(
    *,
    kinds: tuple[GuardrailKind, ...] = ("input", "output", "stream"),
    max_size: int = 3,
    faults: bool = True,
) -> st.SearchStrategy[tuple[GuardrailPlan, ...]]:
    """Up to ``max_size`` guardrails of the given ``kinds`` (named ``g1``, ``g2``,
    ...): each trips or misbehaves (only pass or trip unless ``faults``) from a drawn
    call on, after a drawn delay; stream ones may trip on a chunk's text."""

    @st.composite
    def plans(draw: st.DrawFn) -> tuple[GuardrailPlan, ...]:
        count = draw(st.integers(0, max_size))
        return tuple(draw(_plan(f"g{n + 1}", kinds, faults)) for n in range(count))

    return plans()


@st.composite
def _limits(draw: st.DrawFn, deadline: bool) -> UsageLimits | None:
    small = st.none() | st.integers(0, 4)
    requests = draw(small)
    tool_calls = draw(small)
    # A few tokens: a chunk is about half a token, so these are crossed mid-stream.
    output_tokens = draw(st.none() | st.integers(0, 6))
    total_tokens = draw(st.none() | st.integers(0, 40))
    seconds = draw(st.none() | st.sampled_from([0.5, 1.0, 2.0, 5.0])) if deadline else None
    wrap_up = None
    if seconds is not None:
        wrap_up = draw(st.none() | st.sampled_from([w for w in (0.25, 1.0, 3.0) if w < seconds]))
    if (requests, tool_calls, output_tokens, total_tokens, seconds) == (None,) * 5:
        return None
    return UsageLimits(
        requests=requests,
        tool_calls=tool_calls,
        output_tokens=output_tokens,
        total_tokens=total_tokens,
        deadline=seconds,
        wrap_up=wrap_up,
    )


def usage_limits(*, deadline: bool = True) -> st.SearchStrategy[UsageLimits | None]:
    """Usage limits small enough to be passed: requests and tool calls 0 to 4, output
    tokens 0 to 6 (crossed mid-stream), total tokens 0 to 40, and (if ``deadline``) a deadline
    of 0.5 to 5 s, with or without a ``wrap_up``; None when nothing was drawn."""
    return _limits(deadline)


def policy_faults(
    *,
    guardrails: st.SearchStrategy[tuple[GuardrailPlan, ...]] | None = None,
    limits: st.SearchStrategy[UsageLimits | None] | None = None,
) -> st.SearchStrategy[PolicyFaults]:
    """:class:`PolicyFaults` from :func:`guardrail_plans` and :func:`usage_limits`
    (or the strategies given)."""
    return st.builds(
        PolicyFaults,
        guardrails=guardrails if guardrails is not None else guardrail_plans(),
        limits=limits if limits is not None else usage_limits(),
    )
