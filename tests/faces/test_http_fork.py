"""``POST /sessions/{id}/fork`` (DESIGN §23) against a real server (Hypercorn on
loopback, httpx clients), with in-memory sessions and with a real SQLite file: what the
fork holds (an item index, an event position of an ended run, all), a run continuing
from it, a fork taken while a run is live, principal isolation, hostile ids and
bodies, and the same op over the websocket channel (``ControlClient.fork_session``)."""

from __future__ import annotations

import json
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

import trio_agents as ta
from tests.support.http_support import client, messages, serving
from trio_agents import ToolCall, ToolResult, UserMessage, conversation_problems
from trio_agents.control import ControlError, connect
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import SQLiteSession

pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)\._[^']*' was garbage collected:ResourceWarning"
)


@ta.function_tool
async def look(q: str) -> str:
    """Look it up."""
    await trio.lowlevel.checkpoint()
    return f"seen {q}"


def _agents(release: trio.Event | None = None) -> dict[str, ta.Agent]:
    @ta.function_tool
    async def hold() -> str:
        """Hold until released."""
        assert release is not None
        await release.wait()
        return "released"

    tool_user = ta.Agent(
        name="tools",
        model=ScriptedModel(
            [], default=Turn(text="ok", tool_calls=[("look", {"q": "a"}), ("look", {"q": "b"})])
        ),
        tools=[look],
        max_turns=1,
    )
    talker = ta.Agent(name="talker", model=ScriptedModel([], default="answered"))
    holder = ta.Agent(
        name="holder",
        model=ScriptedModel([Turn(tool_calls=[("hold", {})])], default="held"),
        tools=[hold],
    )
    return {"tools": tool_user, "talker": talker, "holder": holder}


async def _run(http: httpx.AsyncClient, agent: str, session_id: str, text: str) -> list[Any]:
    """Start a run in the session, follow it to its end; its events."""
    body = {"agent": agent, "input": text, "session_id": session_id, "subscribe": "all"}
    async with http.stream("POST", "/runs", json=body) as answer:
        assert answer.status_code == 200, await answer.aread()
        return [m.data["event"] async for m in messages(answer)]


async def _fork(http: httpx.AsyncClient, session_id: str, **body: Any) -> httpx.Response:
    return await http.post(f"/sessions/{session_id}/fork", json=body)


async def _items(path: Path, principal: str, session_id: str) -> list[ta.Item]:
    async with SQLiteSession(path, json.dumps([principal, session_id])) as sqlite:
        return await sqlite.get_stored_items()


@pytest.fixture(params=["memory", "sqlite"])
def sessions(request: pytest.FixtureRequest, tmp_path: Path) -> Path | None:
    return None if request.param == "memory" else tmp_path / "sessions.db"


async def test_fork_at_an_index_an_event_and_all(sessions: Path | None) -> None:
    async with serving(_agents(), sessions=sessions) as served, client(served.base) as alice:
        events = await _run(alice, "tools", "s1", "go")
        assert events[-1]["status"] == "failed"  # max_turns: its calls are answered
        items_events = [e for e in events if e["type"] == "run.item"]
        whole = await _fork(alice, "s1", new_session_id="all")
        assert whole.status_code == 201, whole.text
        assert whole.json() == {"session_id": "all", "items": len(items_events)}
        # An index inside the parallel calls' group is rounded down before it.
        first_call = next(
            i for i, e in enumerate(items_events) if e["item"].get("type") == "function_call"
        )
        inside = await _fork(alice, "s1", new_session_id="inside", at=first_call + 1)
        assert inside.json() == {"session_id": "inside", "items": first_call}
        # An event position: what the session held once that run.item was applied.
        user_event = items_events[0]
        at_event = await _fork(
            alice,
            "s1",
            new_session_id="ev",
            at={"run_id": user_event["run_id"], "seq": user_event["seq"]},
        )
        assert at_event.json() == {"session_id": "ev", "items": 1}
        # A run continues from the fork: its conversation starts with the fork's items.
        follow = await _run(alice, "talker", "inside", "and then?")
        assert follow[-1]["status"] == "completed"
        if sessions is not None:
            original = await _items(sessions, "alice", "s1")
            assert len(original) == len(items_events)  # untouched
            forked = await _items(sessions, "alice", "inside")
            assert forked[:first_call] == original[:first_call]
            assert forked[first_call] == UserMessage("and then?")
            assert conversation_problems(forked) == []
            assert await _items(sessions, "alice", "all") == original


