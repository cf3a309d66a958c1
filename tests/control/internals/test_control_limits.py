"""The control server's memory bounds (bytes per principal), its busy policy through
the core's ``on_busy``, and a peer that floods pings and never reads."""

from __future__ import annotations

import json
from contextlib import suppress

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.cli_app import blocker
from tests.support.control_support import TOKENS, serving
from trio_agents.control import ControlError, ControlServer, Limits, connect
from trio_agents.hosting._sessions import SESSION_OVERHEAD, items_bytes
from trio_agents.models import ScriptedModel, Turn

HANG_GUARD = 20  # seconds; a bound against hangs, never a wait


def answering(text: str = "ok") -> ta.Agent:
    return ta.Agent(name="a", model=ScriptedModel([], default=Turn(text=text)))


async def started_tool(run: object) -> None:
    from trio_agents.control import RemoteRun

    assert isinstance(run, RemoteRun)
    async for event in run.events():
        if isinstance(event, ta.ToolStarted):
            return


async def test_inject_bytes_per_run_give_limit_exceeded_item_count_inbox_full() -> None:
    limits = Limits(max_inject_bytes_per_run=1500, ping_interval=None)
    with trio.fail_after(HANG_GUARD):
        async with (
            serving({"b": blocker()}, limits=limits, run_options={"inbox_capacity": 3}) as (
                _,
                url,
            ),
            connect(url, token="tok-alice") as client,
        ):
            run = await client.start("b", "go")
            await started_tool(run)
            await run.inject("x" * 600)
            await run.inject("y" * 600)  # 2 x ~640 bytes: under 1500
            with pytest.raises(ControlError) as too_big:
                await run.inject("z" * 600)
            assert too_big.value.code == "limit_exceeded"
            assert "bytes" in too_big.value.message
            await run.inject("small")  # a refused inject counted nothing
            with pytest.raises(ControlError) as full:  # 3 items: the inbox's count
                await run.inject("more")
            assert full.value.code == "inbox_full"
            await run.cancel("done")
            terminal = await run.wait()
    assert terminal.status == "cancelled"


async def test_idle_sessions_are_evicted_lru_active_ones_never() -> None:
    big = "m" * 2000
    size = SESSION_OVERHEAD + items_bytes([ta.UserMessage(big), ta.AssistantMessage("ok")])
    # room for two finished sessions, not three
    limits = Limits(max_session_bytes_per_principal=2 * size + 100, ping_interval=None)
    model = ScriptedModel([], default=Turn(text="ok"))
    agents = {"a": ta.Agent(name="a", model=model), "b": blocker()}
    with trio.fail_after(HANG_GUARD):
        async with (
            serving(agents, limits=limits) as (server, url),
            connect(url, token="tok-alice") as client,
            connect(url, token="tok-bob") as bob,
        ):
            # an active run holds session "held" (its input counts, it is never evicted)
            held = await client.start("b", big, session_id="held")
            await started_tool(held)
            # with "held" active, only one more session fits: each new one evicts the last
            for name in ("s1", "s2", "s3"):
                await (await client.start("a", big, session_id=name)).wait()
            stats = server.principal_statistics("alice")
            assert stats.session_bytes <= limits.max_session_bytes_per_principal
            assert stats.sessions == 2  # "held" and the most recent, "s3"
            assert stats.sessions_evicted == 2
            # another principal's sessions are its own budget
            await (await bob.start("a", big, session_id="s1")).wait()
            assert server.principal_statistics("bob").sessions == 1
            # the held session kept its conversation: cancel, then continue it
            await held.cancel("enough")
            await held.wait()
            again = await client.start("a", "and now?", session_id="held")
            await again.wait()
            # s1 was evicted: a new run on it starts from nothing
            fresh = await client.start("a", "hello again", session_id="s1")
            await fresh.wait()
    (held_request,) = [r for r in model.requests if r.items[-1] == ta.UserMessage("and now?")]
    assert held_request.items[0] == ta.UserMessage(big)  # the held session's history
    (new,) = [r for r in model.requests if r.items[-1] == ta.UserMessage("hello again")]
    assert new.items == (ta.UserMessage("hello again"),)  # s1's was evicted


async def test_active_sessions_over_the_limit_give_limit_exceeded() -> None:
    limits = Limits(max_session_bytes_per_principal=3000, ping_interval=None)
    with trio.fail_after(HANG_GUARD):
        async with (
            serving({"b": blocker()}, limits=limits) as (server, url),
            connect(url, token="tok-alice") as client,
        ):
            first = await client.start("b", "q" * 2000, session_id="one")
            await started_tool(first)
            with pytest.raises(ControlError) as refused:
                await client.start("b", "w", session_id="two")
            assert refused.value.code == "limit_exceeded"
            assert server.principal_statistics("alice").sessions == 1
            await first.cancel("done")
            await first.wait()
            # the finished session is idle now: evicted to make room
            second = await client.start("b", "w", session_id="two")
            await started_tool(second)
            assert server.principal_statistics("alice").sessions_evicted == 1
            await second.cancel("done")


