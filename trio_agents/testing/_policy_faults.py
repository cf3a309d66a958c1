"""Policy faults: guardrails that trip or misbehave on purpose, and usage limits.

Run policies (DESIGN §18) add new ways for a run to end: a guardrail trips, raises,
hangs or swallows a cancel; a usage limit is passed. :class:`PolicyFaults` says, for
one example, which guardrails its agent gets (each a :class:`GuardrailPlan`) and which
:class:`~trio_agents.UsageLimits` its run gets;
:func:`~trio_agents.testing.run_policy_schedule` then builds watched guardrails from
the plans, which record every call (:class:`GuardrailCall`: when, on what, how it
ended) for the policy checker.

Every misbehaviour is cancellable except the one that is about not being cancellable
(``"swallow_cancel"``, which swallows one ``trio.Cancelled`` and then answers): a
guardrail that blocks *and* ignores cancellation forever could stop any run from
ending.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypeAlias, final

import attrs
import trio

from .. import GuardrailResult, InputGuardrail, OutputGuardrail, UsageLimits
from .. import input_guardrail as make_input_guardrail
from .. import output_guardrail as make_output_guardrail
from ._fakes import stray_cancelled
from ._faults import InjectedFault

__all__ = [
    "GUARDRAIL_BEHAVIOURS",
    "GuardrailBehaviour",
    "GuardrailCall",
    "GuardrailKind",
    "GuardrailPlan",
    "PolicyFaults",
    "WatchedGuardrails",
]

GuardrailKind: TypeAlias = Literal["input", "output", "stream"]
"""Where a guardrail sits: on new user input, on the final answer, or gating the
stream (``@output_guardrail(stream=True)``)."""

GuardrailBehaviour: TypeAlias = Literal[
    "pass", "trip", "raise", "hang", "garbage", "stray_cancel", "swallow_cancel"
]
"""What a guardrail does once its ``delay`` is over (see :class:`GuardrailPlan`)."""

_SYNC_BEHAVIOURS = frozenset({"pass", "trip", "raise", "garbage"})
"""What a sync plan may do: nothing that waits."""

GUARDRAIL_BEHAVIOURS: tuple[GuardrailBehaviour, ...] = (
    "pass",
    "trip",
    "raise",
    "hang",
    "garbage",
    "stray_cancel",
    "swallow_cancel",
)

GARBAGE_VERDICT = "looks fine to me"
"""What a ``"garbage"`` guardrail returns: neither a ``GuardrailResult`` nor a bool."""


@final
@attrs.frozen
class GuardrailPlan:
    """One guardrail of an example.

    It sleeps ``delay`` virtual seconds on every call (so "passes slowly", and trips at
    a chosen time: before, during or after the model's stream, at the same moment as a
    chunk, the final answer or a tool finishing — the strategies draw delays on the
    same 1/8 s grid as scripts). Calls before the ``call``-th (from 1) then pass; from
    it on it does ``behaviour``:

    - ``"pass"``: passes (a slow guardrail, if ``delay``);
    - ``"trip"``: returns ``GuardrailResult(True, info)``;
    - ``"raise"``: raises :class:`~trio_agents.testing.InjectedFault`;
    - ``"hang"``: waits until cancelled;
    - ``"garbage"``: returns a str, neither a result nor a bool;
    - ``"stray_cancel"``: raises a ``trio.Cancelled`` no scope of the run cancelled;
    - ``"swallow_cancel"``: waits until cancelled, swallows the ``Cancelled`` and
      passes (a guardrail that is never cancelled just passes).

    A ``"stream"`` guardrail with ``trip_on`` also trips (whatever ``behaviour``) on
    any text containing ``trip_on``: the text that holds it must never be published.

    Attributes:
        name: the guardrail's name (unique in an example).
        kind: ``"input"``, ``"output"`` or ``"stream"``.
        behaviour: see above.
        delay: virtual seconds each call takes before it answers.
        call: the first call (from 1) that does ``behaviour``.
        blocking: for an input guardrail: before the model call instead of beside it.
        trip_on: for a stream guardrail: trip on text containing it.
        sync: for a stream guardrail: a plain function, not ``async def`` (the run
            checks it in the stream loop as each delta arrives); it cannot wait, so
            its ``delay`` must be 0 and its ``behaviour`` one of ``"pass"``,
            ``"trip"``, ``"raise"`` and ``"garbage"``.
    """

    name: str
    kind: GuardrailKind
    behaviour: GuardrailBehaviour = "pass"
    delay: float = 0.0
    call: int = 1
    blocking: bool = False
    trip_on: str | None = None
    sync: bool = False

    def __attrs_post_init__(self) -> None:
        if self.sync and (
            self.kind != "stream" or self.delay or self.behaviour not in _SYNC_BEHAVIOURS
        ):
            raise ValueError(f"a sync guardrail plan cannot wait: {self!r}")

    @property
    def info(self) -> str:
        """The ``info`` of this guardrail's trips."""
        return f"{self.name} says no"

    def describe(self) -> str:
        """A short readable form."""
        extra = " blocking" if self.blocking else ""
        if self.sync:
            extra += " sync"
        if self.trip_on is not None:
            extra += f" trip_on={self.trip_on!r}"
        return (
            f"{self.kind} guardrail {self.name}{extra}: {self.behaviour} from call"
            f" {self.call}, {self.delay:g} s per call"
        )


