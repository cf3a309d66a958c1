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

from .. import EventsDropped, RunEvent, RunUpdated
from ._ops import serve_request
from ._protocol import ProtocolError, error_frame, event_frame, tree_event_frame
from ._registry import Registry, RunEntry
from ._requests import parse_request
from ._stream import GuardedStream

if TYPE_CHECKING:
    from ._server import ControlServer

__all__ = ["Connection"]

logger = logging.getLogger("trio_agents.control")


@final
class Connection:
    """One authenticated client connection (see the module docstring)."""

    def __init__(
        self,
        server: ControlServer,
        registry: Registry,
        ws: WebSocketConnection,
        stream: GuardedStream,
        principal: str,
    ) -> None:
        self.server = server
        self.registry = registry
        self.ws = ws
        self.stream = stream
        self.principal = principal
        self.limits = registry.limits
        self.subscriptions: dict[str, trio.CancelScope] = {}
        # Tree subscriptions (§17), by the id of the run whose subtree they follow: apart
        # from the plain ones, as a client may want both for one run.
        self.tree_subscriptions: dict[str, trio.CancelScope] = {}
        self._remote: set[str] = set()  # subscriptions followed from a cluster's log
        self.owned: set[RunEntry] = set()
        self.placed: set[str] = set()  # its runs on other nodes, on_disconnect="cancel"
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
        # A cluster's node hands its runs over: subscriptions end where this node's
        # part of them does (the client re-subscribes elsewhere from the next seq).
        for run_id in list(self._remote):
            self.unsubscribe(run_id)

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
                with trio.move_on_at(self.server.shutdown_deadline):
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

    def subscribe(self, entry: RunEntry, from_seq: int | None, mode: str) -> None:
        """(Re)subscribe to a run; a second subscription to it replaces the first."""
        self.unsubscribe(entry.run_id)
        scope = trio.CancelScope()
        self.subscriptions[entry.run_id] = scope
        self.start_soon(self._forward, entry, from_seq, mode, scope)

    def unsubscribe(self, run_id: str) -> bool:
        scope = self.subscriptions.pop(run_id, None)
        self._remote.discard(run_id)
        if scope is None:
            return False
        scope.cancel()
        self._subscriptions_changed.set()
        return True

    def subscribe_tree(self, entry: RunEntry, mode: str) -> None:
        """(Re)subscribe to a run's subtree (``run.subscribe`` with ``"tree": true``)."""
        self.unsubscribe_tree(entry.run_id)
        scope = trio.CancelScope()
        self.tree_subscriptions[entry.run_id] = scope
        self.start_soon(self._forward_tree, entry, mode, scope)

    def unsubscribe_tree(self, run_id: str) -> bool:
        scope = self.tree_subscriptions.pop(run_id, None)
        if scope is None:
            return False
        scope.cancel()
        self._subscriptions_changed.set()
        return True

    def subscribe_remote(self, run_id: str, from_seq: int | None, mode: str) -> None:
        """Follow a run of another node (a cluster) from its persisted event log."""
        self.unsubscribe(run_id)
        scope = trio.CancelScope()
        self.subscriptions[run_id] = scope
        self._remote.add(run_id)
        self.start_soon(self._follow, run_id, from_seq, mode, scope)

    async def _follow(
        self, run_id: str, from_seq: int | None, mode: str, scope: trio.CancelScope
    ) -> None:
        cluster = self.registry.cluster
        assert cluster is not None
        try:
            with scope:
                await cluster.follow(run_id, from_seq, mode, self.send)
        except Exception:
            logger.exception("following the events of %s failed", run_id)
        finally:
            if self.subscriptions.get(run_id) is scope:
                del self.subscriptions[run_id]
                self._remote.discard(run_id)
            self._subscriptions_changed.set()

    async def _forward(
        self, entry: RunEntry, from_seq: int | None, mode: str, scope: trio.CancelScope
    ) -> None:
        assert entry.run is not None
        sent: list[int] = []  # the seq of the last event queued, once there is one
        try:
            with scope:
                # Every event that is ready in one list (one checkpoint per list, not per
                # event: a model's network read often carries many deltas); each event
                # still passes the same checks, in order, before it is queued.
                async for batch in entry.run.events(from_seq).batches():
                    if not await self._forward_batch(entry, entry.fence, batch, mode, sent):
                        # A cluster: this node's attempt stopped (lease lost) and the run
                        # goes on elsewhere. The client is still subscribed: follow the
                        # run's persisted log from the first seq it was not sent (this
                        # attempt's unsent persisted events, then the next attempt's).
                        # Not while this node stops: its connections close (1001) and
                        # their clients re-subscribe elsewhere.
                        cluster = self.registry.cluster
                        if (
                            cluster is not None
                            and not self._shutting_down
                            and self.subscriptions.get(entry.run_id) is scope
                        ):
                            self._remote.add(entry.run_id)
                            start = sent[-1] + 1 if sent else from_seq
                            await cluster.follow(entry.run_id, start, mode, self.send)
                        break
        except Exception:
            logger.exception("forwarding the events of %s failed", entry.run_id)
        finally:
            if self.subscriptions.get(entry.run_id) is scope:
                del self.subscriptions[entry.run_id]
                self._remote.discard(entry.run_id)
            self._subscriptions_changed.set()

    async def _forward_batch(
        self, entry: RunEntry, fence: Any, batch: list[RunEvent], mode: str, sent: list[int]
    ) -> bool:
        """Queue the frames of ``batch``'s events; False once the run goes on elsewhere."""
        for event in batch:
            if (
                fence is not None
                and fence.closed
                and (fence.fence_seq is None or event.seq > fence.fence_seq)
            ):
                return False  # not this node's: the run goes on elsewhere
            if mode == "status" and not isinstance(event, RunUpdated | EventsDropped):
                continue
            if entry.log is not None and entry.log.persisted_seq < event.seq:
                # A cluster: an event is sent once persisted, so a client never sees an
                # event a crash of this node could lose (the next attempt would reuse its
                # seq), and a terminal status only once the session is released
                # cluster-wide (the next run.start on any node finds it free, as in one
                # process).
                await entry.log.wait_persisted(event.seq)
                if entry.log.persisted_seq < event.seq:
                    return False  # this attempt stopped writing: the run goes on elsewhere
            await self._queue(event_frame(event))
            if sent:
                sent[0] = event.seq
            else:
                sent.append(event.seq)
        return True

    async def _forward_tree(self, entry: RunEntry, mode: str, scope: trio.CancelScope) -> None:
        """Send the events of ``entry``'s subtree, merged, until its terminal update.

        With a cluster, the run's own events are sent once persisted, as on a plain
        subscription; its descendants' are not in the cluster's log (a tree lives on
        its root's node) and are sent as they happen. Once this node's attempt of the
        tree stops (lease lost, hand-over), the subscription ends: the client
        subscribes again where the tree goes on.
        """
        assert entry.run is not None
        log = entry.log  # None for a child run, and without a cluster
        fence = entry.tree.fence
        try:
            with scope:
                async for event in entry.run.events(tree=True):
                    own = event.run_id == entry.run_id
                    if (
                        fence is not None
                        and fence.closed
                        and (not own or fence.fence_seq is None or event.seq > fence.fence_seq)
                    ):
                        break  # not this node's: the tree goes on elsewhere
                    if mode == "status" and not isinstance(event, RunUpdated | EventsDropped):
                        continue
                    if own and log is not None and log.persisted_seq < event.seq:
                        await log.wait_persisted(event.seq)
                        if log.persisted_seq < event.seq:
                            break  # this attempt stopped writing: the tree goes on elsewhere
                    await self._queue(tree_event_frame(event, entry.run_id))
        except Exception:
            logger.exception("forwarding the tree events of %s failed", entry.run_id)
        finally:
            if self.tree_subscriptions.get(entry.run_id) is scope:
                del self.tree_subscriptions[entry.run_id]
            self._subscriptions_changed.set()

    async def _queue(self, frame: Mapping[str, Any]) -> None:
        """:meth:`send` without a schedule point while the outbound queue has room; a
        full queue waits as :meth:`send` does (the per-connection bound holds)."""
        text = json.dumps(frame, separators=(",", ":"), default=repr)
        try:
            self._out_send.send_nowait(text)
        except trio.WouldBlock:
            await self._out_send.send(text)
