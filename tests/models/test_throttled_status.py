"""A run shows that its model request waits for the model's ``RateLimit`` (DESIGN §21):
a ``running`` update with ``detail={"throttled": "rate limit"}`` while it waits, one
without it once the request goes out, and nothing when it did not wait. Virtual time
(``autojump_clock``); the HTTP provider against a loopback server."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio
import trio.testing

import trio_agents as ta
from tests.support import chat_wire
from tests.support.helpers import collect
from tests.support.sse_server import Reply, SSEServer
from trio_agents.models import OpenAIChatModel, RateLimit, ScriptedModel, Turn
from trio_agents.testing import check_events

THROTTLED = {"throttled": "rate limit"}


def _updates(events: Sequence[ta.RunEvent]) -> list[tuple[str, dict[str, Any]]]:
    return [(e.status.value, dict(e.detail)) for e in events if isinstance(e, ta.RunUpdated)]


def _checked(run: ta.Run, events: list[ta.RunEvent]) -> list[ta.RunEvent]:
    assert run.result is not None
    check_events(run.result, events).raise_for_violations()
    return events


async def _two_runs(model: Any) -> tuple[list[ta.RunEvent], list[ta.RunEvent]]:
    """Two runs of one model: the first takes the limit's one slot, the second waits."""
    agent = ta.Agent(name="a", model=model)
    async with ta.open_run(agent, "first") as first:
        await trio.testing.wait_all_tasks_blocked()
        async with ta.open_run(agent, "second") as second:
            events = _checked(second, await collect(second))
        first_events = _checked(first, await collect(first))
    return first_events, events


async def test_a_run_waiting_for_a_concurrency_slot_shows_throttled_then_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limit = RateLimit(concurrency=1)
    model = ScriptedModel([Turn("one", delay=5.0), Turn("two")], rate_limit=limit)
    first, second = await _two_runs(model)
    # The first did not wait: no throttled update at all.
    assert _updates(first) == [("queued", {}), ("running", {}), ("completed", {})]
    assert _updates(second) == [
        ("queued", {}),
        ("running", {}),
        ("running", THROTTLED),
        ("running", {}),
        ("completed", {}),
    ]
    # Then the answer: its text comes after the update that ends the wait.
    order = [_label(e) for e in second if _label(e)]
    assert order == ["queued", "running", "throttled", "running", "two", "completed"]


def _label(event: ta.RunEvent) -> str | None:
    if isinstance(event, ta.RunUpdated):
        return "throttled" if event.detail == THROTTLED else event.status.value
    if isinstance(event, ta.ResponseTextDelta):
        return event.text
    return None


async def test_cancelling_a_throttled_run_ends_it_at_once_with_no_request_made(
    autojump_clock: trio.testing.MockClock, server: SSEServer
) -> None:
    server.add(chat_wire.text_reply("one", delay_before_headers=10.0))
    limit = RateLimit(concurrency=1)
    model = OpenAIChatModel("gpt-test", base_url=f"{server.base_url}/v1", rate_limit=limit)
    agent = ta.Agent(name="a", model=model)
    async with model, ta.open_run(agent, "first") as first:
        await server.wait_for_requests(1)
        async with ta.open_run(agent, "second") as second:
            await trio.testing.wait_all_tasks_blocked()
            assert second.status == "running"
            assert limit.waiting == 1
            before = trio.current_time()
            second.cancel("not needed")
            result = await second.wait()
            assert trio.current_time() == before  # at once
        events = _checked(second, await collect(second))
        assert (result.status, result.reason) == ("cancelled", "not needed")
        assert _updates(events) == [
            ("queued", {}),
            ("running", {}),
            ("running", THROTTLED),
            ("cancelled", {}),
        ]
        assert len(server.requests) == 1  # only the first run's
        assert (await first.wait()).status == "completed"


async def test_a_429_retry_after_pause_shows_throttled_then_running(
    autojump_clock: trio.testing.MockClock, server: SSEServer
) -> None:
    limited = Reply.json(429, {"error": {"message": "slow down"}}, headers=[("retry-after", "30")])
    server.add(limited, chat_wire.text_reply("ok"))
    model = OpenAIChatModel(
        "gpt-test", base_url=f"{server.base_url}/v1", rate_limit=RateLimit(concurrency=4)
    )
    agent = ta.Agent(name="a", model=model)
    async with model, ta.open_run(agent, "hi") as run:
        events = _checked(run, await collect(run))
    assert _updates(events) == [
        ("queued", {}),
        ("running", {}),
        ("running", THROTTLED),
        ("running", {}),
        ("completed", {}),
    ]
    assert len(server.requests) == 2
    assert run.result is not None
    assert run.result.final_output == "ok"


async def test_an_http_request_waiting_for_its_slot_shows_throttled(
    autojump_clock: trio.testing.MockClock, server: SSEServer
) -> None:
    server.add(chat_wire.text_reply("one", delay_before_headers=3.0), chat_wire.text_reply("two"))
    model = OpenAIChatModel(
        "gpt-test", base_url=f"{server.base_url}/v1", rate_limit=RateLimit(concurrency=1)
    )
    async with model:
        first, second = await _two_runs(model)
    assert ("running", THROTTLED) not in _updates(first)
    assert _updates(second) == [
        ("queued", {}),
        ("running", {}),
        ("running", THROTTLED),
        ("running", {}),
        ("completed", {}),
    ]


async def test_a_model_request_that_does_not_wait_shows_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(
        [Turn("a"), Turn("b")], rate_limit=RateLimit(requests_per_minute=60, concurrency=1)
    )
    agent = ta.Agent(name="a", model=model)
    for prompt in ("one", "two"):
        async with ta.open_run(agent, prompt) as run:
            await trio.sleep(1.0)  # the request bucket refills: the next never waits
            events = _checked(run, await collect(run))
        assert _updates(events) == [("queued", {}), ("running", {}), ("completed", {})]
