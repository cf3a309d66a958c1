"""Usage limits (DESIGN §18): ``open_run(..., limits=UsageLimits(...))``.

A run with limits owns a :class:`Budget`; a child run charges every budget on its path
to the root (its own, if it was given limits, then each ancestor's): a child can never
spend more than any ancestor has left. Budgets are touched on the runs' Trio thread
only, so they take no lock.

What is counted, and when:

- ``requests``: before each model request is sent (the one that would pass the limit is
  never sent);
- ``tool_calls``: before each tool call executes (the one that would pass it never runs);
- tokens: ``output_tokens`` (and ``total_tokens``) as the response streams, estimated
  from the streamed text (about four characters per token) until the provider reports
  usage, which then replaces the estimate; ``input_tokens`` when usage is reported. A
  response that passes a limit is cut at once.
- ``cost`` (USD): before a request, when its model can estimate it (an optional
  ``estimate_cost(request) -> Decimal | None`` method; the HTTP providers price the
  request body's size as input tokens), a request whose estimate would pass the budget
  is not sent (:func:`estimate_cost`); then when a response's usage is reported, with
  the cost its model priced (``Usage.cost``; a response whose model knows no price adds
  nothing), so the request that passes the budget is the last one (its response is cut
  when its usage arrives, and nothing more is sent). The estimate is a check, not a
  reservation: parallel requests of a tree may each pass it.
- ``deadline``: seconds from the run's start; the run's cancel scope has it as its
  deadline, so it reaches every await of the subtree (reason ``"timeout"``).

A resumed run (:class:`~trio_agents.Resume`, a cluster takeover) starts its budget from
what its earlier attempts spent (``Resume.spent``) and its deadline from its original
start (``Resume.elapsed`` seconds ago): a budget spent before a takeover stays spent.
  ``wrap_up`` seconds before it, a ``when="now"`` injection asks the model for its
  final answer.

Passing a limit ends *the run whose limit it is* ``failed`` (its scope is cancelled; its
descendants end ``cancelled`` / ``"parent cancelled"``, ``detail["by"]`` naming it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from decimal import ROUND_CEILING, Decimal
from typing import TYPE_CHECKING, Any, Final, final

import attrs

from ._exceptions import UsageLimitExceeded
from ._model import ModelRequest, Usage

if TYPE_CHECKING:
    from ._run import Run

__all__ = [
    "WRAP_UP_MESSAGE",
    "Budget",
    "StreamMeter",
    "UsageLimits",
    "charge_all",
    "estimate_cost",
    "estimate_tokens",
    "to_cost",
]

WRAP_UP_MESSAGE: Final = (
    "Time is almost up: stop using tools and give your final answer now, with what you have."
)
"""The user message a ``wrap_up`` injects."""

_COUNTS = ("requests", "tool_calls", "input_tokens", "output_tokens", "total_tokens")


def _check_count(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int or None, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{attribute.name} must be >= 0, got {value!r}")


def _check_seconds(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a number of seconds or None")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{attribute.name} must be a finite number of seconds > 0, got {value!r}")


def to_cost(value: object) -> Decimal | None:
    """A cost limit as an exact Decimal (a float through its shortest repr: ``0.1`` is
    0.1 USD, not its binary neighbour)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Decimal | int | float | str):
        raise TypeError(f"cost must be a Decimal, int, float or None, not {type(value).__name__}")
    cost = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    if not cost.is_finite() or cost < 0:
        raise ValueError(f"cost must be a finite number of USD >= 0, got {value!r}")
    return cost


# A cost crosses a takeover (Resume.spent holds ints) in billionths of a USD, rounded
# up: a restored budget never has less spent than the earlier attempts did.
_COST_SPENT: Final = "cost_nano_usd"
_NANO: Final = Decimal(1_000_000_000)


def _check_wrap_up(instance: UsageLimits, _attribute: object, value: float | None) -> None:
    if value is None:
        return
    if instance.deadline is None:
        raise ValueError("wrap_up needs a deadline (it counts back from it)")
    if value >= instance.deadline:
        raise ValueError(f"wrap_up ({value:g} s) must be shorter than the deadline")


