"""The Python client of the control channel: ``async with connect(url, token=...)``.

One reader task per connection reads every frame: answers wake the request that
waits for them, events go to a per-run buffer (a *feed*) that any number of cursors
read, so a consumer that never reads never holds back the others or the socket. The
frames of a tree subscription (``"tree"``: the run whose subtree they follow) go to a
buffer of their own, in the order they came: the merged stream of the subtree.
"""

from __future__ import annotations

import itertools
import json
import logging
import ssl
import urllib.parse
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Any, Literal, cast, final, overload

import trio
from trio_websocket import ConnectionClosed, ConnectionRejected, WebSocketConnection
from trio_websocket import wrap_client_stream as _wrap_client_stream

from .._events import EventsDropped, RunEvent, RunStatus, RunUpdated, event_from_json
from .._exception_groups import leaves as _leaves
from .._exceptions import ControlConnectionError, ControlError, RunClosedError
from .._items import Item, coerce_items
from .._limits import UsageLimits
from ..hosting._policies import limits_to_wire
from ._protocol import SUBPROTOCOL, RunInfo
from ._stream import GuardedStream

__all__ = [
    "ControlClient",
    "RemoteEventCursor",
    "RemoteRun",
    "RemoteTreeCursor",
    "RemoteUpdated",
    "connect",
]

logger = logging.getLogger("trio_agents.control")

_SEND_BOUND = 10.0  # seconds a shielded request send may take before the link is dropped


@final
class _Pending:
    __slots__ = ("event", "frame")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.frame: dict[str, Any] | None = None


@final
class _Feed:
    """The events received for one run, by seq (bounded; oldest evicted first)."""

    def __init__(self, run_id: str, capacity: int) -> None:
        self.run_id = run_id
        self.capacity = capacity
        self.events: dict[int, RunEvent] = {}
        self.evicted_upto = 0
        self.dropped: list[EventsDropped] = []
        self.terminal: RunUpdated | None = None
        self.subscribed_from: int | None = None  # None: not subscribed
        self.error: ControlConnectionError | None = None
        self.lot = trio.lowlevel.ParkingLot()

    def add(self, event: RunEvent) -> None:
        if isinstance(event, EventsDropped):
            self.dropped.append(event)
        else:
            self.events[event.seq] = event
            if isinstance(event, RunUpdated) and event.status.is_terminal:
                self.terminal = event
            while len(self.events) > self.capacity:
                oldest = min(self.events)
                del self.events[oldest]
                self.evicted_upto = max(self.evicted_upto, oldest)
        self.lot.unpark_all()

    def fail(self, error: ControlConnectionError) -> None:
        self.error = error
        self.lot.unpark_all()

    def at(self, seq: int) -> RunEvent | None:
        """The event at ``seq``, a dropped marker covering it, or None (not yet)."""
        event = self.events.get(seq)
        if event is not None:
            return event
        for marker in self.dropped:
            if marker.first_missing_seq <= seq <= marker.seq:
                return EventsDropped(
                    run_id=self.run_id,
                    seq=marker.seq,
                    first_missing_seq=seq,
                    count=marker.seq - seq + 1,
                )
        if seq <= self.evicted_upto:
            return EventsDropped(
                run_id=self.run_id,
                seq=self.evicted_upto,
                first_missing_seq=seq,
                count=self.evicted_upto - seq + 1,
            )
        return None


@final
class _TreeFeed:
    """The events of one run's subtree as the server sent them, merged, oldest first
    (the last ``capacity``; a cursor that falls behind gets an ``events.dropped``)."""

    def __init__(self, run_id: str, capacity: int) -> None:
        self.run_id = run_id
        self.capacity = capacity
        self.events: list[RunEvent] = []
        self.base = 0  # the position of events[0] in the merged stream
        self.subscribed = False
        self.done = False  # the run's own terminal update came: the stream is complete
        self.stopped = False  # unsubscribed: its cursors end once they have read it all
        self.error: ControlConnectionError | None = None
        self.lot = trio.lowlevel.ParkingLot()

    def add(self, event: RunEvent) -> None:
        if self.done:
            return  # the stream ended: a replay after a new subscription
        self.events.append(event)
        if (
            event.run_id == self.run_id
            and isinstance(event, RunUpdated)
            and event.status.is_terminal
        ):
            self.done = True
        if len(self.events) >= 2 * self.capacity:
            drop = len(self.events) - self.capacity
            del self.events[:drop]
            self.base += drop
        self.lot.unpark_all()

    def fail(self, error: ControlConnectionError) -> None:
        self.error = error
        self.lot.unpark_all()


