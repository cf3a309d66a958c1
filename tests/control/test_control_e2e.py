"""End to end over real loopback sockets: the server, the wire, the Python client."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import trio
import trio.testing
from trio_websocket import ConnectionClosed, ConnectionRejected

import trio_agents as ta
from tests.support.control_support import ask, memory_client, raw_client, serving, wait_until
from trio_agents.control import (
    ControlConnectionError,
    ControlError,
    ControlServer,
    Limits,
    connect,
)
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import MemorySession, Session


def agent_of(model: ScriptedModel, *tools: ta.Tool, name: str = "a") -> ta.Agent:
    return ta.Agent(name=name, instructions="test", model=model, tools=list(tools))


async def test_start_stream_inject_and_complete() -> None:
    model = ScriptedModel([Turn(text="one two three four", delay=0.05), "final answer"])
    with trio.fail_after(20):
        async with (
            serving({"a": agent_of(model)}) as (_, url),
            connect(url, token="tok-alice") as client,
        ):
            run = await client.start("a", "hello", session_id="s1")
            injected = None
            events: list[ta.RunEvent] = []
            async for event in run.events():
                events.append(event)
                if isinstance(event, ta.ResponseTextDelta) and injected is None:
                    injected = await run.inject("and also this")
            terminal = await run.wait()
    assert terminal.status == "completed"
    seqs = [e.seq for e in events]
    assert seqs == list(range(1, len(events) + 1))
    assert isinstance(events[-1], ta.RunUpdated)
    assert events[-1] == terminal
    assert injected is not None
    assert any(isinstance(e, ta.InboxInjected) and e.injection_id == injected for e in events)
    assert any(isinstance(e, ta.InboxDelivered) and e.injection_id == injected for e in events)
    texts = [e.text for e in events if isinstance(e, ta.ResponseTextDelta)]
    assert "".join(texts) == "one two three fourfinal answer"


async def test_cancel_mid_tool_reaches_the_tool() -> None:
    tool_started = trio.Event()
    tool_cancelled = trio.Event()

    @ta.function_tool
    async def slow(x: int) -> int:
        """Sleep for an hour."""
        tool_started.set()
        try:
            await trio.sleep(3600)
        except trio.Cancelled:
            tool_cancelled.set()
            raise
        return x

    model = ScriptedModel([Turn(tool_calls=[("slow", {"x": 1})])])
    with trio.fail_after(20):
        async with (
            serving({"a": agent_of(model, slow)}) as (_, url),
            connect(url, token="tok-alice") as client,
        ):
            run = await client.start("a", "go")
            async for event in run.events():
                if isinstance(event, ta.ToolStarted):
                    await run.cancel("user pressed stop")
            terminal = await run.wait()
            info = await run.get()
    assert tool_started.is_set()
    assert tool_cancelled.is_set()
    assert (terminal.status, terminal.reason) == ("cancelled", "user pressed stop")
    assert (info.status, info.reason) == ("cancelled", "user pressed stop")


async def test_approve_and_reject_over_the_wire() -> None:
    @ta.function_tool(needs_approval=True)
    async def transfer(amount: int) -> str:
        """Move money."""
        return f"moved {amount}"

    model = ScriptedModel(
        [
            Turn(tool_calls=[("transfer", {"amount": 1}), ("transfer", {"amount": 2})]),
            "done",
        ]
    )
    with trio.fail_after(20):
        async with (
            serving({"a": agent_of(model, transfer)}) as (_, url),
            connect(url, token="tok-alice") as client,
        ):
            run = await client.start("a", "pay")
            async for update in run.updated:
                if update.status == "awaiting_approval":
                    pending = list(update.detail["pending"])
                    assert (await run.get()).pending_approvals == tuple(pending)
                    with pytest.raises(ControlError) as unknown:
                        await run.approve("nope")
                    assert unknown.value.code == "not_found"
                    await run.approve(pending[0])
                    await run.reject(pending[1], message="too much")
            events = [e async for e in run.events(1)]
    results = {
        e.item.call_id: e.item
        for e in events
        if isinstance(e, ta.RunItemEvent) and isinstance(e.item, ta.ToolResult)
    }
    assert results[pending[0]].status == "ok"
    assert results[pending[0]].output == "moved 1"
    assert results[pending[1]].status == "error"
    assert "too much" in results[pending[1]].output
    assert events[-1].status == "completed"  # type: ignore[union-attr]


async def test_cancel_by_session_and_session_errors() -> None:
    model = ScriptedModel([], default=Turn(text="x " * 1000, delay=0.05))
    with trio.fail_after(20):
        async with (
            serving({"a": agent_of(model)}) as (_, url),
            connect(url, token="tok-alice") as client,
        ):
            run = await client.start("a", "hi", session_id="s1")
            with pytest.raises(ControlError) as busy:
                await client.start("a", "again", session_id="s1")
            assert busy.value.code == "session_busy"
            assert await client.cancel_session("s1", "stop it") == run.id
            terminal = await run.wait()
            assert (terminal.status, terminal.reason) == ("cancelled", "stop it")
            with pytest.raises(ControlError) as none:
                await client.cancel_session("s1")
            assert none.value.code == "no_active_run"
            with pytest.raises(ta.RunClosedError) as closed:
                await run.inject("too late")
            assert closed.value.status == "cancelled"
            # the session is free again, and "interrupt" supersedes a running one
            second = await client.start("a", "next", session_id="s1")
            third = await client.start("a", "newer", session_id="s1", on_busy="interrupt")
            assert (await second.wait()).reason == "superseded"
            await third.cancel("done")
            assert (await third.wait()).status == "cancelled"


async def test_on_disconnect_cancel_closes_the_model_stream() -> None:
    model = ScriptedModel([Turn(text="y " * 10000, delay=0.05)])
    with trio.fail_after(20):
        async with serving({"a": agent_of(model)}) as (server, url):
            async with connect(url, token="tok-alice") as client:
                run = await client.start("a", "hi", on_disconnect="cancel")
                async for event in run.events():
                    if isinstance(event, ta.ResponseTextDelta):
                        break
                assert model.open_streams == 1
            async with connect(url, token="tok-alice") as other:
                terminal = await other.attach(run.id).wait()
            assert (terminal.status, terminal.reason) == ("cancelled", "client disconnected")
            assert model.open_streams == 0
            assert server.statistics().active_runs == 0


async def test_on_disconnect_continue_and_replay_from_a_seq() -> None:
    model = ScriptedModel([Turn(text="a b c d e f g h", delay=0.05)])
    with trio.fail_after(20):
        async with serving({"a": agent_of(model)}) as (_, url):
            seen: list[ta.RunEvent] = []
            async with connect(url, token="tok-alice") as client:
                run = await client.start("a", "hi")
                async for event in run.events():
                    seen.append(event)
                    if isinstance(event, ta.ResponseTextDelta):
                        break
            async with connect(url, token="tok-alice") as again:
                resumed = again.attach(run.id)
                rest = [e async for e in resumed.events(seen[-1].seq + 1)]
                everything = [e async for e in resumed.events(0)]
    assert rest[-1].status == "completed"  # type: ignore[union-attr]
    assert [e.seq for e in seen + rest] == list(range(1, len(seen) + len(rest) + 1))
    assert everything == seen + rest


async def test_security_tokens_principals_and_origins() -> None:
    # The runs stream for an hour: they are live whenever the test acts on them (a
    # 50 ms turn could end before bob's cancel on a busy machine), and cancelled at the end.
    model = ScriptedModel([], default=Turn(text="z", delay=3600))
    with trio.fail_after(20):
        async with serving({"a": agent_of(model)}, allowed_origins=["https://ok.example"]) as (
            _,
            url,
        ):
            for token, headers in [
                (None, []),
                ("wrong", []),
                ("tok-alicex", []),
                (None, [(b"Authorization", b"Basic tok-alice")]),
            ]:
                with pytest.raises(ConnectionRejected) as rejected:
                    async with raw_client(url, token=token, headers=headers):
                        pass  # pragma: no cover
                assert rejected.value.status_code == 401
            with pytest.raises(ControlConnectionError) as bad:
                async with connect(url, token="wrong"):
                    pass  # pragma: no cover
            assert (bad.value.code, bad.value.status_code) == ("rejected", 401)
            with pytest.raises(ConnectionRejected) as origin:
                async with raw_client(url, headers=[(b"Origin", b"https://evil.example")]):
                    pass  # pragma: no cover
            assert origin.value.status_code == 403
            async with raw_client(url, headers=[(b"Origin", b"https://ok.example")]) as ws:
                assert (await ask(ws, {"id": 1, "op": "runs.list"}))["type"] == "ack"
            with pytest.raises(ConnectionRejected) as subprotocol:
                async with raw_client(url, subprotocols=["other"]):
                    pass  # pragma: no cover
            assert subprotocol.value.status_code == 400

            async with (
                connect(url, token="tok-alice") as alice,
                connect(url, token="tok-bob") as bob,
            ):
                run = await alice.start("a", "secret", session_id="s1")
                theirs = bob.attach(run.id)
                for verb in (
                    theirs.get(),
                    theirs.cancel(),
                    theirs.inject("x"),
                    theirs.approve("c"),
                ):
                    with pytest.raises(ControlError) as hidden:
                        await verb
                    assert hidden.value.code == "not_found"
                with pytest.raises(ControlError) as subscribe:
                    await theirs.wait()
                assert subscribe.value.code == "not_found"
                assert await bob.list_runs() == []
                # session ids are per principal: bob's "s1" is another session
                bobs = await bob.start("a", "mine", session_id="s1")
                with pytest.raises(ControlError) as no_run:
                    await bob.cancel_session("s2")
                assert no_run.value.code == "no_active_run"
                await bobs.cancel()
                await run.cancel()
                assert [r.run_id for r in await alice.list_runs()] == [run.id]


async def test_slow_reader_is_cut_off_fast_reader_gets_everything(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A client that stops reading is cut after send_timeout; one that reads gets every
    event. Over lockstep in-memory streams on a MockClock: the slow client backs the
    server up at once, and virtual time only moves when every task waits, so the fast
    reader can never be the one that looks slow (on loopback sockets under load it
    sometimes was)."""
    chunk = "x" * 4096
    model = ScriptedModel([Turn(text=[chunk] * 300)])
    limits = Limits(send_timeout=0.5, ping_interval=None)
    with trio.fail_after(60):  # virtual seconds: a hang fails at once, deterministically
        async with (
            serving({"a": agent_of(model)}, limits=limits) as (server, _),
            memory_client(server) as fast,
            memory_client(server) as slow,
        ):
            # the slow client starts the run, subscribed, and never reads again
            ack = await ask(
                slow, {"id": 1, "op": "run.start", "agent": "a", "input": "go", "subscribe": "all"}
            )
            assert ack["type"] == "ack"
            assert server.statistics().connections == 2
            sub = await ask(
                fast, {"id": 2, "op": "run.subscribe", "run_id": ack["run_id"], "from_seq": 1}
            )
            assert sub["type"] == "ack"
            events: list[dict[str, Any]] = []
            while not (
                events
                and events[-1]["type"] == "run.updated"
                and events[-1]["status"] in ("completed", "failed", "cancelled")
            ):
                frame = json.loads(await fast.get_message())
                assert frame["type"] == "event", frame
                events.append(frame["event"])
            await wait_until(lambda: server.statistics().connections == 1)
            info = await ask(fast, {"id": 3, "op": "run.get", "run_id": ack["run_id"]})
            slow_got = await messages_until_closed(slow)  # what it had buffered, then the cut
    assert slow_got < 10
    assert info["run"]["status"] == "completed"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert sum(1 for e in events if e["type"] == "response.text.delta") == 300
    assert trio.current_time() >= 0.5  # cut by the send timeout, in virtual time


