"""Every event of the node's runs, persisted in order; subscriptions from the table.

Writing: one reader task per owned run copies ``run.events()`` into the node's buffer
(nothing in the run's own loop waits for the database); one flusher task writes the
buffer in one transaction — events, then each run's row (last seq, status, reason,
turn, pending approvals, the status's detail, what its limits counted so far, and the
session released at its terminal status), then one
NOTIFY ``{"k": "run", "r": run_id, "s": last_seq}`` per run, followed (after a newline)
by the batch's events of that run as ``[[seq, event], ...]``, as many as fit in the
payload (:data:`INLINE_BYTES`) — at least every
:data:`FLUSH_INTERVAL` seconds, at once for a ``run.item`` or ``run.updated`` event, and
at once (as soon as the previous flush is done) while a subscriber on this node waits
for an event: a subscriber on the owner is sent an event only once it is persisted
(:meth:`RunLog.wait_persisted`), so what any client saw survives a crash of the owner
and the next attempt never reuses a seq a client saw. Batches then grow with the load
(whatever arrived during the previous round trip); the run's loop never waits.
The same transaction writes the run's conversation items: the item of every
``run.item`` event the run writes to its session (while it holds the session and did
not drop it, as the run core's ``persist`` decides) is appended to the session with
that event, so after any crash the session and the event log hold both or neither.
The run's session write (``ClusterSession.add_items``, the core's ``persist``) writes
nothing itself: it waits for that flush, and reports its failure (``session error``).
A run's row is only updated while this node owns the attempt (``owner`` and
``attempt`` match): a node that lost its lease (taken over while it was cut off) finds
no row, writes none of the run's events and items, and cancels it locally (reason
``"lease lost"``). A failed flush is retried with backoff (an item is written once even
when a flush is retried after its commit was lost); events are never reordered. A
flush the database *refuses* because of a value in it (``_storable.refused``, or a
value that cannot be encoded) is not retried as a whole: its runs are flushed one by
one, and a run whose own events cannot be stored is fenced, stopped here and ended
``failed`` after its last persisted event; every other run goes on.

Reading (:func:`follow`): a subscriber on any node replays the table from ``from_seq``
and then waits for the run's NOTIFYs (or, bounded, polls), so it sees every persisted
seq once, in order, ending after the terminal ``run.updated`` — or at once when
``from_seq`` is past the last seq of a finished run (or the run's row is gone). Live,
it sends the events a NOTIFY carries (the same text as the table's rows, sent only once
committed) without reading the table; it reads the table again whenever they do not
continue exactly where it is (a NOTIFY lost with a connection, events that did not fit
in the payload, a reconnection), and after a poll interval without any.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, final

import attrs
import trio

from .. import InboxInjected, Run, RunChild, RunItemEvent, RunStatus, RunUpdated
from .._items import Item
from ..sessions._storage import encode_items
from ._capacity import end_run_in
from ._db import ClusterDown, Conn, Database
from ._listener import Listener
from ._routing import store_reply
from ._schema import CHANNEL
from ._storable import refused, storable

if TYPE_CHECKING:
    from ._session import ClusterSession

__all__ = ["FLUSH_INTERVAL", "EventWriter", "Fence", "RunLog", "follow"]

logger = logging.getLogger("trio_agents.cluster")

FLUSH_INTERVAL: Final = 0.1
_TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})
_PAGE: Final = 500
INLINE_BYTES: Final = 7800
"""A NOTIFY payload's limit (PostgreSQL's is 8000 bytes): the events that do not fit
are read from the table by the subscribers."""
_POLL: Final = 2.0
RETRY_UNSTORABLE: Final = 30.0
"""How long the writer retries ending a run whose events the database refuses (while
the database is unreachable); past it, the run's lease expires and a takeover ends it."""


