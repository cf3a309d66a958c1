"""AG-UI, the pure half: what a ``RunAgentInput`` asks of the host, and how a run's
events become AG-UI events (DESIGN §19). No I/O; the route is in ``_agui.py``.

**Messages onto sessions.** An AG-UI client sends the whole conversation on every
run; ours keeps it server-side, in the session named by ``threadId`` (scoped per
principal, as on every face). The session is the record: the new input of a run is
the run of ``user`` messages at the *end* of ``messages`` (those after the last
message of another role), and every earlier message is taken to be in the session
already — it is neither compared nor stored again. A request that ends with no user
message has nothing to run on and is refused. With ``resume``, ``messages`` is not
read at all: the run that continues is the one that was interrupted.

**What is refused, and why.** ``tools`` (frontend tools: our runs execute their tools
server-side, and AG-UI has no channel to hand a call to the browser mid-run),
``context`` (a run's context comes from the server's context hook, never from a
client), a non-empty ``state`` (our agents keep no shared state) and user content
parts that are not text. Each refusal is a 400 naming the field. ``forwardedProps``
may carry ``{"onDisconnect": "cancel" | "continue"}``; other keys are the
application's and are ignored.

**Runs onto AG-UI runs.** One AG-UI run is one stream: ``RUN_STARTED``, then the
run's tree as it happens, then one of ``RUN_FINISHED`` (outcome ``success``,
``interrupt`` or ``cancelled`` — a cancelled run is never reported as a success) or
``RUN_ERROR``. AG-UI has no mid-run channel from the client, so a run that waits for
an approval *ends the AG-UI run* with an ``interrupt`` outcome naming each waiting
call, while our run stays alive, waiting; the client's next ``RunAgentInput`` answers
with ``resume`` and a new AG-UI run streams the same run of ours from where the
interrupted one stopped. An interrupt id is opaque to the client and carries what
the continuation needs (the tree's root, the root's seq where the stream stopped, the
waiting call's run and call id), so any node of a cluster can serve the resume.

**Events.** Assistant text streams as ``TEXT_MESSAGE_*`` (one message per run and
turn; a message left open when an AG-UI run ends is closed there and reopened, same
id, by the run that continues it); tool calls as ``TOOL_CALL_START/ARGS/END`` when
the model makes them and ``TOOL_CALL_RESULT`` when they are answered; each child run
(§17) as a ``STEP_STARTED``/``STEP_FINISHED`` pair around its own events; tool
progress, handoffs and ``events.dropped`` as ``CUSTOM`` events named
``trio-agents.<event type>``. Our own run id travels in ``RUN_STARTED``'s metadata
(``{"trio-agents": {"run_id": ...}}``), so the other faces can steer the run.

**Usage.** The AG-UI run's last event (``RUN_FINISHED``, whatever its outcome, or the
run's ``RUN_ERROR``) carries AG-UI's own ``usage``: one ``TokenUsage`` entry per model
(by the ``model`` of each run's :class:`~trio_agents.Usage`; what a run served by
several models used counts under no model), for the model calls of the whole tree made
during this AG-UI run (:func:`usage_entries`), as the protocol accounts a run: a resumed AG-UI run
reports the calls made since it was asked for, not those of the run it resumes. AG-UI
has no cost field: the cost of those calls (when known) travels as a decimal string in
the event's metadata, ``{"trio-agents": {"cost": "0.000123"}}``.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, Final, Literal, final

import attrs
from ag_ui.core import (
    BaseEvent,
    CustomEvent,
    Interrupt,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    RunStartedEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from pydantic import ValidationError

from .._items import Item, UserMessage
from .._model import Usage

__all__ = [
    "APPROVAL_SCHEMA",
    "META_KEY",
    "AguiInputError",
    "Approval",
    "EventMapper",
    "Resume",
    "Start",
    "interrupt_id",
    "parse_input",
    "plan",
    "usage_entries",
    "with_usage",
]

META_KEY: Final = "trio-agents"
"""Our key in AG-UI ``metadata`` objects (``"ag-ui"`` is reserved for the protocol)."""

PROTOCOL_VERSION: Final = "1.0"

APPROVAL_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean", "description": "run the call (true) or not"},
        "message": {"type": "string", "description": "why not, for the model to read"},
    },
    "required": ["approved"],
}
"""The ``responseSchema`` of every approval interrupt: what a ``resolved`` resume
entry's ``payload`` holds."""

