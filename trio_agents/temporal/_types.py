"""The values a run's workflow, its attempts and the client exchange: plain data only.

This module imports neither trio nor the run core: the workflow (``_workflow``) imports
it, and workflow code stays plain (Temporal's sandbox, which a replayer may use, refuses
a module that imports trio); these dataclasses travel through Temporal's default JSON
converter (a dataclass of JSON values). Items are carried as their ``to_json()`` dicts;
the attempt converts them back.

No ``from __future__ import annotations`` here: Temporal's converter builds these
dataclasses from JSON with ``typing.get_type_hints`` on every payload, which compiles
each string annotation again; real annotations made that about 6x cheaper (a steering
op's round trip converts four such payloads, two of them in workflow activations).
"""

import dataclasses
from typing import Any, Final

__all__ = [
    "ACTIVITY_ATTEMPT",
    "ACTIVITY_PUSH",
    "CANCELLED_BY_TEMPORAL",
    "PARKED",
    "UPDATE_APPROVE",
    "UPDATE_ATTEMPT_STARTED",
    "UPDATE_CALL_STARTED",
    "UPDATE_CANCEL",
    "UPDATE_INJECT",
    "UPDATE_REJECT",
    "UPDATE_WITHDRAW",
    "WORKFLOW_NAME",
    "AttemptStarted",
    "CallStarted",
    "Catchup",
    "OpAnswer",
    "RunOutcome",
    "RunRequest",
    "SteeringOp",
]

WORKFLOW_NAME: Final = "trio_agents.run"
ACTIVITY_ATTEMPT: Final = "trio_agents.attempt"
ACTIVITY_PUSH: Final = "trio_agents.push_op"
UPDATE_CANCEL: Final = "cancel"
UPDATE_INJECT: Final = "inject"
UPDATE_WITHDRAW: Final = "withdraw"
UPDATE_STEER: Final = "steer"
SIGNAL_CANCEL_REASON: Final = "cancel_reason"
UPDATE_APPROVE: Final = "approve"
UPDATE_REJECT: Final = "reject"
UPDATE_ATTEMPT_STARTED: Final = "attempt_started"
UPDATE_CALL_STARTED: Final = "call_started"

PARKED: Final = "parked"
"""The status of an attempt's outcome that parked at an approval wait (RunOutcome)."""

CANCELLED_BY_TEMPORAL: Final = "workflow cancelled"
"""The reason of a cancel that came from Temporal itself (``temporal workflow cancel``,
the UI, a client's ``handle.cancel()``): Temporal carries no reason to an activity."""


@dataclasses.dataclass
class RunRequest:
    """What starts a run: the workflow's input, recorded first in its history.

    Attributes:
        run_id: the run's id, which is also the workflow id.
        agent: the agent's name in the workers' agents mapping.
        input: the input items, each as its ``to_json()`` dict.
        session_id: the session the run continues (None: no session).
        principal: who started the run (sessions are scoped by it).
        options: JSON-able run options passed to ``open_run`` (``max_turns``,
            ``cleanup_timeout``, ...).
        heartbeat_timeout: seconds without a heartbeat after which Temporal deems the
            attempt lost and retries it (it also bounds how fast a cancel from Temporal
            itself reaches the attempt: the SDK heartbeats at 0.8 x this).
        retry_interval: seconds before a lost attempt is retried.
        limits: the run's usage limits, as ``run.start``'s ``"limits"`` object (None:
            none).
        park_after: seconds a run may wait for an approval on a worker before its
            attempt *parks* (the run core's ``park_after``): the attempt ends, freeing
            its worker, with the calls left open in the session, and the workflow waits
            durably for a decision, then starts the next attempt, which resumes
            waiting and applies it. None: never park. Only a run with a session parks.
        approval_deadline: seconds a parked run waits for a decision (a Temporal
            timer, from the park); when it passes, every call still waiting is
            rejected with the message ``"no decision within N s"``. None: no deadline.
    """

    run_id: str
    agent: str
    input: list[dict[str, Any]]
    session_id: str | None = None
    principal: str = "temporal"
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    heartbeat_timeout: float = 2.0
    retry_interval: float = 0.1
    limits: dict[str, Any] | None = None
    park_after: float | None = None
    approval_deadline: float | None = None