@final
@attrs.define(eq=False)
class Fence:
    """Once ``closed``, a run's session writes and events are no longer persisted (its
    node stopped or handed it over: another node continues from what was)."""

    closed: bool = False
    fence_seq: int | None = None


@final
@attrs.define(eq=False)
class RunLog:
    """What the writer knows of one owned run (this attempt)."""

    run_id: str
    attempt: int
    run: Run
    start_seq: int
    fence: Fence
    persisted_seq: int = 0
    injections: dict[str, int] = attrs.field(factory=dict)
    # Routed injections' answers, by injection id: stored with their inbox.injected.
    replies: dict[str, tuple[int, str]] = attrs.field(factory=dict)
    changed: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)
    # Set by the writer that tracks the run: asks it to flush now (a reader waits).
    hurry: Callable[[], None] = attrs.field(default=lambda: None)
    # The run's ClusterSession (set by the writer's track): the item of each run.item
    # event the run writes to it is written by the flush that persists the event.
    session: ClusterSession | None = None
    # The last seq the writer's reader took from the run (buffered), and a wake-up for
    # whoever waits for it to catch up.
    read_seq: int = 0
    read: trio.Event = attrs.field(factory=trio.Event)
    reader_ended: bool = False
    # Items written with their run.item event, in order: (item, seq), until the run's
    # session write of them (ClusterSession.add_items) has seen them persisted.
    items: collections.deque[tuple[Item, int]] = attrs.field(factory=collections.deque)
    items_seq: int = 0  # the seq of the last such item
    # The error of the last flush of this run's events, if it failed (None once one
    # succeeds): a session write waiting for that flush reports it.
    error: BaseException | None = None
    # A child run's log: its tree's root's (None for a root). A child has no row of its
    # own in trio_agents_runs: its events are fenced by its root's row.
    root: RunLog | None = None

    def signal_changed(self) -> None:
        """Wake whoever waits for a change of this log (persisted, done, an error)."""
        self.changed.set()
        self.changed = trio.Event()

    def read_up_to(self, seq: int) -> None:
        """The reader took every event up to ``seq``: wake whoever waits for it."""
        self.read_seq = seq
        self.read.set()
        self.read = trio.Event()

    def writes_item(self) -> bool:
        """Whether the run writes its committed items to its session now: it holds it
        and did not drop it (a session it could not load, or an input that does not
        fit): exactly when the run core's ``persist`` writes them (``RunState``)."""
        session = self.session
        return session is not None and self.run._state.session is session

    async def wait_read(self, seq: int) -> None:
        """Wait until the reader took every event up to ``seq`` (or it ended)."""
        while self.read_seq < seq and not self.reader_ended:
            await self.read.wait()

    async def wait_injection(self, injection_id: str) -> None:
        """Wait until the ``inbox.injected`` event of ``injection_id`` is persisted."""
        while True:
            seq = self.injections.get(injection_id)
            if seq is not None and seq <= self.persisted_seq:
                return
            if self.done.is_set() and seq is None:
                return
            await self.changed.wait()

    async def wait_persisted(self, seq: int) -> None:
        """Wait until the event ``seq`` is written (or this attempt's writing ended, or
        the event was fenced off: it never will be); the writer flushes at once while
        someone waits."""
        while self.persisted_seq < seq and not self.done.is_set() and not self.fenced(seq):
            self.hurry()
            await self.changed.wait()

    def fenced(self, seq: int) -> bool:
        """Whether the event ``seq`` will never be written by this attempt (fenced)."""
        fence = self.fence
        return fence.closed and (fence.fence_seq is None or seq > fence.fence_seq)


