"""The cluster's event log on a real PostgreSQL: what a NOTIFY carries and how a
subscriber on another node follows a run from it (``trio_agents.cluster._eventlog``).

A subscriber gets live events from the NOTIFYs themselves (no read of the table) while
they continue exactly where it is; a lost NOTIFY, an event too big for the payload, or a
reconnection sends it back to the table, so it still sees every seq once, in order.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import attrs
import trio
import trio.testing

from trio_agents.cluster import _eventlog
from trio_agents.cluster._db import Conn, Database
from trio_agents.cluster._eventlog import INLINE_BYTES, EventWriter, follow
from trio_agents.cluster._listener import Listener

T = TypeVar("T")
RUN = "r-follow"
NODE = "n1"


@attrs.define(eq=False)
class CountingDatabase:
    """A Database whose table reads by ``follow`` are counted: ``pages`` as they start,
    ``pages_read`` once they returned."""

    db: Database
    pages: int = 0
    pages_read: int = 0

    async def call(self, fn: Callable[[Conn], T]) -> T:
        page = getattr(fn, "func", None) is _eventlog._page
        self.pages += page
        result = await self.db.call(fn)
        self.pages_read += page
        return result


def event(seq: int, status: str = "running", text: str = "") -> dict[str, Any]:
    """A ``run.updated`` event's JSON (``text`` pads it to any size)."""
    return {
        "type": "run.updated",
        "run_id": RUN,
        "seq": seq,
        "status": status,
        "reason": text or None,
        "turn": 0,
        "at": 0.0,
        "detail": {},
    }


@attrs.define(eq=False)
class Rig:
    db: Database
    counting: CountingDatabase
    listener: Listener
    writer: EventWriter
    received: list[dict[str, Any]] = attrs.field(factory=list)
    changed: trio.Event = attrs.field(factory=trio.Event)
    ended: trio.Event = attrs.field(factory=trio.Event)

    async def persist(self, *events: dict[str, Any]) -> None:
        """Write ``events`` as the owner's writer does (rows, events, NOTIFY)."""
        rows = {RUN: {"attempt": 1, "seq": max(e["seq"] for e in events)}}
        tuples = [(RUN, e["seq"], e["type"], json.dumps(e)) for e in events]
        lost = await self.db.call(lambda conn: self.writer._write(conn, tuples, rows, []))
        assert lost == []

    async def insert_silently(self, *events: dict[str, Any]) -> None:
        """Write ``events`` into the table without a NOTIFY (one lost with a connection)."""

        def insert(conn: Conn) -> None:
            for e in events:
                conn.execute(
                    "INSERT INTO trio_agents_events (run_id, seq, type, data) VALUES (%s, %s, %s, %s)",
                    (RUN, e["seq"], e["type"], json.dumps(e)),
                )

        await self.db.call(insert)

    async def wait_for(self, count: int) -> None:
        with trio.fail_after(10):
            while len(self.received) < count:
                await self.changed.wait()

    async def send(self, message: dict[str, Any]) -> None:
        self.received.append(message)
        self.changed.set()
        self.changed = trio.Event()

    async def table(self) -> list[tuple[int, dict[str, Any]]]:
        def read(conn: Conn) -> list[tuple[int, dict[str, Any]]]:
            rows = conn.execute(
                "SELECT seq, data FROM trio_agents_events WHERE run_id = %s ORDER BY seq", (RUN,)
            ).fetchall()
            return [(int(seq), json.loads(data)) for seq, data in rows]

        return await self.db.call(read)


