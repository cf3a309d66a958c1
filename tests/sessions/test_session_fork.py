"""Forking a conversation (DESIGN §23), once against every backend (Memory, a real
SQLite file, the suite's PostgreSQL): a fork at every item boundary is valid model
input and a run continues from it; the tree's child sessions come along when their call
is kept; the original is never changed, not even by a fork taken while it is written;
a fork never overwrites; bad ``at`` and ids are refused with clear errors."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Literal

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.session_backends import EVERY_KIND, Store, stored_rows
from trio_agents import (
    AssistantMessage,
    Item,
    ToolCall,
    ToolResult,
    UserMessage,
    conversation_problems,
)
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import (
    MemorySession,
    SessionExistsError,
    SQLiteSession,
    fork_point,
    fork_session,
)

text = st.text(max_size=8)


@st.composite
def conversations(draw: st.DrawFn) -> list[Item]:
    """What a session holds: messages, parallel call groups answered in any order,
    calls answered one by one, handoffs (``transfer_to_<name>``), items a guardrail
    marked ``rejected_by``; and, half the time, the tail of a live run (a group whose
    calls are not all answered yet)."""
    items: list[Item] = []
    n = 0
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["user", "assistant", "parallel", "serial", "handoff"]))
        mark = draw(st.none() | st.just("guard"))
        if kind == "user":
            items.append(UserMessage(draw(text), rejected_by=mark))
        elif kind == "assistant":
            done = draw(st.booleans())
            status: Literal["completed", "incomplete"] = "completed" if done else "incomplete"
            items.append(AssistantMessage(draw(text), status=status, rejected_by=mark))
        elif kind == "handoff":
            n += 1
            items += [
                ToolCall(f"c{n}", "transfer_to_b", "{}"),
                ToolResult(f"c{n}", "transferred to b"),
            ]
        else:
            ids = [f"c{n + i}" for i in range(1, draw(st.integers(1, 4)) + 1)]
            n += len(ids)
            if kind == "serial":
                for i in ids:
                    items += [ToolCall(i, "t"), ToolResult(i, "out")]
            else:
                items += [ToolCall(i, "t") for i in ids]
                items += [ToolResult(i, "out", status="error") for i in draw(st.permutations(ids))]
    if draw(st.booleans()):  # a live run's tail: calls made, some answered
        ids = [f"c{n + i}" for i in range(1, draw(st.integers(1, 3)) + 1)]
        items += [ToolCall(i, "t") for i in ids]
        answered = draw(st.lists(st.sampled_from(ids), unique=True, max_size=len(ids) - 1))
        items += [ToolResult(i, "out") for i in answered]
    return items


async def _fork_everywhere(source: Any, items: list[Item]) -> None:
    """Fork ``source`` (holding ``items``) at every boundary and check each fork."""
    for at in range(len(items) + 2):
        fork = await source.fork(f"f{at}", at=at)
        forked = await fork.get_items()
        aclose = getattr(fork, "aclose", None)
        if aclose is not None:
            await aclose()
        kept = fork_point(items, at)
        assert forked == items[:kept]
        assert conversation_problems(forked) == []
        # Rounded down as little as possible: every longer prefix up to `at` splits a
        # call from its result.
        for longer in range(kept + 1, min(at, len(items)) + 1):
            assert conversation_problems(items[:longer]) != []
    assert await stored_rows(source) == items


@settings(max_examples=150, deadline=None)
@given(items=conversations())
def test_a_fork_at_every_boundary_is_valid_model_input(items: list[Item]) -> None:
    async def main() -> None:
        source = MemorySession("s")
        await source.add_items(items)
        await _fork_everywhere(source, items)

    trio.run(main)


@settings(max_examples=25, deadline=None)
@given(items=conversations())
def test_a_fork_at_every_boundary_of_a_sqlite_file(items: list[Item]) -> None:
    """The same on a real SQLite file, where the cut is computed from what the
    database reads of each row."""

    async def main() -> None:
        with tempfile.TemporaryDirectory() as scratch:
            async with SQLiteSession(Path(scratch) / "s.db", "s") as source:
                await source.add_items(items)
                await _fork_everywhere(source, items)

    trio.run(main)


# -- every backend ------------------------------------------------------------------------


def _helper_agent() -> ta.Agent:
    return ta.Agent(name="helper", instructions="help", model=ScriptedModel([], default="helped"))


@ta.function_tool
async def lookup(q: str) -> str:
    """Look something up."""
    await trio.lowlevel.checkpoint()
    return f"found {q}"


def _tree_agent() -> ta.Agent:
    """A conversation with parallel calls (one of them a sub-agent, whose child session
    is ``<session>/call_1_1``), a handoff, and answers."""
    second = ta.Agent(name="second", instructions="two", model=ScriptedModel(["second answers"]))
    script = ScriptedModel(
        [
            Turn(tool_calls=[("lookup", {"q": "a"}), ("helper", {"input": "x"})]),
            Turn(text="thinking", tool_calls=[("lookup", {"q": "b"})]),
            Turn(tool_calls=[("transfer_to_second", {})]),
        ]
    )
    return ta.Agent(
        name="first",
        instructions="one",
        model=script,
        tools=[lookup, _helper_agent().as_tool(name="helper")],
        handoffs=[second],
    )


async def test_fork_of_a_tree_at_every_item(store: Store) -> None:
    source = store.session("src")
    result = await ta.run(_tree_agent(), "go", session=source)
    assert result.status is ta.RunStatus.COMPLETED
    items = await stored_rows(source)
    child_id = "src/call_1_1"
    child_items = await _below(store, source, child_id).get_items()
    assert child_items  # the sub-agent's conversation
    call_at = next(i for i, it in enumerate(items) if getattr(it, "call_id", "") == "call_1_1")
    for at in range(len(items) + 1):
        fork = await source.fork(f"f{at}", at=at)
        store.opened.append(fork)
        forked = await fork.get_items()
        assert forked == items[: fork_point(items, at)]
        assert conversation_problems(forked) == []
        forked_child = await _below(store, fork, f"f{at}/call_1_1").get_items()
        # The child session comes along exactly when its call is kept (whole: the
        # call's result is kept too, so the child run had ended).
        assert forked_child == (child_items if fork_point(items, at) > call_at else [])
        # Any run continues from the fork: its first request is the fork plus its input.
        model = ScriptedModel(["again"])
        again = ta.Agent(name="again", instructions="i", model=model)
        follow = await ta.run(again, "and now?", session=fork)
        assert follow.status is ta.RunStatus.COMPLETED
        assert list(model.requests[0].items) == [*forked, UserMessage("and now?")]
    # The original and its child are untouched.
    assert await stored_rows(source) == items
    assert await _below(store, source, child_id).get_items() == child_items
    assert await source.child_session_ids() == [child_id]


def _below(store: Store, session: Any, session_id: str) -> Any:
    """A session of ``session``'s tree (memory keeps a tree in the objects that made
    it: the parent's ``with_id``)."""
    made = session.with_id(session_id)
    store.opened.append(made)
    return made


