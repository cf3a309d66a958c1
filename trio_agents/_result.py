"""What a run ends with: :class:`RunResult`, and the :class:`RunStatistics` snapshot;
the two errors that carry a result (:class:`RunFailedError`, :class:`SubAgentFailed`:
drawn in ``_exceptions.py``'s tree, kept here so that module needs no result)."""

from __future__ import annotations

from typing import Any

import attrs

from ._events import RunStatus
from ._exceptions import TrioAgentsError
from ._items import Item
from ._model import Usage

__all__ = ["RunFailedError", "RunResult", "RunStatistics", "SubAgentFailed"]


@attrs.frozen
class RunResult:
    """The outcome of a run; ``Run.result`` once the run is terminal.

    Attributes:
        run_id: the run's id.
        status: ``completed``, ``failed`` or ``cancelled``; ``awaiting_approval`` for a
            run that *parked* (:attr:`parked`).
        reason: why it failed or was cancelled (``"parked"`` for a parked run) (``"max_turns"``, the cancel reason,
            ``"parent cancelled"``, ``"session error: …"``, ``"cleanup timed out"``, an
            error summary); None when completed.
        final_output: the final answer (None unless completed): its text (a ``str``)
            when the agent has no ``output_type``, else the parsed value — an instance
            of the attrs class or dataclass, a dict for a ``TypedDict`` or a JSON
            schema, an ``int``, ... (typed ``Any``: annotate where you read it,
            ``point: Point = result.final_output``).
        new_items: the items this run added to the conversation (input included).
        conversation: history + new items: valid model input, whatever the status —
            except for a parked run, whose calls awaiting approval are left open in it
            (and in its session) until a resumed run answers them.
        usage: token usage summed over the model calls that reported it; None when no
            model call reported any (a server that sends no usage is not a zero). Its
            ``cost`` (USD) is the exact sum of the priced calls' costs, None when none
            was priced.
        turns: the number of model calls started.
        unconsumed: injected items that no turn consumed, in injection order.
        error: the exception behind a failure, if there was one.
        finish_reason: the last model response's finish reason (``"stop"``,
            ``"tool_calls"``, ``"length"``, …) when the model said one. A final answer
            cut by anything but a normal stop is kept as an incomplete
            :class:`~trio_agents.AssistantMessage`.
        tree_usage: :attr:`usage` plus every descendant run's (child runs, DESIGN §17);
            None when none of them reported any. Equal to ``usage`` for a run without
            children.
    """

    run_id: str
    status: RunStatus
    reason: str | None
    final_output: Any
    new_items: tuple[Item, ...]
    conversation: tuple[Item, ...]
    usage: Usage | None
    turns: int
    unconsumed: tuple[Item, ...] = ()
    error: BaseException | None = attrs.field(default=None, eq=False)
    finish_reason: str | None = None
    tree_usage: Usage | None = None

    @property
    def ok(self) -> bool:
        """True when the run completed."""
        return self.status is RunStatus.COMPLETED

    @property
    def parked(self) -> bool:
        """True when the run *parked* (the ``park_after`` option, DESIGN §20): it
        stopped at its approval wait without a cancel repair, its calls awaiting
        approval left open in its session, for a run resumed from that session
        (``resume=``) to wait for the same decisions. Not an end of the run: its
        status is ``awaiting_approval`` (not terminal), its reason ``"parked"``."""
        return self.status is RunStatus.AWAITING_APPROVAL

    def raise_for_status(self) -> RunResult:
        """Raise :class:`RunFailedError` if the run failed; otherwise return ``self``.

        A cancelled run is not an error: check ``status`` for it.
        """
        if self.status is RunStatus.FAILED:
            raise RunFailedError(self) from self.error
        return self


@attrs.frozen
class RunStatistics:
    """A snapshot of a run's internals, from :meth:`Run.statistics`."""

    status: RunStatus
    turn: int
    last_seq: int
    open_tool_calls: int
    inbox_items: int
    pending_approvals: tuple[str, ...]


class RunFailedError(TrioAgentsError):
    """Raised by :meth:`RunResult.raise_for_status` for a run whose status is ``failed``.

    Attributes:
        result: the :class:`~trio_agents.RunResult` of the failed run.
        reason: the failure reason (``"max_turns"``, an error summary, ...).
    """

    def __init__(self, result: RunResult) -> None:
        super().__init__(f"run {result.run_id} failed: {result.reason}")
        self.result = result
        self.reason = result.reason


class SubAgentFailed(TrioAgentsError):
    """A child run of ``Agent.as_tool`` failed and the parent runs with
    ``on_tool_error="fail"``: the parent fails with this as ``result.error``.

    Attributes:
        result: the child's :class:`~trio_agents.RunResult`.
    """

    def __init__(self, agent: str, result: RunResult) -> None:
        super().__init__(f"sub-agent {agent} failed: {result.reason}")
        self.result = result
