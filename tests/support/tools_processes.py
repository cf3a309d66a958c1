"""Process groups seen from /proc: did a cancelled tool's processes all die?

Shared by the tests of ``ToolContext.run_process`` alone and of tools in runs.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio
import trio.lowlevel


def group_members(pgid: int) -> dict[int, str]:
    """The members of process group ``pgid`` and their states, from /proc."""
    states: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path("/proc", name, "stat").read_text()
        except OSError:
            continue  # exited while we looked
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid:
            states[int(name)] = fields[0]
    return states


def live_members(pgid: int) -> list[int]:
    """The pids of the group's processes that have not exited (zombies have).

    A member may fork and exit between the listing of /proc and the reading of its
    state. So "none alive" needs two scans in a row that find the same members all
    dead: the second listing, made after they were all seen dead, includes every
    child they forked.
    """
    dead_before: set[int] | None = None
    while True:
        states = group_members(pgid)
        live = [pid for pid, state in states.items() if state not in ("Z", "X")]
        if live or dead_before == set(states):
            return live
        dead_before = set(states)


async def wait_until_group_dead(pgid: int) -> None:
    """Wait (on pidfds, not by polling) until no process of the group is alive.

    A SIGKILL takes effect when the target next runs, a moment after kill()
    returned; and orphans are reaped by init whenever init gets to it, so
    ``os.killpg(pgid, 0)`` may still find zombies for a while: those are dead too.
    """
    with trio.fail_after(10):  # far less than the minutes the processes would live
        while live := live_members(pgid):
            for pid in live:
                try:
                    pidfd = os.pidfd_open(pid)
                except ProcessLookupError:
                    continue
                try:
                    await trio.lowlevel.wait_readable(pidfd)
                finally:
                    os.close(pidfd)
