"""One active run per session across the cluster: the runs table's ``active_key``.

A run's row is inserted when it starts, holding ``active_key = session_key`` (NULL for a
run without a session); a partial unique index on ``active_key`` lets one row per
session hold it. The writer sets it back to NULL in the transaction that persists the
run's terminal status (``_eventlog.py``), so the next run may claim the session as soon
as any node can see that status. A takeover keeps the row (and so the claim).

``on_busy`` when the insert finds the session held:

A session is held, for this, also while runs queued for it wait (its holder just
ended; the next one has yet to claim it, or waits for its node's takeover): a start
never takes it past them (``"interrupt"`` aside, which goes first).

- ``"reject"``: ``session_busy`` — unless the holder is a run of this node that has
  already ended and whose terminal status is being written, which is waited for (a
  client that saw the terminal event may start the next run at once, as in one process);
- ``"enqueue"`` / ``"interrupt"``: the row is inserted *unclaimed* (``active_key``
  NULL, status ``queued``) and the ``run.start`` is acked at once, the run ``queued``,
  as in one process. :func:`claim_queued` then (``"interrupt"``: after cancelling the
  holder with reason ``"superseded"``, routed to its owner) waits for the holder to end
  and sets the row's ``active_key`` — unless the run ended meanwhile (cancelled while
  queued: it never touches the session). A row that is unfinished, has a session and
  no ``active_key`` is a queued run: a takeover queues it again.

Waiting is woken by the holder's NOTIFY (its terminal status persisted) and bounded by a
poll of :data:`POLL` seconds. Queued runs get the session in the order they were queued
(their rows' ``created_at``), cluster-wide, as in one process: an ``enqueue`` run claims
it only once no unfinished run queued before it waits (one whose node died waits for
its takeover, keeping its place), nor an ``interrupt`` run, which goes first as in one
process (``options["on_busy"]``; among several ``interrupt`` runs, whichever claims
first).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import psycopg
import trio

from ..hosting._error_codes import ProtocolError
from ._db import ClusterDown, Conn
from ._schema import session_key

if TYPE_CHECKING:
    from ._cluster_node import ClusterNode

__all__ = ["POLL", "claim_queued", "claim_run"]

POLL: Final = 1.0


async def claim_run(
    cluster: ClusterNode,
    *,
    run_id: str,
    principal: str,
    session_id: str | None,
    agent: str,
    on_busy: str,
    options: dict[str, Any],
    cancel_holder: Callable[[str, str | None], Awaitable[None]],
    command: int | None = None,
) -> str | None:
    """Insert the run's row, claiming its session per ``on_busy`` (see the module
    docstring); None when it holds the session, else the id of the run it is queued
    behind (unclaimed: see :func:`claim_queued`).

    A start placed here by another node (``command``, its routed command) holds that
    command's row while it inserts the run's: the placing node, if it gives up
    waiting, withdraws the command first (``Router.send``), so either the run's row
    exists once the command is withdrawn, or the run never starts.

    Raises:
        ProtocolError: ``session_busy`` (``reject``), or ``internal`` if the database
            cannot be reached, or the placing node gave up on this start.
    """
    key = session_key(principal, session_id, run_id)
    node, ttl = cluster.node_id, cluster.lease_ttl

    def values(claim: str | None) -> tuple[Any, ...]:
        """The row's values, claiming the session (``claim``) or queued (None)."""
        return (run_id, principal, session_id, key, claim, agent, json.dumps(options), node, ttl)

    insert = functools.partial(
        _insert_run,
        key=key,
        claimed=values(key if session_id is not None else None),
        queued=values(None),
        on_busy=on_busy,
        command=command,
    )
    queue = on_busy != "reject"
    while True:
        try:
            holder = await cluster.db.call(insert)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        if holder is None:
            return None
        holder_id, owner = holder
        if holder_id == "-":
            raise ProtocolError("internal", "the node that placed this run gave up on it")
        if not holder_id:
            continue  # it ended between our insert and our look
        if queue:
            if on_busy == "interrupt":
                await cancel_holder(holder_id, owner)
            return holder_id
        local = cluster.writer.logs.get(holder_id)
        if local is not None and local.run.status.is_terminal:
            await local.done.wait()  # its release is being written: then it is free
            continue
        raise ProtocolError("session_busy", f"session {session_id!r} has an active run")


_INSERT_RUN = (
    "INSERT INTO trio_agents_runs (run_id, principal, session_id, session_key,"
    " active_key, agent, options, status, owner, lease_expires_at)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s, 'queued', %s,"
    " now() + make_interval(secs => %s))"
)


