"""``GET /runs/{id}/timeline`` (DESIGN §23) against a real server (Hypercorn on loopback,
httpx clients): a live tree's snapshot, the cancelled tree's closed spans, the same
timeline the run tree's served events give, and another principal's run not found."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.http_support import client, messages, serving, start
from tests.support.timeline_checks import span_problems
from trio_agents.models import ModelEvent, ScriptedModel, TextDelta, Turn

# A client that leaves an SSE stream mid-way abandons httpx's nested body generators;
# they are finalized by the garbage collector and Trio warns (CONVENTIONS, "httpx
# aiter_lines()"). Exactly those warnings, nothing else.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)\._[^']*' was garbage collected:ResourceWarning"
)


class _Stalls:
    """A model that streams a few words, then never another (until cancelled)."""

    def stream(self, request: ta.ModelRequest) -> AbstractAsyncContextManager[AsyncIterator[Any]]:
        return self._stream()

    @asynccontextmanager
    async def _stream(self) -> AsyncIterator[AsyncIterator[ModelEvent]]:
        async def events() -> AsyncIterator[ModelEvent]:
            yield TextDelta("first words ")
            await trio.sleep_forever()

        yield events()


@ta.function_tool
async def wait_forever() -> str:
    """Wait until the run is cancelled."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def _tree() -> ta.Agent:
    streamer = ta.Agent(name="streamer", model=_Stalls())
    return ta.Agent(
        name="boss",
        model=ScriptedModel(
            [],
            default=Turn(
                "delegating",
                tool_calls=[("streamer", {"input": "go"}), ("wait_forever", {})],
                usage=ta.Usage(30, 4),
            ),
        ),
        tools=[streamer.as_tool(), wait_forever],
    )


async def _tree_events(http: Any, run_id: str) -> list[dict[str, Any]]:
    """The tree's events as its SSE stream serves them, to its end."""
    async with http.stream("GET", f"/runs/{run_id}/events", params={"tree": 1}) as response:
        return [message.data["event"] async for message in messages(response)]


async def test_timeline_of_a_live_then_cancelled_tree() -> None:
    async with serving({"boss": _tree()}) as served, client(served.base) as alice:
        run_id = await start(alice, "boss")
        # Follow the tree until the child streams and the root's other tool runs.
        async with (
            alice.stream("GET", f"/runs/{run_id}/events", params={"tree": 1}) as events,
            aclosing(messages(events)) as stream,
        ):
            streamed = started = False
            async for message in stream:
                event = message.data["event"]
                streamed |= event["type"] == "response.text.delta" and event["run_id"] != run_id
                started |= event["type"] == "tool.started" and event["name"] == "wait_forever"
                if streamed and started:
                    break
        live = (await alice.get(f"/runs/{run_id}/timeline")).json()["timeline"]
        assert live["root_id"] == run_id
        running = sorted((s["kind"], s["name"]) for s in live["spans"] if s["end"] is None)
        assert running == [
            ("model", "model"),  # the child's call, cut mid-stream: no usage yet
            ("run", "boss"),
            ("run", "streamer"),
            ("tool", "streamer"),
            ("tool", "wait_forever"),
        ]
        assert {s["status"] for s in live["spans"] if s["end"] is None} == {"running"}
        (root_call,) = [s for s in live["spans"] if s["kind"] == "model" and s["end"]]
        assert root_call["usage"] == {
            "input_tokens": 30,
            "output_tokens": 4,
            "model": "ScriptedModel",
        }
        answer = await alice.post(f"/runs/{run_id}/cancel?wait=1", json={"reason": "stop"})
        assert answer.json()["run"]["status"] == "cancelled"
        body = (await alice.get(f"/runs/{run_id}/timeline")).json()["timeline"]
        # The same timeline as the tree's served events give, and every span closed.
        served_events = await _tree_events(alice, run_id)
        derived = ta.timeline(served_events, names={run_id: "boss"})
        assert json.loads(json.dumps(derived.to_json())) == body
        assert span_problems(derived, closed=True) == []
        statuses = sorted((s["kind"], s["name"], s["status"]) for s in body["spans"])
        assert statuses == [
            ("model", "ScriptedModel", "completed"),
            ("model", "model", "cancelled"),
            ("run", "boss", "cancelled"),
            ("run", "streamer", "cancelled"),
            ("tool", "streamer", "cancelled"),
            ("tool", "wait_forever", "cancelled"),
        ]
        # A child's own timeline is its subtree.
        (child,) = [s for s in body["spans"] if s["kind"] == "run" and s["parent_id"]]
        sub = (await alice.get(f"/runs/{child['id']}/timeline")).json()["timeline"]
        assert sub["root_id"] == child["id"]
        assert sorted(s["kind"] for s in sub["spans"]) == ["model", "run"]


async def test_timeline_of_a_finished_run_and_of_unknown_runs() -> None:
    async with (
        serving() as served,
        client(served.base) as alice,
        client(served.base, "tok-bob") as bob,
    ):
        run_id = await start(alice, "talker")
        async with alice.stream("GET", f"/runs/{run_id}/events") as events:
            async for _ in messages(events):
                pass
        answer = await alice.get(f"/runs/{run_id}/timeline")
        assert answer.status_code == 200
        spans = answer.json()["timeline"]["spans"]
        assert [(s["kind"], s["status"]) for s in spans] == [
            ("run", "completed"),
            ("model", "completed"),
        ]
        for who, path in [(bob, f"/runs/{run_id}"), (alice, "/runs/nope")]:
            missing = await who.get(f"{path}/timeline")
            assert missing.status_code == 404
            assert missing.json()["error"]["code"] == "not_found"