@final
class EventWriter:
    """The node's event writer (see the module docstring)."""

    def __init__(self, db: Database, listener: Listener, node_id: str) -> None:
        self._db = db
        self._listener = listener
        self._node_id = node_id
        # (log, event, the event's item as stored in the session, if written with it);
        # (log, None, None) once the run has no more events.
        self._buffer: list[tuple[RunLog, Any, str | None]] = []
        self._pending = trio.Event()
        self._urgent = trio.Event()
        self.logs: dict[str, RunLog] = {}
        # Cancels of child runs acked before their node died, by child id (a takeover
        # sets them): the resumed tree's child is cancelled as soon as it is made.
        self.child_cancels: dict[str, tuple[str | None, str]] = {}
        self.flushes = 0
        self.lease_ttl = 10.0  # the node's (ClusterNode sets it)

    def track(self, nursery: trio.Nursery, log: RunLog, session: ClusterSession | None) -> None:
        """Start persisting ``log.run``'s events (from ``log.start_seq``), and the items
        the run writes to ``session`` with their ``run.item`` events; and those of each
        child run it starts (:meth:`_track_child`)."""
        self.logs[log.run_id] = log
        log.hurry = self._urgent_now
        if session is not None:
            log.session = session
            session.log = log
        nursery.start_soon(self._read, log, nursery)

    def _track_child(self, nursery: trio.Nursery, parent: RunLog, child_id: str) -> None:
        """Persist the events of a child run ``parent``'s run just started, under its
        own id (its grandchildren's too, as its reader finds them): in the same
        transactions as its root's, fenced by its root's row, so any node follows it.
        Its conversation is written by its own session, as in one process."""
        child = parent.run.find(child_id)
        if child is None or child_id in self.logs:
            return
        root = parent.root or parent
        resume = child._options.resume  # a child a takeover resumed continues its log
        start = 1 if resume is None else resume.next_seq
        # Its own fence (seqs are per run), closed with its root's (hand-over, lease
        # lost, crash: they close every log of the node; a root fenced off by a flush
        # closes its children's, _flush).
        log = RunLog(
            child_id, parent.attempt, child, start, Fence(closed=root.fence.closed), root=root
        )
        self.logs[child_id] = log
        log.hurry = self._urgent_now
        cancel = self.child_cancels.pop(child_id, None)
        if cancel is not None:
            # Read here, right after the child's announcement: the child is still
            # loading its session (a database read), before any model call or tool.
            reason, mode = cancel
            child.cancel(reason, mode=mode)  # type: ignore[arg-type]
        nursery.start_soon(self._read, log, nursery)

    def _urgent_now(self) -> None:
        self._urgent.set()

    async def _read(self, log: RunLog, nursery: trio.Nursery) -> None:
        try:
            async for event in log.run.events(log.start_seq):
                if log.fenced(event.seq):
                    break
                item: str | None = None
                if isinstance(event, RunChild) and event.status is RunStatus.QUEUED:
                    self._track_child(nursery, log, event.child_id)
                if isinstance(event, RunItemEvent):
                    self._urgent.set()
                    if log.writes_item():
                        item = _encoded(event.item)
                        if item is not None:
                            log.items.append((event.item, event.seq))
                            log.items_seq = event.seq
                elif isinstance(event, RunUpdated | InboxInjected):
                    self._urgent.set()
                    if isinstance(event, InboxInjected):
                        log.injections[event.injection_id] = event.seq
                self._buffer.append((log, event, item))
                self._pending.set()
                log.read_up_to(event.seq)
        finally:
            self._buffer.append((log, None, None))  # "no more events": done once flushed
            self._pending.set()
            self._urgent.set()
            log.reader_ended = True
            log.read_up_to(log.read_seq)

    async def run(self) -> None:
        """The flusher: runs until cancelled."""
        backoff = 0.05
        while True:
            await self._pending.wait()
            with trio.move_on_after(FLUSH_INTERVAL):
                await self._urgent.wait()
            self._pending = trio.Event()
            self._urgent = trio.Event()
            batch, self._buffer = self._buffer, []
            try:
                await self._flush(batch)
                backoff = 0.05
            except Exception as exc:
                if not isinstance(exc, ClusterDown) or refused(exc):
                    # A value the database refuses (or that cannot be encoded): retrying
                    # the batch would fail forever and persist nothing of any run.
                    await self._isolate(batch)
                    continue
                if self._db.dead:
                    continue  # a stopped node persists nothing more
                logger.warning("flushing run events failed; retrying", exc_info=True)
                for log in {entry[0] for entry in batch}:
                    log.error = exc  # a session write waiting for this flush sees it
                    log.signal_changed()
                self._buffer[:0] = batch
                self._pending.set()
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def flush_now(self) -> None:
        """Wake the flusher at once (a hand-over)."""
        self._pending.set()
        self._urgent.set()
        await trio.lowlevel.checkpoint()

    async def _flush(self, batch: list[tuple[RunLog, Any, str | None]]) -> None:
        events: list[tuple[str, int, str, str]] = []
        rows: dict[str, dict[str, Any]] = {}
        logs: dict[str, RunLog] = {}
        ended: list[RunLog] = []
        replies: list[tuple[str, str, int, str]] = []
        items: dict[str, list[tuple[int, str]]] = {}
        lost: list[str] = []
        for log, event, item in batch:
            logs[log.run_id] = log
            row = rows.setdefault(
                log.run_id,
                {
                    "attempt": log.attempt,
                    "seq": 0,
                    "usage": _spent(log.run),
                    "run_usage": _own_usage(log.run),
                    "tree": _tree(log),
                },
            )
            if event is None:
                ended.append(log)
                continue
            data = event.to_json()
            # Non-JSON values (a tool's progress data) as the control channel sends them.
            events.append((log.run_id, event.seq, event.type, json.dumps(data, default=repr)))
            row["seq"] = max(row["seq"], event.seq)
            if item is not None:
                items.setdefault(log.run_id, []).append((event.seq, item))
            if isinstance(event, InboxInjected) and event.injection_id in log.replies:
                replies.append((log.run_id, event.injection_id, *log.replies[event.injection_id]))
            _update_record(row, event, data)
        for run_id, row in rows.items():
            if row.get("finished") and row["tree"] is None:
                row["writing"] = [
                    other.run_id for other in self.logs.values() if other.root is logs[run_id]
                ]
        if rows:
            writes = [
                (run_id, session, encoded)
                for run_id, encoded in items.items()
                if (session := logs[run_id].session) is not None
            ]
            lost = await self._db.call(
                lambda conn: self._write(conn, events, rows, replies, writes)
            )
            for run_id, injection_id, _, _ in replies:
                logs[run_id].replies.pop(injection_id, None)
            self.flushes += 1
            for run_id in lost:
                log = logs[run_id].root or logs[run_id]  # a child's tree is its root's
                if not log.fence.closed:
                    logger.warning("run %s was taken over by another node; stopping it", run_id)
                    log.fence.closed = True
                    log.run.cancel("lease lost")
                for other in self.logs.values():
                    if other.root is log or other is logs[run_id]:
                        other.fence.closed = True  # nothing more of its tree is written
        for run_id, row in rows.items():
            log = logs[run_id]
            log.error = None
            if run_id not in lost:
                # Only what this flush wrote counts as persisted: the events of a run
                # fenced off (taken over) were dropped, and the next attempt reuses
                # their seqs, so a subscriber here must never be sent them.
                log.persisted_seq = max(log.persisted_seq, row["seq"])
            log.signal_changed()
            if row.get("finished"):
                self._listener.notify(("run", run_id))
        for log in ended:
            log.done.set()
            log.signal_changed()
            if self.logs.get(log.run_id) is log:
                del self.logs[log.run_id]

    # -- a batch the database refuses: find the run it belongs to -------------------

    async def _isolate(self, batch: list[tuple[RunLog, Any, str | None]]) -> None:
        """Flush the batch run by run: the runs whose events can be stored are, and a
        run whose own events cannot be (its flush refused, not merely failing while the
        database is unreachable) is ended :meth:`_unstorable`. Runs whose flush failed
        otherwise go back to the buffer, in order, for the retry."""
        groups: dict[str, list[tuple[RunLog, Any, str | None]]] = {}
        for entry in batch:
            groups.setdefault(entry[0].run_id, []).append(entry)
        retry: list[tuple[RunLog, Any, str | None]] = []
        for entries in groups.values():
            try:
                await self._flush(entries)
            except Exception as exc:
                if self._db.dead:
                    return
                if isinstance(exc, ClusterDown) and not refused(exc):
                    retry += entries
                else:
                    await self._unstorable(entries, exc)
        if retry:
            self._buffer[:0] = retry
            self._pending.set()

    async def _unstorable(
        self, entries: list[tuple[RunLog, Any, str | None]], exc: Exception
    ) -> None:
        """A run whose events the database refuses: nothing more of this attempt is
        persisted (fenced), the run is stopped here, and its row ends ``failed`` with
        a terminal event after the last persisted one, so no subscriber, session
        queue or takeover waits for it."""
        log = entries[0][0]
        reason = storable(f"its events could not be stored: {exc!r}"[:1000])
        logger.error("run %s: %s; it fails", log.run_id, reason, exc_info=exc)
        fence = log.fence
        if not fence.closed or fence.fence_seq is None or fence.fence_seq > log.persisted_seq:
            fence.fence_seq = log.persisted_seq
        fence.closed = True
        # Its events buffered meanwhile are fenced off too (its reader drops the next).
        self._buffer = [e for e in self._buffer if e[0] is not log or e[1] is None]
        log.error = exc  # its session write waiting for this flush fails
        log.run.cancel(reason)

        def end(conn: Conn) -> None:
            row = conn.execute(
                "SELECT last_seq FROM trio_agents_runs WHERE run_id = %s AND owner = %s"
                " AND attempt = %s AND NOT finished FOR UPDATE",
                (log.run_id, self._node_id, log.attempt),
            ).fetchone()
            if row is not None:  # still this attempt's: end it (else another node has it)
                end_run_in(
                    conn, log.run_id, int(row[0]) + 1, RunStatus.FAILED, reason, if_absent=True
                )

        backoff = 0.05
        with trio.move_on_after(RETRY_UNSTORABLE):
            while not self._db.dead:
                try:
                    await self._db.call(end)
                    break
                except ClusterDown:
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
        log.signal_changed()
        if any(event is None for _, event, _ in entries):
            log.done.set()
            if self.logs.get(log.run_id) is log:
                del self.logs[log.run_id]

    def _write(
        self,
        conn: Conn,
        events: list[tuple[str, int, str, str]],
        rows: dict[str, dict[str, Any]],
        replies: list[tuple[str, str, int, str]],
        items: Sequence[tuple[str, ClusterSession, list[tuple[int, str]]]] = (),
    ) -> list[str]:
        lost: list[str] = []
        written: dict[str, int] = {}
        for run_id, row in rows.items():
            if row.get("tree") is not None:
                if _write_child(conn, run_id, row, self._node_id) is None:
                    lost.append(run_id)
                continue
            # The run's row lock, held until the commit, fences everything below: a
            # node that no longer owns this attempt writes no event and no item. It
            # returns the last seq persisted before (a flush retried after its commit
            # was lost with the connection writes no item twice).
            found = conn.execute(
                "UPDATE trio_agents_runs AS r SET last_seq = GREATEST(r.last_seq, %(seq)s),"
                " status = COALESCE(%(status)s, status), reason = CASE WHEN %(status)s IS NULL"
                " THEN reason ELSE %(reason)s END, turn = COALESCE(%(turn)s, turn),"
                " pending = COALESCE(%(pending)s, pending), detail = COALESCE(%(detail)s, detail),"
                " finished = finished OR %(finished)s, usage = COALESCE(%(usage)s, usage),"
                " run_usage = COALESCE(%(run_usage)s, run_usage),"
                " active_key = CASE WHEN %(finished)s THEN NULL ELSE active_key END,"
                # The row lock is ours: renew the run's lease with it (the heartbeat
                # skips rows locked when it beats).
                " lease_expires_at = GREATEST(lease_expires_at,"
                " now() + make_interval(secs => %(ttl)s)), updated_at = now()"
                " FROM (SELECT last_seq FROM trio_agents_runs WHERE run_id = %(run_id)s) AS before"
                " WHERE r.run_id = %(run_id)s AND owner = %(node)s AND attempt = %(attempt)s"
                " RETURNING before.last_seq",
                {
                    "seq": row["seq"],
                    "status": row.get("status"),
                    "reason": row.get("reason"),
                    "turn": row.get("turn"),
                    "pending": row.get("pending"),
                    "detail": row.get("detail"),
                    "finished": bool(row.get("finished")),
                    "usage": row.get("usage"),
                    "run_usage": row.get("run_usage"),
                    "run_id": run_id,
                    "node": self._node_id,
                    "attempt": row["attempt"],
                    "ttl": self.lease_ttl,
                },
            ).fetchone()
            if found is None:
                lost.append(run_id)
                continue
            written[run_id] = int(found[0])
            if row.get("finished"):
                # Its tree is over: a child run an earlier attempt started and this one
                # did not resume (its log ended with its node) ends too, so no follower
                # of it waits for ever (it reads its table: nothing more will come).
                # Not the children this attempt still writes (their last events may
                # follow in a later flush).
                conn.execute(
                    "UPDATE trio_agents_children SET finished = true"
                    " WHERE root_id = %s AND NOT finished AND NOT (run_id = ANY(%s))",
                    (run_id, row.get("writing", [])),
                )
        # The items of the batch's run.item events, in the same transaction as the
        # events: after a crash the session and the event log hold both or neither.
        for run_id, session, pairs in items:
            if run_id in written:
                encoded = [item for seq, item in pairs if seq > written[run_id]]
                if encoded:
                    session.inner._add_items_sync(conn, encoded)
        kept = [e for e in events if e[0] not in lost]
        if kept:
            conn.execute(
                "INSERT INTO trio_agents_events (run_id, seq, type, data)"
                " SELECT * FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::text[])"
                " ON CONFLICT DO NOTHING",
                tuple(list(column) for column in zip(*kept, strict=True)),
            )
        for run_id, _, command_id, reply in replies:
            if run_id not in lost:  # answered with the injection it made durable
                store_reply(conn, command_id, reply)
        payloads = [
            _payload(run_id, row["seq"], [(e[1], e[3]) for e in kept if e[0] == run_id])
            for run_id, row in rows.items()
            if run_id not in lost
        ]
        if payloads:
            conn.execute(
                "SELECT pg_notify(%s, p) FROM unnest(%s::text[]) AS p", (CHANNEL, payloads)
            )
        return lost


