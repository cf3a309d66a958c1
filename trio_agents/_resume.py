"""Resuming a run that another process started (a cluster takeover, DESIGN §12).

A resumed run loads its session like any run, except that the calls left open at the
end of the stored conversation are not closed as ``cancelled``: each one either runs
(again, for a tool declared idempotent; for the first time, for a call that never
started, such as one that was awaiting approval) or gets an ``interrupted`` error result
for the model to read. Its events continue the seqs of the earlier attempts, and its
first ``running`` status says ``detail={"resumed": True, "attempt": n}``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, final

import attrs

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
        raise TypeError("started must be a collection of call ids, not a str")
    return frozenset(value)


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
    """

    attempt: int = attrs.field(validator=_check_at_least(2))
    next_seq: int = attrs.field(validator=_check_at_least(1))
    started: frozenset[str] = attrs.field(default=frozenset(), converter=_to_frozenset)
    reason: str = attrs.field(
        default="the node running this call stopped", validator=attrs.validators.instance_of(str)
    )

    @property
    def detail(self) -> dict[str, Any]:
        """The ``detail`` of the resumed run's first ``running`` status."""
        return {"resumed": True, "attempt": self.attempt}