@final
@attrs.frozen(kw_only=True)
class UsageLimits:
    """Limits on what a run and its whole subtree may spend (None: no limit).

    Attributes:
        requests: model requests.
        tool_calls: tool calls executed.
        input_tokens: input tokens, as the provider reports them.
        output_tokens: output tokens (estimated from the streamed text while a response
            streams without usage).
        total_tokens: input plus output tokens.
        cost: USD (a :class:`~decimal.Decimal`; an int, float or decimal string is
            converted exactly), the sum of the ``Usage.cost`` of every response, as
            each response's usage is reported (a model that knows no price adds
            nothing; docs/models.md, "Cost").
        deadline: seconds from the run's start; the run then ends ``failed`` /
            ``"timeout"``.
        wrap_up: seconds before ``deadline`` at which a ``when="now"`` injection asks
            the model for its final answer (:data:`WRAP_UP_MESSAGE`).
    """

    requests: int | None = attrs.field(default=None, validator=_check_count)
    tool_calls: int | None = attrs.field(default=None, validator=_check_count)
    input_tokens: int | None = attrs.field(default=None, validator=_check_count)
    output_tokens: int | None = attrs.field(default=None, validator=_check_count)
    total_tokens: int | None = attrs.field(default=None, validator=_check_count)
    cost: Decimal | None = attrs.field(default=None, converter=to_cost)
    deadline: float | None = attrs.field(default=None, validator=_check_seconds)
    wrap_up: float | None = attrs.field(default=None, validator=[_check_seconds, _check_wrap_up])


@final
class Budget:
    """What one run with limits (and its subtree) has used so far."""

    __slots__ = ("_estimate", "cost", "limits", "owner", "used")

    def __init__(self, limits: UsageLimits, owner: Run) -> None:
        self.limits = limits
        self.owner = owner
        self.used: dict[str, int] = dict.fromkeys(_COUNTS, 0)
        self.cost = Decimal(0)  # USD, exact: the sum of the reported Usage.cost
        # Output tokens estimated for responses still streaming without usage.
        self._estimate = 0

    def spent(self) -> dict[str, int]:
        """Every count used so far, an estimate of the responses still streaming
        included (what a cluster persists with the run, :attr:`Resume.spent`)."""
        spent = dict(self.used)
        spent["output_tokens"] += self._estimate
        spent["total_tokens"] += self._estimate
        if self.cost:
            spent[_COST_SPENT] = int((self.cost * _NANO).to_integral_value(ROUND_CEILING))
        return spent

    def restore(self, spent: Mapping[str, int]) -> None:
        """Start from what earlier attempts of the run spent (a resumed run)."""
        for name in _COUNTS:
            self.used[name] = max(self.used[name], int(spent.get(name, 0)))
        self.cost = max(self.cost, Decimal(int(spent.get(_COST_SPENT, 0))) / _NANO)

    def report(self) -> Mapping[str, Mapping[str, float]]:
        """``{name: {"used": n, "limit": m}}`` for every limit set (for a budget bar)."""
        found: dict[str, Mapping[str, float]] = {}
        for name in _COUNTS:
            limit = getattr(self.limits, name)
            if limit is not None:
                used = self.used[name]
                if name in ("output_tokens", "total_tokens"):
                    used += self._estimate
                found[name] = {"used": used, "limit": limit}
        if self.limits.cost is not None:
            found["cost"] = {"used": float(self.cost), "limit": float(self.limits.cost)}
        return found

    def _over(self, name: str, used: int | Decimal) -> UsageLimitExceeded | None:
        limit = getattr(self.limits, name)
        if limit is not None and used > limit:
            return UsageLimitExceeded(name, used, limit, self.owner.id)
        return None

    def check_estimate(self, cost: Decimal) -> UsageLimitExceeded | None:
        """A request about to be sent is estimated to cost ``cost``: the error if the
        spend so far plus that passes the cost limit (nothing is charged)."""
        limit = self.limits.cost
        if limit is not None and self.cost + cost > limit:
            return UsageLimitExceeded(
                "cost", self.cost + cost, limit, self.owner.id, estimated=True
            )
        return None

    def charge(self, name: str, count: int = 1) -> UsageLimitExceeded | None:
        """Count ``count`` requests or tool calls; the error if that passes the limit."""
        self.used[name] += count
        return self._over(name, self.used[name])

    def stream(self, estimate: int) -> UsageLimitExceeded | None:
        """A response streaming without usage has an estimated ``estimate`` output
        tokens more."""
        self._estimate += estimate
        used = self.used["output_tokens"] + self._estimate
        total = self.used["total_tokens"] + self._estimate
        return self._over("output_tokens", used) or self._over("total_tokens", total)

    def settle(self, estimate: int, usage: Usage | None) -> UsageLimitExceeded | None:
        """A response's usage arrived (or it ended without any): replace its estimate
        (``estimate`` tokens) by the usage, or keep the estimate as the usage."""
        self._estimate -= estimate
        if usage is None:
            usage = Usage(0, estimate)
        used = self.used
        used["input_tokens"] += usage.input_tokens
        used["output_tokens"] += usage.output_tokens
        used["total_tokens"] += usage.input_tokens + usage.output_tokens
        if usage.cost is not None:
            self.cost += usage.cost
        return (
            self._over("input_tokens", used["input_tokens"])
            or self._over("output_tokens", used["output_tokens"])
            or self._over("total_tokens", used["total_tokens"])
            or self._over("cost", self.cost)
        )


