"""One active run per session across the cluster: the runs table's ``active_key``.

A run's row is inserted when it starts, holding ``active_key = session_key`` (NULL for a
run without a session); a partial unique index on ``active_key`` lets one row per
session hold it. The writer sets it back to NULL in the transaction that persists the
run's terminal status (``_eventlog.py``), so the next run may claim the session as soon
as any node can see that status. A takeover keeps the row (and so the claim).

``on_busy`` when the insert finds the session held:

- ``"reject"``: ``session_busy`` — unless the holder is a run of this node that has
  already ended and whose terminal status is being written, which is waited for (a
  client that saw the terminal event may start the next run at once, as in one process);
- ``"interrupt"``: cancel the holder with reason ``"superseded"`` (routed to its owner),
  then wait for it to end and claim;
- ``"enqueue"``: wait for the holder to end, then claim.

Waiting is woken by the holder's NOTIFY (its terminal status persisted) and bounded by a
poll of :data:`POLL` seconds. The ``run.start`` of a waiting run is answered once it has
claimed the session (unlike one process, where the ack comes first and the run is
``queued``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import trio

from ..control._protocol import ProtocolError
from ._db import ClusterDown, Conn
from ._session import session_key

if TYPE_CHECKING:
    from ._cluster import PostgresCluster

__all__ = ["POLL", "claim_run"]

POLL: Final = 1.0


async def claim_run(
    cluster: PostgresCluster,
    *,
    run_id: str,
    principal: str,
    session_id: str | None,
    agent: str,
    on_busy: str,
    options: dict[str, Any],
    cancel_holder: Callable[[str, str | None], Awaitable[None]],
) -> None:
    """Insert the run's row, claiming its session per ``on_busy`` (see the module
    docstring).

    Raises:
        ProtocolError: ``session_busy`` (``reject``), or ``internal`` if the database
            cannot be reached.
    """
    key = session_key(principal, session_id, run_id)
    active = key if session_id is not None else None
    node, ttl = cluster.node_id, cluster.lease_ttl

    def insert(conn: Conn) -> tuple[str, str | None] | None:
        row = conn.execute(
            "INSERT INTO trio_agents_runs (run_id, principal, session_id, session_key,"
            " active_key, agent, options, status, owner, lease_expires_at)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, 'queued', %s,"
            " now() + make_interval(secs => %s))"
            " ON CONFLICT (active_key) WHERE active_key IS NOT NULL DO NOTHING RETURNING run_id",
            (run_id, principal, session_id, key, active, agent, json.dumps(options), node, ttl),
        ).fetchone()
        if row is not None:
            return None
        holder = conn.execute(
            "SELECT run_id, owner FROM trio_agents_runs WHERE active_key = %s", (key,)
        ).fetchone()
        return ("", None) if holder is None else (str(holder[0]), holder[1])

    interrupted: set[str] = set()
    while True:
        try:
            holder = await cluster.db.call(insert)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        if holder is None:
            return
        holder_id, owner = holder
        if not holder_id:
            continue  # it ended between our insert and our look
        wake = cluster.listener.watch(("run", holder_id))
        local = cluster.writer.logs.get(holder_id)
        if local is not None and local.run.status.is_terminal:
            await local.done.wait()  # its release is being written: then it is free
            continue
        if on_busy == "reject":
            raise ProtocolError("session_busy", f"session {session_id!r} has an active run")
        if on_busy == "interrupt" and holder_id not in interrupted:
            interrupted.add(holder_id)
            await cancel_holder(holder_id, owner)
        with trio.move_on_after(POLL):
            await wake.wait()