@final
class RemoteTreeCursor(AsyncIterator[RunEvent]):
    """The events of a remote run and of every descendant, merged in the order they
    happened, each with its own ``run_id`` and ``seq`` (``run.subscribe`` with
    ``"tree": true``); ends after the run's own terminal update. Subscribes on first
    use; safe to ``break`` out of."""

    def __init__(self, run: RemoteRun) -> None:
        self._run = run
        self._feed: _TreeFeed | None = None
        self._next = 0

    def __aiter__(self) -> RemoteTreeCursor:
        return self

    async def __anext__(self) -> RunEvent:
        feed = self._feed
        if feed is None:
            client = self._run._client
            feed = self._feed = client._tree_for(self._run.id)
            await client._ensure_tree_subscribed(feed)
            self._next = feed.base
        await trio.lowlevel.checkpoint()
        while True:
            if self._next < feed.base:
                missing = feed.base - self._next
                dropped = EventsDropped(
                    run_id=feed.run_id, seq=0, first_missing_seq=self._next, count=missing
                )
                self._next = feed.base
                return dropped
            if self._next < feed.base + len(feed.events):
                event = feed.events[self._next - feed.base]
                self._next += 1
                return event
            if feed.done or feed.stopped:
                raise StopAsyncIteration
            if feed.error is not None:
                raise feed.error
            await feed.lot.park()


@final
class RemoteEventCursor(AsyncIterator[RunEvent]):
    """Events of a remote run, from ``from_seq`` (inclusive) to the terminal update.

    Subscribes on first use (``run.subscribe``); safe to ``break`` out of.
    """

    def __init__(self, run: RemoteRun, from_seq: int | None) -> None:
        if from_seq is not None and (
            isinstance(from_seq, bool) or not isinstance(from_seq, int) or from_seq < 0
        ):
            raise ValueError("from_seq must be an int >= 0 or None")
        self._run = run
        self._from_seq = from_seq
        self._next: int | None = None

    def __aiter__(self) -> RemoteEventCursor:
        return self

    async def __anext__(self) -> RunEvent:
        feed = self._run._feed
        if self._next is None:
            await self._run._client._ensure_subscribed(feed, self._from_seq)
            start = self._from_seq if self._from_seq is not None else feed.subscribed_from
            self._next = max(1, start or 1)
        await trio.lowlevel.checkpoint()
        while True:
            if feed.terminal is not None and self._next > feed.terminal.seq:
                raise StopAsyncIteration
            event = feed.at(self._next)
            if event is not None:
                self._next = event.seq + 1
                return event
            if feed.error is not None:
                raise feed.error
            await feed.lot.park()


@final
class RemoteUpdated(AsyncIterator[RunUpdated]):
    """Status updates of a remote run: the current status first, then each change."""

    def __init__(self, run: RemoteRun) -> None:
        self._run = run
        self._cursor: RemoteEventCursor | None = None
        self._pushback: RunUpdated | None = None

    def __aiter__(self) -> RemoteUpdated:
        return self

    async def __anext__(self) -> RunUpdated:
        if self._cursor is None:
            target = (await self._run.get()).seq
            self._cursor = RemoteEventCursor(self._run, None)
            latest: RunUpdated | None = None
            async for event in self._cursor:
                if isinstance(event, RunUpdated):
                    if event.seq > target and latest is not None:
                        self._pushback = event
                        return latest
                    latest = event
                if event.seq >= target and latest is not None:
                    return latest
            if latest is not None:
                return latest
            raise StopAsyncIteration
        if self._pushback is not None:
            event, self._pushback = self._pushback, None
            return event
        async for event in self._cursor:
            if isinstance(event, RunUpdated):
                return event
        raise StopAsyncIteration


