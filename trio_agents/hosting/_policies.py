"""Run policies over the control channel (DESIGN §18): ``run.start``'s ``"limits"``,
capped by the server's ``Limits.max_run_limits``, and the server's ``context`` hook.

- **Limits** travel as a JSON object of the :class:`~trio_agents.UsageLimits` fields
  (``requests``, ``tool_calls``, ``input_tokens``, ``output_tokens``, ``total_tokens``,
  ``cost``, ``deadline``, ``wrap_up``), each a number or ``null`` (not asked); ``cost``
  (USD) may also be a decimal string, which is how it is sent (exact). The server's
  maximum is a cap *and* a default: a limit it sets applies to every run, at the
  client's value when that is not above it. A value above it is refused
  (``invalid_request`` naming the field) rather than clamped: a client that asked for
  200 requests and silently got 50 would see its run fail for a reason it cannot
  explain, while a refusal tells it the maximum at once, before anything ran.
- **Context** never travels: it is an in-process object (a database pool, the user's
  record). The server's application supplies it through the hook
  ``ControlServer(context=hook)``, called as ``hook(principal, info)`` (sync or async,
  ``info`` a :class:`RunStartInfo`) on the node that runs the run, once per start and
  once per cluster takeover (``info.resumed``). A hook that raises is a server fault:
  the ``run.start`` answers ``internal`` (the error is logged) and nothing is started.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Mapping
from decimal import Decimal
from typing import Any, Final, TypeAlias

import attrs

from .._items import Item
from .._limits import UsageLimits, to_cost
from ._error_codes import ProtocolError

__all__ = [
    "LIMIT_FIELDS",
    "ContextHook",
    "RunStartInfo",
    "call_context_hook",
    "effective_limits",
    "limits_from_wire",
    "limits_to_wire",
]

logger = logging.getLogger("trio_agents.hosting")

_COUNTS: Final = ("requests", "tool_calls", "input_tokens", "output_tokens", "total_tokens")
_SECONDS: Final = ("deadline", "wrap_up")
LIMIT_FIELDS: Final[tuple[str, ...]] = (*_COUNTS, "cost", *_SECONDS)
"""The fields of ``run.start``'s ``"limits"`` object."""


@attrs.frozen(kw_only=True)
class RunStartInfo:
    """What a ``context`` hook of a :class:`~trio_agents.control.ControlServer` is told
    about the run it supplies a context for.

    Attributes:
        run_id: the run's id.
        agent: the agent's name on the server.
        session_id: the session the run uses, if any.
        input: the run's input items (empty for a resumed run: its input is in its
            session already).
        limits: the run's effective :class:`~trio_agents.UsageLimits` (after the
            server's maximum), or None.
        resumed: True when a cluster node takes the run over from another node.
    """

    run_id: str
    agent: str
    session_id: str | None
    input: tuple[Item, ...]
    limits: UsageLimits | None
    resumed: bool = False


ContextHook: TypeAlias = Callable[[str, RunStartInfo], Any | Awaitable[Any]]
"""``hook(principal, info) -> context`` (sync or async): a run's ``context``."""


def limits_from_wire(name: str, value: Any) -> Mapping[str, int | float | Decimal]:
    """Validate ``run.start``'s ``"limits"`` object: the limits asked (``null`` ones
    left out). Each field is checked on its own here; how they combine (``wrap_up``
    against the deadline) only once the server's maximum is applied
    (:func:`effective_limits`).

    Raises:
        ValueError: naming the offending field (``limits.<field>``).
    """
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be an object")
    unknown = sorted(set(value) - set(LIMIT_FIELDS))
    if unknown:
        shown = ", ".join(repr(str(key)[:64]) for key in unknown[:5])
        raise ValueError(f"unknown field(s) in {name}: {shown}")
    asked: dict[str, int | float | Decimal] = {}
    for field in LIMIT_FIELDS:
        given = value.get(field)
        if given is None:
            continue
        if field == "cost":
            try:
                asked[field] = _wire_cost(given)
            except (TypeError, ValueError, ArithmeticError):
                raise ValueError(
                    f"{name}.cost must be a number of USD >= 0 (or its decimal string) or null"
                ) from None
            continue
        if field in _COUNTS:
            if isinstance(given, bool) or not isinstance(given, int) or given < 0:
                raise ValueError(f"{name}.{field} must be an integer >= 0 or null")
        elif (
            isinstance(given, bool)
            or not isinstance(given, int | float)
            or not (given > 0 and math.isfinite(given))
        ):
            raise ValueError(f"{name}.{field} must be a number of seconds > 0 or null")
        asked[field] = given
    return asked


def _wire_cost(value: object) -> Decimal:
    cost = to_cost(value)
    if cost is None:
        raise ValueError("cost is null")
    return cost


def limits_to_wire(limits: UsageLimits | Mapping[str, Any]) -> dict[str, Any]:
    """``limits`` as ``run.start``'s ``"limits"`` object (the limits that are set; a
    cost as its decimal string, so it stays exact and JSON)."""
    if isinstance(limits, UsageLimits):
        found = {field: getattr(limits, field) for field in LIMIT_FIELDS}
    else:
        found = dict(limits)
    return {
        field: str(value) if isinstance(value, Decimal) else value
        for field, value in found.items()
        if value is not None
    }


def effective_limits(
    asked: Mapping[str, Any] | None, maximum: UsageLimits | None
) -> UsageLimits | None:
    """The run's limits: what the client ``asked``, within the server's ``maximum``,
    which also supplies every limit the client left out (see the module docstring).

    Raises:
        ProtocolError: ``invalid_request``, a limit above the maximum, or limits that
            do not fit together (a ``wrap_up`` not shorter than the deadline).
    """
    asked = asked or {}
    values: dict[str, Any] = {}
    for field in (*_COUNTS, "cost", "deadline"):
        cap = None if maximum is None else getattr(maximum, field)
        wanted = asked.get(field)
        if field == "cost" and wanted is not None:
            try:  # a decimal string (limits_to_wire's) or a number
                wanted = _wire_cost(wanted)
            except (TypeError, ValueError, ArithmeticError) as exc:
                raise ProtocolError("invalid_request", f"limits.cost: {exc}") from None
        if wanted is not None and cap is not None and wanted > cap:
            raise ProtocolError(
                "invalid_request",
                f"limits.{field} {wanted:g} is above the server's maximum {cap:g}",
            )
        values[field] = wanted if wanted is not None else cap
    wrap_up = asked.get("wrap_up")
    if wrap_up is None and maximum is not None and maximum.wrap_up is not None:
        deadline = values["deadline"]
        # The server's wrap_up is a default: kept while it fits the run's deadline.
        if deadline is not None and maximum.wrap_up < deadline:
            wrap_up = maximum.wrap_up
    values["wrap_up"] = wrap_up
    if all(value is None for value in values.values()):
        return None
    try:
        return UsageLimits(**values)
    except (TypeError, ValueError) as exc:
        raise ProtocolError("invalid_request", f"limits: {exc}") from None


async def call_context_hook(hook: ContextHook, principal: str, info: RunStartInfo) -> Any:
    """The run's context from the server's hook.

    Raises:
        ProtocolError: ``internal``, the hook raised (logged here: a server fault).
    """
    try:
        context = hook(principal, info)
        if inspect.isawaitable(context):
            context = await context
    except Exception:
        logger.exception("the context hook raised for run %s", info.run_id)
        raise ProtocolError("internal", "the server could not set up the run's context") from None
    return context
