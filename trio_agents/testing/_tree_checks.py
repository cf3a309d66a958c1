"""The tree invariants (DESIGN §17 "Harness"): no run outlives its parent's call,
updates bottom-up, the tree's conversations, and a subtree's cancel leaving its
ancestors running; and :func:`check_tree`, for a tree driven from its root's
handle."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .. import Run, RunChild, RunItemEvent, RunStatus, RunUpdated, ToolResult, conversation_problems
from .._output import compile_output
from ._event_checks import events_report
from ._invariants import EPSILON, Found, Report, Violation, in_order
from ._observation import NodeRecord, TreeObservation
from ._tree import height, tree_events, walk

__all__ = ["about_run", "check_tree", "check_tree_invariants", "subtree"]


def check_tree(run: Run) -> Report:
    """Check a whole run tree from its root's handle, once the root has ended.

    Every run of the tree gets the checks of :func:`check_events` (its statuses, one
    terminal update, seqs, result, conversation, items, tools; ``output_type``
    from its agent), and the tree gets the tree invariants that its handles and
    events can show: ``tree-call-scope`` (no run outlives the call that started it),
    ``tree-bottom-up`` (a child's terminal update, then the parent's ``run.child``
    event, then the parent's result for that call; the root's terminal update last),
    ``tree-conversations`` and ``tree-subtree-cancel`` (a child whose own cancel ended
    it leaves its parent running). Use it on trees you drive yourself; a
    :func:`~trio_agents.testing.run_tree_schedule` observation, checked by
    :func:`check_run`, is checked against much more. Messages name the run (by id and
    agent) they are about.
    """
    tree = _tree_of(run)
    out: Found = []
    for node, handle in zip(tree.nodes, walk(run), strict=True):
        compiled = compile_output(handle[0].agent.output_type)
        spec = compiled.spec if compiled is not None else None
        for violation in events_report(node.outcome, node.events, spec).violations:
            out.append(about_run(node, violation))
    check_tree_invariants(tree, out, cancels_known=False)
    return Report(in_order(out), "\n".join(tree.describe()))


def _tree_of(root: Run) -> TreeObservation:
    """What a tree's handles show (no times, no schedule)."""
    events = tree_events(root)
    nodes = [
        NodeRecord(
            run_id=node.id,
            agent=node.agent.name,
            parent_id=node.parent_id,
            call_id=node.call_id,
            depth=depth,
            height=height(node),
            outcome=node.result,
            events=tuple(e for e in events if e.run_id == node.id),
        )
        for node, depth in walk(root)
    ]
    return TreeObservation(tuple(nodes), tuple(events))


def about_run(node: NodeRecord, violation: Violation) -> Violation:
    """A violation of one run of a tree: say which."""
    return Violation(violation.invariant, f"run {node.run_id} ({node.agent}): {violation.message}")


def _ancestors(node: NodeRecord, by_id: Mapping[str, NodeRecord]) -> list[NodeRecord]:
    found: list[NodeRecord] = []
    parent = by_id.get(node.parent_id) if node.parent_id is not None else None
    while parent is not None:
        found.append(parent)
        parent = by_id.get(parent.parent_id) if parent.parent_id is not None else None
    return found


def subtree(node: NodeRecord, nodes: Sequence[NodeRecord]) -> list[NodeRecord]:
    """``node`` and every run below it."""
    ids = {node.run_id}
    found = [node]
    for other in nodes:  # pre-order: a parent comes before its children
        if other.parent_id in ids:
            ids.add(other.run_id)
            found.append(other)
    return found