@final
class _UpdatedStream:
    def __init__(self, run: RemoteRun) -> None:
        self._run = run

    def __aiter__(self) -> RemoteUpdated:
        return RemoteUpdated(self._run)


def _items_json(items: str | Item | Mapping[str, Any] | Iterable[Any]) -> str | list[Any]:
    if isinstance(items, str):
        return items
    return [item.to_json() for item in coerce_items(items)]


@final
class RemoteRun:
    """A run on a control server, with the verbs of a local :class:`~trio_agents.Run`.

    The verbs are async (each is a request and its answer). A verb the server refuses
    raises :class:`~trio_agents.RunClosedError` for a finished run and
    :class:`~trio_agents.control.ControlError` (with ``.code``) otherwise. Differences
    from a local run: :meth:`wait` returns the terminal
    :class:`~trio_agents.RunUpdated` (the conversation stays on the server), and
    :meth:`get` returns a :class:`~trio_agents.control.RunInfo`.
    """

    def __init__(self, client: ControlClient, run_id: str) -> None:
        self._client = client
        self.id = run_id
        self._feed = client._feed_for(run_id)

    def __repr__(self) -> str:
        return f"<RemoteRun {self.id}>"

    @property
    def status(self) -> RunStatus | None:
        """The latest status received for this run on this connection (None: none yet)."""
        if self._feed.terminal is not None:
            return self._feed.terminal.status
        updates = [e for e in self._feed.events.values() if isinstance(e, RunUpdated)]
        return max(updates, key=lambda e: e.seq).status if updates else None

    async def _call(self, op: str, **fields: Any) -> dict[str, Any]:
        try:
            return await self._client.request(op, run_id=self.id, **fields)
        except ControlError as exc:
            if exc.code != "run_closed":
                raise
            status = "closed"
            if self._feed.terminal is not None:
                status = str(self._feed.terminal.status)
            else:
                with suppress(ControlError):
                    status = str((await self.get()).status)
            raise RunClosedError(self.id, status) from exc

    async def cancel(self, reason: str | None = None, *, mode: str = "immediate") -> None:
        """Cancel the run (``run.cancel``); see :meth:`trio_agents.Run.cancel`."""
        fields: dict[str, Any] = {"mode": mode}
        if reason is not None:
            fields["reason"] = reason
        await self._call("run.cancel", **fields)

    async def inject(
        self,
        items: str | Item | Mapping[str, Any] | Iterable[Any],
        *,
        when: str = "next_turn",
    ) -> str:
        """Inject items (``run.inject``) and return the injection id.

        Items are validated locally first (``TypeError``/``ValueError``, nothing sent).
        """
        answer = await self._call("run.inject", items=_items_json(items), when=when)
        return str(answer["injection_id"])

    async def withdraw(self, injection_id: str) -> bool:
        """Take back an undelivered injection; True if it was withdrawn."""
        answer = await self._call("run.withdraw", injection_id=injection_id)
        return bool(answer["withdrawn"])

    async def approve(self, call_id: str, *, content: Mapping[str, Any] | None = None) -> None:
        """Let a tool call waiting for approval run, or answer yes to a question a
        running call asks (``not_found`` if none waits); ``content``: a question's
        answer, a JSON object matching its ``schema`` (``invalid_request`` when it
        does not, nothing decided)."""
        fields: dict[str, Any] = {"call_id": call_id}
        if content is not None:
            fields["content"] = dict(content)
        await self._call("run.approve", **fields)

    async def reject(self, call_id: str, *, message: str | None = None) -> None:
        """Refuse a tool call waiting for approval; the model reads ``message``."""
        fields: dict[str, Any] = {"call_id": call_id}
        if message is not None:
            fields["message"] = message
        await self._call("run.reject", **fields)

    async def get(self) -> RunInfo:
        """The run's current :class:`~trio_agents.control.RunInfo` (``run.get``)."""
        answer = await self._client.request("run.get", run_id=self.id)
        return RunInfo.from_json(answer["run"])

    @overload
    def events(
        self, from_seq: int | None = None, *, tree: Literal[False] = False
    ) -> RemoteEventCursor: ...

    @overload
    def events(self, from_seq: None = None, *, tree: Literal[True]) -> RemoteTreeCursor: ...

    def events(
        self, from_seq: int | None = None, *, tree: bool = False
    ) -> RemoteEventCursor | RemoteTreeCursor:
        """Every event of the run from ``from_seq`` (inclusive; None: the oldest the
        server retains), ending after the terminal update. Re-attaching after a
        disconnect with the next seq you need gets every missed event (or an
        ``events.dropped`` marker for what the server no longer retains).

        ``tree=True``: the events of the run and of every descendant, merged in the
        order they happened (:class:`RemoteTreeCursor`; no ``from_seq``)."""
        if tree:
            if from_seq is not None:
                raise ValueError("events(tree=True) replays from the oldest retained event")
            return RemoteTreeCursor(self)
        return RemoteEventCursor(self, from_seq)

    async def children(self) -> list[RemoteRun]:
        """Handles on the run's child runs, in start order (``run.get``)."""
        children = (await self.get()).children
        if children is None:
            raise ControlError(
                "not_found", f"the children of run {self.id} are not known to this server"
            )
        return [RemoteRun(self._client, child) for child in children]

    @property
    def updated(self) -> _UpdatedStream:
        """Status updates: ``async for update in run.updated`` (current status first)."""
        return _UpdatedStream(self)

    async def wait(self) -> RunUpdated:
        """Wait for the run to end; return its terminal ``run.updated`` event."""
        feed = self._feed
        await self._client._ensure_subscribed(feed, None)
        while feed.terminal is None:
            if feed.error is not None:
                raise feed.error
            await feed.lot.park()
        await trio.lowlevel.checkpoint()
        return feed.terminal

    async def unsubscribe(self, *, tree: bool = False) -> bool:
        """Stop receiving this run's events on this connection (``run.unsubscribe``).

        ``tree=True``: its tree subscription; the tree cursors reading it end once they
        have read what came before, and a later ``events(tree=True)`` subscribes again
        (replaying from the oldest event the server retains)."""
        if tree:
            answer = await self._client.request("run.unsubscribe", run_id=self.id, tree=True)
            # Every frame of that subscription came before the answer.
            feed = self._client._trees.pop(self.id, None)
            if feed is not None:
                feed.stopped = True
                feed.lot.unpark_all()
            return bool(answer["unsubscribed"])
        answer = await self._client.request("run.unsubscribe", run_id=self.id)
        self._feed.subscribed_from = None
        return bool(answer["unsubscribed"])


