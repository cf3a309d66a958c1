"""The run host of one process (``trio_agents.hosting.LocalHost``): every method of the
``RunHost`` interface, principal isolation on each, subscriptions (``from_seq``,
``tree``, ``status_only``, ``events.dropped`` past retention), ``wait_terminal``,
owners' ``on_disconnect``, a cancel racing completion, and the host a
``ControlServer`` shares with its websocket channel."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.control_support import launch, serving, sleep_hour
from trio_agents.control import ControlServer, Limits, connect
from trio_agents.hosting import HostedEvent, HostError, LocalHost, Origin, RunHost, StartRequest
from trio_agents.models import ScriptedModel, Turn


def _agent(model: ScriptedModel, *tools: ta.Tool, name: str = "a") -> ta.Agent:
    return ta.Agent(name=name, instructions="test", model=model, tools=list(tools))


def _sleeper(name: str = "s") -> ta.Agent:
    return _agent(
        ScriptedModel([], default=Turn(tool_calls=[("sleep_hour", {})])), sleep_hour, name=name
    )


def _talker(text: str = "one two three four five six") -> ta.Agent:
    return _agent(ScriptedModel([], default=Turn(text=text, delay=1.0)), name="t")


def _start(agent: str, text: str = "go", **kwargs: Any) -> StartRequest:
    return StartRequest(agent=agent, input=(ta.UserMessage(text),), **kwargs)


ALICE = Origin(principal="alice")
BOB = Origin(principal="bob")


async def _collect(events: AsyncIterator[HostedEvent]) -> list[HostedEvent]:
    return [event async for event in events]


async def _until(host: LocalHost, run_id: str, status: str) -> None:
    async with host.events("alice", run_id, status_only=True) as updates:
        async for hosted in updates:
            if hosted.event.get("status") == status:
                return
    raise AssertionError(f"{run_id} never reached {status}")


async def test_start_get_list_events_and_wait_terminal(autojump_clock: Any) -> None:
    host = LocalHost({"t": _talker()})
    host_as_protocol: RunHost = host  # LocalHost is a RunHost (checked by mypy)
    assert host_as_protocol.agents["t"].name == "t"
    async with host.running():
        run_id = await host.start(ALICE, _start("t"))
        info = await host.get("alice", run_id)
        assert info.run_id == run_id
        assert info.agent == "t"
        assert [r.run_id for r in await host.list("alice")] == [run_id]
        assert await host.list("bob") == []
        async with host.events("alice", run_id) as events:
            got = await _collect(events)
        terminal = await host.wait_terminal("alice", run_id)
    assert terminal.status == "completed"
    assert [e.seq for e in got] == list(range(1, len(got) + 1))
    assert all(e.run_id == run_id for e in got)
    assert got[-1].event["type"] == "run.updated"
    assert got[-1].event["status"] == "completed"
    text = "".join(e.event["text"] for e in got if e.event["type"] == "response.text.delta")
    assert text == "one two three four five six"


async def test_another_principal_is_not_found_on_every_method(autojump_clock: Any) -> None:
    host = LocalHost({"s": _sleeper()})
    async with host.running():
        run_id = await host.start(ALICE, _start("s", session_id="s1"))
        calls: list[Callable[[], Awaitable[object]]] = [
            lambda: host.get("bob", run_id),
            lambda: host.cancel("bob", run_id, "mine now"),
            lambda: host.wait_terminal("bob", run_id),
            lambda: host.inject("bob", run_id, (ta.UserMessage("psst"),)),
            lambda: host.withdraw("bob", run_id, "inj_1"),
            lambda: host.approve("bob", run_id, "call_1_0"),
            lambda: host.reject("bob", run_id, "call_1_0", "no"),
        ]
        for call in calls:
            with pytest.raises(HostError) as caught:
                await call()
            assert caught.value.code == "not_found"
        for tree in (False, True):
            with pytest.raises(HostError) as caught:
                async with host.events("bob", run_id, tree=tree):
                    pass  # pragma: no cover
            assert caught.value.code == "not_found"
        # Sessions are per principal: bob's "s1" has no run.
        with pytest.raises(HostError) as caught:
            await host.cancel_session("bob", "s1")
        assert caught.value.code == "no_active_run"
        assert await host.list("bob", all=True) == []
        host.disconnected(object())  # an unknown owner: nothing happens
        assert (await host.get("alice", run_id)).status != "cancelled"
        await host.cancel("alice", run_id, "done")


async def test_inject_withdraw_approve_reject(autojump_clock: Any) -> None:
    model = ScriptedModel(
        [
            Turn(tool_calls=[("launch", {}), ("launch", {})]),
            Turn(text="done"),
        ]
    )
    host = LocalHost({"a": _agent(model, launch)})
    async with host.running():
        run_id = await host.start(ALICE, _start("a"))
        await _until(host, run_id, "awaiting_approval")
        pending = (await host.get("alice", run_id)).pending_approvals
        assert len(pending) == 2
        injection = await host.inject("alice", run_id, (ta.UserMessage("later"),), "when_idle")
        assert await host.withdraw("alice", run_id, injection) is True
        assert await host.withdraw("alice", run_id, injection) is False
        with pytest.raises(HostError) as caught:
            await host.approve("alice", run_id, "nope")
        assert caught.value.code == "not_found"
        await host.approve("alice", run_id, pending[0])
        await host.reject("alice", run_id, pending[1], "too risky")
        terminal = await host.wait_terminal("alice", run_id)
        assert terminal.status == "completed"
        with pytest.raises(HostError) as caught:
            await host.inject("alice", run_id, (ta.UserMessage("late"),))
        assert caught.value.code == "run_closed"
        async with host.events("alice", run_id) as events:
            got = await _collect(events)
    results = {
        e.event["item"]["call_id"]: e.event["item"]
        for e in got
        if e.event["type"] == "run.item" and e.event["item"]["type"] == "function_call_output"
    }
    assert results[pending[0]]["output"] == "launched"
    assert "too risky" in results[pending[1]]["output"]


async def test_events_from_seq_and_status_only(autojump_clock: Any) -> None:
    host = LocalHost({"t": _talker()})
    async with host.running():
        run_id = await host.start(ALICE, _start("t"))
        await host.wait_terminal("alice", run_id)
        async with host.events("alice", run_id) as events:
            everything = await _collect(events)
        async with host.events("alice", run_id, from_seq=3) as events:
            tail = await _collect(events)
        async with host.events("alice", run_id, status_only=True) as events:
            statuses = await _collect(events)
    assert tail == everything[2:]
    assert {e.event["type"] for e in statuses} == {"run.updated"}
    assert [e.event["status"] for e in statuses][-1] == "completed"
    with pytest.raises(HostError) as caught:
        async with host.events("alice", run_id, from_seq=-1):
            pass  # pragma: no cover
    assert caught.value.code == "invalid_request"


async def test_events_past_retention_start_with_events_dropped(autojump_clock: Any) -> None:
    host = LocalHost({"t": _talker("a b c d e f g h i j k l")}, run_options={"event_retention": 4})
    async with host.running():
        run_id = await host.start(ALICE, _start("t"))
        await host.wait_terminal("alice", run_id)
        async with host.events("alice", run_id, from_seq=1) as events:
            got = await _collect(events)
        async with host.events("alice", run_id, from_seq=None) as events:
            retained = await _collect(events)
    assert retained == got[1:]  # from the oldest retained: no marker
    dropped = got[0]
    assert dropped.event["type"] == "events.dropped"
    assert dropped.event["first_missing_seq"] == 1
    assert [e.seq for e in got[1:]] == list(range(dropped.seq + 1, dropped.seq + 1 + len(got) - 1))
    assert len(got) - 1 <= 4
    assert got[-1].event["status"] == "completed"


async def test_tree_events_carry_each_run_and_end_with_the_root(autojump_clock: Any) -> None:
    child = _agent(ScriptedModel([Turn(text="dug", delay=1.0)]), name="digger")
    root = _agent(
        ScriptedModel([Turn(tool_calls=[("digger", {"input": "dig"})]), Turn(text="found")]),
        child.as_tool(),
        name="root",
    )
    host = LocalHost({"root": root})
    async with host.running():
        run_id = await host.start(ALICE, _start("root"))
        async with host.events("alice", run_id, tree=True) as events:
            got = await _collect(events)
        info = await host.get("alice", run_id)
        assert info.children is not None
        (child_id,) = info.children
        child_info = await host.get("alice", child_id)
        everything = await host.list("alice", all=True)
        with pytest.raises(HostError) as caught:
            async with host.events("alice", run_id, tree=True, from_seq=2):
                pass  # pragma: no cover
        assert caught.value.code == "invalid_request"
        with pytest.raises(HostError) as caught:
            await host.get("bob", child_id)
        assert caught.value.code == "not_found"
    assert child_info.parent_id == run_id
    assert [r.run_id for r in everything] == [run_id, child_id]
    assert {e.run_id for e in got} == {run_id, child_id}
    assert got[-1].run_id == run_id
    assert got[-1].event["status"] == "completed"
    child_events = [e for e in got if e.run_id == child_id]
    assert [e.seq for e in child_events] == list(range(1, len(child_events) + 1))
    assert child_events[-1].event["status"] == "completed"


async def test_wait_terminal_after_cancel(autojump_clock: Any) -> None:
    host = LocalHost({"s": _sleeper()})
    async with host.running():
        run_id = await host.start(ALICE, _start("s", session_id="s1"))
        await _until(host, run_id, "running")
        async with trio.open_nursery() as nursery:
            seen: list[Any] = []

            async def wait() -> None:
                seen.append(await host.wait_terminal("alice", run_id))

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            assert not seen
            assert await host.cancel_session("alice", "s1", "stop it") == run_id
        (terminal,) = seen
        with pytest.raises(HostError) as caught:
            await host.cancel("alice", run_id, "again")
        assert caught.value.code == "run_closed"
        with pytest.raises(HostError) as caught:
            await host.cancel_session("alice", "s1")
        assert caught.value.code == "no_active_run"
    assert (terminal.status, terminal.reason) == ("cancelled", "stop it")


@pytest.mark.parametrize("on_disconnect", ["cancel", "continue"])
async def test_disconnected_applies_on_disconnect(autojump_clock: Any, on_disconnect: str) -> None:
    host = LocalHost({"s": _sleeper()})
    owner = object()
    async with host.running():
        owned = await host.start(
            Origin(principal="alice", owner=owner),
            _start("s", on_disconnect=on_disconnect),
        )
        ownerless = await host.start(ALICE, _start("s", on_disconnect="cancel"))
        await _until(host, owned, "running")
        host.disconnected(owner)
        host.disconnected(owner)  # idempotent
        await trio.testing.wait_all_tasks_blocked()
        info = await host.get("alice", owned)
        other = await host.get("alice", ownerless)
        if on_disconnect == "cancel":
            assert (info.status, info.reason) == ("cancelled", "client disconnected")
        else:
            assert not info.status.is_terminal
        assert not other.status.is_terminal  # no owner: nothing to disconnect
    # Leaving the block shuts the host down: every run ends "server shutdown".
    final = await host.get("alice", ownerless)
    assert (final.status, final.reason) == ("cancelled", "server shutdown")


async def test_a_cancel_racing_completion_is_applied_or_run_closed(autojump_clock: Any) -> None:
    host = LocalHost({"t": _agent(ScriptedModel([], default=Turn(text="x", delay=1.0)), name="t")})
    outcomes: set[str] = set()
    async with host.running():
        for delay in (0.5, 1.0, 1.5, 2.0):
            run_id = await host.start(ALICE, _start("t"))
            async with trio.open_nursery() as nursery:

                async def cancel_at(delay: float = delay, run_id: str = run_id) -> None:
                    await trio.sleep(delay)
                    try:
                        await host.cancel("alice", run_id, "race")
                    except HostError as exc:
                        outcomes.add(exc.code)  # run_closed: it completed first
                    else:
                        outcomes.add("cancelled")

                nursery.start_soon(cancel_at)
                terminal = await host.wait_terminal("alice", run_id)
            assert terminal.status in ("cancelled", "completed")
            if terminal.status == "cancelled":
                assert terminal.reason == "race"
    assert outcomes == {"cancelled", "run_closed"}


async def test_refusals_are_host_errors(autojump_clock: Any) -> None:
    limits = Limits(max_runs_per_principal=1, max_run_limits=ta.UsageLimits(requests=5))
    host = LocalHost({"s": _sleeper()}, limits=limits)
    with pytest.raises(HostError) as caught:
        await host.start(ALICE, _start("s"))
    assert caught.value.code == "internal"  # not served
    async with host.running():
        for request, code in [
            (_start("nobody"), "not_found"),
            (
                StartRequest(agent="s", input=(ta.UserMessage("x"),), context={"k": 1}),
                "invalid_request",
            ),
            (_start("s", limits=ta.UsageLimits(requests=10)), "invalid_request"),
        ]:
            with pytest.raises(HostError) as caught:
                await host.start(ALICE, request)
            assert caught.value.code == code, request
        await host.start(ALICE, _start("s"))
        with pytest.raises(HostError) as caught:
            await host.start(ALICE, _start("s"))
        assert caught.value.code == "limit_exceeded"
        with pytest.raises(RuntimeError):
            await host.serve()


async def test_a_control_server_shares_its_host_with_the_websocket() -> None:
    agents = {"s": _sleeper()}
    with trio.fail_after(20):
        async with (
            serving(agents) as (server, url),
            connect(url, token="tok-alice") as client,
        ):
            host = server.host
            assert "s" in host.agents
            hosted = await host.start(ALICE, _start("s"))
            remote = await client.start("s", "over the socket")
            listed = await client.request("runs.list")
            assert {r["run_id"] for r in listed["runs"]} == {hosted, remote.id}
            assert {r.run_id for r in await host.list("alice")} == {hosted, remote.id}
            await host.cancel("alice", remote.id, "from http")
            terminal = await remote.wait()
            assert (terminal.status, terminal.reason) == ("cancelled", "from http")
            await host.cancel("alice", hosted, "done")
            with pytest.raises(RuntimeError):
                await host.serve()


async def test_an_error_in_the_running_block_comes_out_as_itself_after_the_runs_end(
    autojump_clock: Any,
) -> None:
    host = LocalHost({"s": _sleeper()})
    started: list[str] = []

    async def buggy_caller() -> None:
        async with host.running():
            started.append(await host.start(ALICE, _start("s")))
            await _until(host, started[0], "running")
            assert (await host.get("alice", started[0])).status == "running"
            raise KeyError("the caller's bug")

    with pytest.raises(KeyError) as info:  # not an ExceptionGroup: the block's own error
        await buggy_caller()
    assert info.value.args == ("the caller's bug",)
    # the run ended with the block, before the error came out
    assert (await host.get("alice", started[0])).status == "cancelled"


async def test_a_cancel_from_outside_leaves_the_running_block_quietly(
    autojump_clock: Any,
) -> None:
    host = LocalHost({"s": _sleeper()})
    with trio.CancelScope() as outside:
        async with host.running():
            run_id = await host.start(ALICE, _start("s"))
            await _until(host, run_id, "running")
            assert (await host.get("alice", run_id)).status == "running"
            outside.cancel()
            await trio.sleep_forever()
    assert outside.cancelled_caught  # the block's Cancelled, not a group of them
    assert (await host.get("alice", run_id)).status == "cancelled"


def test_park_after_in_run_options_is_refused_as_nothing_would_resume_the_run() -> None:
    # A parked run ends its attempt, its calls left open, for a later attempt to resume
    # (the TemporalHost starts one when the decision comes): a LocalHost (a
    # ControlServer's, a cluster node's) never would, so the run would sit awaiting a
    # decision that nothing can apply. Refused at once, where the host is configured.
    agents = {"s": _sleeper()}
    with pytest.raises(ValueError, match="cannot hold 'park_after'"):
        LocalHost(agents, run_options={"park_after": 30})
    with pytest.raises(ValueError, match="cannot hold 'park_after'"):
        ControlServer(agents, auth={"tok": "alice"}, run_options={"park_after": 30})
    LocalHost(agents, run_options={"park_after": None})  # never parks: accepted
