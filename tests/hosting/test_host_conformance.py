"""The host conformance suite: what every :class:`~trio_agents.hosting.RunHost` does, run
against each host — :class:`~trio_agents.hosting.LocalHost` (one process, SQLite
sessions) and the PostgreSQL cluster's host (``PostgresCluster(dsn).host(...)``, served
on its own, no face): a node that runs the runs itself, and a node whose runs all run
on another node (placed starts, routed ops, events from the persisted log) — through
the interface only.

— and the TemporalHost (a real dev server; the runs on a worker embedded in the test's
Trio program), with its sessions and run store in SQLite, and in PostgreSQL. A new host passes by adding a fixture to :data:`HOSTS`: an async
context manager that serves a host of ``agents`` with sessions that survive a run.
docs/architecture.md ("How a new host plugs in") says what else it implements.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.control_support import launch
from tests.support.helpers import SEAT_FORM, book
from tests.support.timeline_checks import span_problems
from trio_agents.control import Limits
from trio_agents.hosting import (
    HostedEvent,
    HostError,
    LocalHost,
    Origin,
    RunHost,
    StartRequest,
    run_timeline,
)
from trio_agents.models import ScriptedModel, Turn

OpenHost = Callable[[Mapping[str, ta.Agent]], AbstractAsyncContextManager[RunHost]]

_LIMITS = Limits(ping_interval=None, shutdown_timeout=10.0)
ALICE = Origin(principal="alice")


def _local(tmp_path: Path) -> OpenHost:
    @asynccontextmanager
    async def open_host(agents: Mapping[str, ta.Agent]) -> AsyncIterator[RunHost]:
        host = LocalHost(agents, sessions=tmp_path / "sessions.db", limits=_LIMITS)
        async with host.running():
            yield host

    return open_host


def _cluster(dsn: str) -> OpenHost:
    from trio_agents.cluster import PostgresCluster

    @asynccontextmanager
    async def open_host(agents: Mapping[str, ta.Agent]) -> AsyncIterator[RunHost]:
        cluster = PostgresCluster(dsn, node_id="A", lease_ttl=5.0)
        host = cluster.host(agents, limits=_LIMITS)
        async with host.running():
            yield host

    return open_host


def _routed(dsn: str) -> OpenHost:
    """The host of node B of a cluster whose runs all run on node A: B is full (a run
    of another principal fills it), so every start is placed on A and every op on a
    run is routed there; events come from the cluster's persisted log."""
    from trio_agents.cluster import PostgresCluster

    @asynccontextmanager
    async def open_host(agents: Mapping[str, ta.Agent]) -> AsyncIterator[RunHost]:
        served = {**agents, "filler": _filler()}
        a = PostgresCluster(dsn, node_id="A", lease_ttl=5.0).host(served, limits=_LIMITS)
        b = PostgresCluster(dsn, node_id="B", lease_ttl=5.0, max_runs=1)
        host = b.host(served, limits=_LIMITS)
        async with a.running(), host.running():
            filler = await host.start(Origin(principal="carol"), _start(agent="filler"))
            await _until(host, filler, "running", principal="carol")
            yield host
            # Every test starts a run: placed on A, its ops routed there.
            assert b.statistics().routed > 0
            assert b.statistics().owned_runs == 1  # the filler only

    return open_host


def _filler() -> ta.Agent:
    @ta.function_tool
    async def hold() -> str:
        """Hold the node's room."""
        await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    model = ScriptedModel([], default=Turn(tool_calls=[("hold", {})]))
    return ta.Agent(name="filler", instructions="test", model=model, tools=[hold])


def _temporal(target: str, where: Path | str) -> OpenHost:
    """A TemporalHost over a real dev server, its runs run by a worker embedded in the
    test's own Trio program (the agents' scripted models and tools are the test's), its
    sessions and run store ``where`` says: a SQLite file, or a PostgreSQL database."""
    from tests.support.temporal_support import embedded_temporal_host

    def open_host(agents: Mapping[str, ta.Agent]) -> AbstractAsyncContextManager[RunHost]:
        return embedded_temporal_host(target, where, agents, _LIMITS)

    return open_host


