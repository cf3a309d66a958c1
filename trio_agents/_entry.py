"""The entry points: ``open_run`` (a context manager), ``serve_run`` (the nursery-passing
form) and ``run`` (one-shot). Each builds a :class:`~trio_agents.Run`, claims its
session, and runs :meth:`Run._serve` in a nursery of the caller's.

The top of the run core's chain (docs/architecture.md): a root run is made here, and
handed :data:`~trio_agents._children.CHILDREN`, what its tool calls start child runs
with.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from ._agent import Agent
from ._children import CHILDREN
from ._hold import hold
from ._options import make_options
from ._result import RunResult
from ._run import Run, RunInput
from .sessions._base import Session

__all__ = ["open_run", "run", "serve_run"]


async def serve_run(
    agent: Agent,
    input: RunInput,
    *,
    session: Session | None = None,
    run_id: str | None = None,
    task_status: trio.TaskStatus[Run] = trio.TASK_STATUS_IGNORED,
    **options: Any,
) -> RunResult:
    """Run ``agent`` on ``input`` as a task: ``run = await nursery.start(serve_run, ...)``.

    The nursery-passing form of :func:`open_run`: ``task_status.started`` hands back the
    :class:`Run`, and the task ends when the run does, returning its result. If the
    nursery's scope is cancelled, the run records ``cancelled`` / ``"parent
    cancelled"`` after its bounded repair and ``trio.Cancelled`` propagates.
    """
    handle = _root(agent, input, session, run_id, options)
    handle._claim_session()
    await handle._serve(task_status=task_status)
    assert handle.result is not None
    return handle.result


@asynccontextmanager
async def open_run(
    agent: Agent,
    input: RunInput,
    *,
    session: Session | None = None,
    run_id: str | None = None,
    **options: Any,
) -> AsyncIterator[Run]:
    """Start a run and yield its :class:`Run` handle.

    Leaving the block normally waits for the run to end. An exception other than
    ``trio.Cancelled`` leaving the block cancels the run (reason ``"caller exited"``),
    waits for its repair, and propagates. A cancellation from an enclosing scope ends
    the run with reason ``"parent cancelled"`` and propagates. A failed or cancelled run
    is never raised: see ``run.result.status``.

    Options (keyword arguments): ``cleanup_timeout`` (5 s), ``max_concurrent_tools`` (8),
    ``inbox_capacity`` (1024 items), ``event_retention`` (65536 events),
    ``on_tool_error`` (``"return"`` or ``"fail"``), ``hooks`` (:class:`RunHooks`),
    ``thread_limiter`` (for sync tools), ``max_turns`` (overrides the agent's),
    ``max_depth`` (32: how many levels of child runs may grow below the run; a deeper
    one is not started, docs/multi-agent.md), ``max_handoffs`` (10: how many times the
    run may switch agents; a transfer past it is answered with an error),
    ``on_busy`` (when ``session`` already has an active run in this process:
    ``"reject"`` raises :class:`SessionBusyError` at once, ``"interrupt"`` cancels that
    run with reason ``"superseded"`` and starts once its repair is persisted,
    ``"enqueue"`` waits for it to end; the run is ``queued`` while it waits, and a run
    cancelled while it waits leaves the session untouched). For durable runs (a cluster,
    docs/cluster.md): ``before_tool`` (``async def before_tool(call)``, awaited just
    before each tool call executes, after its approval; if it raises, the tool does not
    run and the call gets ``"not started: …"``) and ``resume`` (a :class:`Resume`:
    continue a run another process started, from ``session`` and with empty ``input``).
    ``input_overlap`` (``"keep"``; ``"skip"``: the input's first user messages are
    dropped when they equal, by content, the user messages that end the stored
    conversation, for a client that re-sends its whole message list; an input left
    empty is a retry of those, checked again by the input guardrails, or fails the run
    with :class:`InvalidConversationError` when all of them were rejected).
    ``park_after`` (None; seconds): a turn whose approval wait lasted that long *parks*
    the run — it ends without a cancel repair, its calls awaiting approval left open in
    its session, ``result.parked`` true — for a run resumed from the session
    (``resume``) to wait for the same decisions (docs/lifecycle.md); needs a session.
    ``record_requests`` (False; True: each model request is kept in the event log as a
    ``model.request`` event, for :func:`replay` and the timeline, docs/time-travel.md)
    and ``record_requests_max_bytes`` (1,000,000: a request whose JSON is larger is
    recorded as omitted, with its size). Child runs inherit both.

    Raises:
        SessionBusyError: ``on_busy="reject"`` and the session is busy.
        ValueError: ``resume`` without a session, or with input; ``park_after``
            without a session.
    """
    handle = _root(agent, input, session, run_id, options)
    handle._claim_session()
    async with hold(handle) as held:
        yield held


async def run(
    agent: Agent,
    input: RunInput,
    *,
    session: Session | None = None,
    run_id: str | None = None,
    **options: Any,
) -> RunResult:
    """Run ``agent`` on ``input`` to the end and return the :class:`RunResult`.

    Never raises for a failed or cancelled run: call ``result.raise_for_status()``.
    """
    # open_run's nursery, task and start-up handshake exist for a body that holds the
    # handle; here there is none, so this task runs the run (same cancel semantics: an
    # outer cancellation is recorded as "parent cancelled", then propagates).
    handle = _root(agent, input, session, run_id, options)
    del options  # made into the run's RunOptions: not held by this frame for the run
    handle._claim_session()
    await handle._serve(direct=True)
    assert handle.result is not None
    return handle.result


def _root(
    agent: Agent,
    input: RunInput,
    session: Session | None,
    run_id: str | None,
    options: dict[str, Any],
) -> Run:
    """A root run (no parent), its calls able to start child runs."""
    return Run(
        agent,
        input,
        session=session,
        run_id=run_id,
        options=make_options(options),
        _child_starter=CHILDREN,
    )
