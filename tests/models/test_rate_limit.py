"""RateLimit (DESIGN §21): concurrency, requests and tokens per minute, shared by every
run using a model object; FIFO; a waiting request cancels at once; a 429 with
Retry-After pauses every sharer. Real providers on a loopback server; virtual time
(``autojump_clock``) so the waits are exact and instant."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support import chat_wire
from tests.support.model_streams import collect
from tests.support.sse_server import SSE, RecordedRequest, Reply, SSEServer
from trio_agents.models import OpenAIChatModel, RateLimit, ScriptedModel, TextDelta, Turn, Usage


class Arrivals:
    """Records when (virtual time) each request reached the server, and which run's."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.prompts: list[str] = []

    def __call__(self, request: RecordedRequest) -> Reply | None:
        self.times.append(trio.current_time())
        self.prompts.append(request.json["messages"][-1]["content"])
        return None  # the scripted reply


def _model(server: SSEServer, limit: RateLimit, **options: Any) -> OpenAIChatModel:
    return OpenAIChatModel(
        "gpt-test", base_url=f"{server.base_url}/v1", rate_limit=limit, **options
    )


async def test_200_concurrent_runs_never_exceed_the_limit_go_fifo_and_a_waiter_cancels_at_once(
    autojump_clock: trio.testing.MockClock, server: SSEServer
) -> None:
    runs = 200
    arrivals = Arrivals()
    server.validate = arrivals
    # Every answer takes exactly one (virtual) second before its headers.
    server.add(*[chat_wire.text_reply("ok", delay_before_headers=1.0) for _ in range(runs)])
    limit = RateLimit(concurrency=5)
    model = _model(server, limit)
    agent = ta.Agent(name="a", model=model)
    results: dict[int, ta.RunResult] = {}
    handles: dict[int, ta.Run] = {}

    async def one(index: int, task_status: trio.TaskStatus[None]) -> None:
        async with ta.open_run(agent, f"run {index}") as run:
            handles[index] = run
            task_status.started()
            results[index] = await run.wait()

    async with model, trio.open_nursery() as nursery:
        for index in range(runs):
            await nursery.start(one, index)
            # Each run reaches the limit's queue before the next starts: the order
            # they queue in is their index.
            await trio.testing.wait_all_tasks_blocked()
        assert limit.in_use == 5
        assert limit.waiting == runs - 5
        before = trio.current_time()
        handles[150].cancel("not needed")
        await trio.testing.wait_all_tasks_blocked()
        # The waiting run ended at once (no virtual time passed), before its turn.
        assert 150 in results
        assert trio.current_time() == before
    cancelled = results.pop(150)
    assert cancelled.status == "cancelled"
    assert cancelled.reason == "not needed"
    assert all(result.status == "completed" for result in results.values())
    # FIFO: the runs got their slots in the order they queued, 5 at a time, one batch
    # a second (within a batch the requests race to the server over 5 connections).
    expected = [f"run {index}" for index in range(runs) if index != 150]
    batches: dict[float, set[str]] = {}
    for at, prompt in zip(arrivals.times, arrivals.prompts, strict=True):
        batches.setdefault(at, set()).add(prompt)
    assert list(batches.values()) == [set(expected[i : i + 5]) for i in range(0, len(expected), 5)]
    # Never more than 5 at once: each request holds the server for exactly 1 s, so no
    # window of 1 s holds more than 5 arrivals, and the limit is used to the full.
    times = arrivals.times
    assert all(times[i + 5] - times[i] >= 1.0 for i in range(len(times) - 5))
    assert times[-1] - times[0] == pytest.approx((len(times) // 5) - 1 + (len(times) % 5 > 0))


async def test_requests_per_minute_spaces_requests(
    autojump_clock: trio.testing.MockClock, server: SSEServer
) -> None:
    arrivals = Arrivals()
    server.validate = arrivals
    server.add(*[chat_wire.text_reply("ok") for _ in range(6)])
    model = _model(server, RateLimit(requests_per_minute=30))  # one every 2 s
    async with model, trio.open_nursery() as nursery:
        for _ in range(6):
            nursery.start_soon(collect, model)
    start = arrivals.times[0]
    assert [round(t - start, 6) for t in arrivals.times] == [0, 2, 4, 6, 8, 10]


async def test_tokens_per_minute_counts_the_reported_usage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 600 tokens a minute is 10 a second. The first answer reports 200 tokens: the next
    # request waits until they are paid back (about 20 s, less the estimate taken).
    limit = RateLimit(tokens_per_minute=600)
    model = ScriptedModel(
        [Turn("a", usage=Usage(150, 50)), Turn("b", usage=Usage(1, 1))], rate_limit=limit
    )
    starts: list[float] = []
    for _ in range(2):
        async with model.stream(ta.ModelRequest("", (ta.UserMessage("hi"),))) as events:
            starts.append(trio.current_time())
            [event async for event in events]
    assert 18 < starts[1] - starts[0] <= 20.1


async def test_a_429_with_retry_after_pauses_every_request_sharing_the_limit(
    autojump_clock: trio.testing.MockClock, server: SSEServer
) -> None:
    arrivals = Arrivals()
    server.validate = arrivals
    limited = Reply.json(429, {"error": {"message": "slow down"}}, headers=[("retry-after", "30")])
    server.add(limited, chat_wire.text_reply("a"), chat_wire.text_reply("b"))
    limit = RateLimit(concurrency=10)
    # Two model objects, one limit: an account's limit shared by two models.
    first, second = _model(server, limit), _model(server, limit)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect, first)
        await server.wait_for_requests(1)
        await trio.testing.wait_all_tasks_blocked()
        paused_at = arrivals.times[0]
        nursery.start_soon(collect, second)
    # The second request waited out the first one's Retry-After, as did the retry.
    assert len(arrivals.times) == 3
    assert all(t - paused_at >= 30 for t in arrivals.times[1:])


async def test_a_request_waiting_out_a_pause_cancels_at_once(
    autojump_clock: trio.testing.MockClock, server: SSEServer
) -> None:
    limit = RateLimit(requests_per_minute=60)
    model = _model(server, limit)
    server.add(chat_wire.text_reply("ok"))
    limit_paused = trio.current_time()
    limit.pause(600)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, model)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
    assert trio.current_time() == limit_paused
    assert server.requests == []


