"""``POST /runs/{id}/replay`` (DESIGN §23) against a real server (Hypercorn on loopback,
httpx clients) whose agents' model is an OpenAI Chat Completions model on a loopback
wire server: a recorded ``model.request`` sent again to a served agent's model is the
same HTTP request body, byte for byte, and its response is answered; another
principal's run is not found; an event that is no recorded request, an unknown agent
and a malformed body are refused; a client that leaves cancels the model call."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import trio

import trio_agents as ta
from tests.support.http_support import client, messages, serving, start
from tests.support.provider_wires import WIRES
from tests.support.sse_server import Reply, SSEServer
from trio_agents.faces import HttpLimits
from trio_agents.models import OpenAIChatModel

CHAT = WIRES["chat"]


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    # The model talks to a loopback server: no proxy or key from the machine leaks in.
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


@pytest.fixture
async def wire(nursery: trio.Nursery) -> SSEServer:
    server = SSEServer()
    await nursery.start(server.serve)
    return server


def _agents(wire: SSEServer) -> dict[str, ta.Agent]:
    return {
        "weather": ta.Agent(
            name="weather",
            instructions="Answer with the weather.",
            model=CHAT.model(wire),
            model_settings={"temperature": 0.25},
        ),
        # Another served agent, on another model name at the same provider.
        "critic": ta.Agent(
            name="critic", model=OpenAIChatModel("gpt-critic", base_url=f"{wire.base_url}/v1")
        ),
    }


async def _finished_events(http: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    async with http.stream("GET", f"/runs/{run_id}/events") as response:
        return [message.data["event"] async for message in messages(response)]


async def _recorded_run(http: httpx.AsyncClient) -> tuple[str, list[dict[str, Any]]]:
    run_id = await start(http, "weather", input="Weather in Oslo?")
    return run_id, await _finished_events(http, run_id)


async def _recorded_request(
    http: httpx.AsyncClient,
) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """A finished run that recorded its one model request: its id, its events and that
    request's ``model.request`` event."""
    run_id, events = await _recorded_run(http)
    (recorded,) = [e for e in events if e["type"] == "model.request"]
    return run_id, events, recorded


