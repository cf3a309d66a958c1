"""LISTEN/NOTIFY from Trio: one dedicated connection per node, in a worker thread.

The thread LISTENs on :data:`~._schema.CHANNEL` and waits with psycopg's
``conn.notifies(timeout=...)`` in short slices, so it notices a stop request within
:data:`_SLICE` seconds; each payload is handed to the Trio thread with
``TrioToken.run_sync_soon`` (never blocking either side). A lost connection (PostgreSQL
restarted) is reconnected with exponential backoff; NOTIFY is lossy across that gap, so
after every (re)connection :meth:`Listener.notify_all` wakes every waiter, and each
re-reads the tables it follows (the catch-up).

Waiters use :meth:`Listener.watch`: take the event *before* reading the state it
guards, then wait on it; a notification for the key, or a reconnection, sets it.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any, final

import psycopg
import trio

from ._schema import CHANNEL

__all__ = ["Listener"]

logger = logging.getLogger("trio_agents.cluster")

_SLICE = 0.2
"""Seconds per ``notifies()`` wait: how soon the thread sees a stop request."""


@final
class Listener:
    """The node's LISTEN connection and the waiters keyed by what they follow."""

    def __init__(self, dsn: str, on_message: Callable[[dict[str, Any]], None]) -> None:
        self._dsn = dsn
        self._on_message = on_message
        self._waiters: dict[Hashable, set[trio.Event]] = {}
        self._stop = threading.Event()
        self.connected = trio.Event()
        self.reconnects = 0
        self.dead = False
        self.last_error: BaseException | None = None

    def watch(self, key: Hashable) -> trio.Event:
        """An event set by the next notification for ``key`` (or a reconnection)."""
        event = trio.Event()
        self._waiters.setdefault(key, set()).add(event)
        return event

    def notify(self, key: Hashable) -> None:
        """Wake the waiters of ``key`` (Trio thread)."""
        for event in self._waiters.pop(key, ()):
            event.set()

    def notify_all(self) -> None:
        """Wake every waiter: after a reconnection each one re-reads the tables."""
        waiters, self._waiters = self._waiters, {}
        for events in waiters.values():
            for event in events:
                event.set()

    async def run(self) -> None:
        """Listen until cancelled (then the thread stops within a slice)."""
        token = trio.lowlevel.current_trio_token()
        self._stop.clear()
        try:
            await trio.to_thread.run_sync(self._thread, token, abandon_on_cancel=True)
        finally:
            self._stop.set()

    def stop(self) -> None:
        """Stop listening (a crashed node's tests; thread-safe)."""
        self.dead = True
        self._stop.set()

    # -- the thread ------------------------------------------------------------------

    def _thread(self, token: trio.lowlevel.TrioToken) -> None:
        backoff = 0.05
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    backoff = 0.05
                    self._soon(token, self._connected)
                    while not self._stop.is_set():
                        for notify in conn.notifies(timeout=_SLICE):
                            self._soon(token, self._dispatch, notify.payload)
                            if self._stop.is_set():
                                break
            except Exception as exc:  # psycopg.Error mostly; never let the thread die
                self.last_error = exc
                logger.info("cluster LISTEN connection lost (%r); reconnecting", exc)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)

    def _soon(self, token: trio.lowlevel.TrioToken, fn: Callable[..., None], *args: Any) -> None:
        try:
            token.run_sync_soon(fn, *args)
        except trio.RunFinishedError:
            self._stop.set()

    def _connected(self) -> None:
        if self.dead:
            return
        if self.connected.is_set():
            self.reconnects += 1
        self.connected.set()
        self.notify_all()
        self._on_message({"k": "connected"})

    def _dispatch(self, payload: str) -> None:
        if self.dead:
            return
        try:
            message = json.loads(payload)
        except ValueError:
            return
        if isinstance(message, dict):
            self._on_message(message)