def charge_all(
    budgets: tuple[Budget, ...], step: Callable[[Budget], UsageLimitExceeded | None]
) -> bool:
    """Apply ``step`` to every budget a run charges (its own, then each ancestor's);
    each limit it passes fails that budget's run at once. True if any was passed (the
    caller must not go on: its next checkpoint raises)."""
    over = False
    for budget in budgets:
        exceeded = step(budget)
        if exceeded is not None:
            budget.owner._limit_exceeded(exceeded)
            over = True
    return over


def estimate_cost(model: object, request: ModelRequest) -> Decimal | None:
    """The model's estimate of what ``request`` will cost (USD), if it makes one: its
    optional ``estimate_cost(request)`` method (models without one are not estimated).

    Raises:
        TypeError: the method returned something other than a ``Decimal`` or ``None``.
    """
    method = getattr(model, "estimate_cost", None)
    if method is None:
        return None
    cost = method(request)
    if cost is not None and not isinstance(cost, Decimal):
        raise TypeError(
            f"{type(model).__name__}.estimate_cost must return a Decimal or None,"
            f" not {type(cost).__name__}"
        )
    return cost


def estimate_tokens(chars: int) -> int:
    """About four characters per token (what a budget counts before usage arrives)."""
    return -(-chars // 4)


@final
class StreamMeter:
    """One model response's spending against a run's budgets: its streamed text as an
    estimate of output tokens, replaced by its usage once the provider reports it."""

    __slots__ = ("_budgets", "_chars", "_estimate")

    def __init__(self, budgets: tuple[Budget, ...]) -> None:
        self._budgets = budgets
        self._chars = 0
        self._estimate = 0  # the tokens charged for _chars so far

    def _apply(self, step: Callable[[Budget], UsageLimitExceeded | None]) -> bool:
        return charge_all(self._budgets, step)

    def text(self, text: str) -> bool:
        """More text streamed; True if that passed a limit (the run is being stopped)."""
        self._chars += len(text)
        estimate = estimate_tokens(self._chars)
        more = estimate - self._estimate
        if more <= 0:
            return False
        self._estimate = estimate
        return self._apply(lambda budget: budget.stream(more))

    def usage(self, usage: Usage) -> bool:
        """The provider reported usage: it replaces the estimate so far."""
        estimate, self._estimate, self._chars = self._estimate, 0, 0
        return self._apply(lambda budget: budget.settle(estimate, usage))

    def close(self) -> None:
        """The response ended: an estimate no usage replaced counts as its usage."""
        if self._estimate:
            estimate, self._estimate = self._estimate, 0
            self._apply(lambda budget: budget.settle(estimate, None))