HOSTS = ["local", "cluster", "cluster-routed", "temporal", "temporal-postgres"]


@pytest.fixture(params=HOSTS)
def open_host(request: pytest.FixtureRequest, tmp_path: Path) -> OpenHost:
    """Serves a host of the given agents for the block (each host's own fixture)."""
    if request.param == "local":
        return _local(tmp_path)
    if request.param == "cluster":
        return _cluster(request.getfixturevalue("pg_dsn"))
    if request.param == "temporal":
        return _temporal(request.getfixturevalue("temporal_server"), tmp_path / "sessions.sqlite3")
    if request.param == "temporal-postgres":
        from tests.support.pg_support import postgres_url

        database = postgres_url(request.getfixturevalue("pg_dsn"))
        return _temporal(request.getfixturevalue("temporal_server"), database)
    return _routed(request.getfixturevalue("pg_dsn"))


def _start(agent: str = "a", text: str = "go", **kwargs: Any) -> StartRequest:
    return StartRequest(agent=agent, input=(ta.UserMessage(text),), **kwargs)


def _waiting(started: list[str], gate: trio.Event, called: trio.Event) -> ta.Tool:
    """A tool ``wait`` that records its call id, says it started, then waits for
    ``gate``."""

    @ta.function_tool
    async def wait(ctx: ta.ToolContext) -> str:
        """Wait for the gate."""
        started.append(ctx.call_id)
        called.set()
        await gate.wait()
        return "released"

    return wait


def _agents(model: ScriptedModel, *tools: ta.Tool) -> dict[str, ta.Agent]:
    return {"a": ta.Agent(name="a", instructions="test", model=model, tools=list(tools))}


async def _collect(host: RunHost, run_id: str, **kwargs: Any) -> list[HostedEvent]:
    async with host.events("alice", run_id, **kwargs) as events:
        return [event async for event in events]


async def _until(host: RunHost, run_id: str, status: str, principal: str = "alice") -> None:
    async with host.events(principal, run_id, status_only=True) as updates:
        async for hosted in updates:
            if hosted.event.get("status") == status:
                return
    raise AssertionError(f"{run_id} never reached {status}")


async def _refused(code: str, call: Callable[[], Any]) -> None:
    with pytest.raises(HostError) as caught:
        await call()
    assert caught.value.code == code, caught.value


async def test_start_events_terminal_get_and_list(open_host: OpenHost) -> None:
    model = ScriptedModel([Turn(text="one two three")])
    with trio.fail_after(60):
        async with open_host(_agents(model)) as host:
            run_id = await host.start(ALICE, _start())
            got = await _collect(host, run_id)
            terminal = await host.wait_terminal("alice", run_id)
            info = await host.get("alice", run_id)
            listed = await host.list("alice")
            assert await host.list("bob") == []
    assert [event.seq for event in got] == list(range(1, len(got) + 1))
    assert all(event.run_id == run_id for event in got)
    assert (got[-1].event["type"], got[-1].event["status"]) == ("run.updated", "completed")
    text = "".join(e.event["text"] for e in got if e.event["type"] == "response.text.delta")
    assert text == "one two three"
    assert terminal.status == info.status == "completed"
    assert (info.run_id, info.agent, info.seq) == (run_id, "a", got[-1].seq)
    assert [run.run_id for run in listed] == [run_id]


