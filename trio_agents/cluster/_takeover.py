"""Leases and takeover.

Every ``lease_ttl / 3`` seconds a node's heartbeat task (its own: no scan, resumption
or cleanup delays it) runs one transaction on its own connection (never waiting for the
pool the work uses): it upserts its row in ``trio_agents_nodes`` (lease, capacity,
running count, draining) and extends the lease of every unfinished run it owns *and
runs* (runs it stopped on its own are released instead; runs a previous process under
the same node id left behind expire and are taken over), skipping the rows another
transaction has locked (``SKIP LOCKED``: the heartbeat never waits for the locks the
work holds; the node's flush renews the lease of each run row it writes, and the next
beat the others). Its scan task, as often,
scans for runs whose lease expired, or that their node *released* on a graceful
shutdown (``SELECT ... FOR UPDATE SKIP LOCKED``, at most as many as it has room for),
claims them (``owner = me``, ``attempt + 1``) and resumes each
from its session with :class:`trio_agents.Resume`: seqs continue after the last persisted
one, calls recorded in ``trio_agents_tool_starts`` count as started (they get
``interrupted`` unless idempotent), and injections that were acked (a persisted
``inbox.injected``) but neither delivered nor withdrawn are injected again — unless
their items are already in the session after their acceptance (an ``inbox.delivered``
lost with its node: see :func:`_undelivered`). Approvals and rejections recorded in the
run's row are given to the resumed run (``Resume.approved``/``rejected``), which answers
the calls it asks for again with them, without an ``awaiting_approval`` status; so is what
its limits counted so far (its row's ``usage``, ``Resume.spent``), what its model calls
used (its row's ``run_usage``, ``Resume.usage``: its usage and cost go on from it), the
time since it was accepted (``Resume.elapsed``: its deadline counts from then), and its tree's
unfinished child runs (``Resume.children``: a child the tree resumes keeps its id and
continues its log). A run that had handed off continues as the agent its last persisted
``run.handoff`` names (``Resume.agent``), not the one it was started with. A run whose
client's node (``on_disconnect="cancel"``) is
dead is cancelled at once (``"client disconnected"``), and each scan also cancels this
node's runs whose client's node has died since (``ClusterNode.check_clients``). A
NOTIFY ``{"k": "scan"}`` (a node handing its runs over) triggers a scan at once.

Every :data:`CLEANUP_INTERVAL` seconds a node also deletes the rows of runs finished
longer than ``retain_finished`` ago (and their events, tool starts, withdrawals and
commands, their child runs' rows and events), answered commands as old, and node rows whose lease expired as long ago.

A run whose agent this node does not serve, or that cannot be resumed, is marked
``failed`` with a terminal event, so it never stays orphaned.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Final

import attrs
import trio

from .._events import (
    InboxDelivered,
    InboxInjected,
    RunHandoff,
    RunItemEvent,
    RunStatus,
    event_from_json,
)
from .._items import Item, item_from_json
from .._limits import UsageLimits
from .._model import Usage, usage_from_json
from .._resume import Resume
from .._run import Run
from ..hosting._error_codes import ProtocolError
from ..hosting._policies import effective_limits, limits_from_wire
from ._capacity import end_run_in
from ._db import ClusterDown, Conn, Dedicated
from ._queries import CLIENT_GONE, decisions_of, live_nodes
from ._schema import CHANNEL

if TYPE_CHECKING:
    from ._cluster_node import ClusterNode

__all__ = ["Claimed", "Leases"]

logger = logging.getLogger("trio_agents.cluster")

CLEANUP_INTERVAL: Final = 60.0
"""Seconds between a node's sweeps of finished runs past their retention."""

_TIME: Final = "now() + make_interval(secs => %(ttl)s)"