async def test_a_replay_sends_the_recorded_request_again_and_answers_the_response(
    wire: SSEServer,
) -> None:
    wire.add(CHAT.text("It is ", "sunny."))
    async with (
        serving(_agents(wire), run_options={"record_requests": True}) as served,
        client(served.base) as alice,
    ):
        run_id, events, recorded = await _recorded_request(alice)
        assert recorded["request"] is not None
        wire.add(CHAT.text("Still ", "sunny", "."))
        answer = await alice.post(
            f"/runs/{run_id}/replay", json={"seq": recorded["seq"], "agent": "weather"}
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["run_id"] == run_id
        assert body["seq"] == recorded["seq"]
        assert body["turn"] == 1
        assert (body["agent"], body["model"], body["recorded_model"]) == (
            "weather",
            "gpt-test",
            "gpt-test",
        )
        assert body["response"] == {
            "text": "Still sunny.",
            "tool_calls": [],
            "usage": {"input_tokens": 9, "output_tokens": 3},
            "finish_reason": "stop",
        }
        # The very request the run sent, byte for byte.
        assert len(wire.requests) == 2
        assert wire.requests[1].body == wire.requests[0].body
        # Against another served agent's model: the same request, to that model.
        wire.add(CHAT.text("Cloudy."))
        other = await alice.post(
            f"/runs/{run_id}/replay", json={"seq": recorded["seq"], "agent": "critic"}
        )
        assert other.status_code == 200, other.text
        assert other.json()["model"] == "gpt-critic"
        assert other.json()["response"]["text"] == "Cloudy."
        sent = wire.requests[2].json
        assert sent["model"] == "gpt-critic"
        assert sent["messages"] == wire.requests[0].json["messages"]
        # Nothing else happened: no run was started, the run's log is as it was.
        assert [run["run_id"] for run in (await alice.get("/runs")).json()["runs"]] == [run_id]
        assert await _finished_events(alice, run_id) == events


async def test_refusals(wire: SSEServer) -> None:
    wire.add(CHAT.text("It is ", "sunny."))
    async with (
        serving(_agents(wire), run_options={"record_requests": True}) as served,
        client(served.base) as alice,
        client(served.base, "tok-bob") as bob,
    ):
        run_id, events, recorded = await _recorded_request(alice)
        seq = recorded["seq"]

        async def refused(who: httpx.AsyncClient, path: str, body: Any) -> tuple[int, str]:
            answer = await who.post(path, json=body)
            return answer.status_code, answer.json()["error"]["code"]

        replay = f"/runs/{run_id}/replay"
        # Another principal's run is one that does not exist, as on every route.
        assert await refused(bob, replay, {"seq": seq, "agent": "weather"}) == (404, "not_found")
        assert await refused(alice, "/runs/nope/replay", {"seq": 1, "agent": "weather"}) == (
            404,
            "not_found",
        )
        # An event that is no model.request, and one past the run's latest.
        assert events[0]["type"] != "model.request"
        assert await refused(alice, replay, {"seq": 1, "agent": "weather"}) == (
            400,
            "invalid_request",
        )
        assert await refused(alice, replay, {"seq": 10_000, "agent": "weather"}) == (
            400,
            "invalid_request",
        )
        # The model is a served agent's, by name: anything else is refused.
        assert await refused(alice, replay, {"seq": seq, "agent": "nobody"}) == (404, "not_found")
        for body in (
            {"seq": seq, "model": "openai:gpt-4o@http://10.0.0.1/v1"},
            {"seq": seq, "agent": "weather", "model": "openai:x"},
            {"seq": True, "agent": "weather"},
            {"seq": "4", "agent": "weather"},
            {"seq": 0, "agent": "weather"},
            {"agent": "weather"},
            {"seq": seq, "agent": ""},
            [seq, "weather"],
        ):
            assert await refused(alice, replay, body) == (400, "invalid_request"), body
        # No model was called by any of these.
        assert len(wire.requests) == 1


async def test_a_run_without_record_requests_has_nothing_to_replay(wire: SSEServer) -> None:
    wire.add(CHAT.text("It is ", "sunny."))
    async with serving(_agents(wire)) as served, client(served.base) as alice:
        run_id, events = await _recorded_run(alice)
        assert not [e for e in events if e["type"] == "model.request"]
        for event in events:
            answer = await alice.post(
                f"/runs/{run_id}/replay", json={"seq": event["seq"], "agent": "weather"}
            )
            assert answer.status_code == 400
            assert "not a model.request" in answer.json()["error"]["message"]


async def test_a_request_too_large_to_record_is_refused(wire: SSEServer) -> None:
    wire.add(CHAT.text("It is ", "sunny."))
    options = {"record_requests": True, "record_requests_max_bytes": 10}
    async with serving(_agents(wire), run_options=options) as served, client(served.base) as alice:
        run_id, _, recorded = await _recorded_request(alice)
        assert recorded["omitted"] == "too large"
        answer = await alice.post(
            f"/runs/{run_id}/replay", json={"seq": recorded["seq"], "agent": "weather"}
        )
        assert answer.status_code == 400
        assert "was not recorded (too large" in answer.json()["error"]["message"]
        assert len(wire.requests) == 1


async def test_a_client_that_leaves_cancels_the_replay(wire: SSEServer) -> None:
    wire.add(CHAT.text("It is ", "sunny."))
    # One stream per principal: the replay holds it while the model answers.
    limits = HttpLimits(max_streams_per_principal=1)
    async with (
        serving(_agents(wire), run_options={"record_requests": True}, limits=limits) as served,
        client(served.base) as alice,
    ):
        run_id, _, recorded = await _recorded_request(alice)
        wire.add(CHAT.held("Thinking"))  # the model answers a little, then never ends
        body = {"seq": recorded["seq"], "agent": "weather"}
        async with trio.open_nursery() as nursery:
            leaving = trio.CancelScope()

            async def replay_then_leave() -> None:
                with leaving:
                    async with client(served.base) as impatient:
                        await impatient.post(f"/runs/{run_id}/replay", json=body)
                    raise AssertionError("the held replay answered")

            nursery.start_soon(replay_then_leave)
            await wire.wait_for_requests(2)
            # While it runs, the replay counts against the principal's streams.
            busy = await alice.post(f"/runs/{run_id}/replay", json=body)
            assert busy.status_code == 429
            assert busy.json()["error"]["code"] == "limit_exceeded"
            leaving.cancel()  # the client closes its connection
        # The server cancelled the model call: it closed its connection to the model
        # (bounded only so that a regression fails instead of hanging).
        with trio.fail_after(30):
            await wire.connections[-1].closed.wait()
        # And the stream it held is free again.
        wire.add(CHAT.text("Fine."))
        again = await alice.post(f"/runs/{run_id}/replay", json=body)
        assert again.status_code == 200, again.text
        assert again.json()["response"]["text"] == "Fine."


async def test_a_replay_ends_when_the_server_shuts_down(wire: SSEServer) -> None:
    wire.add(CHAT.text("It is ", "sunny."))
    async with (
        serving(_agents(wire), run_options={"record_requests": True}) as served,
        client(served.base) as alice,
    ):
        run_id, _, recorded = await _recorded_request(alice)
        wire.add(CHAT.held("Thinking"))
        answers: list[httpx.Response] = []

        async def replay() -> None:
            body = {"seq": recorded["seq"], "agent": "weather"}
            answers.append(await alice.post(f"/runs/{run_id}/replay", json=body))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(replay)
            await wire.wait_for_requests(2)
            served.app.shutdown()
        (answer,) = answers
        assert answer.status_code == 503
        assert answer.json()["error"] == {
            "code": "internal",
            "message": "the server is shutting down",
        }
        with trio.fail_after(30):  # a bound only, so that a regression fails
            await wire.connections[-1].closed.wait()


async def test_a_model_that_fails_is_a_bad_gateway(wire: SSEServer) -> None:
    wire.add(CHAT.text("It is ", "sunny."))
    async with (
        serving(_agents(wire), run_options={"record_requests": True}) as served,
        client(served.base) as alice,
    ):
        run_id, _, recorded = await _recorded_request(alice)
        wire.add(Reply.json(400, CHAT.error_body("that model is gone")))
        answer = await alice.post(
            f"/runs/{run_id}/replay", json={"seq": recorded["seq"], "agent": "weather"}
        )
        assert answer.status_code == 502
        error = answer.json()["error"]
        assert error["code"] == "internal"
        assert error["message"].startswith("the model failed: ")
        assert "that model is gone" in error["message"]


async def test_a_request_past_the_runs_retention_is_refused(wire: SSEServer) -> None:
    wire.add(CHAT.text("It is ", "sunny."))
    # The log keeps the run's last 2 events only: its model.request is long gone.
    options = {"record_requests": True, "event_retention": 2}
    async with serving(_agents(wire), run_options=options) as served, client(served.base) as alice:
        run_id, events = await _recorded_run(alice)
        assert events[0]["type"] == "events.dropped"
        assert not [e for e in events if e["type"] == "model.request"]
        first_kept = events[1]["seq"]
        assert first_kept > 3
        for seq in range(1, first_kept):
            answer = await alice.post(
                f"/runs/{run_id}/replay", json={"seq": seq, "agent": "weather"}
            )
            assert answer.status_code == 400
            assert answer.json()["error"] == {
                "code": "invalid_request",
                "message": f"event {seq} of run {run_id} is no longer retained",
            }
        assert len(wire.requests) == 1


async def test_replays_are_rate_limited_per_principal(wire: SSEServer) -> None:
    """Each replay is a model call the server pays for: past ``replay_burst`` at once
    a principal's next replay is a 429 ``limit_exceeded`` (no model call), while
    another principal's bucket is its own."""
    wire.add(CHAT.text("It is sunny."))
    limits = HttpLimits(replay_burst=2, replay_rate=0.001)
    async with (
        serving(_agents(wire), run_options={"record_requests": True}, limits=limits) as served,
        client(served.base) as alice,
        client(served.base, "tok-bob") as bob,
    ):
        run_id, _, recorded = await _recorded_request(alice)
        body = {"seq": recorded["seq"], "agent": "weather"}
        for _ in range(2):
            wire.add(CHAT.text("Sunny."))
            assert (await alice.post(f"/runs/{run_id}/replay", json=body)).status_code == 200
        sent = len(wire.requests)
        refused = await alice.post(f"/runs/{run_id}/replay", json=body)
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "limit_exceeded"
        assert "too many replays" in refused.json()["error"]["message"]
        assert len(wire.requests) == sent  # no model call
        # Bob's bucket is his own (his replay of Alice's run is not_found, not 429).
        assert (await bob.post(f"/runs/{run_id}/replay", json=body)).status_code == 404
