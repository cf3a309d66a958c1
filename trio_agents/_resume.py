"""Resuming a run that another process started (a cluster takeover, DESIGN §12).

A resumed run loads its session like any run, except that the calls left open at the
end of the stored conversation are not closed as ``cancelled``: each one either runs
(again, for a tool declared idempotent; for the first time, for a call that never
started, such as one that was awaiting approval) or gets an ``interrupted`` error result
for the model to read. Its events continue the seqs of the earlier attempts, and its
first ``running`` status says ``detail={"resumed": True, "attempt": n}``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Any, final

import attrs

from ._model import Usage

__all__ = ["Resume"]


def _check_at_least(minimum: int) -> Any:
    def check(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{attribute.name} must be an int, not {type(value).__name__}")
        if value < minimum:
            raise ValueError(f"{attribute.name} must be >= {minimum}, got {value!r}")

    return check


def _to_frozenset(value: Collection[str]) -> frozenset[str]:
    if isinstance(value, str):
        raise TypeError("a collection of call ids is expected, not a str")
    if not all(isinstance(call_id, str) for call_id in value):
        raise TypeError("call ids must be str")
    return frozenset(value)


def _to_rejections(value: Mapping[str, str | None]) -> Mapping[str, str | None]:
    if not isinstance(value, Mapping):
        raise TypeError(f"rejected must be a mapping of call id -> message, not {value!r}")
    rejections = dict(value)
    for call_id, message in rejections.items():
        if not isinstance(call_id, str) or not (message is None or isinstance(message, str)):
            raise TypeError("rejected maps str call ids to a str message or None")
    return MappingProxyType(rejections)


def _to_spent(value: Mapping[str, int]) -> Mapping[str, int]:
    if not isinstance(value, Mapping):
        raise TypeError(f"spent must be a mapping of limit name -> count, not {value!r}")
    spent = dict(value)
    for name, count in spent.items():
        if not isinstance(name, str) or isinstance(count, bool) or not isinstance(count, int):
            raise TypeError("spent maps str limit names to int counts")
        if count < 0:
            raise ValueError(f"spent[{name!r}] must be >= 0, got {count!r}")
    return MappingProxyType(spent)


def _to_elapsed(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"elapsed must be a number of seconds, not {type(value).__name__}")
    if not value >= 0:  # NaN too
        raise ValueError(f"elapsed must be >= 0, got {value!r}")
    return float(value)


def _to_children(
    value: Mapping[tuple[str, str], tuple[str, int]],
) -> Mapping[tuple[str, str], tuple[str, int]]:
    if not isinstance(value, Mapping):
        raise TypeError(f"children must be a mapping, not {value!r}")
    children: dict[tuple[str, str], tuple[str, int]] = {}
    for key, found in value.items():
        if not (
            isinstance(key, tuple)
            and len(key) == 2
            and all(isinstance(part, str) for part in key)
            and isinstance(found, tuple)
            and len(found) == 2
            and isinstance(found[0], str)
            and found[0]
            and isinstance(found[1], int)
            and not isinstance(found[1], bool)
        ):
            raise TypeError("children maps (parent run id, call id) to (child run id, next seq)")
        if found[1] < 1:
            raise ValueError(f"a child's next seq must be >= 1, got {found[1]!r}")
        children[key] = found
    return MappingProxyType(children)


def _check_decisions(instance: Resume, _attribute: object, _value: object) -> None:
    both = instance.approved & instance.rejected.keys()
    if both:
        raise ValueError(f"calls both approved and rejected: {sorted(both)}")


@final
@attrs.frozen(kw_only=True)
class Resume:
    """How to continue a run whose earlier attempt ended with its process (the
    ``resume=`` run option). A cluster builds it from what it persisted; a single
    process never needs it.

    Attributes:
        attempt: this attempt's number (2 for the first takeover).
        next_seq: the seq of this attempt's first event: one past the last event the
            earlier attempts persisted.
        started: ids of the calls whose tool had started executing (the earlier
            attempt recorded each one before running it, see the ``before_tool`` run
            option). Such a call gets ``ToolResult(status="error", output="interrupted:
            <reason>")`` unless its tool is idempotent, in which case it runs again. A
            call left open that never started (one awaiting approval, say) runs, after
            its approval.
        reason: why the earlier attempt ended, for the ``interrupted`` results.
        approved: ids of calls an earlier attempt had an approval for but had not run
            (a cluster records every decision before applying it). When the resumed
            run asks for such a call's approval again, it is approved at once: no
            ``awaiting_approval`` status for it, and a later ``approve``/``reject`` of
            it raises :class:`UnknownCallError`, as for any answered call.
        rejected: the same for rejections: call id -> the rejection's message (or
            ``None``).
        agent: the name of the agent the run worked as when the earlier attempt
            stopped (the ``to_agent`` of its last ``run.handoff``; a cluster reads it
            from the events it persisted). The resumed run continues as the agent of
            that name among those the given agent can reach by handoffs (a name none
            of them has raises ``ValueError``). None: the agent it is given.
        spent: what the earlier attempts spent against the run's ``limits`` (name ->
            count: ``requests``, ``tool_calls``, ``input_tokens``, ``output_tokens``,
            ``total_tokens``, and ``cost_nano_usd``: the cost in billionths of a USD,
            rounded up): the resumed run's budget starts from it, so a limit passed
            before the takeover stays passed.
        elapsed: seconds since the run's original start: its ``limits.deadline``
            counts from then, not from this attempt's start.
        usage: what the earlier attempts' model calls used (the run's own
            :attr:`~trio_agents.Run.usage` when they stopped, as a cluster persists
            it): the resumed run's usage starts from it, so its
            :attr:`RunResult.usage <trio_agents.RunResult.usage>` and cost count
            every attempt's calls. None: nothing known (it starts from nothing).
        children: the child runs the earlier attempts started in the tree, by
            ``(parent run id, call id)``: ``(child run id, its next seq)``. A child the
            resumed tree resumes (§17: an agent-tool call whose child session holds
            items) keeps its id and continues its seqs from there, so its log, its
            subscribers and the ops sent to it by id go on; the mapping is handed down
            the tree.
    """

    attempt: int = attrs.field(validator=_check_at_least(2))
    next_seq: int = attrs.field(validator=_check_at_least(1))
    started: frozenset[str] = attrs.field(default=frozenset(), converter=_to_frozenset)
    reason: str = attrs.field(
        default="the node running this call stopped", validator=attrs.validators.instance_of(str)
    )
    approved: frozenset[str] = attrs.field(default=frozenset(), converter=_to_frozenset)
    # Left out of the hash (a read-only mapping is not hashable); equality compares it.
    rejected: Mapping[str, str | None] = attrs.field(
        factory=dict, converter=_to_rejections, validator=_check_decisions, hash=False
    )
    agent: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )
    spent: Mapping[str, int] = attrs.field(factory=dict, converter=_to_spent, hash=False)
    elapsed: float = attrs.field(default=0.0, converter=_to_elapsed)
    usage: Usage | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Usage))
    )
    children: Mapping[tuple[str, str], tuple[str, int]] = attrs.field(
        factory=dict, converter=_to_children, hash=False
    )

    @property
    def detail(self) -> dict[str, Any]:
        """The ``detail`` of the resumed run's first ``running`` status."""
        return {"resumed": True, "attempt": self.attempt}
