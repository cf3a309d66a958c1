"""The Session contract, once, run against every backend (Memory, a real SQLite file,
the suite's PostgreSQL): round trips, sessions kept apart, ``with_id``, session ids,
concurrent appends, all-or-nothing batches under cancellation and failure, closing with
a write in flight, and a run's write that is cancelled after it stored its items. What only one backend promises (SQLite's WAL and file sharing,
PostgreSQL's write-back repair and pool) is in sessions/internals/."""

from __future__ import annotations

import json

import pytest
import trio
import trio.lowlevel
import trio.testing

import trio_agents as ta
from tests.support.session_backends import (
    EVERY_KIND,
    STORABLE,
    Store,
    StoredThenCancelled,
    assert_batches_whole,
    stored_rows,
)
from trio_agents import UserMessage, conversation_problems
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import Session, SessionStorageError


def needs(store: Store, what: object) -> None:
    if what is None:
        pytest.skip(f"{store.backend} has no such part")


async def test_is_a_session(store: Store) -> None:
    session = store.session("main")
    assert isinstance(session, Session)
    assert session.session_id == "main"


async def test_round_trip_of_every_item_type(store: Store) -> None:
    assert conversation_problems(EVERY_KIND) == []
    session = store.session("main")
    await session.add_items(EVERY_KIND[:4])
    await session.add_items(EVERY_KIND[4:])
    assert await session.get_items() == EVERY_KIND
    assert await store.session("main", **store.pair[1]).get_items() == EVERY_KIND
    if store.rows is not None:
        # Stored as the items' to_json, one JSON document per row, positions from 0.
        rows = store.rows("main")
        assert [p for p, _ in rows] == list(range(len(EVERY_KIND)))
        assert [json.loads(data) for _, data in rows] == [item.to_json() for item in EVERY_KIND]


async def test_empty_add_is_a_no_op(store: Store) -> None:
    session = store.session("main")
    await session.add_items([])
    assert await session.get_items() == []
    assert store.positions("main") in (None, [])


async def test_add_items_rejects_non_items_and_writes_nothing(store: Store) -> None:
    if store.backend == "memory":
        pytest.skip("MemorySession stores what it is given (no encoding step to refuse it)")
    session = store.session("main")
    with pytest.raises(TypeError, match="item 1"):
        await session.add_items([UserMessage("ok"), {"role": "user", "content": "no"}])
    with pytest.raises(TypeError, match="item 0"):
        await session.add_items("hello")
    with pytest.raises(TypeError, match="item 0"):
        await session.replace_items("hello")
    assert await session.get_items() == []


async def test_clear(store: Store) -> None:
    a, b = store.session("a"), store.session("b")
    await a.add_items([UserMessage("a1"), UserMessage("a2")])
    await b.add_items([UserMessage("b1")])
    await a.clear()
    assert await a.get_items() == []
    assert await b.get_items() == [UserMessage("b1")]
    # Positions start again from 0 after a clear.
    await a.add_items([UserMessage("a3")])
    assert await a.get_items() == [UserMessage("a3")]
    assert store.positions("a") in (None, [0])
    assert store.positions("b") in (None, [0])


async def test_many_sessions_in_one_store_are_kept_apart(store: Store) -> None:
    sessions = [store.session(f"s{i}") for i in range(5)]
    for round_ in range(3):
        for i, s in enumerate(sessions):
            await s.add_items([UserMessage(f"s{i} r{round_}")])
    for i, s in enumerate(sessions):
        assert await s.get_items() == [UserMessage(f"s{i} r{r}") for r in range(3)]
        assert store.positions(f"s{i}") in (None, [0, 1, 2])
    # A second object for the same id sees the same conversation.
    again = store.session("s3", **store.pair[1])
    assert await again.get_items() == await sessions[3].get_items()


async def test_with_id_is_another_conversation_in_the_same_store(store: Store) -> None:
    parent = store.session("parent")
    child = parent.with_id("parent/call-1")
    store.opened.append(child)
    assert child.session_id == "parent/call-1"
    await parent.add_items([UserMessage("parent's")])
    await child.add_items([UserMessage("child's")])
    assert await parent.get_items() == [UserMessage("parent's")]
    again = parent.with_id("parent/call-1")  # memory: the same object; else a new one
    store.opened.append(again)
    assert await again.get_items() == [UserMessage("child's")]
    with pytest.raises(ValueError, match="session_id"):
        parent.with_id("")


@pytest.mark.parametrize("session_id", STORABLE)
async def test_a_storable_session_id_round_trips(store: Store, session_id: str) -> None:
    await store.session(session_id).add_items([UserMessage(session_id[:10])])
    again = store.session(session_id, **store.pair[1])
    assert await again.get_items() == [UserMessage(session_id[:10])]
    assert await store.session(session_id + "x").get_items() == []


async def test_concurrent_appends_to_one_session(store: Store) -> None:
    tasks, batch_size = 25, 7
    # Two objects for the same session id, each with its own connection(s).
    first = store.session("busy", **store.pair[0])
    second = store.session("busy", **store.pair[1])

    async def writer(n: int) -> None:
        target = first if n % 2 else second
        await target.add_items([UserMessage(f"w{n}:{j}") for j in range(batch_size)])

    async with trio.open_nursery() as nursery:
        for n in range(tasks):
            nursery.start_soon(writer, n)
    writers = assert_batches_whole(await first.get_items(), batch_size)
    assert sorted(writers) == sorted(f"w{n}" for n in range(tasks))
    assert store.positions("busy") in (None, list(range(tasks * batch_size)))


