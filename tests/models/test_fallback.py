"""FallbackModel (DESIGN §21): the next model answers a request the previous one failed
retryably before its first output; after output began, or for an error that blames the
request, nothing falls back. Real providers on real loopback servers speaking their
wire formats (tests/support/sse_server.py), driven through whole runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support import anthropic_wire, chat_wire
from tests.support.model_streams import collect
from tests.support.sse_server import SSE, Reply, SSEServer, unused_port
from trio_agents import AssistantMessage, ModelError
from trio_agents.models import (
    AnthropicModel,
    FallbackError,
    FallbackModel,
    OpenAIChatModel,
    ScriptedModel,
    TextDelta,
    Turn,
    Usage,
)

ANTHROPIC_OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}


def _chat_error(message: str) -> dict[str, Any]:
    return {"error": {"message": message}}


@pytest.fixture
async def start_server(nursery: trio.Nursery) -> Callable[..., Any]:
    """Start one more loopback server (the ``server`` fixture is the first)."""

    async def start(*replies: Reply) -> SSEServer:
        server = SSEServer()
        server.add(*replies)
        await nursery.start(server.serve)
        return server

    return start


def _anthropic(server: SSEServer, name: str, **options: Any) -> AnthropicModel:
    options.setdefault("retry_base_delay", 0.01)
    return AnthropicModel(name, base_url=server.base_url, **options)


def _chat(server: SSEServer, name: str, **options: Any) -> OpenAIChatModel:
    options.setdefault("retry_base_delay", 0.01)
    return OpenAIChatModel(name, base_url=f"{server.base_url}/v1", **options)


async def test_a_529_after_the_providers_retries_goes_to_the_fallback(
    server: SSEServer, start_server: Callable[..., Any]
) -> None:
    overloaded = Reply.json(529, ANTHROPIC_OVERLOADED)
    server.add(overloaded, overloaded)
    backup = await start_server(anthropic_wire.text_reply("from ", "backup"))
    model = FallbackModel(
        _anthropic(server, "claude-primary", max_retries=1), _anthropic(backup, "claude-backup")
    )
    with trio.fail_after(10):
        result = await ta.run(ta.Agent(name="a", model=model), "hi")
    assert result.status == "completed", result.reason
    assert result.final_output == "from backup"
    assert len(server.requests) == 2  # the primary's own retry came first
    assert len(backup.requests) == 1
    assert backup.requests[0].json["messages"] == server.requests[0].json["messages"]
    # Which model answered is recorded with the usage it reported.
    assert result.usage == Usage(25, 12, model="claude-backup")


async def test_a_503_goes_to_a_fallback_given_as_a_spec_string(
    server: SSEServer, start_server: Callable[..., Any]
) -> None:
    server.add(Reply.json(503, _chat_error("unavailable")))
    backup = await start_server(chat_wire.text_reply("ok"))
    spec = f"openai:gpt-backup@{backup.base_url}/v1"
    model = FallbackModel(_chat(server, "gpt-primary", max_retries=0), spec)
    assert model.names == ("gpt-primary", spec)
    with trio.fail_after(10):
        result = await ta.run(ta.Agent(name="a", model=model), "hi")
    assert result.status == "completed", result.reason
    assert result.final_output == "ok"
    assert [len(server.requests), len(backup.requests)] == [1, 1]
    assert backup.requests[0].json["model"] == "gpt-backup"
    assert result.usage is not None
    assert result.usage.model == spec


async def test_output_begun_then_a_dropped_connection_does_not_fall_back(
    server: SSEServer, start_server: Callable[..., Any]
) -> None:
    # The role chunk and "Hel" and "lo" arrive, then the connection drops.
    server.add(chat_wire.text_reply("Hel", "lo", " world", drop_after=3))
    backup = await start_server(chat_wire.text_reply("never"))
    model = FallbackModel(_chat(server, "gpt-primary"), _chat(backup, "gpt-backup"))
    with trio.fail_after(10):
        result = await ta.run(ta.Agent(name="a", model=model), "hi")
    assert result.status == "failed"
    assert result.reason is not None
    assert "stream ended early" in result.reason
    assert not isinstance(result.error, FallbackError)
    assert result.new_items[-1] == AssistantMessage("Hello", status="incomplete")
    assert backup.requests == []


async def test_a_400_does_not_fall_back(
    server: SSEServer, start_server: Callable[..., Any]
) -> None:
    server.add(Reply.json(400, _chat_error("messages: bad role")))
    backup = await start_server(chat_wire.text_reply("never"))
    model = FallbackModel(_chat(server, "gpt-primary"), _chat(backup, "gpt-backup"))
    with trio.fail_after(10):
        result = await ta.run(ta.Agent(name="a", model=model), "hi")
    assert result.status == "failed"
    assert result.reason is not None
    assert "bad role" in result.reason
    assert isinstance(result.error, ModelError)
    assert result.error.status_code == 400
    assert not isinstance(result.error, FallbackError)
    assert backup.requests == []


async def test_on_selects_what_falls_back(
    server: SSEServer, start_server: Callable[..., Any]
) -> None:
    server.add(Reply.json(400, _chat_error("this model has no tools")))
    backup = await start_server(chat_wire.text_reply("ok"))
    model = FallbackModel(
        _chat(server, "gpt-primary"),
        _chat(backup, "gpt-backup"),
        on=lambda error: isinstance(error, ModelError) and error.status_code in (400, 429),
    )
    with trio.fail_after(10):
        assert (await collect(model))[0] == TextDelta("ok")


async def test_when_every_model_fails_one_error_names_each_failure(
    server: SSEServer, start_server: Callable[..., Any]
) -> None:
    server.add(Reply.json(503, _chat_error("primary is down")))
    backup = await start_server(Reply.json(529, ANTHROPIC_OVERLOADED))
    refused = OpenAIChatModel(
        "gpt-nowhere", base_url=f"http://127.0.0.1:{unused_port()}/v1", max_retries=0
    )
    model = FallbackModel(
        _chat(server, "gpt-primary", max_retries=0),
        _anthropic(backup, "claude-backup", max_retries=0),
        refused,
    )
    with trio.fail_after(10):
        result = await ta.run(ta.Agent(name="a", model=model), "hi")
    assert result.status == "failed"
    error = result.error
    assert isinstance(error, FallbackError)
    assert [name for name, _ in error.failures] == ["gpt-primary", "claude-backup", "gpt-nowhere"]
    statuses = [getattr(failure, "status_code", None) for _, failure in error.failures]
    assert statuses == [503, 529, None]
    assert error.retryable
    assert result.reason is not None
    for part in ("all 3 models failed", "primary is down", "busy", "request failed"):
        assert part in result.reason


async def test_a_failure_on_the_fallback_that_does_not_fall_back_lists_both(
    server: SSEServer, start_server: Callable[..., Any]
) -> None:
    server.add(Reply.json(503, _chat_error("primary is down")))
    backup = await start_server(Reply.json(401, _chat_error("invalid api key")))
    third = await start_server(chat_wire.text_reply("never"))
    model = FallbackModel(
        _chat(server, "gpt-primary", max_retries=0),
        _chat(backup, "gpt-backup"),
        _chat(third, "gpt-third"),
    )
    with trio.fail_after(10), pytest.raises(FallbackError) as caught:
        await collect(model)
    assert [name for name, _ in caught.value.failures] == ["gpt-primary", "gpt-backup"]
    assert caught.value.status_code == 401
    assert not caught.value.retryable
    assert third.requests == []


async def test_cancel_while_the_fallback_streams_closes_it_and_starts_no_third(
    server: SSEServer, start_server: Callable[..., Any]
) -> None:
    server.add(Reply.json(503, _chat_error("primary is down")))
    backup = await start_server(Reply(events=[SSE(chat_wire.chunk("Part"))], end="hold"))
    third = await start_server(chat_wire.text_reply("never"))
    model = FallbackModel(
        _chat(server, "gpt-primary", max_retries=0),
        _chat(backup, "gpt-backup"),
        _chat(third, "gpt-third"),
    )
    with trio.fail_after(10):
        async with ta.open_run(ta.Agent(name="a", model=model), "hi") as run:
            async for update in run.events():
                if isinstance(update, ta.ResponseTextDelta):
                    run.cancel("user pressed stop")
        await backup.connections[0].closed.wait()
    assert run.result is not None
    assert run.result.status == "cancelled"
    assert run.result.new_items[-1] == AssistantMessage("Part", status="incomplete")
    assert third.requests == []
    assert third.connections == []


async def test_cancel_before_the_fallback_answers_starts_no_third(
    server: SSEServer, start_server: Callable[..., Any]
) -> None:
    server.add(Reply.json(503, _chat_error("primary is down")))
    # The fallback never sends its headers: the cancel lands while it is being entered.
    backup = await start_server(Reply(delay_before_headers=3600, events=[]))
    third = await start_server(chat_wire.text_reply("never"))
    model = FallbackModel(
        _chat(server, "gpt-primary", max_retries=0),
        _chat(backup, "gpt-backup"),
        _chat(third, "gpt-third"),
    )
    with trio.fail_after(10):
        async with ta.open_run(ta.Agent(name="a", model=model), "hi") as run:
            await backup.wait_for_requests(1)
            run.cancel("user pressed stop")
            result = await run.wait()
        await backup.connections[0].closed.wait()
    assert result.status == "cancelled"
    assert result.reason == "user pressed stop"
    assert third.connections == []


async def test_async_with_enters_every_member_that_pools(
    server: SSEServer, start_server: Callable[..., Any]
) -> None:
    server.add(Reply.json(503, _chat_error("down")), Reply.json(503, _chat_error("down")))
    backup = await start_server(chat_wire.text_reply("one"), chat_wire.text_reply("two"))
    scripted = ScriptedModel(["never"])
    model = FallbackModel(
        _chat(server, "gpt-primary", max_retries=0), _chat(backup, "gpt-backup"), scripted
    )
    with trio.fail_after(10):
        async with model:
            assert (await collect(model))[0] == TextDelta("one")
            assert (await collect(model))[0] == TextDelta("two")
            # Each member kept one pooled connection for the block.
            assert [len(server.connections), len(backup.connections)] == [1, 1]
            assert not backup.connections[0].closed.is_set()
        await backup.connections[0].closed.wait()
        await server.connections[0].closed.wait()
    assert scripted.calls == 0


async def test_usage_names_each_model_and_a_mixed_sum_names_none(
    autojump_clock: trio.testing.MockClock,
) -> None:
    busy = ModelError("overloaded", status_code=529, retryable=True)
    primary = ScriptedModel([Turn(fail=busy), Turn("done", usage=Usage(3, 1))])
    backup = ScriptedModel([Turn(tool_calls=[("look", {})], usage=Usage(5, 2))])
    backup_named = Named("backup-model", backup)
    agent = ta.Agent(name="a", model=FallbackModel(primary, backup_named), tools=[look])
    result = await ta.run(agent, "hi")
    assert result.status == "completed", result.reason
    assert [primary.calls, backup.calls] == [2, 1]
    # Turn 1 came from the backup, turn 2 from the primary: the sum names neither.
    assert result.usage == Usage(8, 3, model=None)
    single = await ta.run(
        ta.Agent(name="b", model=FallbackModel(ScriptedModel(["hi"]), "demo")), "x"
    )
    assert single.usage is not None
    assert single.usage.model == "ScriptedModel"


def look() -> str:
    """Look around."""
    return "nothing"


class Named:
    """A model with a ``model`` name, as the HTTP providers have."""

    def __init__(self, name: str, inner: ScriptedModel) -> None:
        self.model = name
        self._inner = inner

    def stream(self, request: ta.ModelRequest) -> Any:
        return self._inner.stream(request)


def test_members_and_on_are_checked() -> None:
    with pytest.raises(TypeError, match="member must be a model"):
        FallbackModel(ScriptedModel([]), 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown model spec"):
        FallbackModel("nonsense")
    with pytest.raises(TypeError, match="on="):
        FallbackModel(ScriptedModel([]), on=42)  # type: ignore[arg-type]
    model = FallbackModel(ScriptedModel([], native_output=True), "demo", on=(ModelError,))
    assert not model.native_output
    assert FallbackModel(ScriptedModel([], native_output=True)).native_output


async def test_structured_output_over_native_and_tool_members(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The primary answers natively (JSON text), the backup with the final_answer tool:
    # the run offers the tool, so the native primary is asked to use it too.
    primary = ScriptedModel(
        [Turn(tool_calls=[("final_answer", {"x": 1, "y": 2})])], native_output=True
    )
    backup = ScriptedModel([])
    agent = ta.Agent(name="a", model=FallbackModel(primary, backup), output_type=Point)
    result = await ta.run(agent, "where?")
    assert result.status == "completed", result.reason
    assert result.final_output == Point(1, 2)
    (request,) = primary.requests
    assert request.output is None
    assert "final_answer" in [tool.name for tool in request.tools]


@attrs.frozen
class Point:
    """A point."""

    x: int
    y: int
