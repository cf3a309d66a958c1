"""LISTEN/NOTIFY from Trio: one dedicated connection per node, in a worker thread.

The thread LISTENs on :data:`~._schema.CHANNEL` and waits with psycopg's
``conn.notifies(timeout=...)`` in short slices, so it notices a stop request within
:data:`_SLICE` seconds; each payload is handed to the Trio thread with
``TrioToken.run_sync_soon`` (never blocking either side). A lost connection (PostgreSQL
restarted) is reconnected with exponential backoff; NOTIFY is lossy across that gap, so
after every (re)connection :meth:`Listener.notify_all` wakes every waiter, and each
re-reads the tables it follows (the catch-up).

Waiters use ``with listener.watch(key) as wake:``: take the waiter *before* reading the
state it guards, then wait on it; a notification for the key, or a reconnection, sets
it. Leaving the block unregisters it (no waiter outlives its wait). A waiter made with
``keep=True`` also keeps the messages of the notifications that set it, in order
(``None`` for a reconnection or a local wake-up: "read the table again"), and is taken
again with :meth:`Wake.take` — how a subscriber gets the events a NOTIFY carries.

A payload is one JSON object, optionally followed by a newline and more JSON text (JSON
text never holds a raw newline): the object is parsed here, the rest is handed on as
text under ``"tail"`` (parsed only by a waiter that wants it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any, final

import psycopg
import trio

from ..sessions._postgres import keepalives
from ._schema import CHANNEL

__all__ = ["Listener", "Wake"]

logger = logging.getLogger("trio_agents.cluster")

_SLICE = 0.2
"""Seconds per ``notifies()`` wait: how soon the thread sees a stop request."""


@final
class Wake:
    """Set by the notifications of a key (see the module docstring)."""

    __slots__ = ("_event", "_keep", "messages")

    def __init__(self, keep: bool) -> None:
        self._event = trio.Event()
        self._keep = keep
        self.messages: list[dict[str, Any] | None] = []

    def set(self, message: dict[str, Any] | None = None) -> None:
        if self._keep:
            self.messages.append(message)
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        await self._event.wait()

    def take(self) -> list[dict[str, Any] | None]:
        """The messages kept since the last take (and clear the wake-up)."""
        messages, self.messages = self.messages, []
        self._event = trio.Event()
        return messages


@final
class Listener:
    """The node's LISTEN connection and the waiters keyed by what they follow."""

    def __init__(self, dsn: str, on_message: Callable[[dict[str, Any]], None]) -> None:
        self._dsn = dsn
        self._on_message = on_message
        self._waiters: dict[Hashable, set[Wake]] = {}
        self._stop = threading.Event()
        self.connected = trio.Event()
        self.reconnects = 0
        self.dead = False
        self.last_error: BaseException | None = None

    @contextlib.contextmanager
    def watch(self, key: Hashable, *, keep: bool = False) -> Iterator[Wake]:
        """A waiter set by the notifications for ``key`` (or a reconnection),
        registered while the ``with`` block runs (and no longer after it); with
        ``keep``, it keeps their messages."""
        wake = Wake(keep)
        self._waiters.setdefault(key, set()).add(wake)
        try:
            yield wake
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(wake)
                if not waiters:
                    del self._waiters[key]

    def notify(self, key: Hashable, message: dict[str, Any] | None = None) -> None:
        """Wake the waiters of ``key`` (Trio thread); ``message`` for those that keep
        them (None: read the table again)."""
        for wake in list(self._waiters.get(key, ())):
            wake.set(message)

    def notify_all(self) -> None:
        """Wake every waiter: after a reconnection each one re-reads the tables."""
        for waiters in list(self._waiters.values()):
            for wake in list(waiters):
                wake.set(None)

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
                params = psycopg.conninfo.conninfo_to_dict(self._dsn)
                with psycopg.connect(
                    self._dsn, autocommit=True, connect_timeout=5, **keepalives(params)
                ) as conn:
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
        head, newline, tail = payload.partition("\n")
        try:
            message = json.loads(head)
        except ValueError:
            return
        if isinstance(message, dict):
            if newline:
                message["tail"] = tail
            self._on_message(message)