async def test_rejected_items_are_copied_as_they_are(store: Store) -> None:
    source = store.session("s")
    await source.add_items(EVERY_KIND)
    fork = await source.fork("copy")
    store.opened.append(fork)
    assert await fork.get_items() == EVERY_KIND
    if store.rows is not None:
        assert [d for _, d in store.rows("copy")] == [d for _, d in store.rows("s")]
        assert store.positions("copy") == list(range(len(EVERY_KIND)))


async def test_a_fork_never_overwrites(store: Store) -> None:
    source = store.session("s")
    await source.add_items([UserMessage("u"), ToolCall("k", "t"), ToolResult("k", "r")])
    child = _below(store, source, "s/k")
    await child.add_items([UserMessage("child")])
    taken = _below(store, source, "taken")
    await taken.add_items([UserMessage("mine")])
    with pytest.raises(SessionExistsError, match="'taken'") as caught:
        await source.fork("taken")
    assert caught.value.session_id == "taken"
    assert await taken.get_items() == [UserMessage("mine")]
    # The new id is free but the id its child would take is not: nothing is written.
    free = _below(store, source, "free")
    await _below(store, free, "free/k").add_items([UserMessage("someone else's")])
    with pytest.raises(SessionExistsError, match="'free/k'"):
        await source.fork("free")
    assert await free.get_items() == []
    assert await _below(store, free, "free/k").get_items() == [UserMessage("someone else's")]
    # A fork's tree is not the source's children: forking into "s/..." is not special.
    assert await source.child_session_ids() == ["s/k"]


@pytest.mark.parametrize(
    ("at", "error", "match"),
    [
        (-1, ValueError, "at must be >= 0"),
        (True, TypeError, "at must be an int"),
        ("1", TypeError, "at must be an int"),
        (("run-1", 3), ValueError, "cannot resolve the event position"),
        (("run-1",), TypeError, "at must be an int"),
    ],
)
async def test_a_bad_at_is_refused(store: Store, at: Any, error: type, match: str) -> None:
    source = store.session("s")
    await source.add_items([UserMessage("u")])
    with pytest.raises(error, match=match):
        await source.fork("f", at=at)
    assert await _below(store, source, "f").get_items() == []