@dataclasses.dataclass
class RunOutcome:
    """The terminal result of a run, recorded in the workflow's history (the activity's
    completion, and the workflow's memo); never the run's deltas.

    Attributes:
        run_id: the run.
        status: ``"completed"``, ``"failed"`` or ``"cancelled"``; an attempt's
            outcome is ``"parked"`` when it parked at an approval wait (the workflow
            then waits for a decision and starts the next attempt: never the run's end).
        reason: why it failed or was cancelled (None when completed; ``"parked"``).
        final_output: the final output (JSON).
        attempt: the number of the attempt that ended the run (1 for the first).
        new_items: the items this attempt added to the conversation, as JSON.
        first_seq: the seq of this attempt's first event (1 unless it resumed).
        pending: the ids of the calls a parked attempt left awaiting approval.
        last_seq: the seq of this attempt's last event (0: unknown).
    """

    run_id: str
    status: str
    reason: str | None
    final_output: Any
    attempt: int
    new_items: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    first_seq: int = 1
    pending: list[str] = dataclasses.field(default_factory=list)
    last_seq: int = 0


@dataclasses.dataclass
class SteeringOp:
    """An op on a running run, recorded in the history by a workflow update.

    Attributes:
        op: ``"cancel"``, ``"inject"``, ``"withdraw"``, ``"approve"`` or ``"reject"``.
        reason: a cancel's reason; a rejection's message.
        items: an inject's items, as JSON.
        when: an inject's ``when`` (``"next_turn"``, ``"now"``, ``"when_idle"``).
        target: the injection id a withdraw takes back; the call id an approve or a
            reject answers.
        index: the op's position in the workflow's list of ops (set by the workflow).
        node: the run of the tree the op is for (None: the root, the workflow's run).
        mode: a cancel's mode (``"immediate"`` or ``"after_turn"``).
        content: an approve's content, the answer to a question that asks for some
            (``ToolContext.request_approval(schema=...)``), as JSON.
    """

    op: str
    reason: str | None = None
    items: list[dict[str, Any]] | None = None
    when: str = "next_turn"
    target: str | None = None
    index: int = -1
    node: str | None = None
    mode: str = "immediate"
    content: dict[str, Any] | None = None


@dataclasses.dataclass
class OpAnswer:
    """The attempt's real answer to a steering op (the §10 answer a face relays).

    Attributes:
        ok: whether the op was applied.
        code: the §10 error code when it was not (``"run_closed"``, ``"invalid_request"``,
            ``"inbox_full"``, ``"not_found"``).
        message: a human-readable message for the error.
        injection_id: an applied inject's id.
        withdrawn: whether a withdraw took its injection back.
        pending: the op is recorded in the history but no attempt has applied it yet
            (none is running, or its worker is unreachable): the next attempt applies
            it when it starts.
    """

    ok: bool
    code: str | None = None
    message: str | None = None
    injection_id: str | None = None
    withdrawn: bool | None = None
    pending: bool = False


@dataclasses.dataclass
class AttemptStarted:
    """An attempt announces itself to its workflow (an update, so it is recorded and
    answered): where ops are pushed to it, and which attempt it is."""

    attempt: int
    address: str


@dataclasses.dataclass
class Catchup:
    """What the workflow answers a starting attempt: the ops recorded so far that it
    must apply, and what earlier attempts recorded for a resume. ``attempt`` is the
    attempt's number in the run, counting the attempts of earlier activities (a parked
    run's next attempt is a new activity, whose Temporal attempt number starts at 1
    again); 0 from a workflow that does not say (the activity's own number then)."""

    ops: list[SteeringOp]
    started_calls: list[str]
    next_seq: int
    attempt: int = 0


@dataclasses.dataclass
class CallStarted:
    """The ``before_tool`` barrier of an attempt: the call is about to execute (recorded
    in the history before the tool runs, so a later attempt never runs it again unless
    its tool is idempotent). ``seq`` is the attempt's last event seq at that point."""

    call_id: str
    seq: int
