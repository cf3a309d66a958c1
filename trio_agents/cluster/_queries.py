"""The cluster's small statements, one function each: reading run rows, the
``before_tool`` barrier, picking nodes with room, withdrawals, releasing a node's runs."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._items import ToolCall
from ..hosting._error_codes import ProtocolError
from ._db import ClusterDown, Conn, Database
from ._eventlog import Fence
from ._routing import Reply, record_cancel_in, store_reply
from ._schema import CHANNEL
from ._session import RETRY_FOR
from ._storable import refused, storable, storable_json

__all__ = [
    "CLIENT_GONE",
    "decisions_of",
    "live_nodes",
    "nodes_with_room",
    "read_runs",
    "record_cancel",
    "record_cancel_in",
    "record_decision",
    "record_withdrawal",
    "release_node",
    "tool_start_barrier",
]

CLIENT_GONE = "client disconnected"
"""The reason of a run cancelled because the node holding its client's connection is
dead: the same as that client's disconnect (``on_disconnect="cancel"``)."""

_COLUMNS = (
    "run_id, agent, session_id, status, reason, last_seq, turn, pending, owner, finished,"
    " principal, run_usage, detail"
)


async def read_runs(db: Database, where: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Run rows matching ``where`` (oldest first), as ``run.get`` fields plus ``owner``,
    ``finished`` and ``principal`` (``usage`` only once the run's node wrote one;
    ``detail`` as of its last persisted status update).

    Raises:
        ProtocolError: ``internal`` when the database cannot be reached.
    """

    def read(conn: Conn) -> list[dict[str, Any]]:
        return [
            {
                "run_id": r[0],
                "agent": r[1],
                "session_id": r[2],
                "status": r[3],
                "reason": r[4],
                "seq": int(r[5]),
                "turn": int(r[6]),
                "pending_approvals": json.loads(r[7]),
                "owner": r[8],
                "finished": bool(r[9]),
                "principal": r[10],
                **({} if r[11] is None else {"usage": json.loads(r[11])}),
                # The current status's detail, as the node running the run wrote it
                # with that status's event (NULL: none written yet).
                "detail": {} if r[12] is None else json.loads(r[12]),
            }
            for r in conn.execute(
                f"SELECT {_COLUMNS} FROM trio_agents_runs WHERE {where} ORDER BY created_at",
                params,
            ).fetchall()
        ]

    try:
        return await db.call(read)
    except ClusterDown as exc:
        raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None


def tool_start_barrier(
    db: Database, run_id: str, node_id: str, attempt: int, fence: Fence
) -> Callable[[ToolCall], Awaitable[None]]:
    """The ``before_tool`` run option: insert ``(run_id, call_id)`` into
    ``trio_agents_tool_starts`` before the tool executes (retried across a database
    restart for up to RETRY_FOR s). If it raises, the tool does not run.

    Fenced in the database: the insert happens only while the run's row says this node
    owns this attempt (``owner``, ``attempt``, not released), under the row's share
    lock, so a node that stalled past its lease and was taken over can never start a
    tool (a takeover's claim waits for the lock; it then sees the start)."""

    def insert(conn: Conn, call_id: str) -> bool:
        owned = conn.execute(
            "SELECT 1 FROM trio_agents_runs WHERE run_id = %s AND owner = %s AND attempt = %s"
            " AND NOT released AND NOT finished FOR SHARE",
            (run_id, node_id, attempt),
        ).fetchone()
        if owned is None:
            return False
        conn.execute(
            "INSERT INTO trio_agents_tool_starts (run_id, call_id, attempt)"
            " VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            (run_id, call_id, attempt),
        )
        return True

    async def barrier(call: ToolCall) -> None:
        backoff = 0.05
        give_up = trio.current_time() + RETRY_FOR
        while True:
            if fence.closed:
                raise RuntimeError("this node no longer runs the call")
            try:
                owned = await db.call(lambda conn: insert(conn, call.call_id))
            except ClusterDown as exc:
                # A call id the database refuses (NUL, from a model) is refused at once:
                # the tool does not run, the model reads the error.
                if db.dead or refused(exc) or trio.current_time() + backoff > give_up:
                    raise
            else:
                if owned:
                    return
                # Taken over (or released): the writer's next flush finds the row
                # gone and stops the run here.
                raise RuntimeError("this node no longer owns the run")
            await trio.sleep(backoff)
            backoff = min(backoff * 2, 1.0)

    return barrier


async def nodes_with_room(db: Database, node_id: str) -> list[str]:
    """Up to three live, non-draining other nodes with room, least loaded first (as of
    their last heartbeat)."""

    def pick(conn: Conn) -> list[str]:
        return [
            str(row[0])
            for row in conn.execute(
                "SELECT node_id FROM trio_agents_nodes WHERE node_id <> %s AND NOT draining"
                " AND lease_expires_at > now() AND running < max_runs"
                " ORDER BY running::float / max_runs LIMIT 3",
                (node_id,),
            ).fetchall()
        ]

    try:
        return await db.call(pick)
    except ClusterDown as exc:
        raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None


async def record_withdrawal(
    db: Database, run_id: str, injection_id: str, reply: Reply | None = None
) -> None:
    """A withdrawn injection is never injected again by a takeover (a routed
    withdrawal's ``reply`` (:data:`Reply`), is stored in the same transaction)."""

    def record(conn: Conn) -> None:
        conn.execute(
            "INSERT INTO trio_agents_withdrawals (run_id, injection_id) VALUES (%s, %s)"
            " ON CONFLICT DO NOTHING",
            (run_id, injection_id),
        )
        if reply is not None:
            store_reply(conn, *reply)

    await db.call(record)


async def record_cancel(
    db: Database,
    run_id: str,
    reason: str | None,
    mode: str,
    reply: Reply | None = None,
    *,
    recorded: bool = False,
) -> None:
    """An acked cancel is durable: kept in the run's ``options`` (``"cancel"``); a
    takeover that finds it ends the run cancelled instead of continuing it.

    A routed cancel's ``reply`` (:data:`Reply`), is stored before the owner
    acts further, so a node that takes the run over answers from it instead of
    serving the command again (it would find the run ended: ``run_closed``). The
    cancel itself was recorded by the node that sent it, before the owner saw it
    (``recorded``): then only the reply is written (a row of the commands table, not
    the run's row, which the repair's writes need)."""
    if recorded and reply is None:
        await trio.lowlevel.checkpoint()
        return

    def record(conn: Conn) -> None:
        if not recorded:
            record_cancel_in(conn, run_id, reason, mode)
        if reply is not None:
            store_reply(conn, *reply)

    await db.call(record)


async def record_decision(
    db: Database,
    run_id: str,
    node_id: str,
    attempt: int,
    call_id: str,
    decision: dict[str, Any],
    reply: Reply | None = None,
) -> str:
    """Record an approval or rejection (``decision``: ``{"approved": bool, "message":
    str | None}``, plus ``"asked_in"``: the attempt, for the answer to a question) in
    the run's ``options`` (``"decisions"``, by call id) before it is applied: a
    takeover applies it to the call its run asks for again. A routed one's ``reply``
    (:data:`Reply`), is stored in the same transaction.

    Returns ``"recorded"``; ``"decided"`` when the call has a decision already (the
    first one stays: the run applies it, never this one) — a question's answer only
    within the attempt that asked it; ``"closed"`` when the run has finished;
    ``"lost"`` when this node no longer runs this attempt (another node took it over:
    nothing is recorded)."""

    def record(conn: Conn) -> str:
        row = conn.execute(
            "SELECT owner, attempt, released, finished, options FROM trio_agents_runs"
            " WHERE run_id = %s FOR UPDATE",
            (run_id,),
        ).fetchone()
        if row is None or row[3]:
            return "closed"
        if row[0] != node_id or int(row[1]) != attempt or row[2]:
            return "lost"
        if _decided(str(row[4]), call_id, attempt):
            return "decided"
        conn.execute(
            "UPDATE trio_agents_runs SET options = jsonb_set(options::jsonb, '{decisions}',"
            " COALESCE(options::jsonb -> 'decisions', '{}'::jsonb)"
            " || jsonb_build_object(%s::text, %s::jsonb))::text WHERE run_id = %s",
            # NUL or a lone surrogate would fail the casts (_storable.py).
            (storable(call_id), json.dumps(storable_json(decision)), run_id),
        )
        if reply is not None:
            store_reply(conn, *reply)
        return "recorded"

    return await db.call(record)


def _recorded(options: str) -> dict[str, Any]:
    """The ``"decisions"`` object of a run's ``options`` (empty when absent or bad)."""
    try:
        recorded = json.loads(options).get("decisions")
    except (TypeError, ValueError, AttributeError):
        return {}
    return recorded if isinstance(recorded, dict) else {}


def _decided(options: str, call_id: str, attempt: int) -> bool:
    """Whether ``call_id`` has a decision that a new one must not replace. A question's
    answer (``"asked_in"``) holds within the attempt that asked it only: the attempt
    that takes the run over runs the asking call again from its start (an idempotent
    tool) and its question, asked again under the same id (each attempt counts its
    questions from 1), waits for a new answer — which the old one must not refuse."""
    decision = _recorded(options).get(call_id)
    if not isinstance(decision, dict):
        return False
    asked_in = decision.get("asked_in")
    return asked_in is None or asked_in == attempt


def decisions_of(options: str) -> dict[str, tuple[bool, str | None]]:
    """The recorded approvals and rejections of calls in a run's ``options``, by call
    id: ``(approved, message)``, for the attempt that takes the run over. Not the
    answers to questions: a question is asked by a running call, which a takeover never
    resumes mid-way (the call is interrupted, or runs again and asks again)."""
    decisions: dict[str, tuple[bool, str | None]] = {}
    for call_id, decision in _recorded(options).items():
        if isinstance(decision, dict) and "asked_in" not in decision:
            message = decision.get("message")
            decisions[str(call_id)] = (
                decision.get("approved") is True,
                message if isinstance(message, str) else None,
            )
    return decisions


def live_nodes(conn: Conn, nodes: list[str]) -> set[str]:
    """Which of ``nodes`` are alive (their lease has not expired)."""
    return {
        str(row[0])
        for row in conn.execute(
            "SELECT node_id FROM trio_agents_nodes WHERE node_id = ANY(%s)"
            " AND lease_expires_at > now()",
            (nodes,),
        ).fetchall()
    }


async def release_node(db: Database, node_id: str) -> None:
    """A graceful stop: release the node's unfinished runs (their leases end now),
    delete its row, and NOTIFY a scan so another node takes them over at once."""

    def release(conn: Conn) -> None:
        conn.execute(
            "UPDATE trio_agents_runs SET released = true, lease_expires_at = now()"
            " WHERE owner = %s AND NOT finished",
            (node_id,),
        )
        conn.execute("DELETE FROM trio_agents_nodes WHERE node_id = %s", (node_id,))
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps({"k": "scan"})))

    await db.call(release)
