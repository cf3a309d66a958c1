"""What every timeline must be (DESIGN §23): spans well nested, and all of them closed
once the tree is terminal. Shared by the timeline tests and the harness property."""

from __future__ import annotations

import trio_agents as ta

_CLOSED = {
    "run": {"completed", "failed", "cancelled"},
    "model": {"completed", "incomplete", "interrupted", "cancelled", "failed"},
    "tool": {"ok", "error", "cancelled"},
}


def span_problems(timeline: ta.Timeline, *, closed: bool) -> list[str]:
    """What is wrong with ``timeline`` (empty: nothing): ids unique; every parent
    exists; each span within its parent's time (start and end); with ``closed``, every
    span has a start, an end and a final status."""
    problems: list[str] = []
    by_id = {span.id: span for span in timeline.spans}
    if len(by_id) != len(timeline.spans):
        problems.append("span ids are not unique")
    roots = [span for span in timeline.spans if span.parent_id is None]
    if len(roots) != 1 or roots[0].id != timeline.root_id:
        problems.append(f"roots {[s.id for s in roots]} for root_id {timeline.root_id}")
    for span in timeline.spans:
        where = f"{span.kind} span {span.id}"
        if closed:
            if span.start is None or span.end is None:
                problems.append(f"{where} is not closed: {span.start}..{span.end}")
            if span.status not in _CLOSED[span.kind]:
                problems.append(f"{where} has status {span.status!r}")
        if span.start is not None and span.end is not None and span.end < span.start:
            problems.append(f"{where} ends before it starts")
        if span.parent_id is None:
            continue
        parent = by_id.get(span.parent_id)
        if parent is None:
            problems.append(f"{where} has no parent {span.parent_id}")
            continue
        if span.kind == "run" and parent.kind != "tool":
            problems.append(f"{where} is under a {parent.kind} span, not its call")
        if span.start is not None and parent.start is not None and span.start < parent.start:
            problems.append(f"{where} starts before its parent {parent.id}")
        if parent.end is not None and (span.end is None or span.end > parent.end):
            problems.append(f"{where} ends after its parent {parent.id}")
    return problems