async def test_retained_bytes_forget_the_oldest_finished_runs_first() -> None:
    limits = Limits(max_retained_bytes_per_principal=3 * 1024 + 500, ping_interval=None)
    with trio.fail_after(HANG_GUARD):
        async with (
            serving({"a": answering()}, limits=limits) as (server, url),
            connect(url, token="tok-alice") as client,
        ):
            runs = [await client.start("a", f"run {i}") for i in range(5)]
            for run in runs:
                await run.wait()
            listed = [info.run_id for info in await client.list_runs()]
            stats = server.principal_statistics("alice")
    assert listed == [run.id for run in runs[-3:]]
    assert stats.retained_runs == 3
    assert stats.retained_bytes <= limits.max_retained_bytes_per_principal


async def test_enqueue_goes_through_the_core_and_session_cancel_hits_the_holder() -> None:
    with trio.fail_after(HANG_GUARD):
        async with (
            serving({"b": blocker()}) as (_, url),
            connect(url, token="tok-alice") as client,
        ):
            first = await client.start("b", "1", session_id="s")
            await started_tool(first)
            queued = await client.start("b", "2", session_id="s", on_busy="enqueue")
            assert (await queued.get()).status == "queued"
            assert await client.cancel_session("s", "next please") == first.id
            assert (await first.wait()).reason == "next please"
            await started_tool(queued)  # it got the session once the first let go
            assert await client.cancel_session("s", "bye") == queued.id
            assert (await queued.wait()).reason == "bye"


# ------------------------------------------------------------ a ping flood


def _ping_frame(payload: bytes) -> bytes:
    """A masked client ping frame (mask 0: the payload as is)."""
    assert len(payload) <= 125
    return bytes([0x89, 0x80 | len(payload)]) + b"\0\0\0\0" + payload


_HANDSHAKE = (
    b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    b"Sec-WebSocket-Protocol: trio-agents.v1\r\nAuthorization: Bearer tok-alice\r\n\r\n"
)


@pytest.mark.parametrize("ping_interval", [None, 30.0], ids=["pings-off", "pings-on"])
async def test_a_ping_flood_that_never_reads_is_cut_within_send_timeout(
    autojump_clock: trio.testing.MockClock, ping_interval: float | None
) -> None:
    """The pongs trio-websocket writes for us are bounded too (virtual time)."""
    send_timeout = 5.0
    limits = Limits(send_timeout=send_timeout, ping_interval=ping_interval)
    server = ControlServer({"a": answering()}, auth=TOKENS, limits=limits)
    # lockstep: a send blocks until the peer reads, as a full TCP window would
    client, server_side = trio.testing.lockstep_stream_pair()
    gone = trio.Event()

    async def serve() -> None:
        await server.handle_stream(server_side)
        gone.set()

    async def flood() -> None:
        with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            while True:
                await client.send_all(_ping_frame(b"p" * 125))

    with trio.fail_after(HANG_GUARD * 100):  # virtual seconds
        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            await client.send_all(_HANDSHAKE)
            response = b""
            while b"\r\n\r\n" not in response:
                response += await client.receive_some()
            assert response.startswith(b"HTTP/1.1 101")
            await trio.testing.wait_all_tasks_blocked()
            assert server.statistics().connections == 1
            flooding_since = trio.current_time()
            nursery.start_soon(flood)  # ...and never read again
            await gone.wait()
            cut_after = trio.current_time() - flooding_since
            nursery.cancel_scope.cancel()
    assert cut_after <= send_timeout + 1.0  # + the best-effort close's own bound
    assert server.statistics().connections == 0


def test_events_decode_through_one_registry() -> None:
    from typing import get_args

    from trio_agents._events import EVENT_TYPES
    from trio_agents.control import event_from_json

    assert set(EVENT_TYPES.values()) == set(get_args(ta.RunEvent))
    delta = ta.ResponseTextDelta("r", 2, 1, "hi")
    assert ta.ResponseTextDelta.from_json(json.loads(json.dumps(delta.to_json()))) == delta
    with pytest.raises(ValueError, match=r"not a run\.updated event"):
        ta.RunUpdated.from_json(delta.to_json())
    with pytest.raises(ValueError, match="seq: expected an integer"):
        event_from_json({**delta.to_json(), "seq": "2"})
    with pytest.raises(ValueError, match="'text' is missing"):
        event_from_json({"type": "response.text.delta", "run_id": "r", "seq": 1, "turn": 1})