def _tree(log: RunLog) -> tuple[str, str, str, str] | None:
    """A child run's place in its tree, as its row keeps it: its root's id, its
    parent's, its call id in its parent and its agent (None for a root)."""
    if log.root is None:
        return None
    run = log.run
    return (log.root.run_id, run.parent_id or "", run.call_id or "", run.agent.name)


def _write_child(conn: Conn, run_id: str, row: dict[str, Any], node_id: str) -> str | None:
    """Upsert a child run's row (its last seq, whether it finished), under its root's
    row lock and only while this node owns the root's attempt: None when it does not
    (fenced: nothing of the child is written either)."""
    root_id, parent_id, call_id, agent = row["tree"]
    found = conn.execute(
        "WITH root AS (SELECT run_id FROM trio_agents_runs WHERE run_id = %(root)s"
        " AND owner = %(node)s AND attempt = %(attempt)s FOR UPDATE)"
        " INSERT INTO trio_agents_children AS c"
        " (run_id, root_id, parent_id, call_id, agent, last_seq, finished)"
        " SELECT %(run_id)s, root.run_id, %(parent)s, %(call)s, %(agent)s, %(seq)s,"
        " %(finished)s FROM root ON CONFLICT (run_id) DO UPDATE SET"
        " last_seq = GREATEST(c.last_seq, EXCLUDED.last_seq),"
        " finished = c.finished OR EXCLUDED.finished RETURNING c.run_id",
        {
            "root": root_id,
            "node": node_id,
            "attempt": row["attempt"],
            "run_id": run_id,
            "parent": parent_id,
            "call": call_id,
            "agent": agent,
            "seq": row["seq"],
            "finished": bool(row.get("finished")),
        },
    ).fetchone()
    return None if found is None else str(found[0])


