""":class:`RunInfo`: what a host reports about a run (``run.get``, ``runs.list``,
``GET /runs/{id}``, an A2A task's record), and its JSON both ways. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import InvalidOperation
from typing import Any

import attrs

from .._events import RunStatus
from .._model import Usage, usage_from_json

__all__ = ["RunInfo"]


@attrs.frozen
class RunInfo:
    """What ``run.get`` and ``runs.list`` report about a run.

    Attributes:
        run_id: the run's id.
        agent: the name the agent is registered under on the server.
        session_id: the session the run uses (None: no session).
        status: its current status.
        reason: why it failed or was cancelled (None otherwise).
        seq: the seq of its latest event.
        turn: the number of model calls started.
        pending_approvals: ids of tool calls waiting for approval.
        parent_id: the run this one is a child of (None at the root of a tree).
        root_id: the root of its tree (its own id at the root).
        children: its child runs' ids, in start order, live and finished; None when
            not known here (a cluster node answering for a tree another node runs).
        detail: the ``detail`` of the run's current status update, as its
            ``run.updated`` event carries it (``waiting`` and ``pending`` while it
            awaits approval; ``by`` and ``reason`` for a subtree's cancel); the same
            on every node of a cluster (the run's row keeps it).
        usage: the run's own token usage and cost (its :attr:`RunResult.usage
            <trio_agents.RunResult.usage>` once terminal; while it runs, what its model
            calls reported so far); None when no model call reported any, or where not
            known (a root run another cluster node runs). Its descendants' are on their
            own records: a tree's total is the sum over its nodes.
    """

    run_id: str
    agent: str
    session_id: str | None
    status: RunStatus
    reason: str | None
    seq: int
    turn: int = 0
    pending_approvals: tuple[str, ...] = ()
    parent_id: str | None = None
    root_id: str = attrs.field(
        default=attrs.Factory(lambda self: self.run_id, takes_self=True)  # a root's
    )
    children: tuple[str, ...] | None = ()
    detail: Mapping[str, Any] = attrs.field(factory=dict)
    usage: Usage | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``run`` object of a ``run.get`` ack (``usage`` as
        :meth:`Usage.to_json <trio_agents.Usage.to_json>` writes it: the cost a decimal
        string; left out when not known)."""
        data: dict[str, Any] = {
            "run_id": self.run_id,
            "agent": self.agent,
            "session_id": self.session_id,
            "status": self.status.value,
            "reason": self.reason,
            "seq": self.seq,
            "turn": self.turn,
            "pending_approvals": list(self.pending_approvals),
            "parent_id": self.parent_id,
            "root_id": self.root_id,
            "children": None if self.children is None else list(self.children),
            "detail": dict(self.detail),
        }
        if self.usage is not None:
            data["usage"] = self.usage.to_json()
        return data

    @classmethod
    def from_json(cls, data: Any) -> RunInfo:
        """Read the ``run`` object of a ``run.get`` ack (raises ``ValueError`` if bad)."""
        try:
            return cls(
                run_id=str(data["run_id"]),
                agent=str(data["agent"]),
                session_id=data.get("session_id"),
                status=RunStatus(data["status"]),
                reason=data.get("reason"),
                seq=int(data["seq"]),
                turn=int(data.get("turn", 0)),
                pending_approvals=tuple(str(c) for c in data.get("pending_approvals", ())),
                detail=_detail(data.get("detail")),
                usage=_usage(data.get("usage")),
                **_tree_fields(data),
            )
        except (KeyError, TypeError, ValueError, AttributeError, InvalidOperation) as exc:
            raise ValueError(f"malformed run info: {exc!r}") from None


def _detail(value: Any) -> dict[str, Any]:
    """A ``run`` object's ``detail`` (absent from an older server's: empty)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"detail must be an object, not {type(value).__name__}")
    return dict(value)


def _usage(value: Any) -> Usage | None:
    """A ``run`` object's ``usage`` (absent: not known), checked as the run core checks a
    model's :class:`Usage` (:func:`~trio_agents._model.usage_from_json`): a peer's record
    must not smuggle in a float cost, a NaN or a negative count that later sums would
    carry."""
    return None if value is None else usage_from_json(value)


def _tree_fields(data: Any) -> dict[str, Any]:
    """The run-tree fields of a ``run`` object (absent from an older server's)."""
    parent_id = data.get("parent_id")
    children = data.get("children", ())
    return {
        "parent_id": None if parent_id is None else str(parent_id),
        "root_id": str(data.get("root_id") or data["run_id"]),
        "children": None if children is None else tuple(str(c) for c in children),
    }