async def test_a_cancel_with_its_reason_ends_cancelled_with_the_conversation_repaired(
    open_host: OpenHost,
) -> None:
    started: list[str] = []
    called = trio.Event()
    model = ScriptedModel([Turn(tool_calls=[("wait", {})])], default=Turn(text="after"))
    with trio.fail_after(60):
        async with open_host(_agents(model, _waiting(started, trio.Event(), called))) as host:
            run_id = await host.start(ALICE, _start(session_id="s1"))
            await called.wait()
            await host.cancel("alice", run_id, "stop it")
            terminal = await host.wait_terminal("alice", run_id)
            got = await _collect(host, run_id)
            await _refused("run_closed", lambda: host.cancel("alice", run_id, "again"))
            # The next run of the session reads the repaired conversation.
            after = await host.start(ALICE, _start(text="again", session_id="s1"))
            assert (await host.wait_terminal("alice", after)).status == "completed"
    assert (terminal.status, terminal.reason) == ("cancelled", "stop it")
    last = got[-1].event
    assert (last["status"], last["reason"]) == ("cancelled", "stop it")
    history = [item.to_json() for item in model.requests[-1].items]
    outputs = [item for item in history if item["type"] == "function_call_output"]
    assert [(o["call_id"], o["status"]) for o in outputs] == [(started[0], "cancelled")]
    assert history[-1]["type"] == "message"
    assert history[-1]["role"] == "user"


async def test_inject_into_a_running_run_reaches_its_model(open_host: OpenHost) -> None:
    started: list[str] = []
    called, gate = trio.Event(), trio.Event()
    model = ScriptedModel([Turn(tool_calls=[("wait", {})])], default=Turn(text="ok"))
    with trio.fail_after(60):
        async with open_host(_agents(model, _waiting(started, gate, called))) as host:
            run_id = await host.start(ALICE, _start())
            await called.wait()
            injection = await host.inject("alice", run_id, (ta.UserMessage("psst"),))
            assert isinstance(injection, str)
            assert injection
            gate.set()
            assert (await host.wait_terminal("alice", run_id)).status == "completed"
            await _refused(
                "run_closed", lambda: host.inject("alice", run_id, (ta.UserMessage("late"),))
            )
    seen = [item.to_json() for item in model.requests[-1].items]
    assert any(item["type"] == "message" and "psst" in str(item.get("content")) for item in seen), (
        seen
    )


async def test_approve_and_reject_a_waiting_approval(open_host: OpenHost) -> None:
    model = ScriptedModel([Turn(tool_calls=[("launch", {}), ("launch", {})]), Turn(text="done")])
    with trio.fail_after(60):
        async with open_host(_agents(model, launch)) as host:
            run_id = await host.start(ALICE, _start())
            await _until(host, run_id, "awaiting_approval")
            pending = (await host.get("alice", run_id)).pending_approvals
            assert len(pending) == 2
            await _refused("not_found", lambda: host.approve("alice", run_id, "nope"))
            await host.approve("alice", run_id, pending[0])
            await host.reject("alice", run_id, pending[1], "too risky")
            assert (await host.wait_terminal("alice", run_id)).status == "completed"
            got = await _collect(host, run_id)
    results = {
        e.event["item"]["call_id"]: e.event["item"]["output"]
        for e in got
        if e.event["type"] == "run.item" and e.event["item"]["type"] == "function_call_output"
    }
    assert results[pending[0]] == "launched"
    assert "too risky" in results[pending[1]]


async def test_a_question_answered_with_content(open_host: OpenHost) -> None:
    """A running call's question is pending like a call; approve's content is checked
    against its schema (refused: ``invalid_request``, nothing decided) and reaches
    the tool."""
    model = ScriptedModel([Turn(tool_calls=[("book", {})]), Turn(text="done")])
    with trio.fail_after(60):
        async with open_host(_agents(model, book)) as host:
            run_id = await host.start(ALICE, _start())
            async with host.events("alice", run_id, status_only=True) as updates:
                async for hosted in updates:
                    if hosted.event["status"] == "awaiting_approval":
                        break
            # What it asks is in the status update, and in the run's record on every
            # host (a routed cluster node's record is the run's row, written with the
            # update: it had no detail before).
            [question] = hosted.event["detail"]["questions"]
            record = await host.get("alice", run_id)
            assert record.detail == hosted.event["detail"]
            (listed,) = await host.list("alice")
            assert listed.detail == hosted.event["detail"]
            (question_id,) = record.pending_approvals
            assert (question["id"], question["message"]) == (question_id, "Which seat?")
            assert question["schema"] == SEAT_FORM
            await _refused(
                "invalid_request",
                lambda: host.approve("alice", run_id, question_id, {"seat": "roof"}),
            )
            assert (await host.get("alice", run_id)).pending_approvals == (question_id,)
            await host.approve("alice", run_id, question_id, {"seat": "window"})
            assert (await host.wait_terminal("alice", run_id)).status == "completed"
            got = await _collect(host, run_id)
    [output] = [
        e.event["item"]["output"]
        for e in got
        if e.event["type"] == "run.item" and e.event["item"]["type"] == "function_call_output"
    ]
    assert output == "approved=True content={'seat': 'window'}"