async def messages_until_closed(ws: Any) -> int:
    """Read until the connection is closed; return how many messages came first."""
    count = 0
    try:
        while True:
            await ws.get_message()
            count += 1
    except ConnectionClosed:
        return count


class RecordingSessions:
    def __init__(self) -> None:
        self.sessions: dict[tuple[str, str], MemorySession] = {}

    def __call__(self, principal: str, session_id: str) -> Session:
        key = (principal, session_id)
        if key not in self.sessions:
            self.sessions[key] = MemorySession(session_id)
        return self.sessions[key]


async def test_shutdown_cancels_runs_persists_sessions_and_closes_1001() -> None:
    @ta.function_tool
    async def forever() -> str:
        """Never returns."""
        await trio.sleep(math.inf)
        return "unreachable"  # pragma: no cover

    model = ScriptedModel([], default=Turn(tool_calls=[("forever", {})]))
    sessions = RecordingSessions()
    server = ControlServer({"a": agent_of(model, forever)}, auth={"t": "p"}, sessions=sessions)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            scope = trio.CancelScope()

            async def serve(*, task_status: trio.TaskStatus[int]) -> None:
                with scope:
                    await server.serve("127.0.0.1", 0, task_status=task_status)

            port = await nursery.start(serve)
            async with connect(f"ws://127.0.0.1:{port}/", token="t") as client:
                runs = [await client.start("a", "go", session_id=f"s{i}") for i in range(3)]
                for run in runs:
                    async for event in run.events():
                        if isinstance(event, ta.ToolStarted):
                            break
                scope.cancel()
                terminals = [await run.wait() for run in runs]
                with pytest.raises(ControlConnectionError) as closed:
                    await wait_forever_for_close(client)
    assert scope.cancelled_caught  # serve() re-raised the cancellation
    assert closed.value.close_code == 1001
    assert {(t.status, t.reason) for t in terminals} == {("cancelled", "server shutdown")}
    assert len(sessions.sessions) == 3
    for session in sessions.sessions.values():
        items = await session.get_items()
        assert ta.conversation_problems(items) == []
        results = [i for i in items if isinstance(i, ta.ToolResult)]
        assert [(r.status, r.output) for r in results] == [
            ("cancelled", "cancelled: server shutdown")
        ]


