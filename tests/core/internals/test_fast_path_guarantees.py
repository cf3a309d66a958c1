"""What the issue-18 cost cuts must keep: the same objects, values and guarantees as
the slower code they replace (their costs are measured in benchmarks/, never here)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import hypothesis
import pytest
import trio
import trio.testing
from hypothesis import strategies as st

import trio_agents as ta
from trio_agents import ResponseTextDelta
from trio_agents._events import EVENT_TYPES
from trio_agents._log import EventCursor, EventLog
from trio_agents._run import _uuid4_hex
from trio_agents._turns import model_turn
from trio_agents.models import (
    FINAL_ANSWER_TOOL,
    Finish,
    ModelRequest,
    ScriptedModel,
    ToolCallDone,
    ToolSpec,
    Turn,
    Usage,
)


def test_append_text_builds_the_same_event_as_the_class() -> None:
    log = EventLog("run_1", retention=8, start_seq=7)
    before = time.time()
    log.append_text(2, "hi")
    fast = log.get(7)
    # The fast path stamps the time as the class's factory does (DESIGN §23).
    assert before <= fast.at <= time.time()
    slow = ResponseTextDelta(run_id="run_1", seq=7, turn=2, text="hi", at=fast.at)
    assert type(fast) is ResponseTextDelta
    assert fast == slow
    assert hash(fast) == hash(slow)
    assert repr(fast) == repr(slow)
    assert fast.to_json() == slow.to_json()
    assert ResponseTextDelta.from_json(fast.to_json()) == fast
    assert log.next_seq == 8


def test_append_text_is_append_for_readers_feeds_and_a_closed_log() -> None:
    # Past the first buffer (it grows), into a tree's feed, and refused once closed.
    fed: list[object] = []

    class Feed:
        def add(self, event: object) -> None:
            fed.append(event)

        def wake(self) -> None:
            pass

    log = EventLog("run_1", retention=64)
    log.feed = Feed()
    for i in range(20):
        log.append_text(1, str(i))
    texts = [event.text for event in log.retained() if isinstance(event, ResponseTextDelta)]
    assert texts == [str(i) for i in range(20)]
    assert fed == log.retained()
    log.close()
    with pytest.raises(RuntimeError, match="closed"):
        log.append_text(1, "late")


async def test_append_text_wakes_a_parked_reader() -> None:
    log = EventLog("run_1", retention=8)
    got: list[ta.RunEvent] = []

    async def read() -> None:
        async for event in EventCursor(log, None):
            got.append(event)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        log.append_text(1, "a")
        await trio.testing.wait_all_tasks_blocked()
        assert [(type(event), event.seq) for event in got] == [(ResponseTextDelta, 1)]
        log.close()


def test_events_are_slotted() -> None:
    # No per-event instance dict (the base class declares empty slots).
    for cls in EVENT_TYPES.values():
        assert "__dict__" not in dir(cls), cls


def test_generated_run_ids_are_uuid4() -> None:
    seen = set()
    for _ in range(200):
        hexed = _uuid4_hex()
        parsed = uuid.UUID(hex=hexed)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert parsed.hex == hexed
        seen.add(hexed)
    assert len(seen) == 200


def _expected_tokens(request: ModelRequest) -> int:
    chars = len(request.instructions)
    for item in request.items:
        assert isinstance(item, ta.UserMessage)
        chars += len(item.content)
    for spec in request.tools:
        chars += len(spec.name) + len(spec.description)
        chars += len(json.dumps(spec.parameters, sort_keys=True, default=str))
    return max(1, -(-chars // 4))


async def test_usage_estimate_counts_each_requests_own_tools(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The model caches the size of the last request's tool specs (the same tuple every
    # turn of a run); another tuple, even of equal length, is measured again.
    small = (ToolSpec("a", "x", {"type": "object"}),)
    large = (ToolSpec("a", "x", {"type": "object", "properties": {"n": {"type": "integer"}}}),)
    model = ScriptedModel(["one", "two", "three"])
    for tools in (small, small, large):
        request = ModelRequest(instructions="i", items=(ta.UserMessage("hello"),), tools=tools)
        async with model.stream(request) as stream:
            usage = [e async for e in stream if isinstance(e, Usage)]
        assert usage[0].input_tokens == _expected_tokens(request)
    assert _expected_tokens(
        ModelRequest(instructions="i", items=(ta.UserMessage("hello"),), tools=large)
    ) != _expected_tokens(
        ModelRequest(instructions="i", items=(ta.UserMessage("hello"),), tools=small)
    )


async def test_streamed_run_events_are_unchanged(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([Turn(text=["a", "b"])])
    agent = ta.Agent(name="t", model=model)
    async with ta.open_run(agent, "go") as run:
        events = [event async for event in run.events()]
    deltas = [e for e in events if isinstance(e, ResponseTextDelta)]
    assert [(d.text, d.turn) for d in deltas] == [("a", 1), ("b", 1)]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert all(d.run_id == run.id for d in deltas)


@ta.function_tool
async def _add(a: int, b: int) -> int:
    """Add."""
    return a + b


async def test_a_plain_run_makes_none_of_its_on_demand_parts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # No session, hooks, approvals or parallel calls: the write lock, the span dict, the
    # approvals dict and the tool limiter are never made, and the state has no dict.
    model = ScriptedModel([Turn(tool_calls=[("_add", {"a": 1, "b": 2})]), "3"])
    agent = ta.Agent(name="t", model=model, tools=[_add])
    async with ta.open_run(agent, "go") as run:
        await run.wait()
    state = run._state
    assert run.result is not None
    assert run.result.final_output == "3"
    assert not hasattr(state, "__dict__")
    assert state._write_lock is None
    assert state._limiter is None
    assert state.spans._open is None
    assert run._approvals._pending is None
    assert run._lock is run._inbox.lock


async def test_approvals_and_cancel_share_the_inbox_lock_without_deadlock(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gated = ta.function_tool(_add.fn, name="gated", needs_approval=True)
    model = ScriptedModel([Turn(tool_calls=[("gated", {"a": 1, "b": 2})]), "3"])
    agent = ta.Agent(name="t", model=model, tools=[gated])
    async with ta.open_run(agent, "go") as run:
        async for update in run.updated:
            if update.status == "awaiting_approval":
                assert run.statistics().pending_approvals == ("call_1_0",)
                run.approve("call_1_0")
        result = await run.wait()
    assert result.final_output == "3"
    assert run.statistics().pending_approvals == ()


@attrs.define(eq=False)
class _MeddlingModel:
    """A model that tries to change what its request says about the tools and the
    output, then answers as the final-answer tool; records what each request said."""

    seen: list[tuple[str, str, str]] = attrs.field(factory=list)
    refused: list[str] = attrs.field(factory=list)

    @contextlib.asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[Any]]:
        add_spec = next(spec for spec in request.tools if spec.name == "_add")
        answer_spec = next(spec for spec in request.tools if spec.name == FINAL_ANSWER_TOOL)
        assert request.output is not None
        self.seen.append(
            (
                add_spec.parameters["properties"]["a"]["type"],
                answer_spec.parameters["properties"]["n"]["type"],
                request.output.schema["properties"]["n"]["type"],
            )
        )
        # Typed Mapping: what a careless model might do anyway.
        tool: Any = add_spec.parameters
        answer: Any = answer_spec.parameters
        output: Any = request.output.schema
        changes: dict[str, Callable[[], object]] = {
            "tool": lambda: tool["properties"]["a"].update(type="string"),
            "answer tool": lambda: answer["required"].clear(),
            "output": lambda: output["properties"].pop("n"),
        }
        for name, change in changes.items():
            try:
                change()
            except TypeError:
                self.refused.append(name)

        async def events() -> AsyncIterator[Any]:
            call = ta.ToolCall(f"call_{len(self.seen)}", FINAL_ANSWER_TOOL, '{"n": 3}')
            yield ToolCallDone(call)
            yield Finish("tool_calls")

        yield events()


@attrs.frozen
class _Answer:
    n: int


async def test_no_run_can_change_the_schemas_other_runs_are_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The tool and output schemas are shared by every run (no per-run copy): a model
    # (or anyone holding a request) that tries to change them is refused, and the next
    # run is told the same as the first.
    model = _MeddlingModel()
    agent = ta.Agent(name="t", model=model, tools=[_add], output_type=_Answer)
    for _ in range(2):
        result = await ta.run(agent, "go")
        assert result.final_output == _Answer(3)
    assert model.seen == [("integer", "integer", "integer")] * 2
    assert model.refused == ["tool", "answer tool", "output"] * 2
    assert _add.parameters["properties"]["a"]["type"] == "integer"


async def test_a_running_tool_call_holds_few_frames_and_no_cancel_event(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # While a tool runs, the run's task is: the entry point, the run's task function,
    # the turn loop, the call, the tool (no frames in between); and an async tool that
    # never reads ctx.cancelled has no threading.Event.
    release = trio.Event()
    contexts: list[ta.ToolContext] = []

    @ta.function_tool
    async def held(ctx: ta.ToolContext) -> str:
        """Wait until released."""
        contexts.append(ctx)
        await release.wait()
        return "done"

    model = ScriptedModel([Turn(tool_calls=[("held", {})]), "ok"])
    agent = ta.Agent(name="t", model=model, tools=[held])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ta.run, agent, "go", name="the run")
        await trio.testing.wait_all_tasks_blocked()
        (task,) = [t for t in nursery.child_tasks if t.name == "the run"]
        names = []
        coro: Any = task.coro
        while coro is not None and hasattr(coro, "cr_code"):
            names.append(coro.cr_code.co_qualname)
            coro = coro.cr_await
        assert names[:5] == [
            "run",
            "Run._serve",
            "drive",
            "_invoke",
            "test_a_running_tool_call_holds_few_frames_and_no_cancel_event.<locals>.held",
        ]
        assert contexts[0]._event is None
        release.set()
    assert contexts[0]._event is None


def _count_stream_scopes() -> tuple[list[int], Callable[[], None]]:
    """Count the cancel scopes the turn engine's model_turn enters (a profile hook on
    this thread); returns the count (a one-element list) and a function to stop."""
    count = [0]
    enter = trio.CancelScope.__enter__.__code__
    turn = model_turn.__code__

    def profile(frame: Any, event: str, _arg: object) -> None:
        if event == "call" and frame.f_code is enter and frame.f_back.f_code is turn:
            count[0] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    return count, lambda: sys.setprofile(previous)


async def test_only_a_run_an_injection_can_reach_has_a_stream_scope(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # ta.run() without hooks: nobody holds the handle, nothing can inject(when="now"),
    # so its turns open no stream scope. Whoever holds a handle gets one per turn.
    agent = ta.Agent(
        name="t",
        model=ScriptedModel([Turn(tool_calls=[("_add", {"a": 1, "b": 2})]), "3"]),
        tools=[_add],
    )
    count, stop = _count_stream_scopes()
    try:
        result = await ta.run(agent, "go")
        assert result.final_output == "3"
        assert count == [0]
        agent = attrs.evolve(
            agent, model=ScriptedModel([Turn(tool_calls=[("_add", {"a": 1, "b": 2})]), "3"])
        )
        async with ta.open_run(agent, "go") as run:
            pass
        assert run.result is not None
        assert run.result.final_output == "3"
        assert count == [2]
    finally:
        stop()


class _InjectNowAtModelStart(ta.RunHooks):
    async def on_model_start(self, run: ta.Run, turn: int, request: ModelRequest) -> None:
        if turn == 1:
            run.inject("actually, this", when="now")


async def test_run_with_hooks_keeps_its_stream_scope_for_inject_now(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # ta.run() hands its handle to hooks, which may inject(when="now") while the model
    # call is being opened: that call is stopped before its stream opens (issue 29
    # item 10), and the only request made carries the injection (without the scope,
    # the first request would be answered without it).
    model = ScriptedModel(["the answer"])
    result = await ta.run(ta.Agent(name="t", model=model), "go", hooks=_InjectNowAtModelStart())
    assert result.final_output == "the answer"
    assert model.calls == 1
    assert model.requests[-1].items == (ta.UserMessage("go"), ta.UserMessage("actually, this"))


@hypothesis.settings(max_examples=200, deadline=None, derandomize=True)
@hypothesis.given(
    start=st.integers(1, 6),
    retention=st.integers(1, 9),
    reads=st.lists(st.tuples(st.integers(0, 12), st.integers(0, 3)), max_size=6),
    from_seq=st.one_of(st.none(), st.integers(0, 20)),
)
def test_a_cursor_reads_what_first_seq_and_get_say(
    start: int, retention: int, reads: list[tuple[int, int]], from_seq: int | None
) -> None:
    # The cursor's inline take against the log's own first_seq and get(): appends and
    # reads interleaved (each pair: append this many deltas, then read this many
    # events), from any position, past retention, on a resumed run's seqs.
    log = EventLog("run_1", retention=retention, start_seq=start)
    cursor = EventCursor(log, from_seq)
    position = log.first_seq if from_seq is None else max(from_seq, 1)

    def expected() -> ta.RunEvent:
        nonlocal position
        first = log.first_seq
        if position < first:
            missing, position = position, first
            return ta.EventsDropped(
                run_id="run_1", seq=first - 1, first_missing_seq=missing, count=first - missing
            )
        event = log.get(position)
        position += 1
        return event

    def ready() -> int:
        # What a read finds without waiting: a marker if the position fell out of
        # retention, then every retained event from there.
        first = log.first_seq
        return (position < first) + max(0, log.next_seq - max(position, first))

    async def main() -> None:
        for appends, count in reads:
            for _ in range(appends):
                log.append_text(1, "x")
            for _ in range(min(count, ready())):
                assert await anext(cursor) == expected()
        log.close()
        rest = [event async for event in cursor]
        want = []
        while position < log.next_seq:
            want.append(expected())
        assert rest == want

    trio.run(main)
