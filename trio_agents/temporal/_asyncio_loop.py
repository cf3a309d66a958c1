"""An asyncio loop in a thread of its own, for a Trio program that talks to Temporal.

``temporalio``'s client is asyncio and bound to the loop it was made on; a
:class:`~trio_agents.temporal.TemporalHost` lives in a Trio program. The host hands each
client call to one long-lived asyncio loop in a daemon thread
(``asyncio.run_coroutine_threadsafe``) and waits for it as a Trio task (the future's done
callback wakes it through the Trio token), so a Trio cancel of the waiting task cancels
the asyncio task, and neither loop ever blocks on the other.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar, final

import trio

__all__ = ["STOP_BOUND", "AsyncioLoop"]

T = TypeVar("T")
log = logging.getLogger("trio_agents.temporal")

STOP_BOUND: Final = 10.0
"""Seconds :meth:`AsyncioLoop.stop` waits for the loop's cancelled tasks to end."""


@final
class AsyncioLoop:
    """An asyncio event loop running in a daemon thread (see the module docstring)."""

    def __init__(self, name: str = "trio-agents-temporal") -> None:
        self._name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the loop's thread (returns once the loop runs)."""
        if self._thread is not None:
            raise RuntimeError("the loop was started already")
        ready = threading.Event()
        loop = asyncio.new_event_loop()

        def main() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                tasks = asyncio.all_tasks(loop)
                for task in tasks:
                    task.cancel()
                if tasks:
                    # Bounded: a task that ignores its cancel (a call blocked in the
                    # SDK's native core) must not keep the program from stopping; it is
                    # left to the daemon thread's end.
                    _, left = loop.run_until_complete(asyncio.wait(tasks, timeout=STOP_BOUND))
                    for task in left:
                        log.warning("stopping the asyncio loop: %r did not end", task)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._loop = loop
        self._thread = threading.Thread(target=main, name=self._name, daemon=True)
        self._thread.start()
        ready.wait()

    def stop(self) -> None:
        """Stop the loop (cancelling what still runs on it) and join its thread. Blocks:
        call it from a thread (``trio.to_thread.run_sync``) in a Trio program."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        self._loop = self._thread = None
        loop.call_soon_threadsafe(loop.stop)
        thread.join()

    async def call(self, fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run ``fn()`` on the loop and wait for its result as a Trio task; a Trio
        cancel cancels it there (and waits for it to end)."""
        loop = self._loop
        if loop is None:
            raise RuntimeError("the asyncio loop is not running")
        token = trio.lowlevel.current_trio_token()
        done = trio.Event()

        def wake(_: concurrent.futures.Future[T]) -> None:
            with contextlib.suppress(trio.RunFinishedError):  # ended: nobody waits
                token.run_sync_soon(done.set)

        future = asyncio.run_coroutine_threadsafe(fn(), loop)
        future.add_done_callback(wake)
        try:
            await done.wait()
        except BaseException:
            future.cancel()
            with trio.CancelScope(shield=True):
                await done.wait()
            raise
        return future.result()