@attrs.frozen
class Claimed:
    """A run this node just took over, with what its resumption needs."""

    run_id: str
    principal: str
    session_id: str | None
    agent: str
    previous_owner: str | None
    attempt: int
    last_seq: int
    started: frozenset[str]
    reinject: tuple[InboxInjected, ...]
    input: tuple[Item, ...] = ()  # its input, if not in its session yet (_input)
    cancel: tuple[str | None, str] | None = None  # an acked cancel: (reason, mode)
    # Recorded approvals and rejections, by call id: (approved, message).
    decisions: tuple[tuple[str, bool, str | None], ...] = ()
    queued: bool = False  # still queued for its session (never claimed it: _claims.py)
    # on_disconnect="cancel": the node holding its client's connection, and whether
    # that node was dead (lease expired, or stopped) when the run was claimed.
    client_node: str | None = None
    client_gone: bool = False
    limits: UsageLimits | None = None  # what it was started with (options["limits"])
    # The agent its last persisted run.handoff switched to (None: it never handed off).
    current_agent: str | None = None
    # What its limits counted so far (its row's usage) and the seconds since it was
    # accepted (its row's created_at): the resumed attempt's budget and deadline.
    spent: dict[str, int] = attrs.field(factory=dict)
    elapsed: float = 0.0
    usage: Usage | None = None  # what its earlier attempts' calls used (its run_usage)
    # Its tree's unfinished child runs, by (parent id, call id): (child id, last seq);
    # and the cancels acked for them, by child id: (reason, mode).
    children: dict[tuple[str, str], tuple[str, int]] = attrs.field(factory=dict)
    child_cancels: dict[str, tuple[str | None, str]] = attrs.field(factory=dict)


def _cancel(options: str) -> tuple[str | None, str] | None:
    try:
        cancel = json.loads(options).get("cancel")
        if not isinstance(cancel, dict):
            return None
        reason, mode = cancel.get("reason"), cancel.get("mode")
        return (
            reason if isinstance(reason, str) else None,
            mode if mode in ("immediate", "after_turn") else "immediate",
        )
    except (TypeError, ValueError, AttributeError):
        return None


def _stored(conn: Conn, key: str) -> list[dict[str, object]]:
    """A session's stored items, as JSON."""
    rows = conn.execute(
        "SELECT data FROM trio_agents_session_items WHERE session_id = %s ORDER BY position",
        (key,),
    ).fetchall()
    return [json.loads(r[0]) for r in rows]


def _find(stored: list[dict[str, object]], block: list[dict[str, object]], start: int) -> int:
    """Where ``block`` occurs (contiguous) in ``stored`` at or after ``start``; -1 if not."""
    if not block:
        return -1
    for at in range(start, len(stored) - len(block) + 1):
        if stored[at : at + len(block)] == block:
            return at
    return -1


def _undelivered(
    pending: tuple[InboxInjected, ...],
    accepted: list[InboxInjected],
    items: list[tuple[int, dict[str, object]]],
    stored: list[dict[str, object]],
) -> tuple[InboxInjected, ...]:
    """The pending injections (acked, no persisted ``inbox.delivered``) whose items are
    not in the stored session after their acceptance.

    An ``inbox.delivered`` event may be lost with its node while the delivered items
    already reached the session (they are written by the run, the events by the
    writer). The rule: every event before a persisted ``inbox.injected`` is persisted
    too (the writer keeps the order), so the last ``run.item`` before the first pending
    injection — the *anchor* — is known; an injection's items are delivered as one
    contiguous block, in acceptance order, after it. So, from the last occurrence of the
    anchor in the session (or its start), each injection accepted since then takes, in
    order, the first later occurrence of its items; the pending ones that find none were
    not delivered and are injected again. (An anchor repeated verbatim after the
    delivery makes a delivered injection look undelivered: it is then delivered twice,
    never lost.)
    """
    first = pending[0].seq
    before = [item for seq, item in items if seq < first]
    cursor = 0
    if before:
        anchor = before[-1]
        for at in range(len(stored) - 1, -1, -1):
            if stored[at] == anchor:
                cursor = at + 1
                break
    left = []
    for event in accepted:
        if event.seq < first:
            continue
        block = [item.to_json() for item in event.items]
        at = _find(stored, block, cursor)
        if at < 0:
            if event in pending:
                left.append(event)
            continue
        cursor = at + len(block)
    return tuple(left)


def _client(options: str) -> str | None:
    try:
        client = json.loads(options).get("client")
    except (TypeError, ValueError, AttributeError):
        return None
    return client if isinstance(client, str) else None


def _limits(options: str) -> UsageLimits | None:
    """The run's limits, as its start stored them (already checked then)."""
    try:
        stored = json.loads(options).get("limits")
        if not isinstance(stored, dict):
            return None
        return effective_limits(limits_from_wire("limits", stored), None)
    except (TypeError, ValueError, AttributeError, ProtocolError):
        return None


