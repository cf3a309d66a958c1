"""Runs queued for capacity: a ``run.start`` when every node of the cluster is full.

The placing node inserts the run's row *unowned* (``owner`` NULL, ``released``, lease
expired at its insert, ``attempt`` 1) with its input in ``options`` and its first status
event, ``queued`` (seq 1), persisted and NOTIFY'd, and acks the start. Such a row is what
the takeover scan (``_takeover.py``) already claims — released, ``FOR UPDATE SKIP
LOCKED``, at most as many as the node has room for, in the order of their
``lease_expires_at`` (here: when they were queued, so first come, first served across
the cluster) — and resumes from the input kept in the row: it runs as a takeover's
attempt 2 (``running`` with ``detail={"resumed": true, "attempt": 2}``). A run with a
session waits for its session once it has a node (queued for it, in the order the
runs were started: ``_claims.py``). A node scans when a run of its own ends while
queued runs may wait, and when a run is queued (a NOTIFY ``{"k": "scan"}``).

A cancel of such a run (from any node, a disconnect's included) ends its row
``cancelled`` in the transaction that would route it (``Router.send``: no transaction
more for a routed cancel), unless a node has claimed it meanwhile (the row lock
decides): then it is routed to that node as for any run.
"""

from __future__ import annotations

import json
import time
from typing import Any

from .._events import RunStatus, RunUpdated
from ..hosting._error_codes import ProtocolError
from ._db import ClusterDown, Conn, Database
from ._schema import CHANNEL, session_key

__all__ = ["cancel_unstarted_in", "end_run_in", "enqueue_start"]


async def enqueue_start(
    db: Database,
    principal: str,
    request: dict[str, Any],
    run_id: str,
    *,
    client_node: str | None,
    bound: int,
) -> None:
    """Queue a ``run.start`` (its wire JSON) for capacity as ``run_id``.

    Raises:
        ProtocolError: ``limit_exceeded`` when ``principal`` has ``bound`` runs queued
            for capacity already, ``session_busy`` for an ``on_busy="reject"`` start
            whose session is held, ``internal`` when the database cannot be reached.
    """
    session_id = request.get("session_id")
    on_busy = request.get("on_busy") or "reject"
    key = session_key(principal, session_id, run_id)
    options: dict[str, Any] = {"input": request.get("input") or []}
    if client_node is not None:
        options["client"] = client_node
    event = RunUpdated(run_id, 1, RunStatus.QUEUED, None, 0, time.time()).to_json()

    def insert(conn: Conn) -> str | None:
        # One queue per principal: its bound holds against concurrent starts.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", ("capacity:" + principal,))
        (queued,) = conn.execute(
            "SELECT count(*) FROM trio_agents_runs WHERE principal = %s AND NOT finished"
            " AND owner IS NULL",
            (principal,),
        ).fetchone() or (0,)
        if int(queued) >= bound:
            return "limit_exceeded"
        if (
            session_id is not None
            and on_busy == "reject"
            and conn.execute(
                "SELECT 1 FROM trio_agents_runs WHERE active_key = %s", (key,)
            ).fetchone()
        ):
            return "session_busy"
        # Unclaimed session (active_key NULL): it claims it once it has a node.
        conn.execute(
            "INSERT INTO trio_agents_runs (run_id, principal, session_id, session_key,"
            " active_key, agent, options, status, owner, released, lease_expires_at,"
            " attempt, last_seq) VALUES (%s, %s, %s, %s, NULL, %s, %s, 'queued', NULL, true,"
            " clock_timestamp(), 1, 1)",
            (run_id, principal, session_id, key, request["agent"], json.dumps(options)),
        )
        conn.execute(
            "INSERT INTO trio_agents_events (run_id, seq, type, data)"
            " VALUES (%s, 1, 'run.updated', %s)",
            (run_id, json.dumps(event)),
        )
        conn.execute(
            "SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps({"k": "run", "r": run_id, "s": 1}))
        )
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps({"k": "scan", "q": 1})))
        return None

    try:
        refused = await db.call(insert)
    except ClusterDown as exc:
        raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
    if refused == "limit_exceeded":
        raise ProtocolError(
            "limit_exceeded",
            f"every node of the cluster is full and {bound} runs of this principal are"
            " queued already",
        )
    if refused == "session_busy":
        raise ProtocolError("session_busy", f"session {session_id!r} has an active run")


def cancel_unstarted_in(conn: Conn, principal: str, run_id: str, reason: str | None) -> bool:
    """End a run queued for capacity ``cancelled`` if no node has claimed it yet, inside
    the caller's transaction (the row lock decides against a claim); False when it has
    an owner (or is not the principal's unfinished run)."""
    row = conn.execute(
        "SELECT last_seq FROM trio_agents_runs WHERE run_id = %s AND principal = %s"
        " AND NOT finished AND owner IS NULL FOR UPDATE",
        (run_id, principal),
    ).fetchone()
    if row is None:
        return False
    end_run_in(conn, run_id, int(row[0]) + 1, RunStatus.CANCELLED, reason)
    return True


def end_run_in(
    conn: Conn,
    run_id: str,
    seq: int,
    status: RunStatus,
    reason: str | None,
    *,
    if_absent: bool = False,
) -> None:
    """End a run that no node runs (never started, or claimed and not resumable) in the
    caller's transaction: its terminal ``run.updated`` as event ``seq``, its row
    finished (the session released), and the NOTIFY its subscribers wait for.
    ``if_absent``: keep an event already stored at ``seq``."""
    event = RunUpdated(run_id, seq, status, reason, 0, time.time()).to_json()
    conn.execute(
        "INSERT INTO trio_agents_events (run_id, seq, type, data)"
        " VALUES (%s, %s, 'run.updated', %s)" + (" ON CONFLICT DO NOTHING" if if_absent else ""),
        (run_id, seq, json.dumps(event)),
    )
    conn.execute(
        # The terminal update written here has no detail and leaves nothing pending:
        # the row says so too (it is the run's record on every node).
        "UPDATE trio_agents_runs SET status = %s, reason = %s, finished = true,"
        " pending = '[]', detail = NULL,"
        " active_key = NULL, last_seq = %s, updated_at = now() WHERE run_id = %s",
        (status.value, reason, seq, run_id),
    )
    conn.execute(
        "SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps({"k": "run", "r": run_id, "s": seq}))
    )
