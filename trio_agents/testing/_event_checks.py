"""The checks of what any run's result and event list show on their own
(:func:`check_events`): statuses, one terminal update, seqs, the result, the
conversation, items against events, streamed text, tools, clean text."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs

from .. import (
    AssistantMessage,
    EventsDropped,
    Item,
    ResponseTextDelta,
    RunEvent,
    RunItemEvent,
    RunResult,
    RunStatus,
    RunUpdated,
    ToolFinished,
    ToolResult,
    ToolStarted,
    conversation_problems,
)

# The output_type machinery has no public entry point (yet): the one private import.
from .._output import compile_output, output_problems
from ..models import ModelRequest, OutputSpec
from ._invariants import Found, Report, Violation, in_order

__all__ = [
    "LEGAL_NEXT",
    "check_clean_text",
    "check_events",
    "events_report",
    "sendable",
    "unmarked",
]


LEGAL_NEXT: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.QUEUED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED}),
    # running again: a model request waits for its rate limit, or goes out (§21).
    RunStatus.RUNNING: frozenset(
        {
            RunStatus.RUNNING,
            RunStatus.AWAITING_APPROVAL,
            RunStatus.COMPLETED,
            RunStatus.FAILED,
            RunStatus.CANCELLED,
        }
    ),
    # awaiting_approval again: the calls waiting below the run changed (§17).
    RunStatus.AWAITING_APPROVAL: frozenset(
        {RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL, RunStatus.FAILED, RunStatus.CANCELLED}
    ),
}


def check_events(
    result: RunResult | None, events: Sequence[RunEvent], *, output_type: object = None
) -> Report:
    """Check what any run's result and full event list can show on their own.

    Statuses, the one terminal update, seqs, the result's coherence, conversation
    validity, ``run.item`` events against ``new_items``, streamed text kept, and
    balanced tool events. Pass the agent's ``output_type`` to also check that a
    completed run's ``final_output`` validates against it. Use it on runs you drive
    yourself; :func:`check_run` checks much more. ``result`` None (a run that never
    ended) is itself a violation.
    """
    compiled = compile_output(output_type)
    return events_report(result, events, compiled.spec if compiled is not None else None)


def events_report(
    result: RunResult | None, events: Sequence[RunEvent], spec: OutputSpec | None
) -> Report:
    out: Found = []
    if not events:
        return Report((Violation("one-terminal", "the run has no events"),))
    _check_statuses(result, events, out)
    _check_approval_repeats(events, out)
    _check_seq(events, out)
    _check_streamed_text(events, out)
    if result is not None:
        _check_result(result, spec, out)
        _check_conversation(result, events, out)
        _check_tools(result, events, out)
    check_clean_text(result, events, (), out)
    return Report(in_order(out))


def _check_statuses(result: RunResult | None, events: Sequence[RunEvent], out: Found) -> None:
    updates = [e for e in events if isinstance(e, RunUpdated)]
    if not updates or updates[0].status is not RunStatus.QUEUED:
        out.append(Violation("statuses", "the first run.updated is not 'queued'"))
    for before, after in itertools.pairwise(updates):
        if before.status.is_terminal:
            continue  # reported as one-terminal
        if after.status not in LEGAL_NEXT[before.status]:
            out.append(
                Violation(
                    "statuses",
                    f"illegal transition {before.status.value} → {after.status.value}"
                    f" (seq {before.seq} → {after.seq})",
                )
            )
        if after.status is RunStatus.AWAITING_APPROVAL and not (
            after.detail.get("pending") or after.detail.get("waiting")
        ):
            out.append(Violation("statuses", f"awaiting_approval (seq {after.seq}) lists no calls"))
    terminal = [u for u in updates if u.status.is_terminal]
    if len(terminal) != 1:
        out.append(Violation("one-terminal", f"{len(terminal)} terminal updates"))
    elif events[-1] is not terminal[0]:
        out.append(
            Violation(
                "one-terminal",
                f"the terminal update (seq {terminal[0].seq}) is not the last event"
                f" (seq {events[-1].seq}, {events[-1].type})",
            )
        )
    elif result is None:
        out.append(
            Violation("one-terminal", "a terminal update was emitted, yet run.result is None")
        )
    elif (terminal[0].status, terminal[0].reason) != (result.status, result.reason):
        out.append(
            Violation(
                "one-terminal",
                f"terminal update says {terminal[0].status.value}/{terminal[0].reason!r},"
                f" the result {result.status.value}/{result.reason!r}",
            )
        )


def _check_approval_repeats(events: Sequence[RunEvent], out: Found) -> None:
    """``awaiting_approval → awaiting_approval`` says the waiting calls changed (§17),
    ``running → running`` that a model request started or stopped waiting for its rate
    limit (§21): never the same detail twice in a row."""
    updates = [e for e in events if isinstance(e, RunUpdated)]
    for before, after in itertools.pairwise(updates):
        if (
            before.status in (RunStatus.AWAITING_APPROVAL, RunStatus.RUNNING)
            and after.status is before.status
            and before.detail == after.detail
        ):
            out.append(
                Violation(
                    "statuses",
                    f"{after.status.value} repeated unchanged (seq {before.seq} → {after.seq})",
                )
            )


def _check_seq(events: Sequence[RunEvent], out: Found) -> None:
    seqs = [e.seq for e in events]
    for a, b in itertools.pairwise(seqs):
        if b <= a:
            out.append(Violation("seq", f"seq {b} follows seq {a}"))
            return
    dropped = any(isinstance(e, EventsDropped) for e in events)
    if seqs and not dropped and seqs != list(range(1, len(seqs) + 1)):
        out.append(Violation("seq", f"seqs are not 1..{len(seqs)}: {seqs[:20]}..."))


def _check_result(result: RunResult, spec: OutputSpec | None, out: Found) -> None:
    if result.status in (RunStatus.FAILED, RunStatus.CANCELLED) and not result.reason:
        out.append(Violation("result", f"a {result.status.value} run has no reason"))
    if result.status is RunStatus.COMPLETED:
        if spec is not None:
            # None may be a valid output (Optional[...]): the schema decides.
            for problem in output_problems(spec, result.final_output)[:3]:
                out.append(Violation("output", f"final_output does not validate: {problem}"))
        elif result.final_output is None:
            out.append(Violation("result", "a completed run has no final_output"))
        if result.reason is not None:
            out.append(Violation("result", f"a completed run has reason {result.reason!r}"))
    elif result.final_output is not None:
        out.append(Violation("result", f"a {result.status.value} run has a final_output"))


def _check_conversation(result: RunResult, events: Sequence[RunEvent], out: Found) -> None:
    for problem in conversation_problems(result.conversation):
        out.append(Violation("conversation", problem))
    n = len(result.new_items)
    if tuple(result.conversation[len(result.conversation) - n :]) != result.new_items:
        out.append(Violation("conversation", "result.conversation does not end with new_items"))
    committed = tuple(e.item for e in events if isinstance(e, RunItemEvent))
    # An item goes out in its run.item event when it is committed; a guardrail's mark is
    # put on at the run's end (the repair), so the result's copy may carry one more.
    new_items = tuple(map(unmarked, result.new_items))
    if tuple(map(unmarked, committed)) != new_items:
        for index, (a, b) in enumerate(itertools.zip_longest(committed, new_items)):
            if a is None or b is None or unmarked(a) != b:
                out.append(
                    Violation(
                        "items-events",
                        f"run.item #{index} is {a!r} but new_items[{index}] is {b!r}",
                    )
                )
                break


def _check_streamed_text(events: Sequence[RunEvent], out: Found) -> None:
    """Nothing the user saw streamed is thrown away (DESIGN §5)."""
    streamed: dict[int, list[str]] = {}
    kept: dict[int, list[str]] = {}
    for event in events:
        if isinstance(event, ResponseTextDelta):
            text: object = event.text  # a broken core may pass a model's garbage on
            if not isinstance(text, str):
                out.append(
                    Violation(
                        "streamed-text",
                        f"response.text.delta seq {event.seq} carries"
                        f" {type(text).__name__}, not str",
                    )
                )
                continue
            streamed.setdefault(event.turn, []).append(text)
        elif isinstance(event, RunItemEvent) and isinstance(event.item, AssistantMessage):
            kept.setdefault(event.turn, []).append(event.item.content)
    for turn, parts in streamed.items():
        text = "".join(parts)
        if text and text not in kept.get(turn, []):
            out.append(
                Violation(
                    "streamed-text",
                    f"turn {turn} streamed {text!r}, but no assistant message of that turn"
                    f" holds it (kept: {kept.get(turn, [])!r})",
                )
            )


def _check_tools(result: RunResult, events: Sequence[RunEvent], out: Found) -> None:
    results = {i.call_id: i for i in result.conversation if isinstance(i, ToolResult)}
    started: dict[str, ToolStarted] = {}
    finished: dict[str, ToolFinished] = {}
    for event in events:
        if isinstance(event, ToolStarted):
            if event.call_id in started:
                out.append(Violation("tools-balanced", f"call {event.call_id!r} started twice"))
            started[event.call_id] = event
        elif isinstance(event, ToolFinished):
            if event.call_id not in started:
                out.append(
                    Violation("tools-balanced", f"call {event.call_id!r} finished, never started")
                )
            elif event.call_id in finished:
                out.append(Violation("tools-balanced", f"call {event.call_id!r} finished twice"))
            finished[event.call_id] = event
            answer = results.get(event.call_id)
            if answer is None or (answer.status, answer.output) != (event.status, event.output):
                out.append(
                    Violation(
                        "tools-balanced",
                        f"tool.finished of {event.call_id!r} ({event.status}: {event.output!r})"
                        f" does not match its result {answer!r}",
                    )
                )
    for call_id in started.keys() - finished.keys():
        out.append(Violation("tools-balanced", f"call {call_id!r} started and never finished"))


def _unencodable(text: object) -> bool:
    if not isinstance(text, str) or text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _holds_unencodable(value: object) -> bool:
    """Whether a JSON-like value holds a str (a key included) UTF-8 cannot encode."""
    if isinstance(value, dict):
        return any(_unencodable(k) or _holds_unencodable(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_unencodable(v) for v in value)
    return _unencodable(value)


def _item_texts(item: Item) -> list[str]:
    return [value for value in item.to_json().values() if isinstance(value, str)]


def check_clean_text(
    result: RunResult | None,
    events: Sequence[RunEvent],
    requests: Sequence[ModelRequest],
    out: Found,
) -> None:
    """No lone surrogate reaches the user, the session or the model: a request body
    holding one cannot be encoded, nor can any later request of the conversation."""
    found: list[str] = []
    for event in events:
        if isinstance(event, ResponseTextDelta) and _unencodable(event.text):
            found.append(f"response.text.delta seq {event.seq}")
        elif isinstance(event, RunItemEvent) and any(map(_unencodable, _item_texts(event.item))):
            found.append(f"run.item seq {event.seq}")
        elif isinstance(event, ToolStarted) and _unencodable(event.arguments):
            found.append(f"tool.started seq {event.seq}")
        elif isinstance(event, ToolFinished) and _unencodable(event.output):
            found.append(f"tool.finished seq {event.seq}")
        elif not isinstance(event, ResponseTextDelta) and _holds_unencodable(event.to_json()):
            # Any other field: a reason, a status's detail, a progress payload, an
            # agent name (what every face encodes as UTF-8 to send the event).
            found.append(f"{event.type} seq {event.seq}")
    if result is not None:
        for index, item in enumerate(result.conversation):
            if any(map(_unencodable, _item_texts(item))):
                found.append(f"result.conversation[{index}]")
        if _unencodable(result.final_output) or _unencodable(result.reason):
            found.append("the result's final_output or reason")
    for number, request in enumerate(requests, 1):
        if any(_unencodable(text) for item in request.items for text in _item_texts(item)):
            found.append(f"model request {number}")
    for where in found[:3]:
        out.append(Violation("clean-text", f"{where} holds text UTF-8 cannot encode"))


def sendable(items: Sequence[Item]) -> list[Item]:
    """``items`` without those marked ``rejected_by`` (what a run sends of them)."""
    return [item for item in items if item.rejected_by is None]


def unmarked(item: Item) -> Item:
    """``item`` without its guardrail mark (what its run.item event carried)."""
    return item if item.rejected_by is None else attrs.evolve(item, rejected_by=None)
