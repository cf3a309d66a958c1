"""Starting and hosting a host's runs, and what a disconnect does to them.

Each run is a task in the host's nursery (:func:`start_run`; a run a distributed host
resumes: :func:`launch`) with the session its host's placement gives it
(:class:`~._placement.RunPlacement`: in one process, in memory (metered) or a
factory's (scoped to its principal); a distributed host's, claimed in its shared store
first). The run's bookkeeping (ids, per-principal counters, retention) is the
:class:`~._registry.Registry`'s. A connection that goes away applies its runs'
``on_disconnect`` (:func:`disconnected`): here, and, for its runs that run elsewhere
now, through the placement.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast, final

import attrs
import trio

from .. import Agent, Item, Run, SessionBusyError, serve_run
from .._limits import UsageLimits
from ..sessions import Session
from ._error_codes import ProtocolError
from ._placement import PlacedRun, RunStart
from ._policies import RunStartInfo, call_context_hook
from ._registry import Owner, Registry, RunEntry

__all__ = ["DISCONNECTED", "disconnected", "launch", "start_run"]

logger = logging.getLogger("trio_agents.hosting")

DISCONNECTED = "client disconnected"
"""The reason of a run cancelled by its client's disconnect (``on_disconnect="cancel"``)."""


@final
@attrs.define
class _Started:
    """A task status that records the run on its entry the moment it exists, so the
    entry never depends on when the starter resumes."""

    entry: RunEntry
    inner: trio.TaskStatus[Run]
    then: Callable[[Run], None] | None = None

    def started(self, run: Run) -> None:
        self.entry.run = run
        if self.then is not None:
            self.then(run)  # before the run's first checkpoint: before any model call
        self.inner.started(run)


async def start_run(
    registry: Registry,
    principal: str,
    owner: Owner | None,
    agent_name: str,
    items: tuple[Item, ...],
    *,
    input_bytes: int,
    session_id: str | None,
    on_disconnect: str,
    on_busy: str,
    input_overlap: str = "keep",
    client_node: str | None = None,
    run_id: str | None = None,
    command: int | None = None,
    limits: UsageLimits | None = None,
) -> RunEntry:
    """Start a run in the host's nursery (after the admission checks:
    ``Registry.check_room``, ``Registry.take_start_token``).

    Its session and record come from the host's placement (:meth:`RunPlacement.place
    <trio_agents.hosting._placement.RunPlacement.place>`); ``client_node`` and
    ``command`` are a start another process placed here (see :class:`RunStart`), which
    has its id (``run_id``).

    The session's busy policy is the core's ``on_busy``: a busy session with
    ``"reject"`` answers ``session_busy``; ``"interrupt"``/``"enqueue"`` start the
    run ``queued`` behind the session's active run.

    ``limits`` are the run's (the server's maximum applied: ``_policies.py``); the
    server's ``context`` hook is called first of all, so a hook that raises
    (``internal``) leaves nothing behind: no session claimed, no record, no run.
    """
    run_id = run_id or f"run_{uuid.uuid4().hex}"
    extra: dict[str, Any] = {}
    if limits is not None:
        extra["limits"] = limits
    if input_overlap != "keep":
        extra["input_overlap"] = input_overlap
    start = RunStart(
        run_id=run_id,
        principal=principal,
        agent=agent_name,
        session_id=session_id,
        input=items,
        on_busy=on_busy,
        on_disconnect=on_disconnect,
        owned=owner is not None,
        client_node=client_node,
        command=command,
        limits=limits,
    )
    if registry.context_hook is not None:
        extra["context"] = await _context(registry, start)
    placement = registry.placement
    placed = await placement.place(start)
    entry = RunEntry(
        run_id=run_id,
        principal=principal,
        agent=agent_name,
        session_id=session_id,
        on_disconnect=on_disconnect,
        owner=owner,
        input_bytes=input_bytes,
        fence=placed.fence,
    )
    registry.register(entry)
    try:
        await launch(registry, entry, items, placed, extra)
    except SessionBusyError:
        raise ProtocolError("session_busy", f"session {session_id!r} has an active run") from None
    except (TypeError, ValueError) as exc:  # the input is not a valid conversation
        raise ProtocolError("invalid_request", str(exc)) from None
    finally:
        if entry.run is None:
            await placement.not_started(start, placed)
    assert entry.run is not None
    entry.log = placement.started(start, placed, entry.run)
    return entry


async def _context(registry: Registry, start: RunStart) -> Any:
    """The run's context from the host's hook (which raises ``internal`` on error)."""
    assert registry.context_hook is not None
    info = RunStartInfo(
        run_id=start.run_id,
        agent=start.agent,
        session_id=start.session_id,
        input=start.input,
        limits=start.limits,
    )
    return await call_context_hook(registry.context_hook, start.principal, info)


async def launch(
    registry: Registry,
    entry: RunEntry,
    items: tuple[Item, ...],
    placed: PlacedRun,
    options: Mapping[str, Any],
    then: Callable[[Run], None] | None = None,
) -> Run:
    """Start the task of ``entry``'s run (registered) in the host's nursery, with its
    placed session and ``options`` (its :attr:`PlacedRun.run_options` added): a new run
    (:func:`start_run`), or a run a distributed host resumes (a ``resume`` option).
    ``then(run)`` is called the moment the run exists, before it can call its model or
    end. A run that does not start is forgotten at once (the error propagates)."""
    assert registry.nursery is not None
    try:
        entry.run = await registry.nursery.start(
            _run_task,
            registry,
            entry,
            registry.agents[entry.agent],
            items,
            placed,
            {**options, **placed.run_options},
            then,
        )
    finally:
        if entry.run is None:
            registry.end(entry, retain=False)
    return entry.run


async def _run_task(
    registry: Registry,
    entry: RunEntry,
    agent: Agent,
    items: tuple[Item, ...],
    placed: PlacedRun,
    options: dict[str, Any],
    then: Callable[[Run], None] | None,
    *,
    task_status: trio.TaskStatus[Run],
) -> None:
    session: Session | None = placed.session
    try:
        # Shielded: only run.cancel(reason) stops a run (shutdown uses "server
        # shutdown"); the scope is cancelled only to force a run past the bound.
        with entry.host_scope:
            await serve_run(
                agent,
                items,
                session=session,
                run_id=entry.run_id,
                task_status=cast(trio.TaskStatus[Run], _Started(entry, task_status, then)),
                on_busy=placed.on_busy,
                **{**registry.run_options, **options},
            )
    finally:
        if entry.run is not None:
            registry.end(entry, retain=True)
        aclose = getattr(session, "aclose", None)
        if placed.close_session and aclose is not None:
            with trio.move_on_after(5.0, shield=True):
                try:
                    await aclose()
                except Exception:
                    logger.exception("closing the session of %s failed", entry.run_id)


def disconnected(registry: Registry, owner: Owner) -> None:
    """The connection ``owner`` is gone: apply the ``on_disconnect`` of the runs it
    started (here, and, through the placement, those that run elsewhere now)."""
    for entry in list(owner.owned):
        entry.owner = None
        if entry.on_disconnect == "cancel" and entry.run is not None:
            entry.run.cancel(DISCONNECTED)
    placed, owner.placed = owner.placed, set()
    if placed and registry.nursery is not None:
        registry.nursery.start_soon(
            registry.placement.cancel_elsewhere, owner.principal, placed, DISCONNECTED
        )
