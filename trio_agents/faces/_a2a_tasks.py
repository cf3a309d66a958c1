"""A run seen as an A2A 1.0 task: the objects of the protocol built from a run's events.

One job: turn what a :class:`~trio_agents.hosting.RunHost` knows about a run (its
:class:`~trio_agents.control.RunInfo` and its event log) into A2A's JSON shapes —
``Task``, ``TaskStatus``, ``Message``, ``Artifact`` and the two stream events — and
nothing else (no I/O: :mod:`._a2a` reads the host and writes the wire).

The mapping (docs/a2a.md has it for users):

* a task is a run: ``id`` is the run id, ``contextId`` the session id;
* statuses: ``queued`` → ``TASK_STATE_SUBMITTED``, ``running`` → ``WORKING``,
  ``awaiting_approval`` → ``INPUT_REQUIRED`` (the status message names the waiting
  calls), ``completed`` / ``failed`` / ``cancelled`` → ``COMPLETED`` / ``FAILED`` /
  ``CANCELED`` (the reason in the status message);
* each assistant message of the run is one artifact, ``answer-<turn>``: streamed text
  deltas append to it, and the finished message replaces it whole (``append: false,
  lastChunk: true``), so a client that missed deltas still ends with the exact text;
* every other event (tools, injections, child runs, handoffs) is a status update in the
  current state, with the run's event JSON in its metadata;
* every stream event carries the run's ``seq`` in ``metadata.seq``: a client that
  re-subscribes skips what it already saw, and nothing is lost.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, Final

import attrs

__all__ = [
    "STATE_OF",
    "TERMINAL_STATES",
    "TaskView",
    "agent_message",
    "stream_event",
    "timestamp",
]

STATE_OF: Final[Mapping[str, str]] = {
    "queued": "TASK_STATE_SUBMITTED",
    "running": "TASK_STATE_WORKING",
    "awaiting_approval": "TASK_STATE_INPUT_REQUIRED",
    "completed": "TASK_STATE_COMPLETED",
    "failed": "TASK_STATE_FAILED",
    "cancelled": "TASK_STATE_CANCELED",
}
"""The A2A task state of each run status."""

TERMINAL_STATES: Final = frozenset(
    {"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"}
)


def timestamp(at: float) -> str:
    """A UNIX time as A2A wants it: ISO 8601 in UTC, ``Z``-suffixed, milliseconds."""
    moment = datetime.datetime.fromtimestamp(at, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def agent_message(
    text: str, *, task_id: str, context_id: str, message_id: str, data: Any = None
) -> dict[str, Any]:
    """A ``ROLE_AGENT`` message of one text part (and one data part, if ``data``)."""
    parts: list[dict[str, Any]] = [{"text": text}]
    if data is not None:
        parts.append({"data": data})
    return {
        "messageId": message_id,
        "contextId": context_id,
        "taskId": task_id,
        "role": "ROLE_AGENT",
        "parts": parts,
    }


def _approval_prompt(calls: list[dict[str, Any]]) -> str:
    # A question (ToolContext.request_approval) is shown as what it asks, first; a
    # call waiting to run by its tool's name.
    asked = [c for c in calls if "question" in c]
    text = " ".join(f"{c['question']['message']} ({c['callId']})" for c in asked)
    names = ", ".join(f"{c['name']} ({c['callId']})" for c in calls if "question" not in c)
    if names:
        text = (
            f"{text} waiting for approval: {names}." if text else f"waiting for approval: {names}."
        )
    content = any(c["question"].get("schema") is not None for c in asked)
    return (
        f"{text} Answer with a message to this task holding a data part"
        ' {"decision": "approve" | "reject", "callId": "...", "message": "..."?'
        + (
            ', "content": {...}? (the question\'s form: its schema is in this data part)'
            if content
            else ""
        )
        + '} (or the text "approve" / "reject" when one call waits).'
    )


def _question(value: Any) -> dict[str, Any] | None:
    """What a face shows of a question: its message and its form's schema (None)."""
    if not isinstance(value, Mapping) or not isinstance(value.get("message"), str):
        return None
    schema = value.get("schema")
    return {"message": value["message"], "schema": schema if isinstance(schema, Mapping) else None}


