"""The sessions of a cluster's runs: :class:`PostgresSession` in the cluster's database,
fenced and patient.

- Stored under ``json.dumps([principal, session_id])`` (a run without a session gets
  its own, ``[principal, "run:" + run_id]``, so every run can be resumed).
- *Fenced*: once the run's :class:`~._eventlog.Fence` is closed (its node stopped, or
  handed the run over, or lost its lease) writes are dropped, so the node that takes the
  run over continues from what was persisted before, never from a repair written by a
  node that was leaving.
- *Raw loads*: :meth:`ClusterSession.get_items` returns the stored rows unrepaired; the
  run core repairs them (and writes the repair back), keeping a resumed run's open
  calls open.
- *Patient*: a write or load that fails because the database is unreachable (a
  PostgreSQL restart) is retried with backoff for up to :data:`RETRY_FOR` seconds (and
  never past the caller's deadline) instead of failing the run. A retried write is
  not stored twice when the earlier try committed and only its answer was lost: an
  append checks the position that try appended at (``_append``), a takeover's input
  its ``input_written`` marker (``add_input``); a replace or a clear is the same again.
- *Written with the events*: once the node's writer tracks the run, the items the run
  commits are written by the writer, each in the transaction that persists its
  ``run.item`` event (``_eventlog.py``); :meth:`ClusterSession.add_items` then waits for
  that flush (and raises :class:`SessionStorageError` if it fails: at once, or after
  :data:`RETRY_FOR` seconds while the database is unreachable). Other writes (a load's
  repair written back, a takeover's input) are this session's own transactions, after
  the items written with events before them.
- *Fenced in the database too*: each write checks, in its transaction and under the
  run's row lock, that the run's row still names this node and attempt (``owner``,
  ``attempt``); a node that stalled past its lease and was taken over never appends to
  the session (the write is dropped; its event writer then finds the run gone and
  stops it).
- Its ``lock_key`` includes the node and the run: the core's in-process claim is per
  run (it keeps a queued run queued behind its gate); the one claim is cluster-wide,
  the runs table's ``active_key`` (``_claims.py``), in the cluster-wide queue order.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, Final, TypeVar, final

import psycopg
import trio

from .._items import Item
from ..sessions._postgres import PostgresSession
from ..sessions._storage import SessionStorageError, encode_items
from ._eventlog import Fence, RunLog
from ._schema import session_key

__all__ = ["RETRY_FOR", "ClusterSession", "session_key"]

T = TypeVar("T")

RETRY_FOR: Final = 30.0


def _transient(exc: SessionStorageError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, psycopg.OperationalError) and not isinstance(
        cause, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled
    )


@final
class ClusterSession:
    """A run's session in a cluster (see the module docstring)."""

    def __init__(
        self, dsn: str, key: str, node_id: str, fence: Fence, run_id: str | None = None
    ) -> None:
        self.inner = PostgresSession(dsn, key)
        self._dsn = dsn
        self.fence = fence
        # Per run: the in-process claim only keeps a queued run queued until its gate
        # lets go (``hosting._run_tasks``); which run has the session, and in what order
        # the queued ones get it, is decided cluster-wide alone (``_claims.py``). A
        # claim shared by the node's runs of a session would order them a second
        # time, by arrival here: a run taken over here (which held the session, or was
        # ahead in its queue) would find it busy with a run queued here after it, or
        # wait for it while that run waits for it cluster-wide.
        self.lock_key: Hashable = ("trio_agents.cluster", node_id, key, run_id)
        self.node_id = node_id
        self.run_id = run_id
        self.attempt = 1  # the run's attempt on this node (a takeover sets its own)
        # The run's log, once the node's writer tracks it: the items the run commits
        # are then written by the writer, each with its run.item event.
        self.log: RunLog | None = None

    def _owned(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether the run's row still names this node and attempt (row lock held
        until the write commits); True for a session without a run."""
        if self.run_id is None:
            return True
        row = conn.execute(
            "SELECT 1 FROM trio_agents_runs WHERE run_id = %s AND owner = %s AND attempt = %s"
            " FOR SHARE",
            (self.run_id, self.node_id, self.attempt),
        ).fetchone()
        return row is not None

    async def _write(self, write: Callable[[psycopg.Connection[Any]], None]) -> None:
        inner = self.inner

        def fenced(conn: psycopg.Connection[Any]) -> None:
            if self._owned(conn):
                write(conn)

        await self._retry(lambda: inner._call(fenced))

    @property
    def session_id(self) -> str:
        return self.inner.session_id

    async def _retry(self, fn: Callable[[], Awaitable[T]]) -> T:
        backoff = 0.05
        give_up = trio.current_time() + RETRY_FOR
        while True:
            try:
                return await fn()
            except SessionStorageError as exc:
                if not _transient(exc) or trio.current_time() + backoff > give_up:
                    raise
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    async def get_items(self) -> list[Item]:
        # The stored rows as they are: the run core repairs them itself, keeping the
        # calls left open by a crashed attempt open when it resumes (PostgresSession's
        # own get_items would close them as cancelled).
        inner = self.inner
        return await self._retry(lambda: inner._call(inner._read_sync))

    async def add_items(self, items: Sequence[Item]) -> None:
        if self.fence.closed:
            await trio.lowlevel.checkpoint()
            return
        rest = await self._written_with_events(items)
        if not rest:
            # Written: a cancel arriving now must not make it look unwritten (the run
            # core would settle it from the rows, but need not).
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        await self._write(self._append(encode_items(rest)))

    def _append(self, encoded: list[str]) -> Callable[[psycopg.Connection[Any]], None]:
        """An append that :meth:`_retry` does not repeat: a try whose commit's answer was
        lost (a transient error) may have committed. Each try notes, before it commits,
        the position it appends at; a later try that finds those rows there holding
        these items appends nothing (only this run writes the session while it holds
        it, fenced, so nothing else can have put them there)."""
        inner = self.inner
        tried: list[int] = []

        def append(conn: psycopg.Connection[Any]) -> None:
            if tried:
                rows = conn.execute(
                    "SELECT data FROM trio_agents_session_items WHERE session_id = %s"
                    " AND position >= %s AND position < %s ORDER BY position",
                    (inner.session_id, tried[-1], tried[-1] + len(encoded)),
                ).fetchall()
                if [row[0] for row in rows] == encoded:
                    return  # the earlier try committed
            row = conn.execute(
                "SELECT next_position FROM trio_agents_sessions WHERE session_id = %s FOR UPDATE",
                (inner.session_id,),
            ).fetchone()
            tried.append(0 if row is None else int(row[0]))
            inner._add_items_sync(conn, encoded)

        return append

    async def add_input(self, items: Sequence[Item]) -> None:
        """Append a taken-over run's input, once: in one transaction with the marker
        ``input_written`` in the run's ``options``, and not at all if the marker is
        already there. A takeover (``_takeover.py``) then knows from the run's own
        record whether its input reached the session — its ``run.item`` events (an
        attempt's input goes in with them) or this marker —, never from what else the
        session holds; and a retried transaction whose commit's answer was lost does
        not append it twice."""
        if self.fence.closed or self.run_id is None:
            await trio.lowlevel.checkpoint()
            return
        encoded = encode_items(items)
        run_id = self.run_id

        def write(conn: psycopg.Connection[Any]) -> None:
            row = conn.execute(
                "UPDATE trio_agents_runs SET options = jsonb_set(options::jsonb,"
                " '{input_written}', 'true'::jsonb)::text WHERE run_id = %s"
                " AND NOT COALESCE((options::jsonb ->> 'input_written')::boolean, false)"
                " RETURNING 1",
                (run_id,),
            ).fetchone()
            if row is not None:
                append(conn)

        append = self._append(encoded)
        await self._written_with_events(())
        await self._write(write)

    async def replace_items(self, items: Sequence[Item]) -> None:
        if self.fence.closed:
            await trio.lowlevel.checkpoint()
            return
        encoded = encode_items(items)
        await self._written_with_events(())
        await self._write(lambda conn: self.inner._replace_sync(conn, encoded))

    async def clear(self) -> None:
        if self.fence.closed:
            await trio.lowlevel.checkpoint()
            return
        await self._written_with_events(())
        await self._write(self.inner._clear_sync)

    async def _written_with_events(self, items: Sequence[Item]) -> list[Item]:
        """Wait until those of ``items`` that the node's writer writes with their
        ``run.item`` events (the run's committed items) are persisted, and until every
        such item before them is; return the others (written by this session itself,
        after them: a load's repair, a takeover's input).

        Raises:
            SessionStorageError: the flush that writes them failed (at once unless the
                database is only unreachable, then after :data:`RETRY_FOR` seconds).
        """
        log = self.log
        if log is None:
            return list(items)
        # Every item committed so far has its run.item event in the run's log: once the
        # writer's reader took them all, it knows which items it writes.
        await log.wait_read(log.run.statistics().last_seq)
        # The run's session writes come in commit order, and so does the queue; its
        # items are found in it in order (by identity: an item committed twice is
        # written twice). Not only at its head: a write cancelled while it waited for
        # its flush leaves its items queued, and when the flush got through, the run
        # core finds them stored (it reads the rows after a write that raised) and
        # never asks for them again — skipped here, they are not mistaken for items
        # this session must write itself (which the writer writes too: twice).
        queue = log.items
        matched = 0  # the queue entries before this one are settled by this write
        rest: list[Item] = []
        for item in items:
            at = _find(queue, item, matched)
            if at is None:
                rest.append(item)
            else:
                matched = at + 1
        # Every item written with its event so far comes before the others.
        seq = queue[matched - 1][1] if rest == [] and matched else log.items_seq
        if seq:
            await self._wait_written(log, seq)
        for _ in range(matched):
            queue.popleft()
        return rest

    async def _wait_written(self, log: RunLog, seq: int) -> None:
        give_up = trio.current_time() + RETRY_FOR
        while log.persisted_seq < seq:
            if log.fenced(seq) or log.done.is_set():
                return  # dropped, as every write of a fenced attempt is
            error = log.error
            if error is not None:
                cause = error.__cause__
                transient = isinstance(cause, psycopg.OperationalError) and not isinstance(
                    cause, psycopg.errors.LockNotAvailable | psycopg.errors.QueryCanceled
                )
                if not transient or trio.current_time() > give_up:
                    raise SessionStorageError(
                        f"session {self.session_id!r}: writing items with their events"
                        f" failed: {error}",
                        session_id=self.session_id,
                    ) from cause
            log.hurry()
            with trio.move_on_at(give_up + 0.001):
                await log.changed.wait()

    async def aclose(self) -> None:
        await self.inner.aclose()

    def with_id(self, session_id: str) -> ClusterSession:
        """The session of a child run of this session's run (DESIGN §17), stored under
        ``session_id`` (``"<this key>/<call id>"``) in the same database: fenced by this
        run's fence and its row (``owner``, ``attempt``) — a tree lives and is taken
        over with its root — and written by itself (the node's writer persists the
        root's events only). Its loads are raw, as this one's are, so a takeover
        resumes the child from what it stored."""
        child = ClusterSession(self._dsn, session_id, self.node_id, self.fence, self.run_id)
        child.attempt = self.attempt
        return child


def _find(queue: collections.deque[tuple[Item, int]], item: Item, start: int) -> int | None:
    """The index of ``item`` (this very object) in ``queue`` from ``start``, or None."""
    for index in range(start, len(queue)):
        if queue[index][0] is item:
            return index
    return None
