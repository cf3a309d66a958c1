"""What every streaming provider promises, once, run against OpenAIChatModel,
OpenAIResponsesModel and AnthropicModel, each on a real loopback server speaking its
wire format byte for byte: text streamed in order, retries (Retry-After, 5xx, refused
connections, a drop before any output), cancellation closing the socket at every point,
client ownership and pooling, and cancelled runs leaving the pool usable. What is one
wire's own (its events, request bodies, error shapes) stays in that provider's file."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.model_streams import REQUEST, collect, collect_into
from tests.support.provider_wires import WIRES, Wire
from tests.support.sse_server import Reply, SSEServer, unused_port
from trio_agents import AssistantMessage, ModelError
from trio_agents.models import Finish, ModelEvent, TextDelta, ToolCallDone

# A leak hangs the many-streams tests for ever; this only bounds that. Generous: under
# coverage tracing on a loaded 2-core machine 250 streams took over 20 s.
HANG_GUARD = 60


@pytest.fixture(params=list(WIRES))
def wire(request: pytest.FixtureRequest) -> Wire:
    return WIRES[request.param]


async def test_text_is_streamed_in_order_and_ends_with_finish(
    wire: Wire, server: SSEServer
) -> None:
    server.add(wire.text("Hel", "lo", " wörld"))
    with trio.fail_after(10):
        events = await collect(wire.model(server))
    assert events == [
        TextDelta("Hel"),
        TextDelta("lo"),
        TextDelta(" wörld"),
        wire.text_usage,
        Finish("stop"),
    ]
    (request,) = server.requests
    assert request.method == "POST"
    assert request.path == wire.path
    assert request.headers["accept"] == "text/event-stream"
    assert "authorization" not in request.headers  # no key: fine for local servers


async def test_a_call_id_reused_from_the_history_gets_a_fresh_one(
    wire: Wire, server: SSEServer
) -> None:
    history = (ta.UserMessage("go"), ta.ToolCall("call_1", "f", "{}"), ta.ToolResult("call_1", "."))
    server.add(wire.call("call_1", "f", "{}"))
    with trio.fail_after(10):
        events = await collect(wire.model(server), ta.ModelRequest("", history))
    assert events[0] == ToolCallDone(ta.ToolCall("call_1_2", "f", "{}"))


# --------------------------------------------------------------------- retries


async def test_429_with_retry_after_then_success(wire: Wire, server: SSEServer) -> None:
    limited = Reply.json(429, wire.error_body("slow down"), headers=[("retry-after", "0")])
    server.add(limited, wire.text("ok"))
    # A 30 s backoff would blow the deadline: only Retry-After: 0 lets this pass.
    model = wire.model(server, retry_base_delay=30, retry_max_delay=30)
    with trio.fail_after(10):
        events = await collect(model)
    assert events[0] == TextDelta("ok")
    assert len(server.requests) == 2
    assert server.requests[0].json == server.requests[1].json


async def test_503_then_success(wire: Wire, server: SSEServer) -> None:
    server.add(Reply.json(503, wire.error_body("busy")), wire.text("ok"))
    with trio.fail_after(10):
        events = await collect(wire.model(server, retry_base_delay=0.01))
    assert events[0] == TextDelta("ok")
    assert len(server.requests) == 2


async def test_5xx_gives_up_after_max_retries(wire: Wire, server: SSEServer) -> None:
    server.add(*[Reply.json(500, wire.error_body("oops")) for _ in range(5)])
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(wire.model(server, max_retries=2, retry_base_delay=0.01))
    assert info.value.status_code == 500
    assert info.value.retryable
    assert "gave up after 3 attempts" in str(info.value)
    assert "oops" in str(info.value)
    assert len(server.requests) == 3


async def test_connect_refused_gives_up_after_max_retries(wire: Wire) -> None:
    base = f"http://127.0.0.1:{unused_port()}"
    model = wire.model_on(base, max_retries=2, retry_base_delay=0.01)
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect(model)
    assert "ConnectError" in str(info.value)
    assert "gave up after 3 attempts" in str(info.value)
    assert info.value.status_code is None


async def test_drop_after_output_is_not_retried(wire: Wire, server: SSEServer) -> None:
    sent = wire.events_before_text + 2  # and then the connection drops
    server.add(wire.text("Hel", "lo", "!", drop_after=sent), wire.text("again"))
    got: list[ModelEvent] = []
    with trio.fail_after(10), pytest.raises(ModelError) as info:
        await collect_into(got, wire.model(server, retry_base_delay=0.01))
    assert got == [TextDelta("Hel"), TextDelta("lo")]
    assert f"stream ended early after {sent} events" in str(info.value)
    assert "RemoteProtocolError" in str(info.value)
    assert len(server.requests) == 1  # never silently re-asked


async def test_drop_before_any_output_is_retried(wire: Wire, server: SSEServer) -> None:
    server.add(wire.dropped_before_output(), wire.text("ok"))
    with trio.fail_after(10):
        events = await collect(wire.model(server, retry_base_delay=0.01))
    assert events[0] == TextDelta("ok")
    assert len(server.requests) == 2


# ---------------------------------------------------------------- cancellation


async def test_cancel_while_waiting_for_the_next_event_closes_the_socket(
    wire: Wire, server: SSEServer
) -> None:
    server.add(wire.held("Hel"))
    got: list[ModelEvent] = []
    first = trio.Event()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def consume() -> None:
                with scope:
                    async with wire.model(server).stream(REQUEST) as stream:
                        async for event in stream:
                            got.append(event)
                            first.set()

            nursery.start_soon(consume)
            await first.wait()
            await trio.testing.wait_all_tasks_blocked()  # the consumer waits in a read
            scope.cancel()
        connection = server.connections[0]
        await connection.closed.wait()
    assert [e for e in got if isinstance(e, TextDelta)] == [TextDelta("Hel")]
    assert connection.closed_at is not None


async def test_cancel_between_events_closes_the_socket(wire: Wire, server: SSEServer) -> None:
    # The consumer is cancelled while busy elsewhere, so httpx's generator chain is
    # suspended at a yield: leaving the stream must unwind it (no GC warning under -W error).
    server.add(wire.held("Hel", "lo"))
    with trio.fail_after(10):
        with trio.CancelScope() as scope:
            async with wire.model(server).stream(REQUEST) as stream:
                async for _event in stream:
                    scope.cancel()
                    await trio.sleep_forever()
        connection = server.connections[0]
        await connection.closed.wait()
    assert connection.closed_at is not None


async def test_cancel_before_headers_closes_the_socket(wire: Wire, server: SSEServer) -> None:
    server.add(wire.text("x", delay_before_headers=5))
    scope = trio.CancelScope()

    async def consume() -> None:
        with scope:
            await collect(wire.model(server))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume)
            await server.wait_for_requests(1)  # sent; the headers come in 5 s
            scope.cancel()
        await server.connections[0].closed.wait()
    assert scope.cancelled_caught


# ------------------------------------------------------------ client ownership


async def test_caller_client_is_used_and_not_closed(wire: Wire, server: SSEServer) -> None:
    server.add(wire.text("one"), wire.held("x"), wire.text("two"))
    with trio.fail_after(10):
        async with httpx.AsyncClient() as client:
            model = wire.model(server, client=client)
            assert (await collect(model))[0] == TextDelta("one")
            with trio.CancelScope() as scope:
                async with model.stream(REQUEST) as stream:
                    async for _event in stream:
                        scope.cancel()
            assert not client.is_closed
            assert (await collect(model))[0] == TextDelta("two")
            assert not client.is_closed
        await server.connections[1].closed.wait()  # the cancelled call's connection
    # The first and third calls shared the pooled connection; the cancelled one was closed.
    assert [c.requests for c in server.connections] == [2, 1]


async def test_per_call_client_is_closed(wire: Wire, server: SSEServer) -> None:
    server.add(wire.text("one"), wire.text("two"))
    model = wire.model(server)
    with trio.fail_after(10):
        await collect(model)
        await server.connections[0].closed.wait()  # the call's own client was closed
        await collect(model)
        await server.connections[1].closed.wait()
    assert [c.requests for c in server.connections] == [1, 1]


async def test_async_with_model_pools_one_client(wire: Wire, server: SSEServer) -> None:
    server.add(wire.text("one"), wire.text("two"))
    model = wire.model(server)
    with trio.fail_after(10):
        async with model:
            assert (await collect(model))[0] == TextDelta("one")
            assert (await collect(model))[0] == TextDelta("two")
            assert len(server.connections) == 1
            assert not server.connections[0].closed.is_set()
        await server.connections[0].closed.wait()  # closed when the block ends
    assert server.connections[0].requests == 2


async def test_many_cancelled_streams_do_not_exhaust_a_small_pool(
    wire: Wire, server: SSEServer
) -> None:
    count = 250  # a leak would exhaust the 2-connection pool by the third call
    for _ in range(count):
        server.add(wire.held("x"))
    server.add(wire.text("still fine"))
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    with trio.fail_after(HANG_GUARD):
        async with httpx.AsyncClient(limits=limits) as client:
            model = wire.model(server, client=client)
            for _ in range(count):
                with trio.CancelScope() as scope:
                    async with model.stream(REQUEST) as stream:
                        async for _event in stream:
                            scope.cancel()
                            await trio.sleep_forever()
            assert (await collect(model))[0] == TextDelta("still fine")
        for connection in server.connections:
            await connection.closed.wait()
    assert len(server.requests) == count + 1


# ------------------------------------------------------------------ full runs


async def test_cache_figures_reach_the_run_usage(wire: Wire, server: SSEServer) -> None:
    # Each provider's own cache fields, byte for byte as its API sends them, come out as
    # Usage.cache_read_tokens / cache_write_tokens, input_tokens counting every input
    # token.
    server.add(wire.cached())
    agent = ta.Agent(name="a", model=wire.model(server))
    with trio.fail_after(10):
        result = await ta.run(agent, "hi")
    assert result.final_output == "cached"
    assert result.usage == wire.cached_usage
    assert result.usage is not None
    assert result.usage.cost is None  # a loopback server: no price is known


async def test_cancelled_run_closes_the_model_socket(wire: Wire, server: SSEServer) -> None:
    server.add(wire.held("Partial ", "answer"))
    agent = ta.Agent(name="a", model=wire.model(server))
    with trio.fail_after(10):
        async with ta.open_run(agent, "hi") as run:
            async for update in run.events():
                if isinstance(update, ta.ResponseTextDelta) and update.text == "answer":
                    run.cancel("user pressed stop")
        await server.connections[0].closed.wait()
    result = run.result
    assert result is not None
    assert result.status == "cancelled"
    assert result.reason == "user pressed stop"
    assert result.new_items[-1] == AssistantMessage("Partial answer", status="incomplete")
    assert server.connections[0].closed_at is not None  # how soon: benchmark B4, not here


async def test_cancelled_runs_through_one_small_pool(wire: Wire, server: SSEServer) -> None:
    # Each run is cancelled mid-stream; a leaked connection would exhaust the pool of
    # two at the third run and hang (fail_after bounds that).
    count = wire.cancelled_runs
    for _ in range(count):
        server.add(wire.held("x"))
    server.add(wire.text("still fine"))
    limits = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    with trio.fail_after(2 * HANG_GUARD):
        async with httpx.AsyncClient(limits=limits) as client:
            agent = ta.Agent(name="a", model=wire.model(server, client=client))
            for _ in range(count):
                async with ta.open_run(agent, "hi") as run:
                    async for event in run.events():
                        if isinstance(event, ta.ResponseTextDelta):
                            run.cancel("stop")
                assert run.result is not None
                assert run.result.status == "cancelled"
            final = await ta.run(agent, "again")
            assert final.final_output == "still fine"
    assert len(server.requests) == count + 1