@final
@attrs.frozen
class PolicyFaults:
    """The policies of one example: guardrails (by plan) and usage limits.

    Attributes:
        guardrails: the agent's guardrails, in order (input ones run in this order when
            blocking; output ones are checked in this order).
        limits: the run's ``limits=`` (None: none).
    """

    guardrails: tuple[GuardrailPlan, ...] = ()
    limits: UsageLimits | None = None

    def __bool__(self) -> bool:
        return bool(self.guardrails) or self.limits is not None

    def describe(self) -> list[str]:
        """One line per guardrail, and the limits."""
        lines = [plan.describe() for plan in self.guardrails]
        if self.limits is not None:
            lines.append(f"limits: {self.limits!r}")
        return lines


GuardrailOutcome: TypeAlias = Literal[
    "passed", "tripped", "raised", "garbage", "stray_cancel", "cancelled"
]


@final
@attrs.define(eq=False)
class GuardrailCall:
    """One call of a watched guardrail.

    Attributes:
        name: the guardrail's name.
        kind: its kind.
        number: the call number of that guardrail (from 1).
        model_call: the model calls opened so far when it was called (for a stream
            guardrail: the turn whose text it checks).
        value: what it was given: the items' reprs joined (input), the answer's str
            (output) or the text streamed so far (stream).
        at: Trio time of the call.
        outcome: how it ended (None while running): ``"passed"``, ``"tripped"``,
            ``"raised"``, ``"garbage"``, ``"stray_cancel"`` or ``"cancelled"``.
        ended_at: Trio time it ended.
        swallowed: whether it swallowed a ``trio.Cancelled`` (its answer came after the
            run tried to stop it).
    """

    name: str
    kind: GuardrailKind
    number: int
    model_call: int
    value: str
    at: float
    outcome: GuardrailOutcome | None = None
    ended_at: float | None = None
    swallowed: bool = False


def _value_text(kind: GuardrailKind, value: Any) -> str:
    if kind == "input" and isinstance(value, Sequence) and not isinstance(value, str):
        return "; ".join(repr(item) for item in value)
    return value if isinstance(value, str) else repr(value)


@final
class WatchedGuardrails:
    """The guardrails of one example, built from its plans, recording every call.

    ``model_calls`` is called at each guardrail call for the number of model calls
    opened so far (the harness passes its watched model's count)."""

    def __init__(self, plans: Sequence[GuardrailPlan], model_calls: Any) -> None:
        self.plans = tuple(plans)
        self.calls: list[GuardrailCall] = []
        self._counts: dict[str, int] = {}
        self._model_calls = model_calls
        self.input: list[InputGuardrail] = []
        self.output: list[OutputGuardrail] = []
        for plan in self.plans:
            fn = self._make(plan)
            if plan.kind == "input":
                self.input.append(make_input_guardrail(name=plan.name, blocking=plan.blocking)(fn))
            else:
                self.output.append(
                    make_output_guardrail(name=plan.name, stream=plan.kind == "stream")(fn)
                )

    def plan(self, name: str) -> GuardrailPlan | None:
        """The plan of the guardrail called ``name``."""
        return next((p for p in self.plans if p.name == name), None)

    def _make(self, plan: GuardrailPlan) -> Any:
        if plan.sync:

            def sync_guardrail(run: Any, value: Any) -> Any:
                return self._call_now(plan, self._record(plan, value))

            sync_guardrail.__name__ = plan.name
            return sync_guardrail

        async def guardrail(run: Any, value: Any) -> Any:
            return await self._call(plan, value)

        guardrail.__name__ = plan.name
        return guardrail

    def _record(self, plan: GuardrailPlan, value: Any) -> tuple[GuardrailCall, str]:
        """Record a call; the record and what the plan does on it."""
        number = self._counts[plan.name] = self._counts.get(plan.name, 0) + 1
        text = _value_text(plan.kind, value)
        record = GuardrailCall(
            plan.name, plan.kind, number, int(self._model_calls()), text, trio.current_time()
        )
        self.calls.append(record)
        behaviour = plan.behaviour if number >= plan.call else "pass"
        if plan.trip_on is not None and plan.trip_on in text:
            behaviour = "trip"
        return record, behaviour

    def _call_now(self, plan: GuardrailPlan, called: tuple[GuardrailCall, str]) -> Any:
        """A call's answer, at once (a sync plan's, and an async one's after its wait)."""
        record, behaviour = called
        record.ended_at = trio.current_time()
        if behaviour == "raise":
            record.outcome = "raised"
            raise InjectedFault(f"guardrail {plan.name} failed on purpose")
        if behaviour == "garbage":
            record.outcome = "garbage"
            return GARBAGE_VERDICT
        if behaviour == "trip":
            record.outcome = "tripped"
            return GuardrailResult(True, plan.info)
        record.outcome = "passed"
        return GuardrailResult(False, "fine")

    async def _call(self, plan: GuardrailPlan, value: Any) -> Any:
        record, behaviour = called = self._record(plan, value)

        def ended(outcome: GuardrailOutcome) -> None:
            record.outcome = outcome
            record.ended_at = trio.current_time()

        try:
            if behaviour == "swallow_cancel":
                try:
                    await trio.sleep(plan.delay) if plan.delay else await trio.sleep_forever()
                except trio.Cancelled:
                    record.swallowed = True  # the fault: not re-raised
                ended("passed")
                return GuardrailResult(False)
            if plan.delay:
                await trio.sleep(plan.delay)
            else:
                await trio.lowlevel.checkpoint()
            if behaviour == "hang":
                await trio.sleep_forever()
            if behaviour == "stray_cancel":
                stray = await stray_cancelled()
                ended("stray_cancel")
                raise stray
        except trio.Cancelled:
            if record.outcome is None:
                ended("cancelled")
            raise
        return self._call_now(plan, called)