def check_tree_invariants(tree: TreeObservation, out: Found, *, cancels_known: bool = True) -> None:
    """The tree invariants of DESIGN §17 "Harness" (``cancels_known``: the tree's
    :attr:`NodeRecord.cancels` list every cancel applied, as the runner's do)."""
    if not tree.nodes:
        return
    position = {id(event): index for index, event in enumerate(tree.events)}
    by_id = {node.run_id: node for node in tree.nodes}
    root = tree.nodes[0]
    if not tree.complete:
        out.append(Violation("run-ends", "`async for` over run.events(tree=True) never ended"))
    for message in tree.outlived:
        out.append(Violation("tree-call-scope", message))
    for node in tree.nodes[1:]:
        parent = by_id.get(node.parent_id or "")
        if parent is None:  # pragma: no cover - walk() gives parents first
            continue
        _check_child(tree, node, parent, position, out)
        _check_child_cancel(node, parent, by_id, out, cancels_known)
    root_terminal = _terminal(root)
    last = tree.events[-1] if tree.events else None
    if (
        root_terminal is not None
        and tree.complete
        and last is not None
        and last is not root_terminal
    ):
        out.append(
            Violation(
                "tree-bottom-up",
                f"the root's terminal update is not the last event of the tree"
                f" ({last.type} of run {last.run_id} seq {last.seq} follows it)",
            )
        )
    for model in tree.models:
        if model.agent == root.agent:
            continue  # the root's model: checked as the root's own
        for number, request in enumerate(model.requests, 1):
            problems = conversation_problems(request.items)
            if problems:
                out.append(
                    Violation(
                        "model-input",
                        f"agent {model.agent}: model request {number} is invalid: {problems[0]}",
                    )
                )
                break
        if model.open_streams:
            out.append(
                Violation(
                    "model-streams-closed",
                    f"agent {model.agent}: {model.open_streams} stream(s) left open",
                )
            )


def _terminal(node: NodeRecord) -> RunUpdated | None:
    for event in reversed(node.events):
        if isinstance(event, RunUpdated) and event.status.is_terminal:
            return event
    return None


def _check_child(
    tree: TreeObservation,
    node: NodeRecord,
    parent: NodeRecord,
    position: Mapping[int, int],
    out: Found,
) -> None:
    """One child against the call of its parent that started it: the conversations,
    the order of the updates, and the child's tool calls against the call's scope."""
    call_id = node.call_id or ""
    what = f"run {node.run_id} ({node.agent}, in call {call_id!r} of run {parent.run_id})"
    _check_child_conversations(node, parent, call_id, what, out)
    result_at = _check_child_order(node, parent, call_id, position, what, out)
    if result_at is not None and tree.event_times:
        _check_child_calls(tree, node, result_at, what, out)


def _check_child_conversations(
    node: NodeRecord, parent: NodeRecord, call_id: str, what: str, out: Found
) -> None:
    """The child's conversation is valid; the parent's holds one result of the call."""
    if node.outcome is not None:
        problems = conversation_problems(node.outcome.conversation)
        if problems:
            out.append(
                Violation(
                    "tree-conversations", f"{what}: its conversation is invalid: {problems[0]}"
                )
            )
    if parent.outcome is not None:
        answers = [
            i
            for i in parent.outcome.conversation
            if isinstance(i, ToolResult) and i.call_id == call_id
        ]
        if len(answers) != 1:
            out.append(
                Violation(
                    "tree-conversations",
                    f"{what}: the parent's conversation holds {len(answers)} result(s) of the call",
                )
            )


def _check_child_order(
    node: NodeRecord,
    parent: NodeRecord,
    call_id: str,
    position: Mapping[int, int],
    what: str,
    out: Found,
) -> int | None:
    """Bottom-up: the parent's log says the child was queued and how it ended, after the
    child's terminal update, and records the call's result after it too.

    Returns where the parent's result of the call stands in the merged log (``None``:
    the child did not end, or the parent recorded no result).
    """
    terminal = _terminal(node)
    result_event = next(
        (
            e
            for e in parent.events
            if isinstance(e, RunItemEvent)
            and isinstance(e.item, ToolResult)
            and e.item.call_id == call_id
        ),
        None,
    )
    if not any(
        isinstance(e, RunChild) and e.child_id == node.run_id and e.status is RunStatus.QUEUED
        for e in parent.events
    ):
        out.append(
            Violation("tree-bottom-up", f"{what}: no run.child 'queued' in the parent's log")
        )
    if terminal is None:
        if parent.outcome is not None:
            out.append(Violation("tree-bottom-up", f"{what} has no terminal update"))
        return None
    _check_child_ended(node, parent, terminal, position, what, out)
    if result_event is None:
        return None
    result_at = position.get(id(result_event))
    terminal_at = position.get(id(terminal))
    if result_at is not None and terminal_at is not None and terminal_at > result_at:
        out.append(
            Violation(
                "tree-bottom-up",
                f"{what}: the parent recorded the call's result before the child's terminal update",
            )
        )
    return result_at


