""":func:`run_timeline`: a run tree's :class:`~trio_agents.Timeline` (DESIGN §23) from
any :class:`~trio_agents.hosting.RunHost`, derived from the events the host serves —
so every host has it (one process, a cluster node reading another node's persisted
log, any host to come) without an op of its own, and it is never a second record.

A snapshot of a live tree: the host's tree subscription ends only with the tree, so
the read stops once it holds, for the run and each descendant the host reported, the
event that was its latest when asked (``RunInfo.seq``), and an event of every child a
``run.child`` event announced; a finished tree's is read to its end.
"""

from __future__ import annotations

from typing import Any

import trio

from .._timeline import Timeline, timeline
from ._host import HostError, RunHost

__all__ = ["run_timeline"]

# After the run's own latest event was read, how long the read waits for a descendant's
# (seconds). Each is in the host's log before the read begins, so on a host that serves
# its logs as they are it is there at once; the wait is only for one the tree's
# retention dropped meanwhile, which would otherwise hold the answer until the tree ends.
_GRACE = 1.0


async def run_timeline(host: RunHost, principal: str, run_id: str) -> Timeline:
    """The timeline of ``run_id``'s subtree as ``host`` serves its events now (what
    ``GET /runs/{id}/timeline`` answers).

    Raises:
        HostError: ``not_found`` (no such run of ``principal``), or what the host's
            ``get`` and ``events`` raise.
    """
    info = await host.get(principal, run_id)
    wanted = {run_id: info.seq}
    below = list(info.children or ())
    while below:
        child = below.pop()
        try:
            child_info = await host.get(principal, child)
        except HostError as exc:
            if exc.code != "not_found":
                raise
            continue  # a child another node has not persisted yet: none of it to wait for
        wanted[child] = child_info.seq
        below.extend(child_info.children or ())
    events: list[Any] = []
    seen: dict[str, int] = {}

    def complete() -> bool:
        return all(seen.get(run, 0) >= seq for run, seq in wanted.items())

    async with host.events(principal, run_id, from_seq=None, tree=True) as stream:
        # No deadline until the run's own latest event is in; then a grace for its
        # descendants' (see _GRACE). A finished tree's stream ends by itself.
        with trio.CancelScope() as scope:
            async for hosted in stream:
                event = hosted.event
                events.append(event)
                seen[hosted.run_id] = max(seen.get(hosted.run_id, 0), hosted.seq)
                if event.get("type") == "run.child" and isinstance(event.get("child_id"), str):
                    # A child the host did not list (a cluster node answering for a tree
                    # another node runs): at least its first event.
                    wanted.setdefault(event["child_id"], 1)
                if complete():
                    break
                if scope.deadline == float("inf") and seen.get(run_id, 0) >= info.seq:
                    scope.deadline = trio.current_time() + _GRACE
    return timeline(events, names={run_id: info.agent})
