"""The cluster's small statements, one function each: reading run rows, the
``before_tool`` barrier, picking nodes with room, withdrawals, releasing a node's runs."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._items import ToolCall
from ..control._protocol import ProtocolError
from ._db import ClusterDown, Conn, Database
from ._eventlog import Fence
from ._routing import CANCEL_RECORDED, record_cancel_in, store_reply
from ._schema import CHANNEL
from ._session import RETRY_FOR

__all__ = [
    "CANCEL_RECORDED",
    "nodes_with_room",
    "read_runs",
    "record_cancel",
    "record_cancel_in",
    "record_withdrawal",
    "release_node",
    "tool_start_barrier",
]

_COLUMNS = (
    "run_id, agent, session_id, status, reason, last_seq, turn, pending, owner, finished, principal"
)


async def read_runs(db: Database, where: str, params: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Run rows matching ``where`` (oldest first), as ``run.get`` fields plus ``owner``,
    ``finished`` and ``principal``.

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
            except ClusterDown:
                if db.dead or trio.current_time() + backoff > give_up:
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
    db: Database, run_id: str, injection_id: str, reply: tuple[int, str] | None = None
) -> None:
    """A withdrawn injection is never injected again by a takeover (a routed
    withdrawal's ``reply``, ``(command_id, reply)``, is stored in the same transaction)."""

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
    reply: tuple[int, str] | None = None,
) -> None:
    """An acked cancel is durable: kept in the run's ``options`` (``"cancel"``); a
    takeover that finds it ends the run cancelled instead of continuing it.

    A routed cancel's ``reply``, ``(command_id, reply)``, is stored before the owner
    acts further, so a node that takes the run over answers from it instead of
    serving the command again (it would find the run ended: ``run_closed``). The
    cancel itself was recorded by the node that sent it, before the owner saw it
    (:data:`CANCEL_RECORDED`): then only the reply is written (a row of the commands
    table, not the run's row, which the repair's writes need)."""
    recorded = CANCEL_RECORDED.get()
    if recorded and reply is None:
        await trio.lowlevel.checkpoint()
        return

    def record(conn: Conn) -> None:
        if not recorded:
            record_cancel_in(conn, run_id, reason, mode)
        if reply is not None:
            store_reply(conn, *reply)

    await db.call(record)


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
