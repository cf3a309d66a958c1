"""Control ops for runs owned by another node: the ``trio_agents_commands`` table.

The client's node inserts the request (op and its fields as JSON, the principal, the
run — or, for a placed ``run.start``, the target node) and NOTIFYs
``{"k": "cmd", "n": owner}``; the owner takes every unanswered command for its runs or
addressed to it (``FOR UPDATE SKIP LOCKED``), answers each with its own local op — the
same code as a single process, so the answers (``injection_id``, ``run_closed``, ...)
are the real ones — writes the reply into the row and NOTIFYs
``{"k": "reply", "n": origin, "c": command_id}``. The client's node then reads the
reply. A command for a run whose owner died stays unanswered until the node that takes
the run over answers it (it runs the open commands of each run it claims), or until
:data:`ROUTE_TIMEOUT` passes: then the client gets ``internal`` with a message saying
to retry (the run is being taken over).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, final

import trio

from ..control._protocol import ProtocolError
from ._db import ClusterDown, Conn, Database
from ._listener import Listener
from ._schema import CHANNEL

__all__ = ["ROUTE_TIMEOUT", "Router"]

logger = logging.getLogger("trio_agents.cluster")

ROUTE_TIMEOUT: Final = 30.0
"""Seconds a routed op waits for the owner's (or its successor's) answer."""

Executor = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
"""``execute(principal, request_json) -> reply``: the node's local op."""


@final
class Router:
    """Sends ops to their run's owner and answers the ops sent to this node."""

    def __init__(self, db: Database, listener: Listener, node_id: str) -> None:
        self._db = db
        self._listener = listener
        self._node_id = node_id
        self.execute: Executor | None = None
        self._wakeup = trio.Event()
        self._inflight: set[int] = set()
        self.routed = 0
        self.served = 0

    # -- the client's side ------------------------------------------------------------

    async def send(
        self,
        principal: str,
        request: dict[str, Any],
        *,
        run_id: str | None,
        target_node: str | None,
        owner: str | None,
    ) -> dict[str, Any]:
        """Route ``request`` (its wire JSON) and return the owner's ack fields.

        Raises:
            ProtocolError: the owner's error, or ``internal`` after ROUTE_TIMEOUT.
        """
        self.routed += 1
        node = self._node_id

        def insert(conn: Conn) -> int:
            row = conn.execute(
                "INSERT INTO trio_agents_commands"
                " (run_id, target_node, origin_node, principal, op, args)"
                " VALUES (%s, %s, %s, %s, %s, %s) RETURNING command_id",
                (run_id, target_node, node, principal, request["op"], json.dumps(request)),
            ).fetchone()
            assert row is not None
            conn.execute(
                "SELECT pg_notify(%s, %s)",
                (CHANNEL, json.dumps({"k": "cmd", "n": target_node or owner})),
            )
            return int(row[0])

        try:
            command_id = await self._db.call(insert)
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        reply: str | None = None
        with trio.move_on_after(ROUTE_TIMEOUT):
            while reply is None:
                wake = self._listener.watch(("reply", command_id))
                try:
                    reply = await self._db.call(
                        lambda conn: _reply(conn, command_id),
                    )
                except ClusterDown:
                    reply = None
                if reply is None:
                    with trio.move_on_after(1.0):
                        await wake.wait()
        if reply is None:
            with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                try:
                    await self._db.call(
                        lambda conn: conn.execute(
                            "DELETE FROM trio_agents_commands WHERE command_id = %s AND"
                            " reply IS NULL",
                            (command_id,),
                        )
                    )
                except ClusterDown:
                    pass
            raise ProtocolError(
                "internal",
                "the node running this run did not answer (it may be being taken over);"
                " retry",
            )
        answer = json.loads(reply)
        if "error" in answer:
            code, message = answer["error"]
            raise ProtocolError(code, message)
        data: dict[str, Any] = answer["ok"]
        return data

    # -- the owner's side -------------------------------------------------------------

    def wake(self) -> None:
        """Commands may be waiting for this node (a NOTIFY, a reconnection, a claim)."""
        self._wakeup.set()

    async def run(self) -> None:
        """Answer commands for this node until cancelled (each in its own task: an op
        may wait, e.g. an injection is acked once persisted)."""
        async with trio.open_nursery() as nursery:
            while True:
                await self._wakeup.wait()
                self._wakeup = trio.Event()
                try:
                    commands = await self._take()
                except ClusterDown:
                    if self._db.dead:
                        return
                    await trio.sleep(0.1)
                    self._wakeup.set()
                    continue
                for command in commands:
                    self._inflight.add(command[0])
                    nursery.start_soon(self._serve, *command)

    async def _take(self) -> list[tuple[int, str, str, str]]:
        node, skip = self._node_id, list(self._inflight)

        def take(conn: Conn) -> list[tuple[int, str, str, str]]:
            return [
                (int(r[0]), str(r[1]), str(r[2]), str(r[3]))
                for r in conn.execute(
                    "SELECT command_id, principal, args, origin_node FROM trio_agents_commands"
                    " WHERE reply IS NULL AND NOT command_id = ANY(%s) AND (target_node = %s"
                    " OR run_id IN (SELECT run_id FROM trio_agents_runs WHERE owner = %s))"
                    " ORDER BY command_id",
                    (skip, node, node),
                ).fetchall()
            ]

        return await self._db.call(take)

    async def _serve(self, command_id: int, principal: str, args: str, origin: str) -> None:
        # A command answered twice (two nodes racing right after a takeover) keeps the
        # first reply (the UPDATE only fills an empty one).
        try:
            assert self.execute is not None
            try:
                answer: dict[str, Any] = {"ok": await self.execute(principal, json.loads(args))}
            except ProtocolError as exc:
                answer = {"error": [exc.code, exc.message]}
            except Exception:
                logger.exception("routed command %s failed", command_id)
                answer = {"error": ["internal", "internal error"]}
            self.served += 1
            note = json.dumps({"k": "reply", "n": origin, "c": command_id})
            text = json.dumps(answer)

            def answer_it(conn: Conn) -> None:
                conn.execute(
                    "UPDATE trio_agents_commands SET reply = %s WHERE command_id = %s"
                    " AND reply IS NULL",
                    (text, command_id),
                )
                conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, note))

            backoff = 0.05
            while True:
                try:
                    await self._db.call(answer_it)
                    return
                except ClusterDown:
                    if self._db.dead:
                        return
                    await trio.sleep(backoff)
                    backoff = min(backoff * 2, 2.0)
        finally:
            self._inflight.discard(command_id)


def _reply(conn: Conn, command_id: int) -> str | None:
    row = conn.execute(
        "SELECT reply FROM trio_agents_commands WHERE command_id = %s", (command_id,)
    ).fetchone()
    if row is None or row[0] is None:
        return None
    return str(row[0])
