"""Retrying SQLite's "database is locked" where SQLite does not wait by itself.

A connection's ``timeout`` (its busy handler) makes most statements wait for another
process's lock, but SQLite returns ``SQLITE_BUSY`` without calling the handler in a few
places that opening a shared file can hit: the journal-mode change to WAL (it needs an
exclusive lock) and WAL recovery, while another process creates the schema or switches
the file. Every module that opens a SQLite file shared between processes (sessions, the
Temporal run store) prepares its connection through :func:`retry_while_busy`.

Called in worker threads only (it sleeps), never on the Trio thread.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def is_busy(exc: sqlite3.OperationalError) -> bool:
    """Whether ``exc`` is SQLite's "database is locked/busy" (worth retrying)."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    message = str(exc)
    return "locked" in message or "busy" in message


def retry_while_busy(fn: Callable[[], T], budget: float) -> T:
    """Call ``fn`` until it does not raise "locked"/"busy", for at most ``budget``
    seconds (backing off from 5 ms to 100 ms between tries); the last error is raised
    once the budget would be passed. Any other error is raised at once."""
    deadline = time.monotonic() + budget
    pause = 0.005
    while True:
        try:
            return fn()
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)  # a worker thread's wait, never the Trio thread's
        pause = min(pause * 2, 0.1)
