"""Watching what a run leaves behind: tasks, worker threads and child processes.

Not only the harness's fakes: every sync tool of a run gets its thread through the
run's ``thread_limiter``, which the runner wraps (:class:`ClockHoldingLimiter` knows
which of its threads still run), and any other thread started during the run is seen
by comparing :func:`threading.enumerate` before and after. Child processes are found
by the process tree (``/proc``: every descendant of this process that was not there
before the run), so a tool that hands its child an explicit ``env=`` is seen too; a
marker in the environment (inherited) still finds a child that left the tree (a
double fork).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Collection, Iterator

import trio

from ._clock import THREAD_PREFIX, ClockHoldingLimiter

__all__ = [
    "MARKER_ENV",
    "ThreadWatch",
    "all_tasks",
    "install_audit_hook",
    "leaked_processes",
    "marked_environment",
    "process_tree",
    "spawn_count",
]

MARKER_ENV = "TRIO_AGENTS_TESTING_RUN"
"""Set in the environment while a run executes: its child processes inherit it."""

# ------------------------------------------------------------------ processes

_spawns = 0
_hook_installed = False


def _audit(event: str, _args: tuple[object, ...]) -> None:
    global _spawns
    if event in ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.system", "os.exec"):
        _spawns += 1


def install_audit_hook() -> None:
    """Count process spawns (an audit hook, installed once per process)."""
    global _hook_installed
    if not _hook_installed:
        sys.addaudithook(_audit)
        _hook_installed = True


def spawn_count() -> int:
    """How many processes this process has spawned since the hook was installed."""
    return _spawns


@contextlib.contextmanager
def marked_environment(run_id: str) -> Iterator[None]:
    """Set :data:`MARKER_ENV` to ``run_id`` for the block."""
    previous = os.environ.get(MARKER_ENV)
    os.environ[MARKER_ENV] = run_id
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(MARKER_ENV, None)
        else:
            os.environ[MARKER_ENV] = previous


def _marked_processes(run_id: str) -> list[tuple[int, str]]:
    """Live processes whose environment carries the run's marker (Linux /proc)."""
    needle = f"{MARKER_ENV}={run_id}".encode()
    found: list[tuple[int, str]] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                environ = f.read()
            if needle not in environ.split(b"\0"):
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        found.append((int(entry), cmdline))
    return found


ProcessKey = tuple[int, str]
"""A process as ``(pid, start time)``: a pid alone may be reused."""