@asynccontextmanager
async def rig(pg_dsn: str, mode: str = "all") -> AsyncIterator[Rig]:
    """A run's row owned by NODE, a listener, and ``follow`` running (subscribed from
    seq 1) once its first read of the table returned and it waits for NOTIFYs (a read
    still in its thread would see what a test writes next)."""
    db = Database(pg_dsn)
    the_rig: Rig | None = None

    def on_message(message: dict[str, Any]) -> None:
        if message.get("k") == "run":
            listener.notify(("run", message.get("r")), message)

    listener = Listener(pg_dsn, on_message)
    try:
        await db.call(
            lambda conn: conn.execute(
                "INSERT INTO trio_agents_runs (run_id, principal, session_key, agent, status,"
                " owner, attempt, lease_expires_at) VALUES (%s, 'alice', 'k', 'a', 'running',"
                " %s, 1, now() + interval '1 minute')",
                (RUN, NODE),
            )
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(listener.run)
            with trio.fail_after(10):
                await listener.connected.wait()
            counting = CountingDatabase(db)
            the_rig = Rig(db, counting, listener, EventWriter(db, listener, NODE))

            async def follow_it() -> None:
                assert the_rig is not None
                await follow(counting, listener, RUN, 1, mode, the_rig.send)  # type: ignore[arg-type]
                the_rig.ended.set()

            nursery.start_soon(follow_it)
            with trio.fail_after(10):
                while counting.pages_read < 1 or ("run", RUN) not in listener._waiters:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            await trio.testing.wait_all_tasks_blocked()
            yield the_rig
            nursery.cancel_scope.cancel()
    finally:
        await db.aclose()


async def test_live_events_come_from_the_notify_and_equal_the_persisted_ones(
    pg_dsn: str,
) -> None:
    async with rig(pg_dsn) as r:
        await r.persist(event(1), event(2))
        await r.persist(event(3))
        await r.wait_for(3)
        assert r.counting.pages == 1  # the first read only: the rest came inline
        table = await r.table()
        assert [(m["seq"], m["event"]) for m in r.received] == table
        await r.persist(event(4, "cancelled"))
        with trio.fail_after(10):
            await r.ended.wait()  # the terminal update ends the subscription
        assert [m["seq"] for m in r.received] == [1, 2, 3, 4]
        assert r.counting.pages == 1


async def test_a_lost_notify_is_made_up_from_the_table(pg_dsn: str) -> None:
    async with rig(pg_dsn) as r:
        await r.persist(event(1))
        await r.wait_for(1)
        await r.insert_silently(event(2), event(3))  # their NOTIFY never came
        await r.persist(event(4))  # carries 4 only: a gap, so the table is read
        await r.wait_for(4)
        assert [m["seq"] for m in r.received] == [1, 2, 3, 4]
        assert [(m["seq"], m["event"]) for m in r.received] == await r.table()
        assert r.counting.pages == 2


async def test_events_too_big_for_the_payload_are_read_from_the_table(pg_dsn: str) -> None:
    async with rig(pg_dsn) as r:
        big = event(2, text="x" * INLINE_BYTES)
        await r.persist(event(1), big, event(3))  # 1 fits, 2 does not: 2 and 3 from the table
        await r.wait_for(3)
        assert [m["seq"] for m in r.received] == [1, 2, 3]
        assert r.received[1]["event"] == big
        assert r.counting.pages == 2


async def test_a_reconnection_sends_the_subscriber_back_to_the_table(pg_dsn: str) -> None:
    async with rig(pg_dsn) as r:
        await r.insert_silently(event(1))
        r.listener.notify_all()  # what a reconnection does
        await r.wait_for(1)
        assert r.counting.pages == 2


async def test_a_status_subscriber_gets_only_updates_from_the_notify(pg_dsn: str) -> None:
    async with rig(pg_dsn, mode="status") as r:
        delta = {"type": "text.delta", "run_id": RUN, "seq": 2, "delta": "hi"}
        await r.persist(event(1), delta, event(3))
        await r.wait_for(2)
        assert [m["seq"] for m in r.received] == [1, 3]
        assert r.counting.pages == 1


def test_the_payload_holds_what_fits_in_order() -> None:
    small = [(seq, json.dumps(event(seq))) for seq in range(1, 4)]
    head, _, tail = _eventlog._payload(RUN, 3, small).partition("\n")
    assert json.loads(head) == {"k": "run", "r": RUN, "s": 3}
    assert json.loads(tail) == [[seq, event(seq)] for seq in range(1, 4)]
    many = [(seq, json.dumps(event(seq, text="y" * 500))) for seq in range(1, 40)]
    payload = _eventlog._payload(RUN, 39, many)
    assert len(payload.encode()) <= INLINE_BYTES
    _, _, tail = payload.partition("\n")
    carried = [seq for seq, _ in json.loads(tail)]
    assert carried == list(range(1, len(carried) + 1))
    assert 1 < len(carried) < 39
    too_big = [(1, json.dumps(event(1, text="z" * INLINE_BYTES)))]
    assert _eventlog._payload(RUN, 1, too_big) == json.dumps({"k": "run", "r": RUN, "s": 1})
