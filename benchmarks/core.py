"""B1 (stream overhead) and B2 (tool turn): in-process runs on ``ScriptedModel``."""

from __future__ import annotations

import time
from collections.abc import Callable

import trio

import trio_agents as ta
from trio_agents.models import ModelRequest, ScriptedModel, TextDelta, Turn

from ._common import Baselines, Figure, median

__all__ = [
    "add",
    "channel_stream_cost",
    "floor_stream_cost",
    "model_stream_cost",
    "stream_fanout",
    "stream_overhead",
    "tool_turn",
    "tool_turn_agent",
]


async def model_stream_cost(deltas: int) -> float:
    """Seconds per delta for draining ``ScriptedModel.stream`` directly (no run)."""
    model = ScriptedModel([Turn(text=["x"] * deltas)])
    request = ModelRequest(instructions="", items=(ta.UserMessage("go"),), tools=(), settings={})
    start = time.perf_counter()
    async with model.stream(request) as stream:
        async for _ in stream:
            pass
    return (time.perf_counter() - start) / deltas


# W1's floor: what any run that publishes each delta as the public event to one
# per-event reader must pay, with nothing of the run's in it. The event is built as the
# run builds it (slot by slot, the cheapest way CPython has to make an attrs instance).
_new = object.__new__
_set_slots = tuple(
    ta.ResponseTextDelta.__dict__[name].__set__ for name in ("run_id", "seq", "turn", "text", "at")
)


def _bare_delta(seq: int, text: str) -> ta.ResponseTextDelta:
    event = _new(ta.ResponseTextDelta)
    set_run_id, set_seq, set_turn, set_text, set_at = _set_slots
    set_run_id(event, "floor")
    set_seq(event, seq)
    set_turn(event, 1)
    set_text(event, text)
    set_at(event, time.time())
    return event


class _BareLog:
    """A list of events and a parking lot: the least a log with readers can be."""

    __slots__ = ("closed", "events", "lot", "parked")

    def __init__(self) -> None:
        self.events: list[ta.ResponseTextDelta] = []
        self.lot = trio.lowlevel.ParkingLot()
        self.parked = 0
        self.closed = False


class _BareCursor:
    """Trio's receive protocol and nothing else (``MemoryReceiveChannel.receive``'s
    order): a cancel point, the take, then the schedule point."""

    __slots__ = ("_log", "_next")

    def __init__(self, log: _BareLog) -> None:
        self._log = log
        self._next = 0

    def __aiter__(self) -> _BareCursor:
        return self

    async def __anext__(self) -> ta.ResponseTextDelta:
        log = self._log
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            if self._next < len(log.events):
                event = log.events[self._next]
                self._next += 1
                await trio.lowlevel.cancel_shielded_checkpoint()
                return event
            if log.closed:
                raise StopAsyncIteration
            log.parked += 1
            try:
                await log.lot.park()
            finally:
                log.parked -= 1


def _turn(deltas: int) -> tuple[ScriptedModel, ModelRequest]:
    model = ScriptedModel([Turn(text=["x"] * deltas)])
    request = ModelRequest(instructions="", items=(ta.UserMessage("go"),), tools=(), settings={})
    return model, request


async def _bare_writer(deltas: int, log: _BareLog) -> None:
    model, request = _turn(deltas)
    seq = 0
    async with model.stream(request) as stream:
        async for event in stream:
            if type(event) is TextDelta:
                seq += 1
                log.events.append(_bare_delta(seq, event.text))
                if log.parked:
                    log.lot.unpark_all()
    log.closed = True
    log.lot.unpark_all()


async def _bare_gated_writer(
    deltas: int, log: _BareLog, check: Callable[[object, str], object]
) -> None:
    """:func:`_bare_writer` with a streaming guardrail's least work per delta: ``check``
    called with the text so far (kept whole, as the gate keeps it), the delta kept only
    if it returned False."""
    model, request = _turn(deltas)
    seq = 0
    checked = ""
    async with model.stream(request) as stream:
        async for event in stream:
            if type(event) is TextDelta:
                whole = checked + event.text
                if check(None, whole) is False:
                    checked = whole
                    seq += 1
                    log.events.append(_bare_delta(seq, event.text))
                    if log.parked:
                        log.lot.unpark_all()
    log.closed = True
    log.lot.unpark_all()


