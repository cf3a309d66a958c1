"""One accepted websocket: requests in, frames out, subscriptions forwarded.

Tasks, all in the connection's nursery: trio-websocket's reader (which also writes
pongs), our reader (one request at a time, answered by :func:`~._ops.serve_request`),
the writer (the only sender of our frames), the pinger, one forwarder per
subscription. Every write to the socket — ours and trio-websocket's — is bounded by
``send_timeout`` (:class:`~._stream.GuardedStream`), so a peer that stops reading is
cut off within it whatever it sends.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, final

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from ..hosting._requests import parse_request
from ._ops import serve_request
from ._protocol import ProtocolError, error_frame
from ._stream import GuardedStream

if TYPE_CHECKING:
    from ..hosting import RunHost
    from ._server import WebsocketFace

__all__ = ["Connection"]

logger = logging.getLogger("trio_agents.control")


@final
class Connection:
    """One authenticated client connection (see the module docstring); ``face`` is the
    websocket face that accepted it (its shutdown deadline bounds the last flush)."""

    def __init__(
        self,
        face: WebsocketFace,
        host: RunHost,
        ws: WebSocketConnection,
        stream: GuardedStream,
        principal: str,
    ) -> None:
        self.face = face
        self.host = host
        self.ws = ws
        self.stream = stream
        self.principal = principal
        self.limits = host.limits
        self.subscriptions: dict[str, trio.CancelScope] = {}
        # Tree subscriptions (§17), by the id of the run whose subtree they follow: apart
        # from the plain ones, as a client may want both for one run.
        self.tree_subscriptions: dict[str, trio.CancelScope] = {}
        self._out_send, self._out_receive = trio.open_memory_channel[str | None](
            self.limits.outbound_queue_size
        )
        self._nursery: trio.Nursery | None = None
        self._reader_scope = trio.CancelScope()
        self._shutting_down = False
        self._flushed = trio.Event()
        self._subscriptions_changed = trio.Event()

    def begin_shutdown(self) -> None:
        """Stop reading requests; the connection then flushes and closes with 1001."""
        self._shutting_down = True
        self._reader_scope.cancel()

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._writer)
            if self.limits.ping_interval is not None:
                nursery.start_soon(self._pinger, self.limits.ping_interval)
            with self._reader_scope:
                if self._shutting_down:  # shutdown began before we got here
                    self._reader_scope.cancel()
                await self._reader()
            if self._shutting_down:
                with trio.move_on_at(self.face.shutdown_deadline):
                    await self._close_gracefully()
            nursery.cancel_scope.cancel()

    async def _close_gracefully(self) -> None:
        # Runs were cancelled first: subscriptions end after their terminal events.
        while self.subscriptions or self.tree_subscriptions:
            self._subscriptions_changed = trio.Event()
            await self._subscriptions_changed.wait()
        await self._out_send.send(None)
        await self._flushed.wait()
        await self.ws.aclose(1001, "server shutdown")

    async def _abort(self, reason: str) -> None:
        """Cut off a slow or dead peer: best-effort 1008 close, then drop the socket.

        The 1008 frame only goes out if no frame was cut in half (``GuardedStream``).
        """
        logger.info("aborting control connection of %r: %s", self.principal, reason)
        with trio.move_on_after(1.0, shield=True):
            await self.ws.aclose(1008, reason)
        with trio.CancelScope(shield=True):
            await self.stream.aclose()
        self._stop()

    def _stop(self) -> None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()

    # ---------------------------------------------------------------- tasks

    async def _writer(self) -> None:
        async for text in self._out_receive:
            if text is None:
                self._flushed.set()
                return
            with trio.move_on_after(self.limits.send_timeout) as timer:
                try:
                    await self.ws.send_message(text)
                except ConnectionClosed:
                    self._stop()
                    return
            if timer.cancelled_caught:
                # Blocked on trio-websocket's lock behind a stalled pong, say.
                await self._abort("send timeout")
                return

    async def _pinger(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            with trio.move_on_after(self.limits.ping_timeout) as timer:
                try:
                    await self.ws.ping()
                except ConnectionClosed:
                    return
                except ValueError:  # a random payload collided with one in flight
                    continue
            if timer.cancelled_caught:
                await self._abort("ping timeout")
                return

    async def _reader(self) -> None:
        while True:
            try:
                message = await self.ws.get_message()
            except ConnectionClosed:
                return
            try:
                request = parse_request(message)
            except ProtocolError as exc:
                await self.send(error_frame(exc.code, exc.message, exc.request_id))
                continue
            await serve_request(self, request)

    async def send(self, frame: Mapping[str, Any]) -> None:
        """Queue one frame for the writer (waits while the queue is full)."""
        text = json.dumps(frame, separators=(",", ":"), default=repr)
        await self._out_send.send(text)

    def start_soon(self, fn: Any, *args: Any) -> None:
        """Start a task in the connection's nursery (it ends with the connection)."""
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    # ---------------------------------------------------------- subscriptions

    def room_for_subscription(self, run_id: str | None, *, tree: str | None = None) -> bool:
        """Whether a subscription to ``run_id`` (or to the tree of ``tree``) fits: it
        replaces one the connection has, or there is room for one more."""
        return (
            (run_id is not None and run_id in self.subscriptions)
            or (tree is not None and tree in self.tree_subscriptions)
            or len(self.subscriptions) + len(self.tree_subscriptions)
            < self.limits.max_subscriptions_per_connection
        )

    def check_subscription_room(self, run_id: str | None, *, tree: str | None = None) -> None:
        if not self.room_for_subscription(run_id, tree=tree):
            raise ProtocolError(
                "limit_exceeded",
                f"at most {self.limits.max_subscriptions_per_connection} subscriptions"
                " per connection",
            )

    async def subscribe(
        self, run_id: str, from_seq: int | None, mode: str, *, tree: bool = False
    ) -> trio.Event:
        """(Re)subscribe to a run (to its subtree with ``tree``); a second subscription
        to it replaces the first. Raises the host's refusal (``not_found``, ...) or
        ``limit_exceeded`` before anything is sent; returns the event to set once the
        ``ack`` is queued, after which the run's events follow."""
        assert self._nursery is not None
        ready = trio.Event()
        await self._nursery.start(self._forward, run_id, from_seq, mode, tree, ready)
        return ready

    def unsubscribe(self, run_id: str) -> bool:
        scope = self.subscriptions.pop(run_id, None)
        if scope is None:
            return False
        scope.cancel()
        self._subscriptions_changed.set()
        return True

    def unsubscribe_tree(self, run_id: str) -> bool:
        scope = self.tree_subscriptions.pop(run_id, None)
        if scope is None:
            return False
        scope.cancel()
        self._subscriptions_changed.set()
        return True

    async def _forward(
        self,
        run_id: str,
        from_seq: int | None,
        mode: str,
        tree: bool,
        ready: trio.Event,
        *,
        task_status: trio.TaskStatus[None],
    ) -> None:
        """One subscription: its events (the host's, in order, each once) as frames,
        until the run's terminal update, an unsubscribe or the connection's end."""
        subscriptions = self.tree_subscriptions if tree else self.subscriptions
        scope = trio.CancelScope()
        registered = False
        try:
            with scope:
                async with self.host.events(
                    self.principal,
                    run_id,
                    from_seq=from_seq,
                    tree=tree,
                    status_only=mode == "status",
                ) as events:
                    if tree:
                        self.check_subscription_room(None, tree=run_id)
                        self.unsubscribe_tree(run_id)
                    else:
                        self.check_subscription_room(run_id)
                        self.unsubscribe(run_id)
                    subscriptions[run_id] = scope
                    registered = True
                    task_status.started()
                    await ready.wait()
                    async for hosted in events:
                        frame = {
                            "type": "event",
                            "run_id": hosted.run_id,
                            "seq": hosted.seq,
                            "event": hosted.event,
                        }
                        if tree:
                            frame["tree"] = run_id
                        await self._queue(frame)
        except Exception:
            if not registered:
                raise  # the subscription's refusal: the op answers it
            logger.exception("forwarding the events of %s failed", run_id)
        finally:
            if registered and subscriptions.get(run_id) is scope:
                del subscriptions[run_id]
            self._subscriptions_changed.set()

    async def _queue(self, frame: Mapping[str, Any]) -> None:
        """:meth:`send` without a schedule point while the outbound queue has room; a
        full queue waits as :meth:`send` does (the per-connection bound holds)."""
        text = json.dumps(frame, separators=(",", ":"), default=repr)
        try:
            self._out_send.send_nowait(text)
        except trio.WouldBlock:
            await self._out_send.send(text)