@pytest.mark.parametrize(
    ("new_id", "error", "match"),
    [
        ("", ValueError, "must not be empty"),
        ("a\x00b", ValueError, "NUL"),
        ("\ud800", ValueError, "surrogate"),
        ("s", ValueError, "into itself"),
        (7, TypeError, "must be a str"),
    ],
)
async def test_a_bad_new_id_is_refused(store: Store, new_id: Any, error: type, match: str) -> None:
    source = store.session("s")
    await source.add_items([UserMessage("u")])
    with pytest.raises(error, match=match):
        await source.fork(new_id)
    assert await source.get_items() == [UserMessage("u")]


async def test_a_huge_id_and_storable_oddities_fork(store: Store) -> None:
    source = store.session("'; DROP TABLE items; -- %s ?")
    await source.add_items([UserMessage("u")])
    child = source.with_id(source.session_id + "/x")
    store.opened.append(child)
    await child.add_items([UserMessage("c")])
    huge = "é" * 1000  # 2000 bytes: what every backend's key holds
    fork = await source.fork(huge)
    store.opened.append(fork)
    assert await fork.get_items() == [UserMessage("u")]


async def test_fork_while_the_source_is_written_is_a_consistent_snapshot(store: Store) -> None:
    """Writers append whole call groups while forks are taken: each fork is a prefix
    of the final conversation made of whole groups (never half an append), and the
    original ends exactly as its writers made it."""
    writers, groups = 4, 6
    source = store.session("busy", **store.pair[0])
    other = store.session("busy", **store.pair[1])
    forks: list[Any] = []

    async def writer(w: int) -> None:
        for g in range(groups):
            call = f"w{w}g{g}"
            target = source if g % 2 else other
            await target.add_items([UserMessage(call), ToolCall(call, "t"), ToolResult(call, "r")])

    async def forker() -> None:
        for n in range(12):
            forks.append(await source.fork(f"snap{n}"))
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for w in range(writers):
            nursery.start_soon(writer, w)
        nursery.start_soon(forker)
    final = await stored_rows(source)
    assert len(final) == writers * groups * 3
    assert conversation_problems(final) == []
    for fork in forks:
        store.opened.append(fork)
        snap = await fork.get_items()
        assert len(snap) % 3 == 0
        assert snap == final[: len(snap)]


async def test_forks_of_a_large_session_while_a_writer_appends_are_whole_prefixes(
    store: Store,
) -> None:
    """A 3,000-item session, copied in the database by each fork, forked over and over
    (whole and at an index) while another connection appends call groups and a large
    batch: every fork is a prefix of the final conversation, cut at a group's end
    (never half an append, never a call without its result), and the original ends as
    its writer made it."""
    source = store.session("large", **store.pair[0])
    writer_side = store.session("large", **store.pair[1])
    base: list[Item] = []
    for g in range(600):
        call = f"base{g}"
        base += [UserMessage(call), ToolCall(call, "t"), ToolResult(call, "r" * (g % 50))]
        base += [AssistantMessage("ok"), UserMessage("next")]
    await source.add_items(base)
    forks: list[tuple[Any, int | None]] = []
    done = trio.Event()

    async def writer() -> None:
        for g in range(20):
            call = f"w{g}"
            await writer_side.add_items([UserMessage(call), ToolCall(call, "t")])
            await writer_side.add_items([ToolResult(call, "r")])
        big = [UserMessage(f"big{i}") for i in range(store.big_batch)]
        await writer_side.add_items(big)
        done.set()

    async def forker() -> None:
        n = 0
        while not done.is_set() or n < 3:
            at = None if n % 2 else 2_000 + n
            forks.append((await source.fork(f"snap{n}", at=at), at))
            n += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer)
        nursery.start_soon(forker)
    final = await stored_rows(source)
    assert len(final) == 3_000 + 20 * 3 + store.big_batch
    assert final[:3_000] == base
    for fork, at in forks:
        store.opened.append(fork)
        snap = await stored_rows(fork)
        assert snap == final[: len(snap)]
        assert conversation_problems(snap) == []
        if at is None:
            # Everything committed at its moment, rounded down to before an open call:
            # after a whole group, or after a group's message (its call is cut off),
            # or after the whole large batch; never inside an append.
            written = len(snap) - 3_000
            assert (0 <= written <= 60 and written % 3 in (0, 1)) or snap == final, written
        else:
            assert len(snap) == fork_point(base, at)


