"""Control ops for runs owned by another node: the ``trio_agents_commands`` table.

The client's node inserts the request (op and its fields as JSON, the principal, the
run — or, for a placed ``run.start``, the target node), in the statement that checks the
run is the principal's and unfinished (``not_found``/``run_closed`` otherwise), and
NOTIFYs ``{"k": "cmd", "n": owner, ...}`` carrying the command itself when it is short.
The owner answers an inline command of one of its runs at once; otherwise (or on a poll
every few seconds, or after a reconnection) it reads every unanswered command for its
runs or addressed to it. It answers each with its own local op — the same code as a
single process, so the answers (``injection_id``, ``run_closed``, ...) are the real
ones — writes the reply into the row (only if it has none: a command is answered once)
and NOTIFYs ``{"k": "reply", "n": origin, "c": command_id, "a": answer}`` (the answer
inline when short; else the client's node reads the row). A command for a run whose owner died stays unanswered until the node that takes
the run over answers it (it runs the open commands of each run it claims), or until
:data:`ROUTE_TIMEOUT` passes: then the client gets ``internal`` with a message saying
to retry (the run is being taken over).

**Exactly-once answers across a takeover.** An op whose effect is durable records its
answer in the very transaction that makes the effect durable (:func:`store_reply`): a
cancel with the run's recorded cancel, a withdrawal with its row, an injection with the
flush that persists its ``inbox.injected`` event (``RunLog.replies``), an approval or
rejection with its decision in the run's row, recorded before it is applied (a takeover
applies it to the call asked again). So a command whose owner died after applying it
and before answering is answered (the client's node reads the row) and never applied
again by the next owner, which only serves commands without a reply.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Final, final

import trio

from ..hosting._error_codes import ProtocolError
from ..hosting._host import Origin
from ._capacity import cancel_unstarted_in
from ._db import ClusterDown, Conn, Database
from ._listener import Listener
from ._schema import CHANNEL
from ._storable import storable_json

__all__ = [
    "ROUTE_TIMEOUT",
    "Reply",
    "Router",
    "ok_reply",
    "record_cancel_in",
    "reply_note",
    "routed_reply",
    "store_reply",
]

logger = logging.getLogger("trio_agents.cluster")

ROUTE_TIMEOUT: Final = 30.0
"""Seconds a routed op waits for the owner's (or its successor's) answer."""

_POLL: Final = 2.0
_REPLY_POLL: Final = 1.0
_INLINE: Final = 6000
"""Commands and replies whose JSON is shorter go in the NOTIFY payload itself (its
limit is 8000 bytes), saving the reader a round trip; longer ones are read from the
table."""

Executor = Callable[[str, dict[str, Any], int], Awaitable[dict[str, Any]]]
"""``execute(principal, request_json, command_id) -> ack fields``: the node's local op.
The command's origin, as values, is :meth:`Router.origin` of its id: the node that
routed it, the run id it names (a placed start's chosen id) and the id under which
the op stores its answer with its durable effect."""


def ok_reply(fields: dict[str, Any]) -> str:
    """The stored reply of a command answered with these ack fields."""
    return json.dumps({"ok": fields})


def record_cancel_in(conn: Conn, run_id: str, reason: str | None, mode: str) -> None:
    """Keep a cancel in the run's ``options`` (``"cancel"``; the first one's reason and
    mode stay), inside the caller's transaction."""
    conn.execute(
        "UPDATE trio_agents_runs SET options = jsonb_set(options::jsonb, '{cancel}',"
        " COALESCE(options::jsonb -> 'cancel', %s::jsonb))::text"
        " WHERE run_id = %s AND NOT finished",
        # A reason with NUL or a lone surrogate would fail the ::jsonb cast (_storable).
        (json.dumps(storable_json({"reason": reason, "mode": mode})), run_id),
    )


UNSTARTED: Final = (-1, None)
"""What a routed cancel's transaction returns when it ended a run queued for capacity
that no node had claimed (``_capacity.cancel_unstarted_in``): nothing to route."""


def reply_note(origin: str, command_id: int, reply: str) -> str:
    """The NOTIFY payload that tells ``origin`` a command is answered (the answer
    itself inline when short; else its sender reads it from the row)."""
    note: dict[str, Any] = {"k": "reply", "n": origin, "c": command_id}
    if len(reply) < _INLINE:
        note["a"] = json.loads(reply)
    return json.dumps(note)


