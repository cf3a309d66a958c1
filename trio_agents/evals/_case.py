"""What one case of an eval is and what it leaves behind.

:class:`AgentInputs` is what a case asks of the agent (a pydantic-evals ``Case``'s
``inputs``: a plain str is the same as ``AgentInputs(input=...)``); :class:`CaseRun` is
what the run did, kept whole (result, every event) so a failing case can be opened
later; :func:`case_run` is how an evaluator reaches it.

``AgentInputs`` is a stdlib dataclass, not attrs: pydantic-evals validates a dataset's
``inputs`` with pydantic when it reads a YAML or JSON file, and pydantic reads dataclasses
natively.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, cast

import attrs
from pydantic import ConfigDict

from .._events import RunEvent
from .._items import ToolCall
from .._limits import UsageLimits
from .._result import RunResult
from .._typeschema import to_json_value

__all__ = ["CASE_RUN_ATTRIBUTE", "AgentInputs", "CaseRun", "case_run", "json_safe"]

CASE_RUN_ATTRIBUTE: Final = "trio_agents.case_run"
"""The key of ``EvaluatorContext.attributes`` under which the runner leaves the
:class:`CaseRun` for the evaluators (it is taken out again before the report is kept)."""


@dataclass(frozen=True)
class AgentInputs:
    """The inputs of one case: what the agent is asked, and by whom.

    Args:
        input: the user message (or a list of items, as ``open_run`` takes them).
        agent: which agent answers, by name, when the eval has several
            (``evaluate(dataset, {"a": agent_a, "b": agent_b})``); None: the only one.
        follow_ups: a scripted user: each message is injected (``when="when_idle"``)
            once the agent has answered the one before, so the run goes on for one more
            turn per follow-up. The final output is the answer to the last one.
        limits: this case's :class:`~trio_agents.UsageLimits`, as a mapping of its
            fields (``{"deadline": 30, "total_tokens": 5000}``); they replace the eval's
            ``limits`` for this case.
    """

    # A typo in a dataset file (``follow_up:``) is an error, not a field left out.
    __pydantic_config__ = ConfigDict(extra="forbid")

    input: str | list[dict[str, Any]]
    agent: str | None = None
    follow_ups: tuple[str, ...] = field(default=())
    limits: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.input, str):
            if not self.input:
                raise ValueError("AgentInputs.input must not be empty")
        elif not isinstance(self.input, list):
            raise TypeError(
                f"AgentInputs.input must be a str or a list of items,"
                f" not {type(self.input).__name__}"
            )
        if isinstance(cast(object, self.follow_ups), str):
            raise TypeError("AgentInputs.follow_ups must be a list of messages, not a str")
        for index, text in enumerate(self.follow_ups):
            if not isinstance(text, str) or not text:
                raise ValueError(f"AgentInputs.follow_ups[{index}] must be a non-empty str")
        object.__setattr__(self, "follow_ups", tuple(self.follow_ups))
        if self.limits is not None:
            self.usage_limits()  # unknown names and bad values fail here, not mid-eval

    def usage_limits(self) -> UsageLimits | None:
        """:attr:`limits` as a :class:`~trio_agents.UsageLimits` (None: the eval's).

        Raises:
            TypeError: a name that is no ``UsageLimits`` field.
            ValueError: a value it refuses.
        """
        if self.limits is None:
            return None
        if not isinstance(self.limits, Mapping):
            raise TypeError("AgentInputs.limits must be a mapping of UsageLimits fields")
        known = {f.name for f in attrs.fields(UsageLimits)}
        unknown = sorted(set(self.limits) - known)
        if unknown:
            raise TypeError(f"AgentInputs.limits: unknown limits {unknown}; known: {sorted(known)}")
        return UsageLimits(**self.limits)


def as_inputs(inputs: object) -> AgentInputs:
    """A case's ``inputs`` as :class:`AgentInputs` (a str is the user message; a
    mapping holds the fields).

    Raises:
        TypeError: anything else.
    """
    if isinstance(inputs, AgentInputs):
        return inputs
    if isinstance(inputs, str):
        return AgentInputs(input=inputs)
    if isinstance(inputs, Mapping):
        unknown = set(inputs) - {"input", "agent", "follow_ups", "limits"}
        if unknown:
            raise TypeError(f"unknown case input fields: {sorted(unknown)}")
        return AgentInputs(**dict(inputs))
    raise TypeError(
        "a case's inputs must be a str (the user message), an AgentInputs or a mapping"
        f" of its fields, not {type(inputs).__name__}"
    )


def json_safe(value: object) -> Any:
    """``value`` as JSON: attrs and dataclass instances as objects, and anything JSON
    cannot hold as its ``repr`` (a report must always be writable)."""
    ok, converted = to_json_value(value)
    return converted if ok else repr(value)


@attrs.frozen
class CaseRun:
    """What the run of one case did: its result and every event, in order.

    Attributes:
        name: the case's name in the report.
        result: the run's :class:`~trio_agents.RunResult` (None: the run never started,
            say the case named an unknown agent).
        events: every event of the run, ``run.updated`` terminal last.
        cancel_reason: the reason the eval cancelled the run with (a
            :class:`~trio_agents.evals.CancelsCleanly` case), or None.
        cancelled_at: the seq of the event the run was cancelled at, or None.
    """

    name: str
    result: RunResult | None
    events: tuple[RunEvent, ...] = ()
    cancel_reason: str | None = None
    cancelled_at: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The run as JSON: status, reason, output, usage, the conversation, every
        event (``RunEvent.to_json``)."""
        result = self.result
        data: dict[str, Any] = {"name": self.name}
        if result is not None:
            data.update(
                run_id=result.run_id,
                status=str(result.status),
                reason=result.reason,
                turns=result.turns,
                final_output=json_safe(result.final_output),
                usage=None if result.usage is None else _usage_json(result),
                conversation=[item.to_json() for item in result.conversation],
            )
        data["cancel_reason"] = self.cancel_reason
        data["cancelled_at"] = self.cancelled_at
        data["events"] = [event.to_json() for event in self.events]
        return data


def _usage_json(result: RunResult) -> dict[str, Any]:
    usage = result.tree_usage if result.tree_usage is not None else result.usage
    assert usage is not None
    data: dict[str, Any] = dict(usage.to_json())
    if usage.cost is not None:
        data["cost"] = str(usage.cost)
    return data


def case_run(ctx: Any) -> CaseRun:
    """The :class:`CaseRun` of the case an evaluator is looking at (``ctx`` is its
    ``EvaluatorContext``): for evaluators of your own that need more than the output.

    Raises:
        LookupError: the case was not run by :func:`trio_agents.evals.evaluate` (say,
            by pydantic-evals' own ``Dataset.evaluate`` with a task of yours).
    """
    attributes: object = getattr(ctx, "attributes", None)
    found = attributes.get(CASE_RUN_ATTRIBUTE) if isinstance(attributes, Mapping) else None
    if not isinstance(found, CaseRun):
        raise LookupError(
            "this evaluator needs the case's run: evaluate the dataset with"
            " trio_agents.evals.evaluate (or Evaluation), not Dataset.evaluate"
        )
    return found


def tool_calls_of(result: RunResult, hidden: Sequence[str]) -> list[ToolCall]:
    """The tool calls the run made, in order, but those named in ``hidden``."""
    return [i for i in result.new_items if isinstance(i, ToolCall) and i.name not in hidden]