def _check_child_ended(
    node: NodeRecord,
    parent: NodeRecord,
    terminal: RunUpdated,
    position: Mapping[int, int],
    what: str,
    out: Found,
) -> None:
    """The parent's log says, once, how the child ended, after the child's terminal
    update."""
    ended = [
        e
        for e in parent.events
        if isinstance(e, RunChild)
        and e.child_id == node.run_id
        and e.status is not RunStatus.QUEUED
    ]
    if len(ended) != 1 or ended[0].status is not terminal.status:
        said = [e.status.value for e in ended]
        out.append(
            Violation(
                "tree-bottom-up",
                f"{what} ended {terminal.status.value}, the parent's run.child events say {said}",
            )
        )
    elif position.get(id(ended[0]), -1) < position.get(id(terminal), -1):
        out.append(
            Violation(
                "tree-bottom-up", f"{what}: run.child came before the child's terminal update"
            )
        )


def _check_child_calls(
    tree: TreeObservation, node: NodeRecord, result_at: int, what: str, out: Found
) -> None:
    """No tool call of the child's subtree outlives the parent's call: all ended by the
    time the parent recorded the call's result."""
    result_time = tree.event_times[result_at]
    below = {n.run_id for n in subtree(node, tree.nodes)}
    for call in tree.tool_calls:
        if call.run_id not in below:
            continue
        late = call.ended_at is not None and call.ended_at > result_time + EPSILON
        if call.state == "running" or late:
            when = "still runs" if call.state == "running" else f"ended at t={call.ended_at:g}"
            out.append(
                Violation(
                    "tree-call-scope",
                    f"{what}: tool {call.tool!r} (call {call.call_id!r} of run {call.run_id})"
                    f" {when}, after the parent's call got its result at t={result_time:g}",
                )
            )


def _check_child_cancel(
    node: NodeRecord,
    parent: NodeRecord,
    by_id: Mapping[str, NodeRecord],
    out: Found,
    cancels_known: bool,
) -> None:
    """Who may have cancelled a child, and what its own cancel does to its parent."""
    result = node.outcome
    if result is None or result.status is not RunStatus.CANCELLED:
        return
    what = f"run {node.run_id} ({node.agent})"
    own = [c for c in node.cancels if c.live and c.kind in ("immediate", "after_turn")]
    ancestors = {a.run_id for a in _ancestors(node, by_id)}
    terminal = _terminal(node)
    by = terminal.detail.get("by") if terminal is not None else None
    if result.reason == "parent cancelled":
        if by not in ancestors:
            out.append(
                Violation(
                    "cancel-reason",
                    f"{what} was cancelled 'parent cancelled' by {by!r}, not one of its ancestors",
                )
            )
        return
    if cancels_known and (not own or result.reason != own[0].reason):
        allowed = [own[0].reason] if own else []
        out.append(
            Violation(
                "cancel-reason",
                f"{what} was cancelled with reason {result.reason!r}; its cancels allow"
                f" {[*allowed, 'parent cancelled']}",
            )
        )
        return
    _check_parent_goes_on(node, parent, what, out, cancels_known)


def _check_parent_goes_on(
    node: NodeRecord, parent: NodeRecord, what: str, out: Found, cancels_known: bool
) -> None:
    """A child's own cancel ended it: the parent goes on (unless something cancelled it
    too), and the parent's call of the child ends ``cancelled``."""
    result = node.outcome
    parent_result = parent.outcome
    if result is None or parent_result is None:
        return
    if (
        cancels_known
        and parent_result.status is RunStatus.CANCELLED
        and not any(c.live for c in parent.cancels)
    ):
        out.append(
            Violation(
                "tree-subtree-cancel",
                f"cancelling {what} alone ended its parent run {parent.run_id} cancelled too"
                f" ({parent_result.reason!r})",
            )
        )
    prefix = f"sub-agent {node.agent} "
    for item in parent_result.conversation:
        if (
            isinstance(item, ToolResult)
            and item.call_id == node.call_id
            and item.output.startswith(prefix)
            and item.status != "cancelled"
        ):
            out.append(
                Violation(
                    "tree-subtree-cancel",
                    f"{what} was cancelled ({result.reason!r}), yet its parent's call"
                    f" {item.call_id!r} ended {item.status!r}: {item.output!r}",
                )
            )