async def test_concurrent_appends_to_several_sessions(store: Store) -> None:
    session_ids, per_session, batch_size = ["a", "b", "c", "d"], 6, 5
    sessions = {sid: store.session(sid) for sid in session_ids}

    async def writer(sid: str, n: int) -> None:
        await sessions[sid].add_items([UserMessage(f"{sid}{n}:{j}") for j in range(batch_size)])

    async with trio.open_nursery() as nursery:
        for n in range(per_session):
            for sid in session_ids:
                nursery.start_soon(writer, sid, n)
    for sid in session_ids:
        writers = assert_batches_whole(await sessions[sid].get_items(), batch_size)
        assert sorted(writers) == sorted(f"{sid}{n}" for n in range(per_session))
        assert store.positions(sid) in (None, list(range(per_session * batch_size)))


async def test_cancel_right_after_starting_add_items_writes_the_whole_batch(
    store: Store,
) -> None:
    session = store.session("main")
    batch = [UserMessage(f"m{i}") for i in range(3000)]
    finished = False

    async def add() -> None:
        nonlocal finished
        await session.add_items(batch)
        finished = True

    async with trio.open_nursery() as nursery:
        nursery.start_soon(add)
        await trio.testing.wait_all_tasks_blocked()  # the write is running in its thread
        nursery.cancel_scope.cancel()
    assert finished  # not abandoned: the caller waited for the commit
    assert await session.get_items() == batch


async def test_a_failing_batch_writes_nothing(store: Store) -> None:
    needs(store, store.poison)
    assert store.poison is not None
    assert store.driver_error is not None
    session = store.session("main")
    await session.add_items([UserMessage("before")])
    store.poison("poison")  # the database itself refuses one row in the middle
    batch = [UserMessage("ok 1"), UserMessage("ok 2"), UserMessage("poison"), UserMessage("ok 3")]
    with pytest.raises(SessionStorageError, match="poisoned row") as info:
        await session.add_items(batch)
    assert isinstance(info.value.__cause__, store.driver_error)
    assert await session.get_items() == [UserMessage("before")]
    # Positions claimed for the batch were rolled back with it; the session still works.
    await session.add_items([UserMessage("after")])
    assert await session.get_items() == [UserMessage("before"), UserMessage("after")]
    assert store.positions("main") == [0, 1]


@pytest.mark.parametrize("yields", [0, 1, 2, 3, 5, 8])
async def test_cancel_at_any_point_is_all_or_nothing(store: Store, yields: int) -> None:
    session = store.session("main")
    size = store.big_batch
    batches = [[UserMessage(f"{attempt}:{i}") for i in range(size)] for attempt in range(3)]
    for batch in batches:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.add_items, batch)
            for _ in range(yields):
                await trio.lowlevel.checkpoint()
            nursery.cancel_scope.cancel()
    loaded = await session.get_items()
    written = [batch for batch in batches if batch[0] in loaded]
    assert loaded == [item for batch in written for item in batch]


async def test_cancelled_before_the_call_writes_nothing(store: Store) -> None:
    session = store.session("main")
    with trio.CancelScope() as scope:
        scope.cancel()
        await session.add_items([UserMessage("never")])
    if store.backend == "memory":
        # Memory's add_items writes first and then only a shielded checkpoint: a call
        # is all (a cancel never reaches it) or nothing, like the others.
        assert not scope.cancelled_caught
        assert await session.get_items() == [UserMessage("never")]
    else:
        assert scope.cancelled_caught
        assert await session.get_items() == []


async def test_aclose_waits_for_a_write_in_flight(store: Store) -> None:
    if store.backend == "memory":
        pytest.skip("MemorySession has nothing to close")
    session = store.session("main")
    batch = [UserMessage(str(i)) for i in range(2000)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.add_items, batch)
        await trio.testing.wait_all_tasks_blocked()
        await session.aclose()
    assert await store.session("main").get_items() == batch


@ta.function_tool
async def echo(text: str) -> str:
    """Answer at once."""
    return text


# Its writes: 1 the input, 2 the text and the call, 3 the call's result, 4 the answer.
CALL_THEN_ANSWER: list[Turn | str] = [
    Turn("let me look", tool_calls=[("echo", {"text": "x"})]),
    "done",
]


@pytest.mark.parametrize("hang_on", [1, 2, 3, 4], ids=["input", "call", "result", "answer"])
async def test_a_cancel_after_the_write_stored_its_items_never_stores_them_twice(
    store: Store, hang_on: int
) -> None:
    # The write of a run stores its items, then a cancel lands at its last checkpoint
    # (the session raises Cancelled after its commit): the repair must not write them
    # again, whatever the backend, through a session the user wrote around it.
    session = StoredThenCancelled(store.session("main"), hang_on)
    agent = ta.Agent(name="w", model=ScriptedModel(CALL_THEN_ANSWER), tools=[echo])
    async with ta.open_run(agent, "hi", session=session) as run:
        await session.stored.wait()
        run.cancel("stop")
    result = run.result
    assert result is not None
    assert (result.status, result.reason) == ("cancelled", "stop")
    rows = await stored_rows(store.session("main"))
    assert conversation_problems(rows) == []
    assert rows == list(result.conversation)  # each item once, the repair's included
    # The next run loads it as it is and goes on.
    again = await ta.run(
        ta.Agent(name="w", model=ScriptedModel(["again"])), "more", session=store.session("main")
    )
    assert again.status == "completed"
    assert list(again.conversation) == [*rows, ta.UserMessage("more"), ta.AssistantMessage("again")]