def _stat(pid: str) -> tuple[int, str, str] | None:
    """``(parent pid, state, start time)`` from ``/proc/<pid>/stat``, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold anything: split after
    # its last ')'. Then: state (3), ppid (4), ..., starttime (22).
    fields = raw[raw.rfind(")") + 2 :].split()
    if len(fields) < 20:
        return None
    return int(fields[1]), fields[0], fields[19]


def _children_by_task(pid: int) -> list[int] | None:
    """The children of ``pid`` from ``/proc/<pid>/task/*/children`` (cheap: a few
    small files), or None if the kernel has no such files."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found += [int(child) for child in f.read().split()]
        except FileNotFoundError:
            if tid == str(pid):
                return None  # no CONFIG_PROC_CHILDREN: the main thread always has one
        except OSError:
            continue
    return found


def _children_by_scan() -> dict[int, list[int]]:
    """Parent pid -> child pids, from every ``/proc/<pid>/stat`` (the fallback)."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return children
    for entry in entries:
        if entry.isdigit():
            stat = _stat(entry)
            if stat is not None:
                children.setdefault(stat[0], []).append(int(entry))
    return children


def process_tree(
    before: Collection[ProcessKey] = (), *, depth: int | None = None
) -> set[ProcessKey]:
    """Live (not zombie) descendants of this process, as ``(pid, start time)``.

    Processes in ``before`` (the tree taken before a run) are left out, and so is
    everything under them: a long-lived child that existed before (a test's server)
    may fork on its own without that being the run's doing. ``depth=1`` gives the
    children only, which is all a later call needs as its ``before``.
    """
    scanned: dict[int, list[int]] | None = None

    def children(pid: int) -> list[int]:
        nonlocal scanned
        found = _children_by_task(pid)
        if found is not None:
            return found
        if scanned is None:
            scanned = _children_by_scan()
        return scanned.get(pid, [])

    found: set[ProcessKey] = set()
    level = [os.getpid()]
    remaining = depth
    while level and (remaining is None or remaining > 0):
        next_level: list[int] = []
        for parent in level:
            for child in children(parent):
                stat = _stat(str(child))
                if stat is None or stat[1] in ("Z", "X"):
                    continue
                key = (child, stat[2])
                if key in before or key in found:
                    continue
                found.add(key)
                next_level.append(child)
        level = next_level
        remaining = None if remaining is None else remaining - 1
    return found


def _cmdline(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return None


def _new_descendants(before: Collection[ProcessKey]) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for key in sorted(process_tree(before)):
        cmdline = _cmdline(key[0])
        if cmdline is not None:
            found.append((key[0], cmdline))
    return found


def leaked_processes(
    run_id: str, before: Collection[ProcessKey] | None = None
) -> list[tuple[int, str]]:
    """Processes of the run still alive: descendants of this process that were not in
    ``before`` (the tree taken before the run; None: none are looked for), and marked
    ones. Killed ones get up to 1 s (real) to disappear."""
    deadline = time.monotonic() + 1.0
    while True:
        found = dict(_marked_processes(run_id))
        if before is not None:
            found.update(_new_descendants(before))
        if not found or time.monotonic() > deadline:
            return sorted(found.items())
        time.sleep(0.01)


# ------------------------------------------------------------------ tasks


def all_tasks() -> list[trio.lowlevel.Task]:
    """Every task of the current ``trio.run``."""
    tasks: list[trio.lowlevel.Task] = []

    def walk(task: trio.lowlevel.Task) -> None:
        tasks.append(task)
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child)

    root = trio.lowlevel.current_root_task()
    assert root is not None
    walk(root)
    return tasks


# ------------------------------------------------------------------ threads


def _busy(thread: threading.Thread) -> bool:
    # An idle Trio worker is named "Trio thread N"; a busy one after its job.
    return thread.is_alive() and not thread.name.startswith(("Trio thread ", THREAD_PREFIX))


class ThreadWatch:
    """The worker threads of one run: those of its ``thread_limiter`` and any thread
    started while it ran. :meth:`settle` waits (real time) for them to end."""

    def __init__(self, limiter: ClockHoldingLimiter) -> None:
        self.limiter = limiter
        self._before: Collection[threading.Thread] = frozenset(threading.enumerate())

    def _strays(self, exclude: threading.Thread | None = None) -> list[threading.Thread]:
        return [
            t
            for t in threading.enumerate()
            if t not in self._before and t is not exclude and _busy(t)
        ]

    def running(self) -> list[str]:
        """A description of each thread of the run still running."""
        found = [f"a worker thread of task {name!r}" for name in self.limiter.running()]
        found += [f"thread {t.name!r}" for t in self._strays()]
        return found

    async def settle(self, grace: float) -> list[str]:
        """Wait up to ``grace`` real seconds for every thread of the run to end;
        return those still running (see :meth:`running`)."""
        if not self.running():
            return []
        deadline = time.monotonic() + grace

        def wait() -> None:
            me = threading.current_thread()
            while time.monotonic() < deadline:
                if self.limiter.idle and not self._strays(exclude=me):
                    return
                time.sleep(0.002)

        # A worker thread: the limiter's releases arrive through the Trio loop.
        await trio.to_thread.run_sync(wait, abandon_on_cancel=True)
        await trio.lowlevel.checkpoint()  # let a just-finished thread report back
        return self.running()