# The websocket channel's bounds on names (session and run ids) and on a rejection's
# message, so every face refuses the same.
MAX_NAME_LENGTH: Final = 256
MAX_MESSAGE_LENGTH: Final = 4096

CANCELLED_APPROVAL: Final = "the user dismissed the approval"
"""The rejection message of an approval whose resume entry is ``cancelled``."""


class AguiInputError(ValueError):
    """A ``RunAgentInput`` this face cannot serve; ``message`` says why (a 400)."""


# ----------------------------------------------------------------- the input


def parse_input(body: Any) -> RunAgentInput:
    """Validate a request body as ``RunAgentInput`` (the ag-ui-protocol model).

    Raises:
        AguiInputError: naming the first offending field.
    """
    if not isinstance(body, dict):
        raise AguiInputError("the body must be a RunAgentInput JSON object")
    try:
        return RunAgentInput.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        count = exc.error_count()
        more = f" (and {count - 1} more problem(s))" if count > 1 else ""
        raise AguiInputError(f"not a valid RunAgentInput: {where}: {first['msg']}{more}") from None


@attrs.frozen
class Start:
    """Start a run in the thread's session with ``input`` (the trailing user messages)."""

    input: tuple[Item, ...]
    on_disconnect: Literal["cancel", "continue"]


@attrs.frozen
class Approval:
    """One resume entry: approve or reject ``call_id`` of ``run_id``."""

    run_id: str
    call_id: str
    approved: bool
    message: str | None = None
    # A question's answer (its payload's "content"): checked against its schema by the run.
    content: dict[str, Any] | None = None


@attrs.frozen
class Resume:
    """Answer the interrupts of the AG-UI run that ended on ``root``'s seq ``seq``, then
    stream ``root``'s tree from there."""

    root: str
    seq: int
    approvals: tuple[Approval, ...]
    on_disconnect: Literal["cancel", "continue"]


def plan(
    run_input: RunAgentInput, *, on_disconnect: Literal["cancel", "continue"] = "cancel"
) -> Start | Resume:
    """What a validated ``RunAgentInput`` asks for (see the module docstring).

    ``on_disconnect`` is the route's default (its query parameter); ``forwardedProps``'
    ``onDisconnect`` overrides it.

    Raises:
        AguiInputError: a refused field, no new user message, a malformed resume.
    """
    if run_input.tools:
        raise AguiInputError(
            "tools: frontend tools are not supported (this server runs its agents' tools"
            " itself); send an empty list"
        )
    if run_input.context:
        raise AguiInputError(
            "context: not accepted from a client (a run's context comes from the"
            " server's context hook); send an empty list"
        )
    if run_input.state not in (None, {}):
        raise AguiInputError("state: these agents keep no shared state; send {} or leave it out")
    if not 0 < len(run_input.thread_id) <= MAX_NAME_LENGTH:
        raise AguiInputError(f"threadId must be 1 to {MAX_NAME_LENGTH} characters")
    mode = _on_disconnect(run_input.forwarded_props, on_disconnect)
    if run_input.resume:
        return _resume(run_input, mode)
    return Start(_new_input(run_input.messages), mode)


def _on_disconnect(
    props: Any, default: Literal["cancel", "continue"]
) -> Literal["cancel", "continue"]:
    if props is None:
        return default
    if not isinstance(props, dict):
        raise AguiInputError("forwardedProps must be an object")
    value = props.get("onDisconnect", default)
    if value == "cancel" or value == "continue":
        return value  # type: ignore[no-any-return]
    raise AguiInputError("forwardedProps.onDisconnect must be 'cancel' or 'continue'")


