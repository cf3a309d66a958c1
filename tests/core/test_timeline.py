"""The run timeline (DESIGN §23): ``run.timeline()`` and ``ta.timeline(events)``, spans
for every model call, tool call and child run, derived from the event log alone; and
``record_requests``, the ``model.request`` events it keeps."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.core_trees import researcher, tool_turn
from tests.support.timeline_checks import span_problems
from trio_agents.models import ScriptedModel, Turn

pytestmark = pytest.mark.trio


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@ta.function_tool
async def wait_forever() -> str:
    """Never returns."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def _priced(input_tokens: int, output_tokens: int, cost: str) -> ta.Usage:
    return ta.Usage(input_tokens, output_tokens, "gpt-test", cost=Decimal(cost))


async def test_spans_of_a_run_with_a_tool_call() -> None:
    model = ScriptedModel(
        [
            Turn(tool_calls=[("add", {"a": 2, "b": 3})], usage=_priced(40, 5, "0.0010")),
            Turn("It is 5.", usage=_priced(50, 3, "0.0020")),
        ]
    )
    agent = ta.Agent(name="calc", model=model, tools=[add])
    async with ta.open_run(agent, "2+3?") as run:
        pass
    timeline = run.timeline()
    assert span_problems(timeline, closed=True) == []
    assert timeline.root_id == run.id
    kinds = [(s.kind, s.name, s.status) for s in timeline.spans]
    assert kinds == [
        ("run", "calc", "completed"),
        ("model", "gpt-test", "completed"),
        ("tool", "add", "ok"),
        ("model", "gpt-test", "completed"),
    ]
    _, first, tool, second = timeline.spans
    assert (first.turn, second.turn) == (1, 2)
    assert first.usage == _priced(40, 5, "0.0010")
    assert second.usage == _priced(50, 3, "0.0020")
    assert tool.call_id == "call_1_0"
    # In order: the first call ends before its tool starts, which ends before the next.
    assert first.end is not None
    assert tool.start is not None
    assert first.end <= tool.start
    assert tool.end is not None
    assert second.start is not None
    assert tool.end <= second.start
    # The run's usage is its calls', equal to the result's; the tree's total too.
    assert run.result is not None
    assert timeline.spans[0].usage == run.result.usage
    assert timeline.usage == _priced(90, 8, "0.0030")
    # The pure function over the events gives the same timeline (names aside: the
    # root's agent name is not in its events).
    events = [event async for event in run.events()]
    derived = ta.timeline(events, names={run.id: "calc"})
    assert derived == timeline
    # ... and over their JSON, as a face serves them.
    as_json = [json.loads(json.dumps(event.to_json())) for event in events]
    assert ta.timeline(as_json, names={run.id: "calc"}) == timeline
    assert json.loads(json.dumps(timeline.to_json()))["spans"][1]["usage"]["cost"] == "0.0010"


async def test_a_cancelled_tree_has_every_span_closed(autojump_clock: Any) -> None:
    # Cancelled while a child streams (mid-stream, a chunk out, the next due in 1000 s)
    # and while the root's other tool waits forever (mid-tool).
    streamer = researcher("streamer", Turn(["first words ", "never ", "sent"], delay=1000))
    root = ta.Agent(
        name="root",
        model=ScriptedModel([tool_turn(("streamer", {"input": "go"}), ("wait_forever", {}))]),
        tools=[streamer.as_tool(), wait_forever],
    )
    async with ta.open_run(root, "start") as run:
        streamed = started = False
        async for event in run.events(tree=True):
            streamed |= isinstance(event, ta.ResponseTextDelta) and event.run_id != run.id
            started |= isinstance(event, ta.ToolStarted) and event.name == "wait_forever"
            if streamed and started:
                live = run.timeline()
                assert span_problems(live, closed=False) == []
                running = {s.name for s in live.spans if s.end is None}
                # The child's call is unnamed until its usage (or, with
                # record_requests, its model.request) says which model it is.
                assert running == {"root", "streamer", "wait_forever", "model"}
                run.cancel("user pressed stop")
                break
    assert run.result is not None
    assert run.result.status == "cancelled"
    timeline = run.timeline()
    assert span_problems(timeline, closed=True) == []
    (child,) = run.children
    statuses = {(s.kind, s.name, s.run_id): s.status for s in timeline.spans}
    assert statuses == {
        ("run", "root", run.id): "cancelled",
        ("model", "ScriptedModel", run.id): "completed",
        ("tool", "streamer", run.id): "cancelled",
        ("tool", "wait_forever", run.id): "cancelled",
        ("run", "streamer", child.id): "cancelled",
        ("model", "model", child.id): "cancelled",
    }
    child_span = timeline.span(child.id)
    assert child_span.parent_id == f"{run.id}:tool:call_1_0"
    assert child_span.call_id == "call_1_0"
    assert [s.id for s in timeline.children(child.id)] == [f"{child.id}:model:1"]
    # A child's own timeline is its subtree, from the tree's shared stream.
    own = child.timeline()
    assert own.root_id == child.id
    assert [(s.kind, s.run_id) for s in own.spans] == [("run", child.id), ("model", child.id)]
    assert span_problems(own, closed=True) == []