def _run_usage(stored: str | None) -> Usage | None:
    """A run's persisted own usage (None if none, or unreadable: the resumed run then
    counts its own calls only, rather than failing to resume)."""
    try:
        return usage_from_json(json.loads(stored)) if stored else None
    except (TypeError, ValueError, ArithmeticError):
        logger.warning("unreadable run_usage %r: the resumed run starts from none", stored)
        return None


def _spent(usage: str | None) -> dict[str, int]:
    """A run's persisted ``usage`` (``{}`` if none, or unreadable)."""
    try:
        stored = json.loads(usage) if usage else {}
    except (TypeError, ValueError):
        return {}
    if not isinstance(stored, dict):
        return {}
    return {
        str(name): count
        for name, count in stored.items()
        if isinstance(count, int) and not isinstance(count, bool) and count >= 0
    }


def _input(options: str, logged: bool) -> tuple[Item, ...]:
    """The run's input, if it has yet to reach the session: not once the run logged a
    ``run.item`` (an attempt's input is its first, written to the session with it) or
    a takeover wrote it (``input_written``, ``ClusterSession.add_input``). What else
    the session holds (earlier runs' items) does not tell."""
    try:
        parsed = json.loads(options)
        if logged or parsed.get("input_written") is True:
            return ()
        return tuple(item_from_json(item) for item in parsed.get("input", ()))
    except (TypeError, ValueError, AttributeError):
        return ()


def _children(
    conn: Conn, ids: list[str]
) -> tuple[
    dict[str, dict[tuple[str, str], tuple[str, int]]],
    dict[str, dict[str, tuple[str | None, str]]],
]:
    """The unfinished child runs of the trees of ``ids`` (roots), by root: by (parent
    id, call id), (child id, last seq); and the cancels acked for them, by child id."""
    children: dict[str, dict[tuple[str, str], tuple[str, int]]] = {}
    cancels: dict[str, dict[str, tuple[str | None, str]]] = {}
    for root_id, parent_id, call_id, child_id, child_seq, cancel in conn.execute(
        "SELECT root_id, parent_id, call_id, run_id, last_seq, cancel"
        " FROM trio_agents_children WHERE root_id = ANY(%s) AND NOT finished",
        (ids,),
    ).fetchall():
        key = (str(parent_id), str(call_id))
        children.setdefault(str(root_id), {})[key] = (str(child_id), int(child_seq))
        acked = _cancel(f'{{"cancel": {cancel}}}') if cancel else None  # as a run's
        if acked is not None:
            cancels.setdefault(str(root_id), {})[str(child_id)] = acked
    return children, cancels


