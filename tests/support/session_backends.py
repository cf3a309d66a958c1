"""Every session backend behind one face, for the session conformance suite
(tests/sessions/test_session_conformance.py): a fresh store of each kind, new session
objects on it, and a look at the rows a backend stored (where it stores rows)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import psycopg
import trio

from tests.support.sessions_sql import postgres_sql, sqlite_sql
from trio_agents import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from trio_agents.sessions import MemorySession, Session

BACKENDS: Final = ("memory", "sqlite", "postgres")

# One of every kind of item, with text a database may mangle (NUL, quotes, JSON, a lone
# surrogate), every status, and each kind marked rejected by a guardrail (DESIGN §18).
EVERY_KIND: Final[list[Item]] = [
    UserMessage('hello ✓ \x00 "quoted" {json} \ud800 lone surrogate'),
    AssistantMessage("thinking…", status="incomplete"),
    AssistantMessage(""),
    ToolCall("call-1", "search", '{"q": "trio"}'),
    ToolCall("call-2", "add", "not even json"),
    ToolResult("call-1", "found it"),
    ToolResult("call-2", "bad arguments", status="error"),
    ToolCall("call-3", "sleep"),
    ToolResult("call-3", "cancelled by the user", status="cancelled"),
    AssistantMessage("done", status="completed"),
    UserMessage("rejected \x00 input", rejected_by="no_secrets"),
    AssistantMessage("its answer", status="incomplete", rejected_by="no_secrets"),
    ToolCall("call-4", "final_answer", '{"x": 1}', rejected_by="g ✓"),
    ToolResult("call-4", "final answer accepted", rejected_by="g ✓"),
]

# Session ids every backend must store and give back as they are.
STORABLE: Final = ["😀 emoji", "'; DROP TABLE items; --", "\\u0000", "%s %(x)s ?", "a" * 2000, " "]


def assert_batches_whole(items: list[Item], batch_size: int) -> list[str]:
    """Each batch is one writer's `w:j` messages, j = 0..batch_size-1, never interleaved."""
    assert len(items) % batch_size == 0
    writers = []
    for start in range(0, len(items), batch_size):
        batch = items[start : start + batch_size]
        assert all(isinstance(item, UserMessage) for item in batch)
        writer = batch[0].content.split(":")[0]  # type: ignore[union-attr]
        assert [item.content for item in batch] == [  # type: ignore[union-attr]
            f"{writer}:{j}" for j in range(batch_size)
        ]
        writers.append(writer)
    return writers


@attrs.define(eq=False)
class Store:
    """One empty store of one backend (a memory root, a SQLite file, a PostgreSQL
    database). ``session(id)`` is a new object on it (memory: the root's ``with_id``, the
    one object of that id), closed when the test ends."""

    backend: str
    make: Callable[..., Session]
    # (position, data) of every stored row of a session, in order; None: no rows (memory).
    rows: Callable[[str], list[tuple[int, str]]] | None
    # Make the database itself refuse any row whose data contains the marker.
    poison: Callable[[str], None] | None
    driver_error: type[BaseException] | None
    # The options of two objects on one session that write through separate connections.
    pair: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
    # Items in a batch big enough that a cancel can land in the middle of its write.
    big_batch: int = 1000
    opened: list[Session] = attrs.field(factory=list)

    def session(self, session_id: str = "main", **options: Any) -> Any:
        session = self.make(session_id, **options)
        self.opened.append(session)
        return session

    def positions(self, session_id: str) -> list[int] | None:
        return None if self.rows is None else [p for p, _ in self.rows(session_id)]

    async def aclose(self) -> None:
        for session in self.opened:
            aclose = getattr(session, "aclose", None)
            if aclose is not None:
                await aclose()


def memory_store() -> Store:
    root = MemorySession("the store's root")
    return Store("memory", lambda sid, **_: root.with_id(sid), None, None, None)


def sqlite_store(path: Path) -> Store:
    sql = sqlite_sql(path)
    return Store("sqlite", sql.session, sql.rows, sql.poison, sqlite3.Error)


def postgres_store(dsn: str) -> Store:
    sql = postgres_sql(dsn)
    return Store(
        "postgres",
        sql.session,
        sql.rows,
        sql.poison,
        psycopg.Error,
        # Two pools: concurrent transactions on one session, kept apart by its row lock.
        pair=({"max_connections": 3}, {"max_connections": 4}),
        big_batch=500,
    )


@attrs.define(eq=False)
class StoredThenCancelled:
    """A user-written session around a backend's whose ``hang_on``-th ``add_items``
    stores its items (the real append returns) and then waits at one more checkpoint
    until cancelled: where a cancel lands on a write that has already happened (a
    session that checks for cancellation after its commit, or whose commit's answer
    was lost). ``stored`` is set once those items are in. Every other capability is
    the wrapped session's, as a typical wrapper passes them through."""

    inner: Session
    hang_on: int
    stored: trio.Event = attrs.field(factory=trio.Event)
    adds: int = 0

    @property
    def session_id(self) -> str:
        return self.inner.session_id

    @property
    def lock_key(self) -> object:
        return self

    async def get_items(self) -> list[Item]:
        return await self.inner.get_items()

    async def add_items(self, items: Sequence[Item]) -> None:
        await self.inner.add_items(items)
        self.adds += 1
        if self.adds == self.hang_on:
            self.stored.set()
            await trio.sleep_forever()  # the write's last checkpoint: cancelled here

    async def clear(self) -> None:
        await self.inner.clear()

    def __getattr__(self, name: str) -> Any:
        # get_stored_items, replace_items, aclose, ... when the inner session has them
        return getattr(self.inner, name)


async def stored_rows(session: Any) -> list[Item]:
    """The items a session stores, as they are (a stored session's ``get_items``
    repairs what it reads)."""
    raw = getattr(session, "get_stored_items", None)
    items: list[Item] = await (raw() if raw is not None else session.get_items())
    return items