def routed_reply(origin: Origin | None, fields: dict[str, Any]) -> Reply | None:
    """What an op answering a routed command (``origin``: its command id and the node
    that sent it) with ``fields`` stores in the transaction making it durable: the reply
    and the NOTIFY to its sender. ``None`` for a local op."""
    if origin is None or origin.command is None:
        return None
    reply = ok_reply(fields)
    node = origin.node
    return origin.command, reply, None if node is None else reply_note(node, origin.command, reply)


Reply = tuple[int, str, str | None]
"""``(command_id, reply, note)``: a routed command's stored answer and the NOTIFY to
send with it (``None``: the router sends it)."""


def store_reply(conn: Conn, command_id: int, reply: str, note: str | None = None) -> None:
    """Answer a command in the caller's transaction (only if it has no answer yet: a
    command is answered once), and notify its sender (``note``) on commit."""
    conn.execute(
        "UPDATE trio_agents_commands SET reply = %s WHERE command_id = %s AND reply IS NULL",
        (reply, command_id),
    )
    if note is not None:
        conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, note))


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
        # The origin of each command being answered, and those whose op stored and sent
        # its answer itself, by command id.
        self._origins: dict[int, Origin] = {}
        self._answered: set[int] = set()
        self._replies: dict[Any, str] = {}
        self._nursery: trio.Nursery | None = None
        # Whether a run is this node's (set by the cluster): inline commands only then.
        self.serves_inline: Callable[[Any, Any], bool] = lambda run_id, principal: False
        self.routed = 0
        self.served = 0

    # -- the client's side ------------------------------------------------------------

    async def send(
        self,
        principal: str,
        request: dict[str, Any],
        *,
        run_id: str | None,
        target_node: str | None = None,
    ) -> dict[str, Any]:
        """Route ``request`` (its wire JSON) to the owner of ``run_id`` (or, for a placed
        ``run.start``, to ``target_node``, ``run_id`` being the new run's id) and return
        its ack fields.

        A placed start that gets no answer in time (its node died after starting it,
        or is slow) is settled here: the command is withdrawn, which the target's start
        cannot outrun (it holds the command row while it inserts the run's row,
        ``_claims.claim_run``); then the start took effect if and only if the run's row
        exists, and its ack is returned (else ``internal``).

        Raises:
            ProtocolError: ``not_found`` (no such run of ``principal``), ``run_closed``
                (it has finished), the owner's own error, or ``internal`` after
                ROUTE_TIMEOUT.
        """
        self.routed += 1
        try:
            inserted = await self._db.call(
                functools.partial(
                    _insert_command,
                    principal=principal,
                    request=request,
                    run_id=run_id,
                    target_node=target_node,
                    origin=self._node_id,
                )
            )
        except ClusterDown as exc:
            raise ProtocolError("internal", f"cluster database unavailable: {exc}") from None
        if inserted is None:
            raise await self._refusal(principal, run_id)
        if inserted is UNSTARTED:
            return {}
        command_id = inserted[0]
        # A start placed on target_node (an op addressed to a node for a run without a
        # row, a child run of a tree there, is not one).
        placed = run_id if target_node is not None and request["op"] == "run.start" else None
        reply = await self._wait_reply(principal, command_id, placed)
        if reply is None:
            raise ProtocolError(
                "internal",
                "the node running this run did not answer (it may be being taken over); retry",
            )
        answer = json.loads(reply)
        if "error" in answer:
            code, message = answer["error"]
            raise ProtocolError(code, message)
        data: dict[str, Any] = answer["ok"]
        return data

    async def _wait_reply(self, principal: str, command_id: int, placed: str | None) -> str | None:
        """The answer to ``command_id`` (None: none within ROUTE_TIMEOUT, and the
        command withdrawn). A placed start (``placed``: its run id) is settled when no
        answer comes, or when the wait is cut: it took effect if and only if its run's
        row exists."""

        def withdraw(conn: Conn) -> str | None:
            gone = conn.execute(
                "DELETE FROM trio_agents_commands WHERE command_id = %s AND reply IS NULL"
                " RETURNING 1",
                (command_id,),
            ).fetchone()
            if gone is None:  # answered meanwhile
                return _reply(conn, command_id)
            if (
                placed is not None
                and conn.execute(
                    "SELECT 1 FROM trio_agents_runs WHERE run_id = %s AND principal = %s",
                    (placed, principal),
                ).fetchone()
            ):  # started by a node that could not answer
                return ok_reply({"run_id": placed})
            return None

        async def settle() -> str | None:
            with (
                trio.CancelScope(shield=True),
                trio.move_on_after(2.0 if placed is None else 10.0),
                contextlib.suppress(ClusterDown),
            ):
                return await self._db.call(withdraw)
            return None

        reply: str | None = None
        try:
            with trio.move_on_after(ROUTE_TIMEOUT):
                while reply is None:
                    reply = await self._poll_reply(command_id)
        except BaseException:
            if placed is not None:
                # A placed start cut here (its connection aborted): settled before
                # this node goes on, so that the run exists if and only if it started
                # (the caller then treats it as placed: its client's disconnect
                # cancels it, ``ClusterHost._place``).
                await settle()
            raise
        if reply is None:
            reply = await settle()
        return reply

    async def _poll_reply(self, command_id: int) -> str | None:
        """The answer, from its NOTIFY (inline) or, after a bounded wait, its row."""
        with self._listener.watch(("reply", command_id)) as wake:
            reply = self._replies.pop(command_id, None)
            if reply is None:
                with trio.move_on_after(_REPLY_POLL):
                    await wake.wait()
                reply = self._replies.pop(command_id, None)
        if reply is None:  # not inline (too long), or its NOTIFY was lost
            with contextlib.suppress(ClusterDown):
                reply = await self._db.call(lambda conn: _reply(conn, command_id))
        return reply

    async def _refusal(self, principal: str, run_id: str | None) -> ProtocolError:
        def look(conn: Conn) -> bool | None:
            row = conn.execute(
                "SELECT finished FROM trio_agents_runs WHERE run_id = %s AND principal = %s",
                (run_id, principal),
            ).fetchone()
            return None if row is None else bool(row[0])

        try:
            finished = await self._db.call(look)
        except ClusterDown as exc:
            return ProtocolError("internal", f"cluster database unavailable: {exc}")
        if finished is None:
            return ProtocolError("not_found", f"no run {run_id!r}")
        return ProtocolError("run_closed", f"run {run_id} is closed")

    def replied(self, message: dict[str, Any]) -> None:
        """A reply NOTIFY for a command of this node (its answer inline, if small)."""
        command_id = message.get("c")
        answer = message.get("a")
        if isinstance(answer, dict):
            self._replies[command_id] = json.dumps(answer)
        self._listener.notify(("reply", command_id))

    def command(self, message: dict[str, Any]) -> None:
        """A command NOTIFY for this node: served at once when it is inline and its run
        is this node's (or it is a placed start); else the table is read."""
        command_id, request, run_id = message.get("c"), message.get("a"), message.get("r")
        nursery = self._nursery
        if (
            nursery is None
            or not isinstance(command_id, int)
            or not isinstance(request, dict)
            or command_id in self._inflight
            or not (message.get("t") or self.serves_inline(run_id, message.get("p")))
        ):
            self.wake()
            return
        self._inflight.add(command_id)
        nursery.start_soon(
            self._serve,
            command_id,
            str(message.get("p")),
            json.dumps(request),
            str(message["o"]),
            run_id if isinstance(run_id, str) else None,
        )

    # -- the owner's side -------------------------------------------------------------

    def wake(self) -> None:
        """Commands may be waiting for this node (a NOTIFY, a reconnection, a claim)."""
        self._wakeup.set()

    async def run(self) -> None:
        """Answer commands for this node until cancelled (each in its own task: an op
        may wait, e.g. an injection is acked once persisted)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            while True:
                # Woken by NOTIFY; a bounded poll covers a notification lost with a
                # connection.
                with trio.move_on_after(_POLL):
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
                    if command[0] in self._inflight:
                        continue  # served inline meanwhile (its NOTIFY came first)
                    self._inflight.add(command[0])
                    nursery.start_soon(self._serve, *command)

    async def _take(self) -> list[tuple[int, str, str, str, str | None]]:
        node, skip = self._node_id, list(self._inflight)

        def take(conn: Conn) -> list[tuple[int, str, str, str, str | None]]:
            return [
                (int(r[0]), str(r[1]), str(r[2]), str(r[3]), None if r[4] is None else str(r[4]))
                for r in conn.execute(
                    "SELECT command_id, principal, args, origin_node, run_id"
                    " FROM trio_agents_commands"
                    " WHERE reply IS NULL AND NOT command_id = ANY(%s) AND (target_node = %s"
                    # A placed start (run_id: the run it would start) is its target's.
                    " OR target_node IS NULL"
                    " AND run_id IN (SELECT run_id FROM trio_agents_runs WHERE owner = %s))"
                    " ORDER BY command_id",
                    (skip, node, node),
                ).fetchall()
            ]

        return await self._db.call(take)

    async def _serve(
        self, command_id: int, principal: str, args: str, origin: str, run_id: str | None
    ) -> None:
        # A command answered twice (two nodes racing right after a takeover) keeps the
        # first reply (the UPDATE only fills an empty one).
        try:
            assert self.execute is not None
            request = json.loads(args)
            # The command's origin, as values the op reads by the command's id: it
            # stores its answer under that id and notifies the node that sent it (a
            # routed cancel was recorded by its sender already, Router.send).
            self._origins[command_id] = Origin(
                principal=principal, node=origin, run_id=run_id, command=command_id
            )
            try:
                fields = await self.execute(principal, request, command_id)
                answer: dict[str, Any] = {"ok": fields}
            except ProtocolError as exc:
                answer = {"error": [exc.code, exc.message]}
            except Exception:
                logger.exception("routed command %s failed", command_id)
                answer = {"error": ["internal", "internal error"]}
            self.served += 1
            if command_id in self._answered:
                return  # stored and sent with the op's own durable effect
            text = json.dumps(answer)
            note = reply_note(origin, command_id, text)

            def answer_it(conn: Conn) -> None:
                store_reply(conn, command_id, text, note)

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
            self._origins.pop(command_id, None)
            self._answered.discard(command_id)

    def origin(self, command_id: int) -> Origin:
        """Where the command this node is answering comes from (see :data:`Executor`)."""
        return self._origins[command_id]

    def answered(self, command_id: int) -> None:
        """The op answering ``command_id`` stored its answer and notified its sender in
        its own transaction: the router sends nothing more (one transaction fewer on
        the path of a routed cancel, withdrawal or decision)."""
        if command_id in self._origins:
            self._answered.add(command_id)


def _insert_command(
    conn: Conn,
    *,
    principal: str,
    request: dict[str, Any],
    run_id: str | None,
    target_node: str | None,
    origin: str,
) -> tuple[int, str | None] | None:
    """Insert a routed command (and record a routed cancel) in one transaction;
    returns its id and the run's owner, :data:`UNSTARTED` for a cancel that ended a
    run queued for capacity at once, None when the run is not the principal's
    unfinished run."""
    args = json.dumps(request)
    # One statement: the run must be the principal's and unfinished; its owner
    # is read with it.
    row = conn.execute(
        "WITH r AS (SELECT owner FROM trio_agents_runs WHERE run_id = %(run)s"
        " AND principal = %(p)s AND NOT finished),"
        " ins AS (INSERT INTO trio_agents_commands"
        " (run_id, target_node, origin_node, principal, op, args)"
        " SELECT %(run)s, %(target)s, %(origin)s, %(p)s, %(op)s, %(args)s"
        " WHERE %(target)s::text IS NOT NULL OR EXISTS (SELECT 1 FROM r)"
        " RETURNING command_id)"
        " SELECT ins.command_id, (SELECT owner FROM r) FROM ins",
        {
            "run": run_id,
            "p": principal,
            "target": target_node,
            "origin": origin,
            "op": request["op"],
            "args": args,
        },
    ).fetchone()
    if row is None:
        return None
    command_id, owner = int(row[0]), row[1]
    if (
        request["op"] == "run.cancel"
        and run_id is not None
        and owner is None
        and cancel_unstarted_in(conn, principal, run_id, request.get("reason"))
    ):  # queued for capacity, claimed by no node: ended here, answered at once
        conn.execute("DELETE FROM trio_agents_commands WHERE command_id = %s", (command_id,))
        return UNSTARTED
    if request["op"] == "run.cancel" and run_id is not None:
        # Durable before the owner sees it: the owner acks without writing it.
        record_cancel_in(conn, run_id, request.get("reason"), request.get("mode", "immediate"))
    note: dict[str, Any] = {"k": "cmd", "n": target_node or owner}
    if len(args) < _INLINE:  # the owner can serve it without reading the row
        note.update(c=command_id, r=run_id, p=principal, a=request, o=origin)
        if target_node is not None:
            note["t"] = 1  # addressed to that node: served there in any case
    conn.execute("SELECT pg_notify(%s, %s)", (CHANNEL, json.dumps(note)))
    return command_id, owner


def _reply(conn: Conn, command_id: int) -> str | None:
    row = conn.execute(
        "SELECT reply FROM trio_agents_commands WHERE command_id = %s", (command_id,)
    ).fetchone()
    if row is None or row[0] is None:
        return None
    return str(row[0])