@final
class ControlClient:
    """A connection to a control server; get one from :func:`connect`."""

    def __init__(self, ws: WebSocketConnection, *, event_buffer: int = 65536) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._pending: dict[str, _Pending] = {}
        self._feeds: dict[str, _Feed] = {}
        self._trees: dict[str, _TreeFeed] = {}
        self._event_buffer = event_buffer
        self._error: ControlConnectionError | None = None
        self.protocol_errors: list[dict[str, Any]] = []
        """``error`` frames with ``"id": null`` the server sent (newest last, at most 100)."""

    # ---------------------------------------------------------------- plumbing

    def _feed_for(self, run_id: str) -> _Feed:
        feed = self._feeds.get(run_id)
        if feed is None:
            feed = self._feeds[run_id] = _Feed(run_id, self._event_buffer)
            if self._error is not None:
                feed.fail(self._error)
        return feed

    def _tree_for(self, run_id: str) -> _TreeFeed:
        feed = self._trees.get(run_id)
        if feed is None:
            feed = self._trees[run_id] = _TreeFeed(run_id, self._event_buffer)
            if self._error is not None:
                feed.fail(self._error)
        return feed

    async def _ensure_tree_subscribed(self, feed: _TreeFeed) -> None:
        if feed.subscribed or feed.done:
            await trio.lowlevel.checkpoint()
            return
        feed.subscribed = True
        try:
            await self.request("run.subscribe", run_id=feed.run_id, events="all", tree=True)
        except BaseException:
            feed.subscribed = False
            raise

    async def _send(self, frame: Mapping[str, Any]) -> None:
        if self._error is not None:
            raise self._error
        text = json.dumps(frame, separators=(",", ":"))
        # Shielded (bounded): a half-sent frame would poison the connection.
        with trio.CancelScope(shield=True):
            with trio.move_on_after(_SEND_BOUND) as timer:
                try:
                    await self._ws.send_message(text)
                except ConnectionClosed as exc:
                    self._fail_all(exc)
            if timer.cancelled_caught:
                await self._ws.aclose(1008, "send timeout")
                self._fail_all(None)
        if self._error is not None:
            raise self._error

    async def request(self, op: str, **fields: Any) -> dict[str, Any]:
        """Send one request and return its ``ack`` frame (low level: prefer the verbs).

        Raises:
            ControlError: the server answered with an ``error`` frame.
            ControlConnectionError: the connection is closed.
        """
        request_id = str(next(self._ids))
        pending = self._pending[request_id] = _Pending()
        try:
            await self._send({"id": request_id, "op": op, **fields})
            await pending.event.wait()
        finally:
            self._pending.pop(request_id, None)
        frame = pending.frame
        if frame is None:
            assert self._error is not None
            raise self._error
        if frame.get("type") == "error":
            raise ControlError(
                str(frame.get("code")), str(frame.get("message")), request_id=request_id
            )
        return frame

    async def _ensure_subscribed(self, feed: _Feed, from_seq: int | None) -> None:
        wanted = 0 if from_seq is None else from_seq
        if feed.subscribed_from is not None and feed.subscribed_from <= max(wanted, 1):
            await trio.lowlevel.checkpoint()
            return
        if feed.terminal is not None and all(
            feed.at(seq) is not None for seq in range(max(wanted, 1), feed.terminal.seq + 1)
        ):
            await trio.lowlevel.checkpoint()
            return
        fields: dict[str, Any] = {"events": "all"}
        if from_seq is not None:
            fields["from_seq"] = from_seq
        feed.subscribed_from = max(wanted, 1)
        try:
            await self.request("run.subscribe", run_id=feed.run_id, **fields)
        except BaseException:
            feed.subscribed_from = None
            raise

    def _fail_all(self, closed: ConnectionClosed | None) -> None:
        if self._error is None:
            reason = None if closed is None else closed.reason
            code = None if reason is None else reason.code
            text = "the control connection was closed"
            if reason is not None:
                detail = f": {reason.reason}" if reason.reason else ""
                text += f" (code {reason.code}{detail})"
            self._error = ControlConnectionError("connection_closed", text, close_code=code)
        for pending in self._pending.values():
            pending.event.set()
        for feed in self._feeds.values():
            feed.fail(self._error)
        for tree in self._trees.values():
            tree.fail(self._error)

    async def _read_loop(self) -> None:
        try:
            while True:
                message = await self._ws.get_message()
                self._dispatch(message)
        except ConnectionClosed as exc:
            self._fail_all(exc)

    def _dispatch(self, message: str | bytes) -> None:
        try:
            frame = json.loads(message)
            kind = frame["type"]
            if kind == "event":
                event = event_from_json(frame["event"])
                tree = frame.get("tree")
                if tree is not None:  # a tree subscription's (to the run ``tree``)
                    self._tree_for(str(tree)).add(event)
                else:
                    self._feed_for(event.run_id).add(event)
            elif kind in ("ack", "error"):
                request_id = frame.get("id")
                pending = self._pending.get(str(request_id)) if request_id is not None else None
                if pending is not None:
                    pending.frame = frame
                    pending.event.set()
                elif kind == "error":
                    self.protocol_errors.append(frame)
                    del self.protocol_errors[:-100]
            else:
                logger.warning("ignoring a control frame of unknown type %r", kind)
        except (ValueError, KeyError, TypeError) as exc:
            logger.warning("ignoring a malformed control frame: %r", exc)

    # ------------------------------------------------------------------- verbs

    async def start(
        self,
        agent: str,
        input: str | Item | Mapping[str, Any] | Iterable[Any],
        *,
        session_id: str | None = None,
        on_disconnect: str = "continue",
        on_busy: str = "reject",
        subscribe: str | None = "all",
        limits: UsageLimits | Mapping[str, Any] | None = None,
    ) -> RemoteRun:
        """Start ``agent`` (its name on the server) on ``input``; return the run.

        With ``subscribe="all"`` (the default) every event from seq 1 is received from
        the start; ``None`` subscribes lazily, on the first ``events()``/``wait()``.
        ``limits`` (a :class:`~trio_agents.UsageLimits`, or a mapping of its fields)
        are the run's usage limits, within the server's maximum (asking more answers
        ``invalid_request``).
        """
        fields: dict[str, Any] = {
            "agent": agent,
            "input": _items_json(input),
            "on_disconnect": on_disconnect,
            "on_busy": on_busy,
        }
        if session_id is not None:
            fields["session_id"] = session_id
        if subscribe is not None:
            fields["subscribe"] = subscribe
        if limits is not None:
            fields["limits"] = limits_to_wire(limits)
        answer = await self.request("run.start", **fields)
        run = RemoteRun(self, str(answer["run_id"]))
        if subscribe == "all":
            run._feed.subscribed_from = 1
        return run

    def attach(self, run_id: str) -> RemoteRun:
        """A handle on an existing run (say, one started by an earlier connection);
        nothing is sent until a verb or ``events()`` is used."""
        return RemoteRun(self, run_id)

    async def list_runs(self, *, all: bool = False) -> list[RunInfo]:
        """Every run of this principal the server still shows (``runs.list``): the
        roots of its run trees, or (``all=True``) every node, each root followed by
        its descendants."""
        answer = await self.request("runs.list", **({"all": True} if all else {}))
        return [RunInfo.from_json(run) for run in answer["runs"]]

    async def cancel_session(
        self, session_id: str, reason: str | None = None, *, mode: str = "immediate"
    ) -> str:
        """Cancel the active run of a session; return its id.

        Raises:
            ControlError: code ``no_active_run`` when the session has none.
        """
        fields: dict[str, Any] = {"session_id": session_id, "mode": mode}
        if reason is not None:
            fields["reason"] = reason
        answer = await self.request("session.cancel", **fields)
        return str(answer["run_id"])

    async def fork_session(
        self, session_id: str, new_session_id: str, *, at: int | tuple[str, int] | None = None
    ) -> int:
        """Fork a session of this principal (``session.fork``, DESIGN §23):
        ``new_session_id`` holds its items up to ``at`` (an item index, an event
        position ``(run_id, seq)`` of an ended run of that session, or None for all),
        rounded down so that no tool call is split from its result, with its tree's
        child sessions. Returns the number of items the fork holds.

        Raises:
            ControlError: ``not_found`` (no such session of this principal),
                ``invalid_request`` (a bad ``at``, or the new session holds items),
                ``session_busy`` (the new session has an active run).
        """
        wire_at: Any = {"run_id": at[0], "seq": at[1]} if isinstance(at, tuple) else at
        answer = await self.request(
            "session.fork", session_id=session_id, new_session_id=new_session_id, at=wire_at
        )
        return int(answer["items"])