async def test_cancel_session_cancels_its_active_run(open_host: OpenHost) -> None:
    called = trio.Event()
    model = ScriptedModel([Turn(tool_calls=[("wait", {})])], default=Turn(text="after"))
    with trio.fail_after(60):
        async with open_host(_agents(model, _waiting([], trio.Event(), called))) as host:
            run_id = await host.start(ALICE, _start(session_id="s1"))
            await called.wait()
            await _refused("no_active_run", lambda: host.cancel_session("bob", "s1"))
            assert await host.cancel_session("alice", "s1", "session over") == run_id
            terminal = await host.wait_terminal("alice", run_id)
            await _refused("no_active_run", lambda: host.cancel_session("alice", "s1"))
    assert (terminal.status, terminal.reason) == ("cancelled", "session over")


async def test_fork_session_while_its_run_waits_in_a_tool(open_host: OpenHost) -> None:
    """DESIGN §23 through the interface: a fork taken while the session's run is in a
    tool call holds what was stored before the call; a run continues from the fork;
    another principal's session is not_found; a fork never overwrites."""
    called = trio.Event()
    gate = trio.Event()
    model = ScriptedModel(
        [Turn(text="checking", tool_calls=[("wait", {})])], default=Turn(text="after")
    )
    with trio.fail_after(60):
        async with open_host(_agents(model, _waiting([], gate, called))) as host:
            run_id = await host.start(ALICE, _start(session_id="s1"))
            await called.wait()
            # The input and the text before the call: the open call is left out.
            assert await host.fork_session("alice", "s1", "f1") == 2
            assert await host.fork_session("alice", "s1", "f0", 1) == 1
            await _refused("not_found", lambda: host.fork_session("bob", "s1", "mine"))
            await _refused("not_found", lambda: host.fork_session("alice", "nope", "x"))
            await _refused("invalid_request", lambda: host.fork_session("alice", "s1", "f1"))
            await _refused("session_busy", lambda: host.fork_session("alice", "f1", "s1"))
            gate.set()
            await host.wait_terminal("alice", run_id)
            follow = await host.start(ALICE, _start(text="from the fork", session_id="f1"))
            assert (await host.wait_terminal("alice", follow)).status == "completed"
    request = model.requests[-1]
    assert [type(i).__name__ for i in request.items] == [
        "UserMessage",
        "AssistantMessage",
        "UserMessage",
    ]


async def test_refusals_are_host_errors_with_their_codes(open_host: OpenHost) -> None:
    called = trio.Event()
    model = ScriptedModel([Turn(tool_calls=[("wait", {})])], default=Turn(text="after"))
    with trio.fail_after(60):
        async with open_host(_agents(model, _waiting([], trio.Event(), called))) as host:
            await _refused("not_found", lambda: host.get("alice", "run_unknown"))
            await _refused("not_found", lambda: host.cancel("alice", "run_unknown"))
            await _refused("not_found", lambda: host.start(ALICE, _start(agent="nobody")))
            run_id = await host.start(ALICE, _start(session_id="s1"))
            await called.wait()
            # Another principal never sees the run, whatever it asks.
            for call in (
                lambda: host.get("bob", run_id),
                lambda: host.cancel("bob", run_id, "mine now"),
                lambda: host.inject("bob", run_id, (ta.UserMessage("psst"),)),
                lambda: host.withdraw("bob", run_id, "inj_1"),
                lambda: host.approve("bob", run_id, "call_1"),
                lambda: host.reject("bob", run_id, "call_1", "no"),
            ):
                await _refused("not_found", call)
            with pytest.raises(HostError) as caught:
                async with host.events("bob", run_id):
                    pass  # pragma: no cover
            assert caught.value.code == "not_found"
            assert await host.list("bob", all=True) == []
            # A busy session refuses a start that will not wait.
            await _refused("session_busy", lambda: host.start(ALICE, _start(session_id="s1")))
            info = await host.get("alice", run_id)
            assert not info.status.is_terminal
            await host.cancel("alice", run_id, "done")
            assert (await host.wait_terminal("alice", run_id)).status == "cancelled"