async def test_a_run_cancelled_mid_stream_closes_its_model_span(autojump_clock: Any) -> None:
    agent = ta.Agent(name="talker", model=ScriptedModel([Turn(["a ", "b ", "c"], delay=1000)]))
    async with ta.open_run(agent, "talk") as run:
        async for event in run.events():
            if isinstance(event, ta.ResponseTextDelta):
                # Open while it streams.
                (_, call) = run.timeline().spans
                assert (call.kind, call.end, call.status) == ("model", None, "running")
                run.cancel("enough")
    (root, call) = run.timeline().spans
    assert (root.status, call.status) == ("cancelled", "cancelled")
    # It ends when its partial text was kept, before the run's terminal update.
    assert call.end is not None
    assert root.end is not None
    assert call.end <= root.end
    assert call.usage is None  # the stream was cut before it reported any


async def test_an_interrupted_call_and_the_next_one(autojump_clock: Any) -> None:
    agent = ta.Agent(
        name="talker",
        model=ScriptedModel([Turn(["one ", "two ", "three"], delay=1000), "after"]),
    )
    async with ta.open_run(agent, "talk") as run:
        async for event in run.events():
            if isinstance(event, ta.ResponseTextDelta):
                run.inject([{"role": "user", "content": "stop, say after"}], when="now")
                break
    assert run.result is not None
    assert run.result.status == "completed"
    timeline = run.timeline()
    assert span_problems(timeline, closed=True) == []
    calls = [(s.turn, s.status) for s in timeline.spans if s.kind == "model"]
    assert calls == [(1, "interrupted"), (2, "completed")]


async def test_record_requests_keeps_each_request_as_sent() -> None:
    model = ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])
    agent = ta.Agent(name="calc", instructions="Add.", model=model, tools=[add])
    async with ta.open_run(agent, "1+2?", record_requests=True) as run:
        pass
    recorded = [e async for e in run.events() if isinstance(e, ta.ModelRequestEvent)]
    assert [e.turn for e in recorded] == [1, 2]
    # Exactly what the model was sent, and its size.
    assert [e.request for e in recorded] == list(model.requests)
    for event in recorded:
        assert event.request is not None
        assert event.omitted is None
        assert event.size == len(json.dumps(event.request.to_json()).encode())
        assert event.model == "ScriptedModel"
        assert ta.ModelRequestEvent.from_json(json.loads(json.dumps(event.to_json()))) == event
    # With the request recorded, the call starts at it.
    timeline = run.timeline()
    starts = [s.start for s in timeline.spans if s.kind == "model"]
    assert starts == [e.at for e in recorded]


async def test_without_the_option_nothing_is_recorded() -> None:
    agent = ta.Agent(name="a", model=ScriptedModel(["hi"]))
    async with ta.open_run(agent, "hello") as run:
        pass
    assert not [e async for e in run.events() if e.type == "model.request"]