async def wait_forever_for_close(client: object) -> None:
    from trio_agents.control import ControlClient

    assert isinstance(client, ControlClient)
    while True:
        await client.list_runs()
        await trio.sleep(0.01)


async def test_sqlite_sessions_by_path_are_per_principal(tmp_path: object) -> None:
    import json as _json
    import os

    from trio_agents.sessions import SQLiteSession

    path = os.path.join(str(tmp_path), "sessions.sqlite3")
    model = ScriptedModel([], default=Turn(text="stored"))
    with trio.fail_after(20):
        async with (
            serving({"a": agent_of(model)}, sessions=path) as (_, url),
            connect(url, token="tok-alice") as alice,
            connect(url, token="tok-bob") as bob,
        ):
            await (await alice.start("a", "from alice", session_id="s1")).wait()
            await (await bob.start("a", "from bob", session_id="s1")).wait()
    async with SQLiteSession(path, _json.dumps(["alice", "s1"])) as stored:
        items = await stored.get_items()
    assert items[0] == ta.UserMessage("from alice")
    assert items[-1] == ta.AssistantMessage("stored")
    assert len(items) == 2


class _ForwarderSteps(trio.abc.Instrument):
    """Counts the task steps of the connections' subscription forwarders."""

    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if task.name.endswith("Connection._forward"):
            self.steps += 1