async def floor_stream_cost(
    deltas: int, check: Callable[[object, str], object] | None = None
) -> float:
    """W1's floor: seconds per delta for ``ScriptedModel`` drained by a bare writer that
    builds each delta's ``ResponseTextDelta`` into a list, beside one bare per-event
    reader (:class:`_BareCursor`). W1 minus this is what the run itself adds. With
    ``check``, the floor of W1 with a streaming guardrail (:func:`_bare_gated_writer`)."""
    log = _BareLog()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        if check is None:
            nursery.start_soon(_bare_writer, deltas, log)
        else:
            nursery.start_soon(_bare_gated_writer, deltas, log, check)
        async for _ in _BareCursor(log):
            pass
    return (time.perf_counter() - start) / deltas


async def _channel_writer(deltas: int, send: trio.MemorySendChannel[ta.ResponseTextDelta]) -> None:
    model, request = _turn(deltas)
    seq = 0
    async with send, model.stream(request) as stream:
        async for event in stream:
            if type(event) is TextDelta:
                seq += 1
                send.send_nowait(_bare_delta(seq, event.text))


async def channel_stream_cost(deltas: int) -> float:
    """The same as :func:`floor_stream_cost` through Trio's own unbounded memory channel
    (``send_nowait`` / ``async for``): what Trio's stock primitive costs for W1's shape."""
    send, receive = trio.open_memory_channel[ta.ResponseTextDelta](float("inf"))
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_channel_writer, deltas, send)
        async with receive:
            async for _ in receive:
                pass
    return (time.perf_counter() - start) / deltas


async def stream_overhead(deltas: int) -> float:
    """B1: seconds per streamed delta for one run with one ``events()`` subscriber."""
    model = ScriptedModel([Turn(text=["x"] * deltas)])
    agent = ta.Agent(name="b1", model=model)
    start = time.perf_counter()
    async with ta.open_run(agent, "go") as run:
        async for _ in run.events():
            pass
    return (time.perf_counter() - start) / deltas


async def _read_batches(run: ta.Run) -> int:
    """Read every event of ``run`` in ``batches()``; return how many."""
    count = 0
    async for batch in run.events().batches():
        count += len(batch)
    return count


async def _read_each(run: ta.Run) -> int:
    """Read every event of ``run`` one by one; return how many."""
    count = 0
    async for _ in run.events():
        count += 1
    return count


async def stream_fanout(
    deltas: int, subscribers: int, *, batches: bool = False
) -> tuple[float, int]:
    """B1 fan-out: wall seconds and events delivered, ``subscribers`` ``events()`` readers
    (reading ``batches()`` if ``batches``)."""
    model = ScriptedModel([Turn(text=["x"] * deltas)])
    agent = ta.Agent(name="b1", model=model)
    delivered = 0

    # The loops inline (not awaited through a helper): every coroutine frame between
    # the task and the cursor is paid again at each of its task steps.
    async def subscribe(run: ta.Run) -> None:
        nonlocal delivered
        count = 0
        if batches:
            async for batch in run.events().batches():
                count += len(batch)
        else:
            async for _ in run.events():
                count += 1
        delivered += count

    start = time.perf_counter()
    async with ta.open_run(agent, "go") as run, trio.open_nursery() as nursery:
        for _ in range(subscribers):
            nursery.start_soon(subscribe, run)
    return time.perf_counter() - start, delivered


def _http_model(base_url: str, deltas: int) -> ta.Model:
    from trio_agents.models._openai import OpenAIChatModel

    return OpenAIChatModel(f"text:{deltas}", base_url=base_url, api_key="x", max_retries=0)


async def http_stream_cost(base_url: str, deltas: int) -> None:
    """W1 over HTTP, the model's own cost: drain one response of ``deltas`` deltas."""
    model = _http_model(base_url, deltas)
    request = ModelRequest(instructions="", items=(ta.UserMessage("go"),), tools=(), settings={})
    async with model.stream(request) as stream:
        async for _ in stream:
            pass


