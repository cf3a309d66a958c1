"""The invariant checker's entry point: :func:`check_run`, every invariant of one
observed example — the root run's, its session's, and for a run tree every run's
below it and the tree's own."""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ._event_checks import check_clean_text, events_report, unmarked
from ._faults import Faults
from ._invariants import Found, Report, Violation, in_order
from ._observation import Observation, TreeObservation
from ._run_checks import (
    check_cancels,
    check_ends,
    check_hooks,
    check_injections,
    check_leaks,
    check_model,
    check_subscribers,
    check_tool_cancellation,
)
from ._session_checks import check_session
from ._tree_checks import about_run, check_tree_invariants, subtree

__all__ = ["check_run"]


def check_run(observation: Observation, *, max_cancel_latency: float | None = None) -> Report:
    """Check every lifecycle invariant (:data:`INVARIANTS`) of one observed example.

    ``max_cancel_latency`` bounds the virtual time from the first immediate (or outer)
    cancel to the terminal update (from the end of a shielded fault tool's shield, if
    one was running), and from a run's own end to its terminal update; by default the
    run's ``cleanup_timeout``, the one deadline of its whole cleanup.

    For a :func:`~trio_agents.testing.run_tree_schedule` observation it also checks
    every run below the root as a run of its own (its log, result, conversation,
    tools, injections, tool cancellation, hooks balanced, cancel latency), and the
    tree invariants (``tree-call-scope``, ``tree-bottom-up``, ``tree-conversations``,
    ``tree-subtree-cancel``); violations about a run below the root name it. Each
    level of the tree has its own cleanup deadline, so a run's latency bound is
    ``max_cancel_latency`` times one plus the number of levels below it.
    """
    obs = observation
    bound = obs.cleanup_timeout if max_cancel_latency is None else max_cancel_latency
    per_level = bound
    if obs.tree is not None and obs.tree.nodes:
        # Each level of the tree has its own cleanup deadline, from when its scope is
        # left: a parent's starts once its children's repairs are done.
        bound *= 1 + obs.tree.nodes[0].height
    # The output spec the run asked the model for (the same on every request).
    spec = obs.requests[-1].output if obs.requests else None
    out = list(events_report(obs.outcome, obs.events, spec).violations)
    result = obs.outcome
    if result is not None and tuple(
        map(unmarked, result.new_items[: len(obs.input_items)])
    ) != tuple(map(unmarked, obs.input_items)):
        out.append(Violation("result", "result.new_items does not start with the run's input"))
    checks: list[Callable[[], None]] = [
        lambda: check_clean_text(None, (), obs.requests, out),
        lambda: check_ends(obs, out),
        lambda: check_tool_cancellation(obs, out),
        lambda: check_model(obs, out),
        lambda: check_subscribers(obs, out),
        lambda: check_cancels(obs, bound, out),
        lambda: check_hooks(obs, out),
        lambda: check_session(obs, out),
        lambda: check_leaks(obs, out),
    ]
    if result is not None:
        checks.insert(2, lambda: check_injections(obs, result, out))
    if obs.tree is not None:
        tree = obs.tree
        checks.append(lambda: check_tree_invariants(tree, out))
        checks.append(lambda: _check_tree_nodes(obs, tree, per_level, out))
    for check in checks:
        check()
    return Report(in_order(out), obs.describe())


# The per-run checks a child gets (as the root gets them from check_run), with what
# cannot be told apart for a child left out: its cancel reason is checked above (a
# parent may cancel it for reasons of its own), and whether a hook error failed it
# (its model's errors are counted per agent, not per run).
_CHILD_SKIPS = frozenset({"cancel-reason", "cancel-before-start", "hook-errors"})


def _check_tree_nodes(obs: Observation, tree: TreeObservation, bound: float, out: Found) -> None:
    """Every run below the root, checked as a run of its own (``bound``: the latency
    bound per level of the tree, as for the root)."""
    for node in tree.nodes[1:]:
        below = {n.run_id for n in subtree(node, tree.nodes)}
        view = attrs.evolve(
            obs,
            run_id=node.run_id,
            outcome=node.outcome,
            events=node.events,
            event_times=node.event_times,
            script=(),
            schedule=(),
            applied=(),
            requests=(),
            open_streams=0,
            cancels=node.cancels,
            injections=node.injections,
            subscribers=(),
            op_errors=(),
            leaked_tasks=(),
            leaked_processes=(),
            tool_calls=node.tool_calls,
            input_items=(),
            run_error=None,
            ended={},
            faults=Faults(),
            streams=(),
            hook_calls=node.hook_calls,
            session_calls=(),
            stored=None,
            fresh_run=None,
            leaked_threads=(),
            tree=attrs.evolve(
                tree, tool_calls=tuple(c for c in tree.tool_calls if c.run_id in below)
            ),
        )
        found: Found = list(events_report(node.outcome, node.events, None).violations)
        node_bound = bound * (1 + node.height)
        if node.outcome is not None:
            check_injections(view, node.outcome, found)
        check_tool_cancellation(view, found, obs.applied)
        check_hooks(view, found)
        if len(node.event_times) == len(node.events):
            check_cancels(view, node_bound, found)
        out.extend(about_run(node, v) for v in found if v.invariant not in _CHILD_SKIPS)