class Leases:
    """The heartbeat and the takeover scan of one node."""

    def __init__(self, node: ClusterNode) -> None:
        self._node = node
        self._wakeup = trio.Event()
        self.draining = False
        self.takeovers = 0
        self.renewed_at = 0.0  # when the last successful heartbeat was sent (Trio clock)
        self._renewed = trio.Event()
        self.fenced = 0
        self._next_cleanup = 0.0
        self._resuming: set[str] = set()
        self._resumed = trio.Event()
        # Runs this node stopped on its own (lease lost): released by the next heartbeat
        # that reaches the database, so another node takes them over at once.
        self.to_release: set[str] = set()
        self.lock = trio.Lock()  # held by a heartbeat, and by the hand-over for good
        # Held by a scan (claims and resumptions): a hand-over waits for the one in
        # flight, so every run it resumed is handed over too.
        self.scanning = trio.Lock()
        self.stopped = False
        # Runs queued for capacity may wait (a NOTIFY said so, or the last scan filled
        # this node's room): a run ending here wakes the scan (ClusterNode.room_freed).
        self.queued = True
        self._connection = Dedicated(node.db)  # the heartbeat's own

    def wake(self) -> None:
        """Scan now (a node released runs, or we reconnected)."""
        self._wakeup.set()

    async def heartbeat(self) -> None:
        """Renew the node's and its runs' leases (one statement)."""
        node = self._node
        sent = trio.current_time()
        releasing = list(self.to_release)
        # Only the runs this process runs (or is resuming, or starting): a node
        # restarted under the same id must not keep alive the leases of its previous
        # process's runs, which then expire and are taken over (by any node, itself
        # included).
        owned = [
            run_id
            for run_id, log in node.writer.logs.items()
            if not log.fence.closed and log.root is None  # a child has no row
        ]
        owned += self._resuming
        owned += node.starting
        params = {
            "node": node.node_id,
            "ttl": node.lease_ttl,
            "max": node.max_runs,
            "running": node.running(),
            "draining": self.draining,
            "releasing": releasing,
            "owned": owned,
        }

        def beat(conn: Conn) -> set[str]:
            # No statement here waits for a run's row lock (the node's own flushes and
            # other nodes' routed writes hold them, for as long as a loaded machine
            # makes them last): rows locked now are skipped (SKIP LOCKED). A skipped
            # run's lease is renewed by the flush holding its row, or by the next beat.
            left: set[str] = set()
            if releasing:
                released = conn.execute(
                    "UPDATE trio_agents_runs SET released = true, lease_expires_at = now()"
                    " WHERE run_id IN (SELECT run_id FROM trio_agents_runs"
                    " WHERE run_id = ANY(%(releasing)s) AND owner = %(node)s AND NOT finished"
                    " FOR UPDATE SKIP LOCKED) RETURNING run_id",
                    params,
                ).fetchall()
                if released:
                    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps({"k": "scan"})))
                # Skipped (locked now): released by the next beat.
                left = {
                    str(row[0])
                    for row in conn.execute(
                        "SELECT run_id FROM trio_agents_runs WHERE run_id = ANY(%(releasing)s)"
                        " AND owner = %(node)s AND NOT finished AND NOT released",
                        params,
                    ).fetchall()
                }
            conn.execute(
                "WITH node AS (INSERT INTO trio_agents_nodes"
                " (node_id, lease_expires_at, max_runs, running, draining)"
                f" VALUES (%(node)s, {_TIME}, %(max)s, %(running)s, %(draining)s)"
                " ON CONFLICT (node_id) DO UPDATE SET lease_expires_at ="
                " EXCLUDED.lease_expires_at, max_runs = EXCLUDED.max_runs, running ="
                " EXCLUDED.running, draining = EXCLUDED.draining, updated_at = now()"
                " RETURNING 1)"
                f" UPDATE trio_agents_runs SET lease_expires_at = {_TIME}"
                " WHERE run_id IN (SELECT run_id FROM trio_agents_runs"
                " WHERE owner = %(node)s AND NOT finished AND NOT released"
                " AND run_id = ANY(%(owned)s) FOR UPDATE SKIP LOCKED)",
                params,
            )
            return left

        # On the node's own connection: never behind the work's pooled connections.
        left = await self._connection.call(beat)
        self.to_release.difference_update(set(releasing) - left)
        self.renewed_at = sent
        self._renewed.set()
        self._renewed = trio.Event()

    async def watchdog(self) -> None:
        """Stop this node's runs once its leases may expire unrenewed (the database
        unreachable for most of ``lease_ttl``): before another node can take them over,
        never at the same time. Runs until cancelled."""
        node = self._node
        while True:
            renewed = self._renewed
            with trio.move_on_at(self.give_up_at()):
                await renewed.wait()
                continue
            if node.db.dead:
                return
            self.fenced += node.lose_all("lease lost")
            await renewed.wait()

    async def run(self, task_status: trio.TaskStatus[None]) -> None:
        """Heartbeat every ``lease_ttl / 3`` s in one task; scan (and sweep) as often in
        another, so a slow scan, resumption or cleanup never delays a heartbeat. Started
        after the first heartbeat; runs until cancelled (or the hand-over stops it)."""
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._beat)
                task_status.started()
                await self._scans()
        finally:
            await self._connection.aclose()

    def give_up_at(self) -> float:
        """When the watchdog stops this node's runs unless a heartbeat renews their
        leases first: ``0.8 * lease_ttl`` after the last renewal was sent (Trio clock)."""
        return self.renewed_at + 0.8 * self._node.lease_ttl

    async def _beat(self, task_status: trio.TaskStatus[None]) -> None:
        node = self._node
        interval = node.lease_ttl / 3
        started = False
        while True:
            # A period from start to start, whatever a beat took: a slow beat does not
            # push the next one back by its own length (on a loaded machine, two beats
            # of a few hundred ms in a row left a 1 s lease no renewal within 0.8 T).
            due = trio.current_time() + interval
            try:
                async with self.lock:
                    if self.stopped:
                        return
                    # Bounded, by the watchdog's moment (one interval at least): a slow
                    # beat (the database or this process busy, a lock waited for) that
                    # renews before the watchdog gives the runs up still counts; cut at
                    # one interval it failed, and the next came too late (its lock and
                    # statement timeouts are capped by this deadline).
                    with trio.move_on_at(max(self.give_up_at(), trio.current_time() + interval)):
                        await self.heartbeat()
                if not started and self.renewed_at > 0:
                    started = True
                    task_status.started()
            except ClusterDown:
                if node.db.dead:
                    return
                logger.warning("cluster heartbeat failed; retrying", exc_info=True)
            await trio.sleep_until(due)  # a period, not a synchronisation

    async def _scans(self) -> None:
        node = self._node
        while not self.stopped:
            try:
                if not self.draining:
                    async with self.scanning:
                        if not self.draining:
                            await self.scan()
                            await node.check_clients()
                    if trio.current_time() >= self._next_cleanup:
                        self._next_cleanup = trio.current_time() + CLEANUP_INTERVAL
                        # Well under the watchdog's margin: its lock waits fail first.
                        with trio.move_on_after(node.lease_ttl / 4):
                            await self.cleanup()
            except ClusterDown:
                if node.db.dead:
                    return
                logger.warning("cluster scan failed; retrying", exc_info=True)
            with trio.move_on_after(node.lease_ttl / 3):
                await self._wakeup.wait()
            self._wakeup = trio.Event()

    async def cleanup(self) -> None:
        """Forget runs finished more than ``retain_finished`` ago (their events, tool
        starts, withdrawals and commands too) and answered commands older than that:
        whichever node does it first (every :data:`CLEANUP_INTERVAL` s per node). Rows
        another transaction holds are skipped (``SKIP LOCKED``): the next sweep gets
        them."""
        node = self._node
        registry = node.registry
        retain = 600.0 if registry is None else registry.limits.retain_finished

        def delete(conn: Conn) -> None:
            old = conn.execute(
                "DELETE FROM trio_agents_runs WHERE run_id IN (SELECT run_id FROM"
                " trio_agents_runs WHERE finished AND updated_at <"
                " now() - make_interval(secs => %s) FOR UPDATE SKIP LOCKED) RETURNING run_id",
                (retain,),
            ).fetchall()
            ids = [str(r[0]) for r in old]
            if ids:
                children = conn.execute(
                    "DELETE FROM trio_agents_children WHERE root_id = ANY(%s) RETURNING run_id",
                    (ids,),
                ).fetchall()
                ids += [str(r[0]) for r in children]  # their events go with their root's
                for table in ("events", "tool_starts", "withdrawals", "commands"):
                    conn.execute(f"DELETE FROM trio_agents_{table} WHERE run_id = ANY(%s)", (ids,))
            conn.execute(
                "DELETE FROM trio_agents_commands WHERE command_id IN (SELECT command_id FROM"
                " trio_agents_commands WHERE reply IS NOT NULL AND created_at <"
                " now() - make_interval(secs => %s) FOR UPDATE SKIP LOCKED)",
                (retain,),
            )
            conn.execute(
                "DELETE FROM trio_agents_nodes WHERE node_id IN (SELECT node_id FROM"
                " trio_agents_nodes WHERE lease_expires_at <"
                " now() - make_interval(secs => %s) FOR UPDATE SKIP LOCKED)",
                (retain,),
            )

        await node.db.call(delete)

    async def scan(self) -> None:
        """Claim and resume runs whose lease expired or that were released."""
        node = self._node
        room = node.max_runs - node.running()
        if room <= 0:
            return
        # Never the runs this node runs (or starts, resumes, or has yet to release):
        # a lease of one of them that lapsed (its row locked at every beat) is renewed
        # by the next beat, not taken over from itself.
        mine = set(self.to_release) | self._resuming | node.starting
        mine.update(run_id for run_id, log in node.writer.logs.items() if not log.fence.closed)
        claimed = await node.db.call(lambda conn: self._claim(conn, room, mine))
        self.queued = len(claimed) >= room  # fewer: none was left to claim
        # Ours from the commit on: a command for any of them waits for its resumption.
        self._resuming.update(run.run_id for run in claimed)
        for run in claimed:
            self.takeovers += 1
            await self.resume(run)

    async def wait_resumed(self, run_id: str) -> None:
        """Wait while ``run_id`` is claimed here and not resumed yet."""
        while run_id in self._resuming:
            await self._resumed.wait()

    async def resume(self, claimed: Claimed) -> None:
        """Continue a run this node just claimed (see the module docstring)."""
        node = self._node
        placement = node.placement
        assert placement is not None
        try:
            if claimed.agent not in placement.registry.agents:
                await self.fail(
                    claimed, f"agent {claimed.agent!r} is not served by node {node.node_id}"
                )
                return
            resume = Resume(
                attempt=claimed.attempt,
                next_seq=claimed.last_seq + 1,
                started=claimed.started,
                reason=f"node {claimed.previous_owner} stopped",
                agent=claimed.current_agent,
                spent=claimed.spent,
                elapsed=claimed.elapsed,
                usage=claimed.usage,
                children={
                    key: (child_id, last_seq + 1)
                    for key, (child_id, last_seq) in claimed.children.items()
                },
                approved={call_id for call_id, approved, _ in claimed.decisions if approved},
                rejected={
                    call_id: message
                    for call_id, approved, message in claimed.decisions
                    if not approved
                },
            )

            def then(run: Run) -> None:
                # Before the resumed run can call its model or end: an acked cancel
                # ends it (the session repaired as by a cancel); acked injections are
                # queued first thing, so none can find the run closed.
                if claimed.cancel is not None:
                    reason, mode = claimed.cancel
                    run.cancel(reason, mode=mode)  # type: ignore[arg-type]
                    return
                if claimed.client_gone:  # its client's node died: as its disconnect
                    run.cancel(CLIENT_GONE)
                    return
                for injected in claimed.reinject:
                    try:
                        run.inject(list(injected.items), when=injected.when)  # type: ignore[arg-type]
                    except Exception:
                        logger.exception("re-injecting into run %s failed", claimed.run_id)

            # Cancels acked for its children: applied as the resumed tree makes them.
            node.writer.child_cancels.update(claimed.child_cancels)
            try:
                await placement.resume(claimed, resume, then)
            except Exception as exc:
                logger.exception("resuming run %s failed", claimed.run_id)
                await self.fail(claimed, f"could not resume: {exc!r}")
                return
        finally:
            self._resuming.discard(claimed.run_id)
            self._resumed.set()
            self._resumed = trio.Event()
            node.router.wake()  # commands that waited for the run's new owner

    def _claim(self, conn: Conn, room: int, mine: set[str]) -> list[Claimed]:
        node = self._node
        rows = conn.execute(
            "SELECT run_id, principal, session_id, agent, owner, attempt, last_seq, options,"
            " session_key, session_id IS NOT NULL AND active_key IS NULL, usage,"
            " GREATEST(EXTRACT(EPOCH FROM now() - created_at), 0)::float8, run_usage"
            " FROM trio_agents_runs WHERE NOT finished AND (released OR lease_expires_at <"
            " now()) AND NOT (run_id = ANY(%s)) ORDER BY lease_expires_at, created_at LIMIT %s"
            " FOR UPDATE SKIP LOCKED",
            # Not the runs this node stopped and has yet to release (its heartbeat, in
            # another task, would release them after we claimed them back), nor those
            # it runs.
            (sorted(mine), room),
        ).fetchall()
        if not rows:
            return []
        ids = [str(r[0]) for r in rows]
        conn.execute(
            "UPDATE trio_agents_runs SET owner = %(node)s, attempt = attempt + 1, released ="
            f" false, lease_expires_at = {_TIME}, updated_at = now()"
            " WHERE run_id = ANY(%(ids)s)",
            {"node": node.node_id, "ttl": node.lease_ttl, "ids": ids},
        )
        starts: dict[str, set[str]] = {}
        for run_id, call_id in conn.execute(
            "SELECT run_id, call_id FROM trio_agents_tool_starts WHERE run_id = ANY(%s)", (ids,)
        ).fetchall():
            starts.setdefault(str(run_id), set()).add(str(call_id))
        withdrawn = {
            (str(r), str(i))
            for r, i in conn.execute(
                "SELECT run_id, injection_id FROM trio_agents_withdrawals WHERE run_id = ANY(%s)",
                (ids,),
            ).fetchall()
        }
        injected, delivered, items, handed_to = _persisted(conn, ids)
        children, child_cancels = _children(conn, ids)
        clients = {str(r[0]): _client(str(r[7])) for r in rows}
        wanted = sorted({node for node in clients.values() if node is not None})
        alive = live_nodes(conn, wanted) if wanted else set()
        claimed = []
        for row in rows:
            run_id, principal, session_id, agent, owner, attempt, last_seq, options, key = row[:9]
            queued, usage, elapsed, run_usage = row[9:]
            accepted = [
                event
                for injection_id, event in injected.get(run_id, {}).items()
                if (run_id, injection_id) not in withdrawn
            ]
            pending = tuple(e for e in accepted if (run_id, e.injection_id) not in delivered)
            if pending and not queued:  # a queued run has delivered nothing
                pending = _undelivered(
                    pending, accepted, items.get(run_id, []), _stored(conn, str(key))
                )
            claimed.append(
                Claimed(
                    run_id=run_id,
                    principal=principal,
                    session_id=session_id,
                    agent=agent,
                    previous_owner=owner,
                    attempt=int(attempt) + 1,
                    last_seq=int(last_seq),
                    started=frozenset(starts.get(run_id, ())),
                    reinject=pending,
                    input=_input(options, bool(items.get(run_id))),
                    cancel=_cancel(options),
                    decisions=tuple(
                        (call_id, approved, message)
                        for call_id, (approved, message) in decisions_of(options).items()
                    ),
                    queued=bool(queued),
                    client_node=clients[run_id],
                    client_gone=clients[run_id] is not None and clients[run_id] not in alive,
                    limits=_limits(options),
                    current_agent=handed_to.get(run_id),
                    spent=_spent(usage),
                    elapsed=float(elapsed),
                    usage=_run_usage(run_usage),
                    children=children.get(run_id, {}),
                    child_cancels=child_cancels.get(run_id, {}),
                )
            )
        return claimed

    async def fail(self, run: Claimed, reason: str) -> None:
        """End a claimed run that cannot be resumed: ``failed`` with a terminal event."""
        node = self._node

        def write(conn: Conn) -> None:
            end_run_in(conn, run.run_id, run.last_seq + 1, RunStatus.FAILED, reason, if_absent=True)

        await node.db.call(write)