async def test_fork_of_a_live_run_leaves_its_open_call_out(store: Store) -> None:
    """A run is inside a tool call: the fork holds what was committed before the call,
    the original goes on and ends with the call's result."""
    release = trio.Event()
    started = trio.Event()

    @ta.function_tool
    async def wait() -> str:
        """Wait."""
        started.set()
        await release.wait()
        return "waited"

    source = store.session("live")
    await source.add_items([UserMessage("before"), AssistantMessage("hello")])
    agent = ta.Agent(
        name="a",
        instructions="i",
        model=ScriptedModel([Turn(text="calling", tool_calls=[("wait", {})]), "done"]),
        tools=[wait],
    )
    async with ta.open_run(agent, "go", session=source) as run:
        await started.wait()
        await trio.testing.wait_all_tasks_blocked()
        fork = await source.fork("snapshot")
        store.opened.append(fork)
        snap = await fork.get_items()
        release.set()
    assert run.result is not None
    assert run.result.status is ta.RunStatus.COMPLETED
    final = await stored_rows(source)
    assert conversation_problems(snap) == []
    assert not any(isinstance(item, ToolCall) for item in snap)  # its call was open
    assert snap == final[: len(snap)]
    assert UserMessage("go") in snap
    assert final[-1] == AssistantMessage("done")


async def test_fork_session_is_the_default_for_any_session(store: Store) -> None:
    """A user's session that wraps a backend (so has with_id but no fork of its own)
    forks through fork_session, tree included when it can list its children."""
    source = store.session("s")
    await source.add_items([UserMessage("u"), ToolCall("k", "t"), ToolResult("k", "r")])
    await _below(store, source, "s/k").add_items([UserMessage("child")])

    class Wrapper:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        @property
        def session_id(self) -> str:
            return str(self.inner.session_id)

        async def get_items(self) -> list[Item]:
            return list(await self.inner.get_items())

        async def add_items(self, items: Any) -> None:
            await self.inner.add_items(items)

        async def clear(self) -> None:
            await self.inner.clear()

        def with_id(self, session_id: str) -> Wrapper:
            made = Wrapper(self.inner.with_id(session_id))
            store.opened.append(made.inner)
            return made

        async def child_session_ids(self) -> list[str]:
            return list(await self.inner.child_session_ids())

    fork: Any = await fork_session(Wrapper(source), "f", at=1)
    assert await fork.get_items() == [UserMessage("u")]
    assert await _below(store, fork.inner, "f/k").get_items() == []
    whole: Any = await fork_session(Wrapper(source), "g")
    assert await whole.get_items() == await source.get_items()
    assert await _below(store, whole.inner, "g/k").get_items() == [UserMessage("child")]
    with pytest.raises(SessionExistsError):
        await fork_session(Wrapper(source), "g")
    with pytest.raises(TypeError, match="with_id"):
        await fork_session(_NoWithId(), "n")


class _NoWithId:
    session_id = "plain"

    async def get_items(self) -> list[Item]:
        return []

    async def add_items(self, items: Any) -> None:
        pass

    async def clear(self) -> None:
        pass


async def test_call_ids_with_quotes_escapes_and_slashes_keep_their_children(store: Store) -> None:
    """The shapes a stored session reads in the database (type, call id) decode call
    ids as they were: a quote, a backslash, non-ASCII text, a slash, a surrogate in
    the items around them."""
    odd = 'c"1\\é/x'
    source = store.session("s")
    await source.add_items(
        [
            UserMessage("\x00 \ud800 text"),
            ToolCall(odd, "t", '{"call_id": "fake", "\\"": 1}'),
            ToolResult(odd, '"call_id":"not this"'),
            ToolCall("plain", "t"),
            ToolResult("plain", "r"),
        ]
    )
    await _below(store, source, f"s/{odd}").add_items([UserMessage("odd child")])
    await _below(store, source, "s/plain").add_items([UserMessage("plain child")])
    cut = await source.fork("cut", at=4)
    store.opened.append(cut)
    assert len(await cut.get_items()) == 3
    assert await cut.child_session_ids() == [f"cut/{odd}"]
    assert await _below(store, cut, f"cut/{odd}").get_items() == [UserMessage("odd child")]


async def test_stored_rows_that_need_a_repair_are_forked_repaired(store: Store) -> None:
    """Rows a crash left invalid (an orphan result, a reused call id) are written to
    the fork repaired, as a load would; the original's rows stay as they are."""
    rows: list[Item] = [
        UserMessage("u"),
        ToolResult("ghost", "orphan"),
        ToolCall("k", "t"),
        ToolResult("k", "r"),
        ToolCall("k", "t"),
        AssistantMessage("a"),
    ]
    source = store.session("s")
    await source.add_items(rows)
    fork = await source.fork("f")
    store.opened.append(fork)
    forked = await fork.get_items()
    assert forked == [
        UserMessage("u"),
        ToolCall("k", "t"),
        ToolResult("k", "r"),
        AssistantMessage("a"),
    ]
    assert conversation_problems(forked) == []
    assert await stored_rows(source) == rows
