"""Durable runs on Temporal (the ``temporal`` extra; DESIGN §20, docs/temporal.md).

A run is a workflow (workflow id = run id) whose history holds the start request, the
steering ops and the terminal result; an attempt of the run is one activity on a
worker, which runs the ordinary trio_agents run under Trio (one long-lived Trio thread
per worker process). A cancel from Temporal (``temporal workflow cancel``, the UI)
stops the run, waits for its repaired result, records it, and only then ends the
workflow CANCELED. A lost worker's attempt is retried on another worker; a run that
failed or was cancelled on its own is not.

Built so far: the workflow, the worker (``TemporalWorker``, ``run_worker``, ``trio-agents
worker``), and a small client API (``start_run``, ``cancel_run``, ``inject_run``,
``withdraw_run``, ``approve_call``, ``reject_call``, ``run_result``). Not built yet: ``TemporalHost`` (every face over Temporal).
"""

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
from ._temporal_host import TemporalHost as TemporalHost
from ._trio_worker import DEFAULT_TASK_QUEUE as DEFAULT_TASK_QUEUE
from ._trio_worker import TemporalWorker as TemporalWorker
from ._trio_worker import run_worker as run_worker
from ._trio_worker import serve_worker as serve_worker
from ._types import CANCELLED_BY_TEMPORAL as CANCELLED_BY_TEMPORAL
from ._types import OpAnswer as OpAnswer
from ._types import RunOutcome as RunOutcome
from ._types import RunRequest as RunRequest
from ._workflow import RunWorkflow as RunWorkflow

__all__ = [
    "CANCELLED_BY_TEMPORAL",
    "DEFAULT_TASK_QUEUE",
    "OpAnswer",
    "RunOutcome",
    "RunRequest",
    "RunStore",
    "RunWorkflow",
    "SessionFactory",
    "TemporalHost",
    "TemporalWorker",
    "approve_call",
    "cancel_run",
    "inject_run",
    "reject_call",
    "run_result",
    "run_worker",
    "serve_worker",
    "sqlite_sessions",
    "start_run",
    "withdraw_run",
]