def _persisted(
    conn: Conn, ids: list[str]
) -> tuple[
    dict[str, dict[str, InboxInjected]],
    set[tuple[str, str]],
    dict[str, list[tuple[int, dict[str, object]]]],
    dict[str, str],
]:
    """What the claimed runs' persisted events say, in one query: their injections (by
    run, then injection id), the deliveries, their items (seq, JSON), and the agent each
    last handed off to."""
    injected: dict[str, dict[str, InboxInjected]] = {}
    delivered: set[tuple[str, str]] = set()
    items: dict[str, list[tuple[int, dict[str, object]]]] = {}
    handed_to: dict[str, str] = {}
    for run_id, data in conn.execute(
        "SELECT run_id, data FROM trio_agents_events WHERE run_id = ANY(%s) AND type IN"
        " ('inbox.injected', 'inbox.delivered', 'run.item', 'run.handoff')"
        " ORDER BY run_id, seq",
        (ids,),
    ).fetchall():
        event = event_from_json(json.loads(data))
        if isinstance(event, RunHandoff):
            handed_to[str(run_id)] = event.to_agent  # in seq order: the last one wins
        elif isinstance(event, InboxInjected):
            injected.setdefault(str(run_id), {})[event.injection_id] = event
        elif isinstance(event, InboxDelivered):
            delivered.add((str(run_id), event.injection_id))
        elif isinstance(event, RunItemEvent):
            items.setdefault(str(run_id), []).append((event.seq, event.item.to_json()))
    return injected, delivered, items, handed_to