def _new_input(messages: Sequence[Any]) -> tuple[Item, ...]:
    """The user messages after the last message of another role, as items."""
    start = len(messages)
    while start > 0 and getattr(messages[start - 1], "role", None) == "user":
        start -= 1
    if start == len(messages):
        raise AguiInputError(
            "messages: the last message must be a user message (the new input of the"
            " run; earlier messages are already in the thread's session)"
        )
    items: list[Item] = []
    for index in range(start, len(messages)):
        content = messages[index].content
        if isinstance(content, str):
            items.append(UserMessage(content))
            continue
        texts: list[str] = []
        for part in content:
            if getattr(part, "type", None) != "text":
                raise AguiInputError(
                    f"messages.{index}.content: only text parts are supported,"
                    f" not {getattr(part, 'type', '?')!r}"
                )
            texts.append(part.text)
        items.append(UserMessage("".join(texts)))
    return tuple(items)


def _resume(run_input: RunAgentInput, mode: Literal["cancel", "continue"]) -> Resume:
    assert run_input.resume is not None
    places: set[tuple[str, int]] = set()
    answered: set[tuple[str, str]] = set()
    approvals: list[Approval] = []
    for index, entry in enumerate(run_input.resume):
        where = f"resume.{index}"
        try:
            root, seq, run_id, call_id = _decode_interrupt_id(entry.interrupt_id)
        except ValueError:
            raise AguiInputError(f"{where}.interruptId: not an interrupt of this server") from None
        places.add((root, seq))
        if (run_id, call_id) in answered:
            # Refused here, before anything is applied: the second answer would fail
            # once the first was applied, leaving a half-applied request.
            raise AguiInputError(f"{where}.interruptId: that interrupt is answered twice")
        answered.add((run_id, call_id))
        if entry.status == "cancelled":
            approvals.append(Approval(run_id, call_id, False, CANCELLED_APPROVAL))
            continue
        payload = entry.payload
        if not isinstance(payload, dict) or not isinstance(payload.get("approved"), bool):
            raise AguiInputError(
                f"{where}.payload: a resolved approval needs {{'approved': true|false}}"
            )
        message = payload.get("message")
        if message is not None and (
            not isinstance(message, str) or len(message) > MAX_MESSAGE_LENGTH
        ):
            raise AguiInputError(
                f"{where}.payload.message must be a string of at most"
                f" {MAX_MESSAGE_LENGTH} characters"
            )
        content = payload.get("content")
        if content is not None and (not isinstance(content, dict) or not payload["approved"]):
            raise AguiInputError(f"{where}.payload.content must be an object, with approved: true")
        approvals.append(Approval(run_id, call_id, payload["approved"], message, content))
    if len(places) != 1:
        raise AguiInputError("resume: every entry must answer the same interrupted run")
    ((root, seq),) = places
    return Resume(root, seq, tuple(approvals), mode)