def test_limits_are_checked() -> None:
    for bad in ({"requests_per_minute": 0}, {"tokens_per_minute": -1}, {"concurrency": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            RateLimit(**bad)
    with pytest.raises(ValueError, match="concurrency"):
        RateLimit(concurrency=True)
    with pytest.raises(TypeError, match="rate_limit"):
        OpenAIChatModel("m", rate_limit=5)  # type: ignore[arg-type]
    limit = RateLimit(requests_per_minute=60, concurrency=2)
    assert OpenAIChatModel("m", rate_limit=limit).rate_limit is limit
    assert "concurrency=2" in repr(limit)


def _answer(prompt_tokens: int, completion_tokens: int) -> Reply:
    return Reply(
        events=[
            SSE(chat_wire.chunk("", role="assistant")),
            SSE(chat_wire.chunk("ok")),
            SSE(chat_wire.chunk(finish="stop")),
            SSE(chat_wire.usage_chunk(prompt_tokens, completion_tokens)),
            chat_wire.DONE,
        ]
    )


async def test_tokens_per_minute_over_http_takes_the_reported_usage(
    autojump_clock: trio.testing.MockClock, server: SSEServer
) -> None:
    arrivals = Arrivals()
    server.validate = arrivals
    server.add(_answer(250, 50), _answer(1, 1))
    model = _model(server, RateLimit(tokens_per_minute=600))  # 10 tokens a second
    async with model:
        await collect(model)
        await collect(model)
    # The bucket holds 10 tokens (a second's worth). The first request took its
    # estimate (its body's size, more than 10) before it was sent; the 300 tokens it
    # reported replaced the estimate after: 290 in debt, and the second waits until
    # the bucket holds 10 again, 30 s. (Without the usage: under 4 s; with the usage
    # added to the estimate instead of replacing it: about 34 s.)
    assert len(server.requests[0].body) // 4 > 10
    assert arrivals.times[1] - arrivals.times[0] == pytest.approx(30)


async def test_each_retry_is_a_request_the_limit_counts(
    autojump_clock: trio.testing.MockClock, server: SSEServer
) -> None:
    arrivals = Arrivals()
    server.validate = arrivals
    server.add(Reply.json(503, {"error": {"message": "busy"}}), chat_wire.text_reply("ok"))
    model = _model(server, RateLimit(requests_per_minute=6), retry_base_delay=0.001)
    assert (await collect(model))[0] == TextDelta("ok")
    assert arrivals.times[1] - arrivals.times[0] == pytest.approx(10)


def test_a_limit_kept_across_trio_runs_forgets_the_last_runs_clock() -> None:
    limit = RateLimit(requests_per_minute=60)
    model = ScriptedModel([], default=Turn("ok"), rate_limit=limit)

    async def paused_far_ahead() -> None:
        await trio.sleep(10_000)
        limit.pause(600)

    async def one_request() -> float:
        start = trio.current_time()
        await collect(model)
        return trio.current_time() - start

    trio.run(paused_far_ahead, clock=trio.testing.MockClock(autojump_threshold=0))
    # A new run's clock starts again at 0: the old pause (at 10,600) is not waited for.
    waited = trio.run(one_request, clock=trio.testing.MockClock(autojump_threshold=0))
    assert waited == 0


async def test_a_retry_after_too_long_to_wait_pauses_sharers_no_longer_than_60_s(
    autojump_clock: trio.testing.MockClock, server: SSEServer
) -> None:
    arrivals = Arrivals()
    server.validate = arrivals
    hour = Reply.json(429, {"error": {"message": "quota"}}, headers=[("retry-after", "3600")])
    server.add(hour, chat_wire.text_reply("b"))
    limit = RateLimit(concurrency=10)
    first, second = _model(server, limit), _model(server, limit)
    # The first request gives up (a provider waits at most 60 s); the limit's other
    # request waits as long as a retry would have, not the hour.
    with pytest.raises(ta.ModelError, match="not waiting longer than 60 s"):
        await collect(first)
    assert (await collect(second))[0] == TextDelta("b")
    assert arrivals.times[1] - arrivals.times[0] == pytest.approx(60)