async def test_fork_of_a_session_with_a_live_run_is_a_snapshot(sessions: Path | None) -> None:
    release = trio.Event()
    async with serving(_agents(release), sessions=sessions) as served, client(served.base) as alice:
        started = await alice.post(
            "/runs", json={"agent": "holder", "input": "wait", "session_id": "live"}
        )
        run_id = started.json()["run_id"]
        async with (
            alice.stream("GET", f"/runs/{run_id}/events") as stream,
            aclosing(messages(stream)) as received,
        ):
            async for message in received:
                if message.type == "tool.started":
                    break
        snap = await _fork(alice, "live", new_session_id="snap")
        assert snap.status_code == 201, snap.text
        assert snap.json()["items"] == 1  # the input; the open call is left out
        # An event position of a run that has not ended is refused, clearly.
        early = await _fork(alice, "live", new_session_id="x", at={"run_id": run_id, "seq": 1})
        assert early.status_code == 400
        assert "has not ended" in early.json()["error"]["message"]
        release.set()
        done = await alice.post(f"/runs/{run_id}/cancel?wait=1", json={})
        assert done.status_code in (200, 409)
        if sessions is not None:
            assert await _items(sessions, "alice", "snap") == [UserMessage("wait")]
            live = await _items(sessions, "alice", "live")
            assert isinstance(live[1], ToolCall)
            assert isinstance(live[2], ToolResult)


async def test_another_principals_session_is_not_found_as_an_unknown_one(
    sessions: Path | None,
) -> None:
    async with (
        serving(_agents(), sessions=sessions) as served,
        client(served.base) as alice,
        client(served.base, token="tok-bob") as bob,
    ):
        await _run(alice, "talker", "s1", "mine")
        theirs = await _fork(bob, "s1", new_session_id="stolen")
        unknown = await _fork(alice, "s1x", new_session_id="x")
        assert theirs.status_code == unknown.status_code == 404
        assert theirs.json()["error"]["code"] == unknown.json()["error"]["code"] == "not_found"
        assert theirs.json()["error"]["message"] == "no session 's1'"
        # Bob's own fork into "s2" and Alice's are different sessions.
        await _run(bob, "talker", "b1", "bob's")
        assert (await _fork(bob, "b1", new_session_id="s2")).status_code == 201
        assert (await _fork(alice, "s1", new_session_id="s2")).status_code == 201
        # A second fork into an id that holds items never overwrites it.
        again = await _fork(alice, "s1", new_session_id="s2")
        assert again.status_code == 400
        assert "never overwrites" in again.json()["error"]["message"]
        # Into a session with an active run: busy.
        release_started = await alice.post(
            "/runs", json={"agent": "holder", "input": "w", "session_id": "busy"}
        )
        assert release_started.status_code == 201
        busy = await _fork(alice, "s1", new_session_id="busy")
        assert busy.status_code == 409, busy.text
        assert busy.json()["error"]["code"] == "session_busy"


@pytest.mark.parametrize(
    "body",
    [
        [],
        {},
        {"new_session_id": ""},
        {"new_session_id": 5},
        {"new_session_id": "n", "at": -1},
        {"new_session_id": "n", "at": True},
        {"new_session_id": "n", "at": 1.5},
        {"new_session_id": "n", "at": "3"},
        {"new_session_id": "n", "at": {"run_id": "r"}},
        {"new_session_id": "n", "at": {"run_id": "r", "seq": -1}},
        {"new_session_id": "n", "at": {"run_id": "r", "seq": 1, "x": 1}},
        {"new_session_id": "n", "at": 2**53},
        {"new_session_id": "n", "extra": 1},
        {"new_session_id": "n", "session_id": "other"},
        {"new_session_id": "a\x00b"},
        {"new_session_id": "x" * 100_000},
    ],
)
async def test_bad_bodies_are_invalid_requests(body: Any) -> None:
    async with serving(_agents()) as served, client(served.base) as alice:
        await _run(alice, "talker", "s1", "hi")
        answer = await alice.post("/sessions/s1/fork", json=body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "invalid_request"


async def test_hostile_ids_in_the_path_and_raw_json() -> None:
    async with serving(_agents()) as served, client(served.base) as alice:
        await _run(alice, "talker", "s1", "hi")
        for raw in (
            b'{"new_session_id": "\\ud800"}',
            b'{"new_session_id": "ok", "at": {"run_id": "\\udfff", "seq": 1}}',
        ):
            answer = await alice.post(
                "/sessions/s1/fork", content=raw, headers={"Content-Type": "application/json"}
            )
            assert answer.status_code == 400
        for path in ("/sessions/%00/fork", "/sessions/" + "x" * 5000 + "/fork"):
            answer = await alice.post(path, json={"new_session_id": "n"})
            assert answer.status_code == 400, (path[:40], answer.text)
        unknown_run = await _fork(alice, "s1", new_session_id="n", at={"run_id": "no", "seq": 1})
        assert unknown_run.status_code == 404
        # The server still serves.
        assert (await _fork(alice, "s1", new_session_id="n")).status_code == 201


async def test_the_same_op_over_the_websocket_channel(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    async with serving(_agents(), sessions=path) as served, client(served.base) as alice_http:
        await _run(alice_http, "tools", "s1", "go")
        async with connect(served.ws_url, token="tok-alice") as alice:
            assert await alice.fork_session("s1", "w1", at=1) == 1
            with pytest.raises(ControlError) as caught:
                await alice.fork_session("s1", "w1")
            assert caught.value.code == "invalid_request"
        async with connect(served.ws_url, token="tok-bob") as bob:
            with pytest.raises(ControlError) as caught:
                await bob.fork_session("s1", "w2")
            assert caught.value.code == "not_found"
        assert await _items(path, "alice", "w1") == [UserMessage("go")]