@attrs.define
class TaskView:
    """The A2A view of one run, built by applying its events in order.

    Start it from what the host said (``from_info``), apply the events replayed from
    the log (:meth:`apply`), and read the ``Task`` with :meth:`task`. The same view
    turns each later event into a stream event (:func:`stream_event`), so a snapshot
    and the events after it agree.
    """

    task_id: str
    context_id: str
    state: str = "TASK_STATE_SUBMITTED"
    reason: str | None = None
    at: float | None = None
    seq: int = 0
    # call id -> {"callId", "name", "arguments"}: every tool call seen, for naming the
    # calls an input-required status waits for.
    calls: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    pending: list[str] = attrs.field(factory=list)
    # calls waiting in descendant runs (a child's tool, §17): {"run_id", "call_id",
    # "name", "arguments"}, as the run's status detail lists them
    below: list[dict[str, Any]] = attrs.field(factory=list)
    # question id -> {"message", "schema"}: the questions this run's calls ask
    # (detail["questions"]), shown as what they ask.
    questions: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    artifacts: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    history: list[dict[str, Any]] = attrs.field(factory=list)
    # The run's own usage as its record gives it (Usage.to_json()); None: not known.
    usage: dict[str, Any] | None = None

    @classmethod
    def from_info(cls, info: Any) -> TaskView:
        """The view of a run as its RunInfo describes it (state, reason, pending calls);
        events applied after refine it (artifacts, history, timestamps)."""
        view = cls(task_id=info.run_id, context_id=info.session_id or "")
        view.state = STATE_OF[str(info.status)]
        view.reason = info.reason
        view.pending = list(info.pending_approvals)
        view.usage = None if info.usage is None else info.usage.to_json()
        return view

    # ----------------------------------------------------------------- applying

    def apply(self, event: Mapping[str, Any]) -> None:
        """Fold one run event (its ``to_json()`` form) into the view."""
        seq = event.get("seq")
        if isinstance(seq, int) and seq > self.seq:
            self.seq = seq
        kind = event.get("type")
        if kind == "run.updated":
            self.state = STATE_OF.get(str(event.get("status")), self.state)
            self.reason = event.get("reason")
            at = event.get("at")
            if isinstance(at, int | float):
                self.at = float(at)
            detail = event.get("detail") or {}
            pending = detail.get("pending") if isinstance(detail, Mapping) else None
            self.pending = [str(c) for c in pending] if isinstance(pending, list) else []
            asked = detail.get("questions") if isinstance(detail, Mapping) else None
            self.questions = {
                str(q.get("id")): shown
                for q in (asked if isinstance(asked, list) else ())
                if isinstance(q, Mapping) and (shown := _question(q)) is not None
            }
            below = detail.get("waiting") if isinstance(detail, Mapping) else None
            self.below = []
            for w in below if isinstance(below, list) else ():
                if not isinstance(w, Mapping):
                    continue
                entry: dict[str, Any] = {
                    "run_id": str(w.get("run_id")),
                    "call_id": str(w.get("call_id")),
                    # the run names each call waiting below it (§17); "?" only for
                    # an event of a server from before it did
                    "name": str(w.get("name", "?")),
                    "arguments": str(w.get("arguments", "")),
                }
                question = _question(w.get("question"))
                if question is not None:
                    entry["question"] = question
                self.below.append(entry)
        elif kind == "response.text.delta":
            artifact = self._artifact(int(event.get("turn", 0)))
            artifact["parts"][0]["text"] += str(event.get("text", ""))
        elif kind == "run.item":
            self._item(int(event.get("turn", 0)), event.get("item") or {})

    def _artifact(self, turn: int) -> dict[str, Any]:
        artifact_id = f"answer-{turn}"
        artifact = self.artifacts.get(artifact_id)
        if artifact is None:
            artifact = {"artifactId": artifact_id, "name": "answer", "parts": [{"text": ""}]}
            self.artifacts[artifact_id] = artifact
        return artifact

    def _item(self, turn: int, item: Mapping[str, Any]) -> None:
        kind, role = item.get("type"), item.get("role")
        if kind == "function_call":
            call_id = str(item.get("call_id", ""))
            self.calls[call_id] = {
                "callId": call_id,
                "name": str(item.get("name", "")),
                "arguments": str(item.get("arguments", "")),
            }
        elif kind == "message" and role == "assistant":
            text = str(item.get("content", ""))
            self._artifact(turn)["parts"][0]["text"] = text
            self.history.append(self._message("ROLE_AGENT", text, f"{self.task_id}-m{self.seq}"))
        elif kind == "message" and role == "user":
            text = str(item.get("content", ""))
            self.history.append(self._message("ROLE_USER", text, f"{self.task_id}-m{self.seq}"))

    def _message(self, role: str, text: str, message_id: str) -> dict[str, Any]:
        return {
            "messageId": message_id,
            "contextId": self.context_id,
            "taskId": self.task_id,
            "role": role,
            "parts": [{"text": text}],
        }

    # ------------------------------------------------------------------ reading

    def waiting_calls(self) -> list[dict[str, Any]]:
        """The calls waiting for approval, each with its tool name and arguments:
        this run's (named by its own log), then its descendants' (``runId`` names the
        run below; the status detail names the call)."""
        unknown = {"name": "?", "arguments": ""}  # a call whose item left the log
        own: list[dict[str, Any]] = []
        for c in self.pending:
            question = self.questions.get(c)
            if question is None:
                own.append({"runId": self.task_id, **self.calls.get(c, {"callId": c, **unknown})})
                continue
            # A question's id is "<call id>:ask-<n>": named by the call that asks it.
            asking = self.calls.get(c.rsplit(":ask-", 1)[0], unknown)
            own.append(
                {
                    "runId": self.task_id,
                    "callId": c,
                    "name": asking["name"],
                    "arguments": asking["arguments"],
                    "question": question,
                }
            )
        below = []
        for w in self.below:
            entry = {
                "runId": w["run_id"],
                "callId": w["call_id"],
                "name": w["name"],
                "arguments": w["arguments"],
            }
            if "question" in w:
                entry["question"] = w["question"]
            below.append(entry)
        return own + below

    def status(self) -> dict[str, Any]:
        """The ``TaskStatus``: the state, and a message where there is something to say
        (the calls an input-required task waits for; why it failed or was cancelled)."""
        status: dict[str, Any] = {"state": self.state}
        message_id = f"{self.task_id}-s{self.seq}"
        if self.state == "TASK_STATE_INPUT_REQUIRED":
            calls = self.waiting_calls()
            status["message"] = agent_message(
                _approval_prompt(calls),
                task_id=self.task_id,
                context_id=self.context_id,
                message_id=message_id,
                data={"waiting": calls},
            )
        elif self.reason is not None and self.state in TERMINAL_STATES:
            status["message"] = agent_message(
                self.reason,
                task_id=self.task_id,
                context_id=self.context_id,
                message_id=message_id,
            )
        if self.at is not None:
            status["timestamp"] = timestamp(self.at)
        return status

    def task(self, *, history_length: int | None = None, artifacts: bool = True) -> dict[str, Any]:
        """The ``Task``; ``history_length`` as A2A defines it (None: all, 0: none),
        ``artifacts=False`` leaves the field out (ListTasks' default)."""
        task: dict[str, Any] = {
            "id": self.task_id,
            "contextId": self.context_id,
            "status": self.status(),
            "metadata": {"seq": self.seq},
        }
        if self.usage is not None:
            task["metadata"]["usage"] = dict(self.usage)
        if artifacts:
            task["artifacts"] = [
                {**a, "parts": [dict(p) for p in a["parts"]]} for a in self.artifacts.values()
            ]
        if history_length is None:
            task["history"] = list(self.history)
        elif history_length > 0:
            task["history"] = self.history[-history_length:]
        return task


