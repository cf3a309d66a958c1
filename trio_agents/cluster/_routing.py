"""Control ops for runs owned by another node: the ``trio_agents_commands`` table.

An op travels as a typed value (:data:`RoutedOp`: the request classes the faces parse
into, a placed start's :class:`~trio_agents.hosting.StartRequest`) up to here, and is
turned into the cluster's wire and back by one codec, :func:`to_wire` /
:func:`from_wire` (a versioned JSON object; an op a node cannot read is answered
``invalid_request``, never a crash). The client's node inserts the op (its wire JSON,
the principal, the run — or, for a placed start, the target node), in the statement
that checks the run is the principal's and unfinished (``not_found``/``run_closed``
otherwise), and NOTIFYs ``{"k": "cmd", "n": owner, ...}`` carrying the command itself
when it is short.
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
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, Literal, TypeAlias, final

import attrs
import trio

from .._items import Item, coerce_items
from ..hosting._error_codes import ProtocolError
from ..hosting._host import Origin, StartRequest
from ..hosting._policies import limits_to_wire
from ..hosting._registry import RunEntry
from ..hosting._requests import RunApprove, RunCancel, RunGet, RunInject, RunReject, RunWithdraw
from ._capacity import cancel_unstarted_in
from ._db import ClusterDown, Conn, Database
from ._listener import Listener
from ._schema import CHANNEL
from ._storable import storable_json

__all__ = [
    "ROUTE_TIMEOUT",
    "WIRE_VERSION",
    "Answer",
    "Control",
    "Reply",
    "RoutedOp",
    "Router",
    "from_wire",
    "ok_reply",
    "record_cancel_in",
    "reply_note",
    "routed_reply",
    "store_reply",
    "to_wire",
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

Control: TypeAlias = RunCancel | RunInject | RunWithdraw | RunApprove | RunReject
"""An op that steers a run: applied on the node that runs it."""

RoutedOp: TypeAlias = StartRequest | Control | RunGet
"""An op one node sends another: the typed values the faces parse into
(``hosting/_requests.py``; a placed start is the host's :class:`StartRequest`), carried
as they are through the host and turned into the cluster's wire (a command row, its
NOTIFY) here only, by :func:`to_wire` and :func:`from_wire`."""


@attrs.frozen
class Answer:
    """What an op answers: its ack ``fields``, and whether the op already ``stored``
    a routed command's answer, and notified its sender, in the transaction that made
    its effect durable (:func:`routed_reply`): then the router sends nothing more (one
    transaction fewer on the path of a routed cancel, withdrawal or decision)."""

    fields: Mapping[str, Any]
    stored: bool = False


Executor = Callable[[RoutedOp, Origin], Awaitable[Answer]]
"""``execute(op, origin) -> answer``: the node's local op. ``origin`` is where the
command comes from, as values: its principal, the node that routed it, the run id it
names (a placed start's chosen id) and the command's id, under which the op stores its
answer with its durable effect."""


# ------------------------------------------------------------------------ the wire

WIRE_VERSION: Final = 1
"""The version of a routed op's wire shape. A reader takes its own version and older
ones (a row written before the ``"v"`` key existed is version 1), ignores keys it does
not know (a newer node's optional additions) and refuses a newer version by name, so
the nodes of a cluster being upgraded one by one keep understanding each other."""

_CONTROLS: Final[Mapping[str, type[Control] | type[RunGet]]] = {
    cls.op: cls for cls in (RunCancel, RunInject, RunWithdraw, RunApprove, RunReject, RunGet)
}
_START: Final = "run.start"


def to_wire(op: RoutedOp) -> dict[str, Any]:
    """``op`` as the JSON object of its command (the keys a version-1 node reads: the
    op's name and its fields; items as their JSON). A start's ``context`` never
    travels (contexts come from the host's hook, DESIGN §18)."""
    if isinstance(op, StartRequest):
        return {
            "v": WIRE_VERSION,
            "op": _START,
            "agent": op.agent,
            "input": [item.to_json() for item in op.input],
            "session_id": op.session_id,
            "on_disconnect": op.on_disconnect,
            "on_busy": op.on_busy,
            "input_overlap": op.input_overlap,
            "limits": None if op.limits is None else limits_to_wire(op.limits),
        }
    wire: dict[str, Any] = {"v": WIRE_VERSION, "op": op.op}
    for field in attrs.fields(type(op)):
        if field.name != "id":  # the client's request id stays with its face
            value = getattr(op, field.name)
            wire[field.name] = _items_json(value) if field.name == "items" else value
    return wire


def from_wire(data: Any) -> RoutedOp:
    """The op a command's JSON object carries (:func:`to_wire`'s), checked field by
    field (types and choices: the bounds were the edge's, on the node that took it).

    Raises:
        ProtocolError: ``invalid_request`` naming what is wrong: not an object, a newer
            wire version, an op that is not routed, a missing or mistyped field.
    """
    if not isinstance(data, dict):
        raise _garbled(f"a routed op must be a JSON object, not {type(data).__name__}")
    version = data.get("v", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise _garbled(f"bad wire version {_shown(version)}")
    if version > WIRE_VERSION:
        raise _garbled(
            f"wire version {version} is newer than this node's ({WIRE_VERSION}): upgrade it"
        )
    op = data.get("op")
    if op == _START:
        return _start_from_wire(data)
    cls = _CONTROLS.get(op) if isinstance(op, str) else None
    if cls is None:
        raise _garbled(f"{_shown(op)} is not a routed op")
    fields: dict[str, Any] = {}
    for field in attrs.fields(cls):
        name = field.name
        if name == "id":
            continue
        value = data.get(name)
        if name == "items":
            fields[name] = _items(cls.op, name, value)
        elif name in _CHOICES:
            fields[name] = _choice(cls.op, name, value, field.default)
        elif name in ("reason", "message"):
            fields[name] = _text(cls.op, name, value, optional=True)
        elif name == "content":  # an approval's answer to a question (a JSON object)
            if value is not None and not isinstance(value, dict):
                raise _garbled(f"{cls.op}: content must be an object or null")
            fields[name] = value
        else:
            fields[name] = _text(cls.op, name, value)
    return cls(**fields)


# The fields with a fixed set of values, and those values (their defaults are the
# request classes').
_CHOICES: Final[Mapping[str, tuple[str, ...]]] = {
    "mode": ("immediate", "after_turn"),
    "when": ("next_turn", "now", "when_idle"),
    "on_disconnect": ("continue", "cancel"),
    "on_busy": ("reject", "interrupt", "enqueue"),
    "input_overlap": ("keep", "skip"),
}


def _start_from_wire(data: dict[str, Any]) -> StartRequest:
    limits = data.get("limits")
    if limits is not None and not isinstance(limits, dict):
        raise _garbled(f"{_START}: limits must be an object or null")
    # Defaults as a version-1 reader had them: a start without on_disconnect does not
    # cancel on its client's disconnect.
    on_disconnect: Literal["continue", "cancel"] = _choice(
        _START, "on_disconnect", data.get("on_disconnect"), "continue"
    )
    on_busy: Literal["reject", "interrupt", "enqueue"] = _choice(
        _START, "on_busy", data.get("on_busy"), "reject"
    )
    input_overlap: Literal["keep", "skip"] = _choice(
        _START, "input_overlap", data.get("input_overlap"), "keep"
    )
    return StartRequest(
        agent=_text(_START, "agent", data.get("agent")),
        input=_items(_START, "input", data.get("input")),
        session_id=_text(_START, "session_id", data.get("session_id"), optional=True),
        on_disconnect=on_disconnect,
        on_busy=on_busy,
        limits=limits,
        input_overlap=input_overlap,
    )


def _items_json(items: tuple[Item, ...]) -> list[dict[str, Any]]:
    return [item.to_json() for item in items]


def _items(op: str, name: str, value: Any) -> tuple[Item, ...]:
    if not isinstance(value, list):
        raise _garbled(f"{op}: {name} must be a list of items")
    try:
        return tuple(coerce_items(value))
    except (TypeError, ValueError, RecursionError) as exc:
        raise _garbled(f"{op}: bad {name}: {str(exc)[:200]}") from None


def _text(op: str, name: str, value: Any, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise _garbled(f"{op}: {name} must be a string{' or null' if optional else ''}")
    return value


def _choice(op: str, name: str, value: Any, default: Any) -> Any:
    if value is None:
        return default
    if value not in _CHOICES[name] or not isinstance(value, str):
        raise _garbled(f"{op}: {name} must be one of {', '.join(_CHOICES[name])}")
    return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _garbled(message: str) -> ProtocolError:
    return ProtocolError("invalid_request", f"unreadable routed op: {message}")


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
        self._replies: dict[Any, str] = {}
        self._nursery: trio.Nursery | None = None
        # This node's runs by id (its registry's), and the wait while a run taken over
        # is being resumed here: set by :meth:`attach`.
        self._runs: Mapping[str, RunEntry] = {}
        self._resumed: Callable[[str], Awaitable[None]] | None = None
        self.routed = 0
        self.served = 0

    def attach(
        self,
        execute: Executor,
        runs: Mapping[str, RunEntry],
        resumed: Callable[[str], Awaitable[None]],
    ) -> None:
        """Serve commands with ``execute``: this node's local ops. ``runs`` are the
        node's runs by id (an inline command is served at once only for one of them),
        ``resumed(run_id)`` waits while a run taken over is being resumed here (a
        command may come first)."""
        self.execute = execute
        self._runs = runs
        self._resumed = resumed

    # -- the client's side ------------------------------------------------------------

    async def send(
        self,
        principal: str,
        request: RoutedOp,
        *,
        run_id: str | None,
        target_node: str | None = None,
    ) -> dict[str, Any]:
        """Route ``request`` to the owner of ``run_id`` (or, for a placed start, to
        ``target_node``, ``run_id`` being the new run's id) and return its ack fields.
        ``request`` is turned into its wire JSON here (:func:`to_wire`), and a cancel
        recorded in the transaction that routes it.

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
        placed = run_id if target_node is not None and isinstance(request, StartRequest) else None
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
        is this node's (or it is a placed start); else (or when the note is not one this
        node can read) the table is read."""
        command_id, request, run_id = message.get("c"), message.get("a"), message.get("r")
        principal, origin = message.get("p"), message.get("o")
        nursery = self._nursery
        if (
            nursery is None
            or not isinstance(command_id, int)
            or not isinstance(request, dict)
            or not isinstance(principal, str)
            or not isinstance(origin, str)
            or not (run_id is None or isinstance(run_id, str))
            or command_id in self._inflight
            or not (message.get("t") or self._serves(run_id, principal))
        ):
            self.wake()
            return
        self._inflight.add(command_id)
        nursery.start_soon(self._serve, command_id, principal, request, origin, run_id)

    def _serves(self, run_id: str | None, principal: str) -> bool:
        """Whether a routed op for ``run_id`` may be answered here at once (a run of
        this node; or no run: a start placed here)."""
        if run_id is None:
            return True
        entry = self._runs.get(run_id)
        return (
            entry is not None
            and entry.principal == principal
            and not (entry.fence is not None and entry.fence.closed)
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
        self,
        command_id: int,
        principal: str,
        args: str | dict[str, Any],
        origin: str,
        run_id: str | None,
    ) -> None:
        """Answer one command (``args``: its wire JSON, as text from its row or as the
        object its NOTIFY carried). An op this node cannot read is answered
        ``invalid_request``, as any refusal: the node goes on."""
        # A command answered twice (two nodes racing right after a takeover) keeps the
        # first reply (the UPDATE only fills an empty one).
        try:
            assert self.execute is not None
            try:
                try:
                    request = from_wire(_loaded(args))
                except ProtocolError as exc:  # refused like any op: the node goes on
                    logger.warning("routed command %s refused: %s", command_id, exc.message)
                    raise
                if self._resumed is not None and not isinstance(request, StartRequest | RunGet):
                    await self._resumed(request.run_id)
                # Where it comes from, as values: the op stores its answer under the
                # command's id and notifies the node that sent it (a routed cancel was
                # recorded by its sender already, Router.send).
                done = await self.execute(
                    request,
                    Origin(principal=principal, node=origin, run_id=run_id, command=command_id),
                )
                if done.stored:
                    self.served += 1
                    return  # stored and sent with the op's own durable effect
                answer: dict[str, Any] = {"ok": dict(done.fields)}
            except ProtocolError as exc:
                answer = {"error": [exc.code, exc.message]}
            except Exception:
                logger.exception("routed command %s failed", command_id)
                answer = {"error": ["internal", "internal error"]}
            self.served += 1
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


def _loaded(args: str | dict[str, Any]) -> Any:
    """A command's wire JSON as an object (its row holds it as text)."""
    if not isinstance(args, str):
        return args
    try:
        return json.loads(args)
    except (ValueError, RecursionError):
        raise _garbled("its JSON does not parse") from None


def _insert_command(
    conn: Conn,
    *,
    principal: str,
    request: RoutedOp,
    run_id: str | None,
    target_node: str | None,
    origin: str,
) -> tuple[int, str | None] | None:
    """Insert a routed command (and record a routed cancel) in one transaction;
    returns its id and the run's owner, :data:`UNSTARTED` for a cancel that ended a
    run queued for capacity at once, None when the run is not the principal's
    unfinished run."""
    wire = to_wire(request)
    args = json.dumps(wire)
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
            "op": wire["op"],
            "args": args,
        },
    ).fetchone()
    if row is None:
        return None
    command_id, owner = int(row[0]), row[1]
    if isinstance(request, RunCancel) and run_id is not None:
        if owner is None and cancel_unstarted_in(conn, principal, run_id, request.reason):
            # Queued for capacity, claimed by no node: ended here, answered at once.
            conn.execute("DELETE FROM trio_agents_commands WHERE command_id = %s", (command_id,))
            return UNSTARTED
        # Durable before the owner sees it: the owner acks without writing it.
        record_cancel_in(conn, run_id, request.reason, request.mode)
    note: dict[str, Any] = {"k": "cmd", "n": target_node or owner}
    if len(args) < _INLINE:  # the owner can serve it without reading the row
        note.update(c=command_id, r=run_id, p=principal, a=wire, o=origin)
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