async def test_a_request_over_the_bound_is_recorded_as_too_large() -> None:
    agent = ta.Agent(name="a", model=ScriptedModel(["short", "short"]))
    async with ta.open_run(
        agent, "x" * 500, record_requests=True, record_requests_max_bytes=300
    ) as run:
        pass
    (event,) = [e async for e in run.events() if isinstance(e, ta.ModelRequestEvent)]
    assert event.request is None
    assert event.omitted == "too large"
    assert event.size > 500
    assert event.to_json()["request"] is None
    with pytest.raises(ValueError, match="not recorded \\(too large"):
        await ta.replay(event, model=ScriptedModel(["again"]))


async def test_a_request_with_a_setting_that_is_no_json_is_recorded_as_omitted() -> None:
    agent = ta.Agent(name="a", model=ScriptedModel(["hi"]), model_settings={"seed": object()})
    async with ta.open_run(agent, "hello", record_requests=True) as run:
        pass
    assert run.result is not None
    assert run.result.status == "completed"
    (event,) = [e async for e in run.events() if isinstance(e, ta.ModelRequestEvent)]
    assert event.request is None
    assert event.omitted is not None
    assert event.omitted.startswith("not JSON")
    json.dumps(event.to_json())  # the event itself always encodes


async def test_children_inherit_record_requests() -> None:
    child = researcher("helper", "42")
    root = ta.Agent(
        name="root",
        model=ScriptedModel([tool_turn(("helper", {"input": "q"})), "done"]),
        tools=[child.as_tool()],
    )
    async with ta.open_run(root, "go", record_requests=True) as run:
        tree = [e async for e in run.events(tree=True)]
    (kid,) = run.children
    recorded = [(e.run_id, e.turn) for e in tree if isinstance(e, ta.ModelRequestEvent)]
    assert recorded == [(run.id, 1), (kid.id, 1), (run.id, 2)]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"record_requests": "yes"}, TypeError),
        ({"record_requests_max_bytes": 0}, ValueError),
        ({"record_requests_max_bytes": 1.5}, TypeError),
    ],
)
async def test_bad_record_options_are_refused(options: dict[str, Any], error: type) -> None:
    agent = ta.Agent(name="a", model=ScriptedModel(["hi"]))
    with pytest.raises(error):
        await ta.run(agent, "hello", **options)


async def test_replay_refuses_what_is_no_request() -> None:
    with pytest.raises(ValueError, match="model request"):
        await ta.replay({"instructions": 3, "items": []}, model=ScriptedModel(["x"]))
    with pytest.raises(TypeError, match="model must be"):
        await ta.replay(ta.ModelRequest("", ()), model=42)  # type: ignore[arg-type]


async def test_timeline_of_no_events_and_of_bad_events() -> None:
    empty = ta.timeline([])
    assert (empty.root_id, empty.spans, empty.usage) == (None, (), None)
    with pytest.raises(ValueError, match="unknown event type"):
        ta.timeline([{"type": "no.such"}])


@pytest.mark.parametrize(
    "usage",
    [
        {"input_tokens": -1, "output_tokens": 0},
        {"input_tokens": 1.5, "output_tokens": 0},
        {"input_tokens": 1, "output_tokens": 0, "cost": 0.1},
        {"input_tokens": 1, "output_tokens": 0, "cost": "NaN"},
        {"input_tokens": 1, "output_tokens": 0, "cost": "-1"},
        {"input_tokens": 1, "output_tokens": 0, "cost": "lots"},
        {"input_tokens": 1, "output_tokens": 0, "model": 7},
    ],
)
async def test_a_run_item_with_a_malformed_usage_is_refused(usage: dict[str, Any]) -> None:
    # What a peer or a store hands back is checked as a model's usage is: a timeline
    # never sums a float cost or a negative count.
    event = {
        "type": "run.item",
        "run_id": "r",
        "seq": 3,
        "turn": 1,
        "item": {"type": "message", "role": "assistant", "content": "hi"},
        "usage": usage,
        "at": 1.0,
    }
    with pytest.raises(ValueError, match=r"malformed run\.item event: usage"):
        ta.timeline([event])