@asynccontextmanager
async def connect(
    url: str,
    *,
    token: str,
    ssl_context: ssl.SSLContext | None = None,
    max_message_size: int = 1 << 26,
    event_buffer: int = 65536,
    connect_timeout: float = 30.0,
) -> AsyncIterator[ControlClient]:
    """Connect to a control server: ``async with connect("ws://host:port/", token=t)``.

    ``token`` goes in ``Authorization: Bearer``; ``wss://`` URLs use ``ssl_context``
    (default: the system's). ``max_message_size`` bounds one incoming frame (an
    ``event`` carrying a long message can be large); ``event_buffer`` bounds the
    events kept per run on the client. ``connect_timeout`` bounds the TCP connect and
    the websocket handshake together. Leaving the block closes the connection
    (code 1000); runs started with ``on_disconnect="cancel"`` are then cancelled by
    the server.

    Raises:
        ControlConnectionError: the connection failed (``code="connect_failed"``: no
            connection, the server closed it during the handshake, or no handshake
            within ``connect_timeout``) or the server refused the handshake
            (``code="rejected"``, ``status_code``).
    """
    connect_deadline = trio.current_time() + connect_timeout
    stream, host, port, resource = await _dial(url, ssl_context, connect_deadline, connect_timeout)
    guarded = GuardedStream(stream)
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            with trio.CancelScope(deadline=connect_deadline) as handshake:
                guarded.on_peer_closed = handshake.cancel
                ws = await _wrap_client_stream(
                    nursery,
                    cast(Any, guarded),
                    host if port in (80, 443) else f"{host}:{port}",
                    resource,
                    subprotocols=[SUBPROTOCOL],
                    extra_headers=[(b"Authorization", f"Bearer {token}".encode())],
                    message_queue_size=16,
                    max_message_size=max_message_size,
                )
            guarded.on_peer_closed = None
            if handshake.cancelled_caught:
                what = (
                    "closed the connection during"
                    if trio.current_time() < connect_deadline
                    else f"did not finish within {connect_timeout:g} s"
                )
                raise ControlConnectionError(
                    "connect_failed", f"{host}:{port} {what} the websocket handshake"
                )
            client = ControlClient(ws, event_buffer=event_buffer)
            nursery.start_soon(client._read_loop)
            try:
                yield client
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                with trio.move_on_after(2.0, shield=True):
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        raise _connection_error(group, body_error) from None
    finally:
        with trio.CancelScope(shield=True):
            await guarded.aclose()