@pytest.mark.parametrize("queue_size", [256, 8])
async def test_a_subscription_forwards_a_backlog_in_few_steps_within_the_bound(
    queue_size: int, autojump_clock: trio.testing.MockClock
) -> None:
    # The forwarder reads run.events().batches() and queues each batch without a
    # schedule point while the outbound queue has room: a backlog of 200 deltas takes a
    # few task steps, not one per event. A full queue still makes it wait (the bound
    # holds, with a lockstep client), and every frame arrives, in order.
    model = ScriptedModel([Turn(text=["x"] * 200)])
    limits = Limits(outbound_queue_size=queue_size, ping_interval=None)
    counter = _ForwarderSteps()
    with trio.fail_after(60):
        async with (
            serving({"a": agent_of(model)}, limits=limits) as (server, _),
            memory_client(server) as client,
        ):
            ack = await ask(client, {"id": 1, "op": "run.start", "agent": "a", "input": "go"})
            await trio.testing.wait_all_tasks_blocked()  # the run is over: a backlog
            info = await ask(client, {"id": 2, "op": "run.get", "run_id": ack["run_id"]})
            assert info["run"]["status"] == "completed"
            trio.lowlevel.add_instrument(counter)
            try:
                sub = await ask(client, {"id": 3, "op": "run.subscribe", "run_id": ack["run_id"]})
                assert sub["type"] == "ack"
                events: list[dict[str, Any]] = []
                while (
                    not events
                    or events[-1]["type"] != "run.updated"
                    or events[-1]["status"] != "completed"
                ):
                    frame = json.loads(await client.get_message())
                    assert frame["type"] == "event", frame
                    events.append(frame["event"])
            finally:
                trio.lowlevel.remove_instrument(counter)
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert sum(1 for e in events if e["type"] == "response.text.delta") == 200
    if queue_size > len(events):
        assert counter.steps <= 5, counter.steps
    else:
        assert counter.steps >= len(events) // queue_size  # it waited for room
