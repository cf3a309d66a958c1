"""The shared run stores of Temporal runs (``SharedRunStore``): the SQLite ``RunStore``
and the ``PostgresRunStore`` keep the same contract — records, the event log, session
claims, attempt claims that fence a stale attempt, change detection — each checked on
both through the public API, with two store objects standing for two processes (a
worker's and a server's). No Temporal server is needed here."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import psycopg
import pytest
import trio

from tests.support.pg_support import postgres_url
from trio_agents import RunStatus
from trio_agents.hosting import RunInfo
from trio_agents.temporal import (
    PostgresRunStore,
    RunStore,
    RunStoreError,
    SharedRunStore,
    shared_storage,
)

OpenStore = Callable[[], SharedRunStore]


@pytest.fixture(params=["sqlite", "postgres"])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> OpenStore:
    """``new_store()``: another store object over this test's one store (as another
    process would open it)."""
    if request.param == "sqlite":
        return lambda: RunStore(tmp_path / "runs.sqlite3")
    url = postgres_url(request.getfixturevalue("pg_dsn"))
    return lambda: PostgresRunStore(url)


@asynccontextmanager
async def opened(new_store: OpenStore) -> AsyncIterator[SharedRunStore]:
    async with new_store() as store:
        yield store


def _info(run_id: str, status: str = "queued", seq: int = 0, **kwargs: object) -> RunInfo:
    return RunInfo(
        run_id=run_id,
        agent="a",
        session_id=kwargs.pop("session_id", None),  # type: ignore[arg-type]
        status=RunStatus(status),
        reason=None,
        seq=seq,
        **kwargs,  # type: ignore[arg-type]
    )


def _event(run_id: str, seq: int, status: str = "running") -> tuple[str, int, str]:
    data = {"type": "run.updated", "run_id": run_id, "seq": seq, "status": status}
    return run_id, seq, json.dumps(data)


async def _seqs(store: SharedRunStore, root: str) -> list[tuple[str, int]]:
    events, _ = await store.events_after(root, 0, None)
    return [(event.run_id, event.seq) for event in events]


async def test_a_stale_attempts_writes_are_refused_once_a_later_attempt_claimed_the_run(
    new_store: OpenStore,
) -> None:
    async with opened(new_store) as worker1, opened(new_store) as worker2:
        first = await worker1.claim_attempt("r1", "alice", "s1", 1, _info("r1"))
        assert (first.owned, first.next_seq) == (True, 1)
        assert await worker1.write_events(
            "r1",
            1,
            "alice",
            [_event("r1", 1), _event("r1", 2)],
            [
                (
                    "r1",
                    None,
                    _info("r1", "running", 2, session_id="s1"),
                )
            ],
            None,
        )
        # Attempt 2, on another worker: its first seq follows what attempt 1 wrote.
        second = await worker2.claim_attempt("r1", "alice", "s1", 2, _info("r1"))
        assert (second.owned, second.next_seq) == (True, 3)
        # The stale attempt is refused, and nothing of its batch is written.
        stale = [(_event("r1", 3, "completed"))]
        record = [("r1", None, _info("r1", "completed", 3))]
        assert not await worker1.write_events("r1", 1, "alice", stale, record, "s1")
        assert await _seqs(worker2, "r1") == [("r1", 1), ("r1", 2)]
        info = await worker2.info("alice", "r1")
        assert info is not None
        assert info.status == "running"
        assert await worker2.session_holder("alice", "s1") == "r1"  # its release refused too
        # The number never goes back: attempt 1 cannot claim the run again.
        assert not (await worker1.claim_attempt("r1", "alice", "s1", 1, _info("r1"))).owned
        assert await worker2.write_events("r1", 2, "alice", [_event("r1", 3)], [], None)
        # A host that ends the run fences every attempt, the latest one too.
        assert await worker1.finish_if_open("alice", "r1", "cancelled", "gone")
        assert not await worker1.finish_if_open("alice", "r1", "cancelled", "again")
        assert not await worker2.write_events("r1", 2, "alice", [_event("r1", 9)], [], None)
        assert not (await worker2.claim_attempt("r1", "alice", "s1", 3, _info("r1"))).owned
        events, _ = await worker2.events_after("r1", 0, None)
        ended = await worker2.info("alice", "r1")
    assert [e.seq for e in events] == [1, 2, 3, 4]
    assert (events[-1].event["status"], events[-1].event["reason"]) == ("cancelled", "gone")
    assert ended is not None
    assert (ended.status, ended.reason, ended.seq) == ("cancelled", "gone", 4)


async def test_records_trees_claims_and_change_detection(new_store: OpenStore) -> None:
    async with opened(new_store) as host, opened(new_store) as worker:
        seen = await host.data_version()
        assert (
            await host.create_run(_info("r1", session_id="s1"), "alice", claim_session=True) is None
        )
        # Busy: the session's holder comes back, and nothing is recorded.
        holder = await host.create_run(_info("r2", session_id="s1"), "alice", claim_session=True)
        assert holder == "r1"
        assert await host.info("alice", "r2") is None
        assert await host.claim_session("alice", "s1", "r3") == "r1"
        assert await host.active_roots("alice") == 1
        # The worker writes the root and a child; the host sees a change committed.
        assert (await worker.claim_attempt("r1", "alice", "s1", 1, _info("r1"))).owned
        child = _info("c1", "running", 1, parent_id="r1", root_id="r1")
        assert await worker.write_events(
            "r1",
            1,
            "alice",
            [_event("r1", 1), _event("c1", 1), _event("r1", 2)],
            [("r1", None, _info("r1", "running", 2, session_id="s1")), ("c1", "r1", child)],
            None,
        )
        assert await host.data_version() != seen
        assert await host.root_of("alice", "c1") == "r1"
        assert await host.root_of("bob", "c1") is None
        assert await host.subtree("r1") == ["r1", "c1"]
        info = await host.info("alice", "r1")
        assert info is not None
        assert info.children == ("c1",)
        assert [i.run_id for i in await host.runs_of("alice", nodes=True)] == ["r1", "c1"]
        assert [i.run_id for i in await host.runs_of("alice", nodes=False)] == ["r1"]
        assert await host.runs_of("bob", nodes=True) == []
        only_child, after = await host.events_after("r1", 0, ["c1"])
        assert [(e.run_id, e.seq) for e in only_child] == [("c1", 1)]
        page, first_page_end = await host.events_after("r1", 0, None, limit=2)
        rest, _ = await host.events_after("r1", first_page_end, None)
        assert [e.seq for e in page + rest] == [1, 1, 2]
        assert after == rest[-1].id
        assert await host.open_roots() == [("alice", "r1")]
        # The root ends: its session is released with its terminal batch.
        ended = _info("r1", "completed", 3, session_id="s1")
        assert await worker.write_events(
            "r1", 1, "alice", [_event("r1", 3, "completed")], [("r1", None, ended)], "s1"
        )
        assert await host.session_holder("alice", "s1") is None
        assert await host.active_roots("alice") == 0
        assert await host.open_roots() == []
        assert await host.claim_session("alice", "s1", "r3") is None
        await host.release_session("alice", "s1", "someone else")
        assert await host.session_holder("alice", "s1") == "r3"
        await host.release_session("alice", "s1", "r3")
        assert await host.session_holder("alice", "s1") is None
        # A start whose workflow never began is forgotten, its claim with it.
        assert (
            await host.create_run(_info("r4", session_id="s4"), "alice", claim_session=True) is None
        )
        await host.forget_run("r4")
        assert await host.info("alice", "r4") is None
        assert await host.session_holder("alice", "s4") is None


async def test_a_look_at_a_busy_session_is_no_change(new_store: OpenStore) -> None:
    """A run queued behind a busy session looks at it again on every change: a look
    that claims nothing (nor a release of a claim it does not hold) must not count as
    one, or each look would wake every server polling the store, and so the next look."""
    async with opened(new_store) as host, opened(new_store) as other:
        assert (
            await other.create_run(_info("r1", session_id="s1"), "alice", claim_session=True)
            is None
        )
        seen = await host.data_version()
        for _ in range(3):
            assert await other.claim_session("alice", "s1", "r2") == "r1"
            await other.release_session("alice", "s1", "r2")  # not its claim
        assert await host.data_version() == seen
        await other.release_session("alice", "s1", "r1")
        assert await host.data_version() != seen


async def test_stores_opened_at_once_on_a_new_sqlite_file_all_open(tmp_path: Path) -> None:
    """Workers and servers start together on one new file: each store opens (the first
    switches the file to WAL, an exclusive lock SQLite's busy wait does not cover: the
    others retry instead of failing with "database is locked")."""
    for attempt in range(20):
        path = tmp_path / f"runs-{attempt}.sqlite3"
        stores = [RunStore(path) for _ in range(8)]
        try:
            async with trio.open_nursery() as nursery:
                for store in stores:
                    nursery.start_soon(store.__aenter__)
        finally:
            for store in stores:
                await store.close()


async def test_concurrent_claims_of_one_session_leave_exactly_one_holder(
    new_store: OpenStore,
) -> None:
    stores = [new_store() for _ in range(6)]
    answers: dict[str, str | None] = {}

    async def claim(store: SharedRunStore, run_id: str) -> None:
        answers[run_id] = await store.claim_session("alice", "s1", run_id)

    try:
        async with trio.open_nursery() as nursery:
            for number, store in enumerate(stores):
                nursery.start_soon(claim, store, f"r{number}")
    finally:
        for store in stores:
            await store.close()
    winners = [run_id for run_id, holder in answers.items() if holder is None]
    assert len(winners) == 1, answers
    assert all(holder == winners[0] for holder in answers.values() if holder is not None)


async def test_postgres_a_claim_waits_for_a_write_in_flight_and_its_seq_follows_it(
    pg_dsn: str,
) -> None:
    # READ COMMITTED fencing: a write holds the root's row until it commits; a claim
    # meanwhile waits for it, and the new attempt's first seq follows what it wrote.
    url = postgres_url(pg_dsn)
    async with PostgresRunStore(url) as worker1, PostgresRunStore(url) as worker2:
        assert (await worker1.claim_attempt("r1", "alice", None, 1, _info("r1"))).owned
        assert await worker1.write_events("r1", 1, "alice", [_event("r1", 1)], [], None)
        with psycopg.connect(pg_dsn) as writer:  # attempt 1's next write, held open
            writer.execute(
                "SELECT attempt FROM trio_agents_temporal_runs WHERE run_id = 'r1' FOR UPDATE"
            )
            writer.execute(
                "INSERT INTO trio_agents_temporal_events (root_id, run_id, seq, event)"
                " VALUES ('r1', 'r1', 2, %s)",
                (_event("r1", 2)[2],),
            )
            claimed = []
            async with trio.open_nursery() as nursery:

                async def claim() -> None:
                    claimed.append(await worker2.claim_attempt("r1", "alice", None, 2, _info("r1")))

                nursery.start_soon(claim)
                with trio.fail_after(30):
                    while not await trio.to_thread.run_sync(_someone_waits_for_a_lock, pg_dsn):  # noqa: ASYNC110
                        await trio.sleep(0.01)  # another connection's state: polled
                assert claimed == []
                writer.commit()
        assert claimed[0].owned
        assert claimed[0].next_seq == 3
        assert not await worker1.write_events("r1", 1, "alice", [_event("r1", 3)], [], None)


def _someone_waits_for_a_lock(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()
    return row is not None and int(row[0]) > 0


async def test_shared_storage_picks_sqlite_files_or_a_postgres_database(
    tmp_path: Path, pg_dsn: str
) -> None:
    store, sessions = shared_storage(tmp_path / "sessions.sqlite3")
    assert isinstance(store, RunStore)
    assert store.path == str(tmp_path / "sessions.sqlite3.runs")
    url = postgres_url(pg_dsn)
    store, sessions = shared_storage(url)
    assert isinstance(store, PostgresRunStore)
    session = sessions("alice", "s1")
    try:
        assert type(session).__name__ == "PostgresSession"
        assert session.session_id == json.dumps(["alice", "s1"])
    finally:
        await session.aclose()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="not a valid PostgreSQL connection string"):
        shared_storage("postgresql://no such host/db")


async def test_postgres_an_unreachable_database_is_a_run_store_error() -> None:
    from tests.support.temporal_support import free_port

    where = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    store = PostgresRunStore(where, statement_timeout=0.5)
    with pytest.raises(RunStoreError, match=re.escape("127.0.0.1")):
        async with store:
            pass  # pragma: no cover


async def test_calls_recorded_by_the_owner_reach_the_next_attempt_and_a_fenced_ones_do_not(
    new_store: OpenStore,
) -> None:
    async with opened(new_store) as worker1, opened(new_store) as worker2:
        first = await worker1.claim_attempt("r1", "p", "s", 1, _info("r1"), address="h:1")
        assert first.owned
        assert first.started == ()
        assert await worker1.record_call("r1", 1, "call-a")
        assert await worker1.record_call("r1", 1, "call-a")  # a repeat is harmless
        assert await worker1.record_call("r1", 1, "call-b")

        second = await worker2.claim_attempt("r1", "p", "s", 2, _info("r1"), address="h:2")
        assert second.owned
        assert second.started == ("call-a", "call-b")
        # The first attempt (a thawed worker) is fenced: its call is not recorded, so it
        # can never look started to anyone.
        assert not await worker1.record_call("r1", 1, "call-late")
        assert await worker2.record_call("r1", 2, "call-c")

        third = await worker1.claim_attempt("r1", "p", "s", 3, _info("r1"))
        assert third.started == ("call-a", "call-b", "call-c")
        # Another run's calls are its own.
        other = await worker1.claim_attempt("r2", "p", "s2", 1, _info("r2"))
        assert other.started == ()


async def test_the_push_address_is_the_owning_attempts_only(new_store: OpenStore) -> None:
    async with opened(new_store) as worker, opened(new_store) as server:
        assert await server.place_of("r1") is None
        await worker.claim_attempt("r1", "p", None, 1, _info("r1"), address="h:1")
        assert await server.place_of("r1") == "h:1"
        # A stale attempt's claim is refused and leaves the address alone.
        await worker.claim_attempt("r1", "p", None, 2, _info("r1"), address="h:2")
        stale = await worker.claim_attempt("r1", "p", None, 1, _info("r1"), address="h:9")
        assert not stale.owned
        assert await server.place_of("r1") == "h:2"
        # An owner that recorded no address has none: not its predecessor's.
        await worker.claim_attempt("r1", "p", None, 3, _info("r1"))
        assert await server.place_of("r1") is None