def interrupt_id(root: str, seq: int, run_id: str, call_id: str) -> str:
    """The opaque id of an approval interrupt: base64url of what the continuation
    needs, so no node has to remember anything between the two AG-UI runs."""
    raw = json.dumps([root, seq, run_id, call_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_interrupt_id(value: str) -> tuple[str, int, str, str]:
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
        decoded = json.loads(raw)
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ValueError("not an interrupt id") from None
    if (
        isinstance(decoded, list)
        and len(decoded) == 4
        and isinstance(decoded[0], str)
        and type(decoded[1]) is int
        and isinstance(decoded[2], str)
        and isinstance(decoded[3], str)
        and all(0 < len(name) <= MAX_NAME_LENGTH for name in (decoded[2], decoded[3]))
    ):
        return decoded[0], decoded[1], decoded[2], decoded[3]
    raise ValueError("not an interrupt id")


# ---------------------------------------------------------------- the events


def _meta(**values: Any) -> dict[str, Any]:
    return {META_KEY: values}


@final
class EventMapper:
    """Our event JSON (a tree's merged stream) in, AG-UI events out, for one AG-UI run.

    Feed every event of the tree from its first retained one; events up to and
    including the root's seq ``after`` (a resumed AG-UI run: what the interrupted one
    already sent) only build up state (open steps, the tool calls' names), and
    produce nothing. :attr:`finished` is set once a terminal AG-UI event was made; feed
    nothing after it.

    Args:
        thread_id: the AG-UI ``threadId`` (the session).
        run_id: the AG-UI ``runId`` (the client's).
        root: our run id, the root of the tree streamed.
        after: the root's seq the stream continues after (0: a new run).
        resolved: the ``(run_id, call_id)`` this request answered: an approval wait
            replayed from before the answer is not an interrupt any more.
    """

    def __init__(
        self,
        *,
        thread_id: str,
        run_id: str,
        root: str,
        after: int = 0,
        resolved: frozenset[tuple[str, str]] = frozenset(),
        parent_run_id: str | None = None,
    ) -> None:
        self._thread_id = thread_id
        self._run_id = run_id
        self._root = root
        self._after = after
        self._resolved = resolved
        self._parent_run_id = parent_run_id
        self._live = after == 0  # past the point the previous AG-UI run stopped at
        self._calls: dict[tuple[str, str], tuple[str, str]] = {}  # -> (name, arguments)
        self._steps: dict[str, str] = {}  # child run id -> step name, while open
        self._open: set[str] = set()  # message ids open in this AG-UI run
        self._streamed: set[str] = set()  # message ids that got text deltas
        self.finished = False

    def started(self) -> list[BaseEvent]:
        """The events opening the AG-UI run (``RUN_STARTED``; on a resumed run, the
        steps still open where the interrupted run closed them)."""
        events: list[BaseEvent] = [
            RunStartedEvent(
                thread_id=self._thread_id,
                run_id=self._run_id,
                parent_run_id=self._parent_run_id,
                protocol_version=PROTOCOL_VERSION,
                metadata=_meta(run_id=self._root),
            )
        ]
        return events

    def feed(self, run_id: str, seq: int, event: Mapping[str, Any]) -> list[BaseEvent]:
        """The AG-UI events for one of ours (none, one or several)."""
        out: list[BaseEvent] = []
        kind = event.get("type")
        if not self._live:
            self._track(run_id, kind, event)
            if run_id == self._root and seq >= self._after:
                self._live = True
                # The interrupted AG-UI run closed every open step: reopen them.
                out.extend(
                    StepStartedEvent(step_name=name, metadata=_meta(run_id=child))
                    for child, name in self._steps.items()
                )
                if seq == self._after:
                    return out
            else:
                return out
        if kind == "response.text.delta":
            out.extend(self._text(run_id, event))
        elif kind == "run.item":
            out.extend(self._item(run_id, event))
        elif kind == "run.child":
            out.extend(self._child(event))
        elif kind == "run.updated":
            if run_id == self._root:
                out.extend(self._status(seq, event))
        elif kind in ("tool.progress", "run.handoff", "events.dropped"):
            value = {k: v for k, v in event.items() if k != "type"}
            out.append(CustomEvent(name=f"{META_KEY}.{kind}", value=value))
        return out

    # Every other event of ours (tool.started/finished, inbox.*) has no AG-UI
    # counterpart the client needs: a call's start and result already say it all.

    def _track(self, run_id: str, kind: Any, event: Mapping[str, Any]) -> None:
        """Follow the state silently (events the previous AG-UI run already sent)."""
        if kind == "run.item":
            self._remember_call(run_id, event.get("item"))
        elif kind == "run.child":
            self._child(event)

    def _remember_call(self, run_id: str, item: Any) -> None:
        if isinstance(item, Mapping) and item.get("type") == "function_call":
            self._calls[(run_id, str(item.get("call_id")))] = (
                str(item.get("name")),
                str(item.get("arguments", "")),
            )

    def _message_id(self, run_id: str, turn: Any) -> str:
        return f"{run_id}.{turn}"

    def _tool_call_id(self, run_id: str, call_id: str) -> str:
        # The root's calls keep their ids (what the other faces approve by); a
        # descendant's conversation has ids of its own, which could repeat a root's.
        return call_id if run_id == self._root else f"{run_id}.{call_id}"

    def _text(self, run_id: str, event: Mapping[str, Any]) -> list[BaseEvent]:
        message_id = self._message_id(run_id, event.get("turn"))
        out: list[BaseEvent] = []
        if message_id not in self._open:
            self._open.add(message_id)
            out.append(TextMessageStartEvent(message_id=message_id, role="assistant"))
        self._streamed.add(message_id)
        out.append(TextMessageContentEvent(message_id=message_id, delta=str(event.get("text"))))
        return out

    def _item(self, run_id: str, event: Mapping[str, Any]) -> list[BaseEvent]:
        item = event.get("item")
        if not isinstance(item, Mapping):
            return []
        kind = item.get("type")
        message_id = self._message_id(run_id, event.get("turn"))
        if kind == "message" and item.get("role") == "assistant":
            if message_id in self._open:
                self._open.discard(message_id)
                return [TextMessageEndEvent(message_id=message_id)]
            content = str(item.get("content", ""))
            if message_id in self._streamed or not content:
                return []  # its text was streamed (and closed) already
            self._streamed.add(message_id)
            return [
                TextMessageStartEvent(message_id=message_id, role="assistant"),
                TextMessageContentEvent(message_id=message_id, delta=content),
                TextMessageEndEvent(message_id=message_id),
            ]
        if kind == "function_call":
            self._remember_call(run_id, item)
            call_id = self._tool_call_id(run_id, str(item.get("call_id")))
            arguments = str(item.get("arguments", ""))
            out: list[BaseEvent] = [
                ToolCallStartEvent(
                    tool_call_id=call_id,
                    tool_call_name=str(item.get("name")),
                    parent_message_id=message_id if message_id in self._streamed else None,
                    metadata=None if run_id == self._root else _meta(run_id=run_id),
                )
            ]
            if arguments:
                out.append(ToolCallArgsEvent(tool_call_id=call_id, delta=arguments))
            out.append(ToolCallEndEvent(tool_call_id=call_id))
            return out
        if kind == "function_call_output":
            raw_id = str(item.get("call_id"))
            return [
                ToolCallResultEvent(
                    message_id=f"{run_id}.result.{raw_id}",
                    tool_call_id=self._tool_call_id(run_id, raw_id),
                    content=str(item.get("output", "")),
                    role="tool",
                    metadata=_meta(status=item.get("status", "ok")),
                )
            ]
        return []  # user messages: the client sent them (or another face injected them)

    def _child(self, event: Mapping[str, Any]) -> list[BaseEvent]:
        child = str(event.get("child_id"))
        status = event.get("status")
        if status == "queued":
            if child in self._steps:
                return []
            name = self._steps[child] = f"{event.get('agent')} ({child})"
            return [StepStartedEvent(step_name=name, metadata=_meta(run_id=child))]
        name_or_none = self._steps.pop(child, None)
        if name_or_none is None:
            return []
        return [
            StepFinishedEvent(step_name=name_or_none, metadata=_meta(run_id=child, status=status))
        ]

    def _close_all(self) -> list[BaseEvent]:
        """Close what is open before the AG-UI run ends (the spec's rule: nothing
        stays open past the run's end); a run that continues reopens them."""
        out: list[BaseEvent] = [TextMessageEndEvent(message_id=m) for m in sorted(self._open)]
        self._open.clear()
        # Innermost first: a run's step opened after its parent's (``_steps`` keeps
        # start order), so closing in reverse start order closes every grandchild's
        # step before its child's, as steps nest (siblings' order is free).
        out.extend(
            StepFinishedEvent(step_name=name, metadata=_meta(run_id=child))
            for child, name in reversed(self._steps.items())
        )
        return out

    def _status(self, seq: int, event: Mapping[str, Any]) -> list[BaseEvent]:
        status = event.get("status")
        reason = event.get("reason")
        if status == "awaiting_approval":
            interrupts = self._interrupts(seq, event.get("detail"))
            if not interrupts:
                return []
            self.finished = True
            return [
                *self._close_all(),
                RunFinishedEvent(
                    thread_id=self._thread_id,
                    run_id=self._run_id,
                    outcome=RunFinishedInterruptOutcome(interrupts=interrupts),
                    metadata=_meta(run_id=self._root, seq=seq),
                ),
            ]
        if status == "completed":
            self.finished = True
            return [
                *self._close_all(),
                RunFinishedEvent(
                    thread_id=self._thread_id,
                    run_id=self._run_id,
                    outcome=RunFinishedSuccessOutcome(),
                    metadata=_meta(run_id=self._root),
                ),
            ]
        if status == "cancelled":
            self.finished = True
            return [
                *self._close_all(),
                RunFinishedEvent(
                    thread_id=self._thread_id,
                    run_id=self._run_id,
                    outcome=RunFinishedCancelledOutcome(),
                    metadata=_meta(run_id=self._root, reason=reason),
                ),
            ]
        if status == "failed":
            self.finished = True
            return [
                *self._close_all(),
                RunErrorEvent(
                    message=str(reason or "the run failed"),
                    code="failed",
                    metadata=_meta(run_id=self._root),
                ),
            ]
        return []

    def _interrupts(self, seq: int, detail: Any) -> list[Interrupt]:
        if not isinstance(detail, Mapping):
            return []
        waiting: list[tuple[str, str]] = [
            (self._root, str(call_id)) for call_id in detail.get("pending") or ()
        ]
        # What the questions ask (ToolContext.request_approval): the root's own in
        # detail["questions"], those below in their waiting entry's "question".
        questions: dict[tuple[str, str], Mapping[str, Any]] = {
            (self._root, str(q.get("id"))): q
            for q in detail.get("questions") or ()
            if isinstance(q, Mapping)
        }
        for entry in detail.get("waiting") or ():
            if isinstance(entry, Mapping):
                run_id, call_id = str(entry.get("run_id")), str(entry.get("call_id"))
                waiting.append((run_id, call_id))
                if isinstance(entry.get("question"), Mapping):
                    questions[(run_id, call_id)] = entry["question"]
                if "name" in entry and (run_id, call_id) not in self._calls:
                    # The run names each call waiting below it: known even where the
                    # descendants' own events are not streamed (the root's log only).
                    self._calls[(run_id, call_id)] = (
                        str(entry["name"]),
                        str(entry.get("arguments", "")),
                    )
        interrupts: list[Interrupt] = []
        for run_id, call_id in waiting:
            if (run_id, call_id) in self._resolved:
                continue  # answered by this very request; its wait is over
            question = questions.get((run_id, call_id))
            if question is not None:
                interrupts.append(self._question(seq, run_id, call_id, question))
                continue
            known = self._calls.get((run_id, call_id))
            # A call unknown here (its item fell out of retention) is still named by id.
            name, arguments = known if known is not None else (None, "")
            interrupts.append(
                Interrupt(
                    id=interrupt_id(self._root, seq, run_id, call_id),
                    reason="tool_approval",
                    message=(
                        f"approve the call {name}({arguments})?"
                        if name is not None
                        else f"approve the tool call {call_id}?"
                    ),
                    tool_call_id=self._tool_call_id(run_id, call_id),
                    response_schema=APPROVAL_SCHEMA,
                    metadata=_meta(run_id=run_id, call_id=call_id, tool=name),
                )
            )
        return interrupts

    def _question(
        self, seq: int, run_id: str, question_id: str, question: Mapping[str, Any]
    ) -> Interrupt:
        """The interrupt of a question a running call asks: its message is the
        question's; a resolved payload's ``content`` answers its form (``schema``)."""
        schema = question.get("schema")
        response_schema = APPROVAL_SCHEMA
        if isinstance(schema, Mapping):
            response_schema = {
                **APPROVAL_SCHEMA,
                "properties": {**APPROVAL_SCHEMA["properties"], "content": dict(schema)},
            }
        call_id = str(question.get("call_id", question_id.rsplit(":ask-", 1)[0]))
        name = question.get("name")
        return Interrupt(
            id=interrupt_id(self._root, seq, run_id, question_id),
            reason="tool_approval",
            message=str(question.get("message", "")),
            tool_call_id=self._tool_call_id(run_id, call_id),
            response_schema=response_schema,
            metadata=_meta(
                run_id=run_id,
                call_id=question_id,
                tool=name if isinstance(name, str) else None,
                question={
                    "message": question.get("message"),
                    "schema": schema if isinstance(schema, Mapping) else None,
                    "data": question.get("data"),
                },
            ),
        )


# ----------------------------------------------------------------- usage


def _less(now: int | None, before: int | None) -> int | None:
    if now is None:
        return None
    return now - (before or 0)


def _less_cost(now: Decimal | None, before: Decimal | None) -> Decimal | None:
    if now is None:
        return None
    return now - (before or Decimal(0))


def _since(now: Usage, before: Usage | None) -> Usage:
    """What a run used since ``before`` (its usage then): the model is known only when
    every call of the run so far was served by it."""
    if before is None:
        return now
    return Usage(
        now.input_tokens - before.input_tokens,
        now.output_tokens - before.output_tokens,
        now.model if now.model == before.model else None,
        cache_read_tokens=_less(now.cache_read_tokens, before.cache_read_tokens),
        cache_write_tokens=_less(now.cache_write_tokens, before.cache_write_tokens),
        cost=_less_cost(now.cost, before.cost),
    )


def usage_entries(
    now: Mapping[str, Usage], before: Mapping[str, Usage]
) -> tuple[list[TokenUsage], Decimal | None]:
    """AG-UI ``usage`` entries for what a tree's runs (run id -> its own usage) used
    between ``before`` and ``now``, one per model (a run served by several models
    counts under none), and the cost of it (None: nothing of it was priced).

    Our ``input_tokens`` already counts cached and cache-written tokens, as AG-UI's
    ``inputTokens`` does, so the cache figures are parts of it, never added to it."""
    by_model: dict[str | None, Usage] = {}
    for run_id, usage in now.items():
        spent = _since(usage, before.get(run_id))
        if spent.total_tokens == 0 and run_id in before:
            continue  # no call of this run in this AG-UI run
        known = by_model.get(spent.model)
        by_model[spent.model] = spent if known is None else known + spent
    entries = [
        TokenUsage(
            model=model,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            total_tokens=usage.total_tokens,
            cached_input_tokens=usage.cache_read_tokens,
            cache_write_input_tokens=usage.cache_write_tokens,
        )
        for model, usage in by_model.items()
    ]
    costs = [usage.cost for usage in by_model.values() if usage.cost is not None]
    return entries, (sum(costs, Decimal(0)) if costs else None)


def with_usage(event: BaseEvent, entries: list[TokenUsage], cost: Decimal | None) -> BaseEvent:
    """``event`` (the AG-UI run's ``RUN_FINISHED`` or ``RUN_ERROR``) with its ``usage``
    and, when known, the cost in its metadata (AG-UI's usage has no cost field)."""
    if not isinstance(event, RunFinishedEvent | RunErrorEvent) or not entries:
        return event
    update: dict[str, Any] = {"usage": entries}
    if cost is not None:
        metadata = dict(event.metadata or {})
        ours = dict(metadata.get(META_KEY) or {})
        metadata[META_KEY] = {**ours, "cost": str(cost)}
        update["metadata"] = metadata
    return event.model_copy(update=update)