async def _dial(
    url: str, ssl_context: ssl.SSLContext | None, deadline: float, allowed: float
) -> tuple[trio.abc.Stream, str, int, str]:
    """The TCP (or TLS) stream to ``url``'s server, opened by ``deadline`` (``allowed``
    seconds after the connect began); with the host, port and resource of the URL.

    Raises:
        ValueError: not a ws:// or wss:// URL.
        ControlConnectionError: ``connect_failed``.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        raise ValueError(f"not a ws:// or wss:// URL: {url!r}")
    host = parts.hostname
    port = parts.port or (443 if parts.scheme == "wss" else 80)
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    try:
        with trio.fail_at(deadline):
            stream = await _open_stream(parts.scheme, host, port, ssl_context)
    except trio.TooSlowError:
        raise ControlConnectionError(
            "connect_failed", f"no connection to {host}:{port} within {allowed:g} s"
        ) from None
    except OSError as exc:
        raise ControlConnectionError(
            "connect_failed", f"could not connect to {host}:{port}: {exc}"
        ) from exc
    return stream, host, port, resource


def _connection_error(group: BaseExceptionGroup, body_error: BaseException | None) -> BaseException:
    """What leaving :func:`connect`'s nursery with ``group`` raises: the block's own
    exception, the connection's error (a refused handshake as ``rejected``), or the
    group itself when it holds anything else."""
    leaves = _leaves(group)
    others = [e for e in leaves if e is not body_error and not isinstance(e, trio.Cancelled)]
    if len(others) == 1 and isinstance(others[0], ControlConnectionError):
        return others[0]
    if len(others) == 1 and isinstance(others[0], ConnectionRejected):
        rejected = others[0]
        return ControlConnectionError(
            "rejected",
            f"the server refused the handshake with HTTP {rejected.status_code}",
            status_code=rejected.status_code,
        )
    if others:
        return group
    if body_error is not None:
        return body_error
    return leaves[0]


async def _open_stream(
    scheme: str, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> trio.abc.Stream:
    if scheme == "wss":
        return await trio.open_ssl_over_tcp_stream(
            host,
            port,
            ssl_context=ssl_context or ssl.create_default_context(),
            https_compatible=True,
        )
    return await trio.open_tcp_stream(host, port)
