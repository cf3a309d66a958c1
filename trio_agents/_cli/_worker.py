"""``trio-agents worker --temporal HOST:PORT --app MOD:AGENTS``: a Temporal worker.

It polls a task queue of the Temporal cluster at HOST:PORT and runs the attempts of
the runs started there (``trio_agents.temporal``; needs the ``temporal`` extra), each in
the worker's one Trio thread. Ctrl-C or SIGTERM stops it: the attempts still running
are stopped and retried by Temporal on another worker. See ``docs/temporal.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from typing import TYPE_CHECKING, NoReturn, TextIO

import trio

from ._errors import CLIError, explain
from ._serve import is_postgres_url, load_app, temporal_storage

if TYPE_CHECKING:
    from ..temporal import SharedRunStore

__all__ = ["worker_command"]


def worker_command(args: argparse.Namespace, out: TextIO) -> int:
    """Run a worker until Ctrl-C or SIGTERM, then exit the process: status 0, or 1 with
    one line on stderr when Temporal cannot be reached (this never returns once the
    worker started)."""
    try:
        from ..temporal import RunStoreError, run_worker
    except ImportError as exc:
        raise CLIError(
            f"the worker needs the temporal extra (pip install 'trio-agents[temporal]'): {exc}"
        ) from None
    agents = load_app(args.app)
    # The runs' events and records live with their sessions (SQLite: beside them, in
    # FILE.runs; PostgreSQL: in the same database): what a server's TemporalHost
    # (`trio-agents serve --temporal`) serves to every face.
    store, sessions, stored = temporal_storage(args.db)
    if is_postgres_url(args.db):
        try:
            trio.run(_open, store)  # its tables are created (or checked) before any run
        except RunStoreError as exc:
            raise CLIError(f"--db: {' '.join(str(exc).split())}") from None

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, task.cancel)
        print(
            f"trio-agents worker: agents {', '.join(sorted(agents))} on task queue"
            f" {args.task_queue!r} of {args.temporal}, {stored}",
            file=out,
            flush=True,
        )
        try:
            await run_worker(
                args.temporal,
                agents,
                sessions=sessions,
                task_queue=args.task_queue,
                namespace=args.namespace,
                host=args.host,
                store=store,
            )
        except RuntimeError as exc:
            raise CLIError(f"cannot reach Temporal at {args.temporal}: {exc}") from None

    try:
        with contextlib.suppress(asyncio.CancelledError):  # Ctrl-C or SIGTERM: it stopped
            asyncio.run(main())
    except BaseException as exc:
        explained = explain(exc)
        if explained is None:
            raise  # a bug: keep the traceback
        message, status = explained
        print(f"trio-agents: error: {message}", file=sys.stderr, flush=True)
        _exit(out, status)
    print("trio-agents worker: stopped", file=out, flush=True)
    _exit(out, 0)


async def _open(store: SharedRunStore) -> None:
    async with store:
        pass


def _exit(out: TextIO, status: int) -> NoReturn:
    """Leave without the interpreter's finalization: temporalio's Rust threads can abort
    it ("PyGILState_Release ... must be current", temporalio/sdk-python#300), which would
    turn a clean exit (or a one-line error) into SIGABRT."""
    out.flush()
    sys.stderr.flush()
    os._exit(status)