def _spent(run: Run) -> str | None:
    """What the run's own limits counted so far, as its row keeps it (None: it has no
    limits). Taken when its events are flushed, so what the persisted events show was
    spent (a request, a tool call, streamed tokens) is in it: a takeover's attempt
    starts its budget from it."""
    budgets = run._state.budgets
    if not budgets or budgets[0].owner is not run:
        return None
    return json.dumps(budgets[0].spent())


def _update_record(row: dict[str, Any], event: Any, data: dict[str, Any]) -> None:
    """What ``event`` (``data``: its JSON) changes in its run's row, the run's record on
    every node that does not run it: ``run.get`` there says what the node running it
    says once the event is persisted."""
    turn = getattr(event, "turn", None)
    if isinstance(turn, int):
        # Every event of a turn says which (a delta, an item, the model request, a
        # delivery), not only a status update: the row counts the model calls the node
        # running the run counts once a call's first event is persisted.
        row["turn"] = turn
    if isinstance(event, RunUpdated):
        row["status"] = event.status.value
        row["reason"] = storable(event.reason)  # a text column (_storable.py)
        pending = (event.detail or {}).get("pending", [])
        row["pending"] = json.dumps(list(pending) if isinstance(pending, list) else [])
        # The detail as the event carries it (the record and the stream never
        # disagree); ASCII-escaped JSON, so any string in it is stored as is.
        row["detail"] = json.dumps(data.get("detail") or {}, default=repr)
        row["finished"] = event.status.value in _TERMINAL


