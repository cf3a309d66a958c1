"""Durable runs on Temporal (the ``temporal`` extra; DESIGN §20, docs/temporal.md).

A run is a workflow (workflow id = run id) whose history holds the start request, the
steering ops and the terminal result; an attempt of the run is one activity on a
worker, which runs the ordinary trio_agents run under Trio (one long-lived Trio thread
per worker process). A cancel from Temporal (``temporal workflow cancel``, the UI)
stops the run, waits for its repaired result, records it, and only then ends the
workflow CANCELED. A lost worker's attempt is retried on another worker; a run that
failed or was cancelled on its own is not.

Every face serves these runs through :class:`TemporalHost` (``trio-agents serve
--temporal``), which reads their events and records from the shared store that the
workers' attempts write (a :class:`SharedRunStore`: :class:`RunStore`, one SQLite file
on one disk, or :class:`PostgresRunStore`, one PostgreSQL database for any number of
machines; :func:`shared_storage` picks it, and the sessions, from one string); workers run as ``trio-agents worker`` processes
(:class:`TemporalWorker`, :func:`run_worker`) or inside a Trio program
(:func:`serve_worker`). A small asyncio client API (``start_run``, ``cancel_run``,
``inject_run``, ``withdraw_run``, ``approve_call``, ``reject_call``, ``run_result``)
serves scripts without a host; :func:`replayer` replays recorded histories against
this version's workflow code, the check before upgrading workers while runs are open.
"""

from typing import TYPE_CHECKING, Any

from ._activity import SessionFactory as SessionFactory
from ._activity import sqlite_sessions as sqlite_sessions
from ._run_client import approve_call as approve_call
from ._run_client import cancel_run as cancel_run
from ._run_client import inject_run as inject_run
from ._run_client import reject_call as reject_call
from ._run_client import run_result as run_result
from ._run_client import start_run as start_run
from ._run_client import withdraw_run as withdraw_run
from ._run_store import RunStore as RunStore
from ._shared_store import RunStoreError as RunStoreError
from ._shared_store import SharedRunStore as SharedRunStore
from ._stores import postgres_sessions as postgres_sessions
from ._stores import shared_storage as shared_storage
from ._temporal_host import TemporalHost as TemporalHost
from ._trio_worker import DEFAULT_TASK_QUEUE as DEFAULT_TASK_QUEUE
from ._trio_worker import TemporalWorker as TemporalWorker
from ._trio_worker import replayer as replayer
from ._trio_worker import run_worker as run_worker
from ._trio_worker import serve_worker as serve_worker
from ._types import CANCELLED_BY_TEMPORAL as CANCELLED_BY_TEMPORAL
from ._types import OpAnswer as OpAnswer
from ._types import RunOutcome as RunOutcome
from ._types import RunRequest as RunRequest
from ._workflow import RunWorkflow as RunWorkflow

if TYPE_CHECKING:
    from ._pg_run_store import PostgresRunStore as PostgresRunStore

__all__ = [
    "CANCELLED_BY_TEMPORAL",
    "DEFAULT_TASK_QUEUE",
    "OpAnswer",
    "PostgresRunStore",
    "RunOutcome",
    "RunRequest",
    "RunStore",
    "RunStoreError",
    "RunWorkflow",
    "SessionFactory",
    "SharedRunStore",
    "TemporalHost",
    "TemporalWorker",
    "approve_call",
    "cancel_run",
    "inject_run",
    "postgres_sessions",
    "reject_call",
    "replayer",
    "run_result",
    "run_worker",
    "serve_worker",
    "shared_storage",
    "sqlite_sessions",
    "start_run",
    "withdraw_run",
]


def __getattr__(name: str) -> Any:
    # Imported on first use, so that the package works without the `postgres` extra.
    if name == "PostgresRunStore":
        from ._pg_run_store import PostgresRunStore

        return PostgresRunStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazy name too, when it imports (see trio_agents.sessions.__dir__).
    try:
        from . import _pg_run_store  # noqa: F401
    except ImportError:
        return sorted(globals())
    return sorted({*globals(), "PostgresRunStore"})