def _insert_run(
    conn: Conn,
    *,
    key: str,
    claimed: tuple[Any, ...],
    queued: tuple[Any, ...],
    on_busy: str,
    command: int | None,
) -> tuple[str, str | None] | None:
    """:func:`claim_run`'s transaction: None when the row was inserted holding the
    session (``claimed``: its values, ``active_key`` set when it names a session);
    else the holder (or the first run queued) and its owner, the row inserted queued
    (``queued``) unless ``reject``; ``("", None)`` when the holder ended between the
    insert and the look, ``("-", None)`` when the placing node withdrew the command."""
    if command is not None and (
        conn.execute(
            "SELECT 1 FROM trio_agents_commands WHERE command_id = %s AND reply IS NULL FOR SHARE",
            (command,),
        ).fetchone()
        is None
    ):
        return ("-", None)  # withdrawn: its node no longer waits for this start
    queue = on_busy != "reject"
    if claimed[4] is not None and on_busy != "interrupt":
        # First come, first served, as in one process (where a session goes straight
        # from its holder to the next waiter): a session free for a moment (its holder
        # just ended; its next run's node dead, waiting for its takeover) is not taken
        # past the runs queued for it.
        ahead = conn.execute(
            "SELECT run_id, owner FROM trio_agents_runs WHERE session_key = %s"
            " AND NOT finished AND active_key IS NULL ORDER BY created_at LIMIT 1",
            (key,),
        ).fetchone()
        if ahead is not None:
            if queue:
                conn.execute(_INSERT_RUN, queued)
            return (str(ahead[0]), ahead[1])
    row = conn.execute(
        _INSERT_RUN + " ON CONFLICT (active_key) WHERE active_key IS NOT NULL DO NOTHING"
        " RETURNING run_id",
        claimed,
    ).fetchone()
    if row is not None:
        return None
    holder = conn.execute(
        "SELECT run_id, owner FROM trio_agents_runs WHERE active_key = %s", (key,)
    ).fetchone()
    if holder is None:
        return ("", None)
    if queue:  # queued: the row without the claim
        conn.execute(_INSERT_RUN, queued)
    return (str(holder[0]), holder[1])


_AHEAD = (
    "q.session_key = %(key)s AND NOT q.finished AND q.active_key IS NULL"
    " AND q.run_id <> me.run_id AND ((q.created_at, q.run_id) < (me.created_at, me.run_id)"
    " OR q.options::jsonb ->> 'on_busy' = 'interrupt')"
)
"""The runs ``q`` that go before the queued run ``me`` of an ``enqueue`` run's session
(``%(key)s``): those queued before it, and ``interrupt`` runs."""


async def claim_queued(
    cluster: ClusterNode,
    *,
    run_id: str,
    key: str,
    on_busy: str,
    waiting: Callable[[], bool],
    cancel_holder: Callable[[str, str | None], Awaitable[None]],
    interrupted: str | None = None,
) -> bool:
    """Claim the session of a queued run once its holder has ended (``"interrupt"``:
    each new holder is cancelled too, but ``interrupted``, the one :func:`claim_run`
    cancelled); False if the run ended first (``waiting()`` is False, or its row is
    finished). Retries while the database is unreachable."""
    cancelled: set[str | None] = {interrupted}

    params = {"key": key, "run": run_id}
    # An enqueue run waits for the runs queued before it, and for interrupt runs.
    ahead = (
        f" AND NOT EXISTS (SELECT 1 FROM trio_agents_runs q WHERE {_AHEAD})"
        if on_busy != "interrupt"
        else ""
    )

    def claim(conn: Conn) -> tuple[bool, tuple[str, str | None] | None]:
        try:
            with conn.transaction():  # a savepoint: another waiter may win the race
                row = conn.execute(
                    "UPDATE trio_agents_runs AS me SET active_key = %(key)s"
                    " WHERE run_id = %(run)s AND NOT finished AND NOT EXISTS (SELECT 1"
                    " FROM trio_agents_runs WHERE active_key = %(key)s)"
                    + ahead
                    + " RETURNING run_id",
                    params,
                ).fetchone()
        except psycopg.errors.UniqueViolation:
            row = None
        if row is not None:
            return True, None
        mine = conn.execute(
            "SELECT finished FROM trio_agents_runs WHERE run_id = %s", (run_id,)
        ).fetchone()
        if mine is None or mine[0]:
            return False, None
        holder = conn.execute(
            "SELECT run_id, owner FROM trio_agents_runs WHERE active_key = %s", (key,)
        ).fetchone()
        if holder is not None and str(holder[0]) == run_id:
            # Its own row holds the session: a claim of it committed whose answer was
            # lost (the connection dropped at the commit: retried here), or made by an
            # earlier attempt of it (whose writes are fenced off). Waiting for the
            # holder to end would wait for itself, forever.
            return True, None
        if holder is None and ahead:
            # No holder: a run queued before this one claims first; wait for it.
            holder = conn.execute(
                "SELECT q.run_id, NULL FROM trio_agents_runs q, trio_agents_runs me"
                f" WHERE me.run_id = %(run)s AND {_AHEAD} ORDER BY q.created_at LIMIT 1",
                params,
            ).fetchone()
        return False, (("", None) if holder is None else (str(holder[0]), holder[1]))

    backoff = 0.05
    while waiting():
        try:
            claimed, holder = await cluster.db.call(claim)
        except ClusterDown:
            if cluster.db.dead:
                return False
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)
            continue
        backoff = 0.05
        if claimed:
            return True
        if holder is None:
            return False  # this run has ended
        holder_id, owner = holder
        if not holder_id:
            continue  # it ended between our update and our look
        with cluster.listener.watch(("run", holder_id)) as wake:
            if on_busy == "interrupt" and holder_id not in cancelled:
                cancelled.add(holder_id)
                await cancel_holder(holder_id, owner)
            with trio.move_on_after(POLL):
                await wake.wait()
    return False
