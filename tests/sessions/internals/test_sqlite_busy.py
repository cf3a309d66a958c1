"""``_sqlite_busy``: the retry of SQLite's "database is locked" where SQLite's own busy
handler does not wait (opening a shared file while another process switches it to WAL)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from trio_agents._sqlite_busy import is_busy, retry_while_busy


def _locked() -> sqlite3.OperationalError:
    return sqlite3.OperationalError("database is locked")


def test_is_busy_knows_locked_and_busy_and_nothing_else(tmp_path: Path) -> None:
    assert is_busy(_locked())
    assert is_busy(sqlite3.OperationalError("database table is busy"))
    assert not is_busy(sqlite3.OperationalError("no such table: runs"))
    # A real one, with its error code: a second connection's write under another's
    # exclusive lock, with no busy wait.
    path = tmp_path / "f.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(sqlite3.OperationalError) as caught:
            other.execute("CREATE TABLE t (x)")
        assert is_busy(caught.value)
    finally:
        holder.close()
        other.close()


def test_retry_while_busy_retries_until_the_lock_is_gone() -> None:
    tries: list[int] = []

    def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise _locked()
        return "done"

    assert retry_while_busy(flaky, budget=5.0) == "done"
    assert len(tries) == 3


def test_retry_while_busy_raises_the_last_error_once_the_budget_is_spent() -> None:
    tries: list[int] = []

    def always_locked() -> None:
        tries.append(1)
        raise _locked()

    with pytest.raises(sqlite3.OperationalError, match="locked"):
        retry_while_busy(always_locked, budget=0.0)
    assert len(tries) == 1


def test_retry_while_busy_raises_any_other_error_at_once() -> None:
    tries: list[int] = []

    def broken() -> None:
        tries.append(1)
        raise sqlite3.OperationalError("no such table: runs")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        retry_while_busy(broken, budget=5.0)
    assert len(tries) == 1