def _own_usage(run: Run) -> str | None:
    """The run's own usage so far, as its row keeps it (None: no model call reported
    any yet). Taken when its events are flushed, so the record another node answers
    from the row says what the node running it says once those events are persisted:
    the terminal update's flush carries the final figure."""
    usage = run.usage
    return None if usage is None else json.dumps(usage.to_json())


def _encoded(item: Item) -> str | None:
    """The item as its session row holds it (None: not storable; the run's own session
    write then fails with the error, as in one process)."""
    try:
        return encode_items([item])[0]
    except (TypeError, ValueError):
        return None


def _payload(run_id: str, last_seq: int, events: list[tuple[int, str]]) -> str:
    """A run's NOTIFY: the head, then (after a newline) as many of ``events`` (seq and
    JSON text, in order) as fit in :data:`INLINE_BYTES`."""
    head = json.dumps({"k": "run", "r": run_id, "s": last_seq})
    room = INLINE_BYTES - len(head) - 3  # the newline and the brackets
    parts: list[str] = []
    for seq, text in events:
        part = f"[{seq},{text}]"
        room -= len(part.encode()) + 1
        if room < 0:
            break
        parts.append(part)
    if not parts:
        return head
    return head + "\n[" + ",".join(parts) + "]"


def _page(
    conn: Conn, *, run_id: str, start: int, absent_ends: bool = True
) -> tuple[list[tuple[Any, ...]], bool]:
    """The run's events from ``start`` (a page), and, when there are none, whether the
    run has ended before ``start`` (finished and its last seq below it, or gone — unless
    ``absent_ends``: a child run whose first events are not flushed yet): then
    nothing more will ever come."""
    rows = conn.execute(
        "SELECT seq, data FROM trio_agents_events WHERE run_id = %s AND seq >= %s"
        " ORDER BY seq LIMIT %s",
        (run_id, start, _PAGE),
    ).fetchall()
    if rows:
        return rows, False
    row = conn.execute(
        "SELECT finished, last_seq FROM trio_agents_runs WHERE run_id = %(r)s UNION ALL"
        " SELECT finished, last_seq FROM trio_agents_children WHERE run_id = %(r)s",
        {"r": run_id},
    ).fetchone()
    if row is None:
        return rows, absent_ends
    return rows, bool(row[0]) and int(row[1]) < start