async def test_the_timeline_of_a_tree_from_the_events_the_host_serves(
    open_host: OpenHost,
) -> None:
    # hosting.run_timeline reads what every host serves (get, events): a live tree's
    # snapshot has its waiting call open; the finished tree's spans are all closed.
    started: list[str] = []
    called, gate = trio.Event(), trio.Event()
    helper = ta.Agent(
        name="helper",
        instructions="test",
        model=ScriptedModel([Turn(tool_calls=[("wait", {})])], default=Turn(text="found")),
        tools=[_waiting(started, gate, called)],
    )
    boss = ScriptedModel([Turn(tool_calls=[("helper", {"input": "look"})])], default="done")
    agents = {"a": ta.Agent(name="a", instructions="test", model=boss, tools=[helper.as_tool()])}
    with trio.fail_after(60):
        async with open_host(agents) as host:
            run_id = await host.start(ALICE, _start())
            await called.wait()
            live = await run_timeline(host, "alice", run_id)
            gate.set()
            await host.wait_terminal("alice", run_id)
            done = await run_timeline(host, "alice", run_id)
            await _refused("not_found", lambda: run_timeline(host, "bob", run_id))
    assert live.root_id == done.root_id == run_id
    assert span_problems(live, closed=False) == []
    # Open: the root; its call and below it the child and the child's call, as far as
    # the host serves them yet (a node reading another node's persisted log lags it).
    open_spans = {(s.kind, s.name) for s in live.spans if s.end is None}
    assert ("run", "a") in open_spans
    assert open_spans <= {("run", "a"), ("tool", "helper"), ("run", "helper"), ("tool", "wait")}
    assert span_problems(done, closed=True) == []
    assert sorted((s.kind, s.name, s.status) for s in done.spans) == [
        ("model", "ScriptedModel", "completed"),
        ("model", "ScriptedModel", "completed"),
        ("model", "ScriptedModel", "completed"),
        ("model", "ScriptedModel", "completed"),
        ("run", "a", "completed"),
        ("run", "helper", "completed"),
        ("tool", "helper", "ok"),
        ("tool", "wait", "ok"),
    ]


async def test_a_runs_record_carries_its_exact_usage_on_every_host(open_host: OpenHost) -> None:
    # Before: a root run's record answered from another node's row (cluster-routed)
    # had no usage; the node running it reported it.
    first = ta.Usage(100, 7, "m", cache_read_tokens=40, cost=Decimal("0.000123"))
    second = ta.Usage(30, 2, "m", cache_write_tokens=10, cost=Decimal("0.0000071"))
    called, gate = trio.Event(), trio.Event()
    model = ScriptedModel(
        [Turn(tool_calls=[("wait", {})], usage=first), Turn(text="ok", usage=second)]
    )
    with trio.fail_after(60):
        async with open_host(_agents(model, _waiting([], gate, called))) as host:
            run_id = await host.start(ALICE, _start())
            # Once the tool's start is seen (persisted, on a cluster), so is the
            # first call's usage, reported before it.
            async with host.events("alice", run_id) as events:
                async for hosted in events:
                    if hosted.event["type"] == "tool.started":
                        break
            live = await host.get("alice", run_id)
            gate.set()
            terminal = await host.wait_terminal("alice", run_id)
            info = await host.get("alice", run_id)
            (listed,) = await host.list("alice")
    assert live.usage == first
    total = first + second
    assert total.cost == Decimal("0.0001301")  # exact: no float on the way
    assert terminal.usage == info.usage == listed.usage == total