def _answer_update(
    ids: Mapping[str, Any], event: Mapping[str, Any], text: str, *, whole: bool
) -> dict[str, Any]:
    """The ``artifactUpdate`` of a turn's answer (artifact ``answer-<turn>``): a piece
    appended (a text delta), or the whole answer replacing the pieces, its last chunk."""
    return {
        "artifactUpdate": {
            **ids,
            "artifact": {
                "artifactId": f"answer-{int(event.get('turn', 0))}",
                "name": "answer",
                "parts": [{"text": text}],
            },
            "append": not whole,
            "lastChunk": whole,
            "metadata": {"seq": event.get("seq"), "type": event.get("type")},
        }
    }


def stream_event(view: TaskView, event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The A2A ``StreamResponse`` of one run event, after it was applied to ``view``
    (None for an event A2A has nothing for). ``metadata.seq`` is the run's seq."""
    seq = event.get("seq")
    kind = event.get("type")
    ids = {"taskId": view.task_id, "contextId": view.context_id}
    if kind == "response.text.delta":  # a piece of the turn's answer
        return _answer_update(ids, event, str(event.get("text", "")), whole=False)
    item = event.get("item") if kind == "run.item" else None
    if (
        isinstance(item, Mapping)
        and item.get("type") == "message"
        and item.get("role") == "assistant"
    ):
        return _answer_update(ids, event, str(item.get("content", "")), whole=True)
    metadata: dict[str, Any] = {"seq": seq, "type": kind}
    if kind != "run.updated":
        # Tools, injections, child runs, handoffs, user items, events.dropped: no A2A
        # object holds them, so the status update in the current state carries the
        # run's own event, whole.
        metadata["event"] = dict(event)
    return {"statusUpdate": {**ids, "status": view.status(), "metadata": metadata}}