async def http_stream_overhead(
    base_url: str, deltas: int, *, subscribers: int = 1, batches: bool = False
) -> None:
    """W1 over HTTP: one run whose response streams ``deltas`` deltas, read by
    ``subscribers`` readers of ``events()`` (of ``events().batches()`` if ``batches``)."""
    agent = ta.Agent(name="b1", model=_http_model(base_url, deltas))
    if subscribers == 1:
        # One reader: the body of the run's block, its loop inline (see stream_fanout).
        async with ta.open_run(agent, "go") as run:
            if batches:
                async for _ in run.events().batches():
                    pass
            else:
                async for _ in run.events():
                    pass
    else:
        read = _read_batches if batches else _read_each
        async with ta.open_run(agent, "go") as run, trio.open_nursery() as nursery:
            for _ in range(subscribers):
                nursery.start_soon(read, run)
    assert run.result is not None
    assert run.result.final_output == "x" * deltas, run.result


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def tool_turn_agent() -> ta.Agent:
    """B2's agent: a fresh script (a call to ``add``, then the answer ``"3"``)."""
    model = ScriptedModel([Turn(tool_calls=[("add", {"a": 1, "b": 2})]), "3"])
    return ta.Agent(name="b2", model=model, tools=[add])


async def tool_turn(runs: int) -> float:
    """B2: seconds per 2-turn run (a tool call to ``add``, then the answer)."""
    total = 0.0
    for _ in range(runs):
        agent = tool_turn_agent()
        start = time.perf_counter()
        result = await ta.run(agent, "1 + 2?")
        total += time.perf_counter() - start
        assert result.final_output == "3", result
    return total / runs


async def bench_b1(base: Baselines, *, deltas: int, subscribers: int, repeats: int) -> list[Figure]:
    model = median([await model_stream_cost(deltas) for _ in range(repeats)])
    per_delta = median([await stream_overhead(deltas) for _ in range(repeats)])
    overhead = per_delta - model
    fan = [await stream_fanout(deltas, subscribers) for _ in range(repeats)]
    wall = median([w for w, _ in fan])
    delivered = fan[0][1]
    per_event = (wall - model * deltas) / delivered
    return [
        Figure(
            "B1.model_own_cost_per_delta",
            model * 1e6,
            "us",
            note=f"draining ScriptedModel.stream directly, {deltas} deltas",
            extra=base.ratios(model),
        ),
        Figure(
            "B1.run_per_delta",
            per_delta * 1e6,
            "us",
            note="whole run, one events() subscriber (model cost included)",
            extra=base.ratios(per_delta),
        ),
        Figure(
            "B1.overhead_per_delta",
            overhead * 1e6,
            "us",
            target=0.5 * base.checkpoint * 1e6,  # W1: 0.5 checkpoint
            note="W1: run per delta minus the model's own cost (target 0.5 checkpoint)",
            extra=base.ratios(overhead),
        ),
        Figure(
            "B1.fanout_per_delivered_event",
            per_event * 1e6,
            "us",
            target=0.2 * base.checkpoint * 1e6,  # W1 fan-out: 0.2 checkpoint
            note=f"W1: {subscribers} events() subscribers, {delivered} deliveries;"
            " (wall - model cost) / deliveries (target 0.2 checkpoint)",
            extra={**base.ratios(per_event), "wall_ms": round(wall * 1e3, 2)},
        ),
    ]


async def bench_b2(base: Baselines, *, runs: int, repeats: int) -> list[Figure]:
    per_run = median([await tool_turn(runs) for _ in range(repeats)])
    return [
        Figure(
            "B2.tool_turn_per_run",
            per_run * 1e3,
            "ms",
            target=40 * base.checkpoint * 1e3,  # W2: 40 checkpoints
            note=f"W2: 2-turn run (tool call to async add, then the answer), {runs} sequential"
            " runs (target 40 checkpoints)",
            extra=base.ratios(per_run),
        )
    ]