def _is_terminal(event: dict[str, Any]) -> bool:
    return event.get("type") == "run.updated" and event.get("status") in _TERMINAL


async def follow(
    db: Database,
    listener: Listener,
    run_id: str,
    from_seq: int | None,
    mode: str,
    send: Callable[[dict[str, Any]], Awaitable[None]],
    *,
    absent_ends: bool = True,
) -> None:
    """Send the run's persisted events from ``from_seq`` on, then the live ones as they
    are persisted, until the terminal ``run.updated`` (see the module docstring).
    ``absent_ends=False``: a run without a row yet (a child run just started) is
    waited for instead of ended."""
    next_seq = max(from_seq or 1, 1)
    backoff = 0.05

    async def deliver(seq: int, event: dict[str, Any]) -> bool:
        """Send one event (status mode: only updates); True once it was terminal."""
        nonlocal next_seq
        next_seq = seq + 1
        if mode != "status" or event.get("type") in ("run.updated", "events.dropped"):
            await send({"type": "event", "run_id": run_id, "seq": seq, "event": event})
        return _is_terminal(event)

    while True:
        with listener.watch(("run", run_id), keep=True) as wake:
            try:
                rows, ended = await db.call(
                    functools.partial(_page, run_id=run_id, start=next_seq, absent_ends=absent_ends)
                )
                backoff = 0.05
            except ClusterDown:
                await trio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            for seq, data in rows:
                if await deliver(seq, json.loads(data)):
                    return
            if ended:
                return  # from_seq past the end of a finished run: nothing will come
            if len(rows) == _PAGE:
                continue
            # Live: the events the NOTIFYs carry, while they continue where we are; a
            # bounded poll covers a NOTIFY lost with a connection.
            while True:
                with trio.move_on_after(_POLL):
                    await wake.wait()
                messages = wake.take()
                if not messages:
                    break  # the poll: read the table
                caught_up = True
                for message in messages:
                    inline = _inline(message)
                    if inline is None:
                        caught_up = False
                        break
                    last_seq, events = inline
                    for seq, event in events:
                        if seq < next_seq:
                            continue  # read from the table already
                        if seq > next_seq:
                            break  # a gap (a lost NOTIFY): the table has it
                        if await deliver(seq, event):
                            return
                    if last_seq >= next_seq:
                        caught_up = False  # more than the payload held, or a gap
                        break
                if not caught_up:
                    break


def _inline(message: dict[str, Any] | None) -> tuple[int, list[tuple[int, dict[str, Any]]]] | None:
    """A run NOTIFY's last seq and the events it carries (None: not one, or unreadable:
    read the table)."""
    if message is None:
        return None
    last_seq = message.get("s")
    if not isinstance(last_seq, int):
        return None
    tail = message.get("tail")
    if tail is None:
        return last_seq, []
    try:
        pairs = json.loads(tail)
        return last_seq, [(int(seq), event) for seq, event in pairs if isinstance(event, dict)]
    except (TypeError, ValueError):
        return None
