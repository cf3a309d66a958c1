"""An attempt's events into the shared store: :class:`EventWriter`.

One writer per attempt copies the run's whole tree of events (``run.events(tree=True)``)
into the shared store (:class:`~._shared_store.SharedRunStore`), with each touched run's record, in batches: a
collector takes every event as it comes (nothing in the run's own loop waits for the
store), and a flusher writes whatever arrived during the previous write in one
transaction — the batches grow with the load. The attempt returns its outcome only once
the writer has written the root's terminal update, so a workflow that completed has its
run's whole log in the store.

A write refused because a later attempt claimed the run (this worker was frozen, or cut
off, and Temporal retried the run elsewhere) fences this attempt: nothing more of it is
written, and its run is cancelled here (reason :data:`FENCED`).
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Mapping
from typing import Any, Final, final

import trio

from .._agent import Agent
from .._events import RunEvent, RunStatus, RunUpdated
from .._run import Run
from ..hosting import RunInfo
from ._shared_store import RunStoreError, SharedRunStore

__all__ = ["FENCED", "EventWriter"]

log = logging.getLogger("trio_agents.temporal")

FENCED: Final = "fenced: another attempt of this run took it over"
"""The reason a fenced attempt's run is cancelled with (in this worker only: the run
goes on, from what was written, in the attempt that took it over)."""

_RETRY_FIRST: Final = 0.05
_RETRY_MAX: Final = 2.0


@final
class EventWriter:
    """Writes the events of ``root`` (this attempt's run and its descendants) into
    ``store``; run :meth:`run` as a task once the run exists."""

    def __init__(
        self,
        store: SharedRunStore,
        root: Run,
        *,
        attempt: int,
        principal: str,
        agent_name: str,
        agents: Mapping[str, Agent],
        session_id: str | None,
        handover: Callable[[], bool] = lambda: False,
    ) -> None:
        self._store = store
        self._root = root
        self._attempt = attempt
        self._principal = principal
        self._agent_name = agent_name
        self._agents = agents
        self._session_id = session_id
        self._handover = handover
        # Taken now, before the run's next checkpoint: the cursor replays from the
        # oldest retained event, and nothing of this attempt is retained-out yet.
        self._cursor = root.events(tree=True)
        self._pending: list[RunEvent] = []
        self._arrived = trio.Event()
        self._collected = False
        self._updates: dict[str, dict[str, Any]] = {}
        self._seqs: dict[str, int] = {}
        self.fenced = False
        self.written_seq = 0
        """The root's last written seq."""

    async def run(self) -> None:
        """Collect and write until the root's terminal update is written (or fenced)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._collect)
            await self._flush_all()

    async def _collect(self) -> None:
        async for event in self._cursor:
            self._pending.append(event)
            self._arrived.set()
        self._collected = True
        self._arrived.set()

    async def _flush_all(self) -> None:
        while True:
            await self._arrived.wait()
            self._arrived = trio.Event()
            batch, self._pending = self._pending, []
            done = self._collected
            if batch and not self.fenced:
                await self._write(batch)
            if done and not self._pending:
                return

    async def _write(self, batch: list[RunEvent]) -> None:
        rows: list[tuple[str, int, str]] = []
        touched: dict[str, None] = {}
        release: str | None = None
        for event in batch:
            data = event.to_json()
            if not event.seq:  # an events.dropped marker of the merged stream: not a run's
                continue
            if self._handed_over(event):
                continue
            rows.append((event.run_id, event.seq, json.dumps(data)))
            touched[event.run_id] = None
            self._seqs[event.run_id] = max(self._seqs.get(event.run_id, 0), event.seq)
            if type(event) is RunUpdated:
                self._updates[event.run_id] = data
                if event.run_id == self._root.id and event.status.is_terminal:
                    release = self._session_id
        records = [self._record(run_id) for run_id in touched if run_id in self._updates]
        delay = _RETRY_FIRST
        while True:
            try:
                # Shielded: a write is whole or not at all, and the terminal batch of a
                # cancelled attempt must still land.
                with trio.CancelScope(shield=True):
                    owned = await self._store.write_events(
                        self._root.id, self._attempt, self._principal, rows, records, release
                    )
                break
            except (sqlite3.Error, RunStoreError) as exc:
                log.warning("run %s: writing events failed, retrying: %s", self._root.id, exc)
                await trio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
        if not owned:
            log.warning(
                "run %s: attempt %d is fenced (a later attempt took the run over):"
                " nothing more of it is written",
                self._root.id,
                self._attempt,
            )
            self.fenced = True
            self._root.cancel(FENCED)
            return
        self.written_seq = self._seqs.get(self._root.id, self.written_seq)

    def _handed_over(self, event: RunEvent) -> bool:
        """Whether ``event`` is the root's terminal update of an attempt handed over (its
        worker shuts down): the run goes on in the next attempt, from the seq after
        the last one written, so this update is not the run's and is not written (nor
        is the session released)."""
        return (
            event.run_id == self._root.id
            and type(event) is RunUpdated
            and event.status.is_terminal
            and self._handover()
        )

    def _record(self, run_id: str) -> tuple[str, str | None, RunInfo]:
        root = self._root
        run = root if run_id == root.id else root.find(run_id)
        update = self._updates[run_id]
        status = RunStatus(update["status"])
        pending: tuple[str, ...] = ()
        usage = None
        parent_id = None
        agent = self._agent_name
        if run is not None:
            pending = () if status.is_terminal else run.statistics().pending_approvals
            usage = run.usage
            parent_id = run.parent_id
            if run is not root or self._agents.get(self._agent_name) is not run.agent:
                agent = run.agent.name
        info = RunInfo(
            run_id=run_id,
            agent=agent,
            session_id=self._session_id if run is root else None,
            status=status,
            reason=update.get("reason"),
            seq=self._seqs[run_id],
            turn=int(update.get("turn") or 0),
            pending_approvals=pending,
            parent_id=parent_id,
            root_id=root.id,
            detail=update.get("detail") or {},
            usage=usage,
        )
        return run_id, parent_id, info
