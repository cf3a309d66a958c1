"""A user's text with a lone surrogate, entering an event, a reason or a run record from
server-side code, followed over every face to the run's end.

A Python str can hold a lone surrogate (``os.fsdecode`` of a file name, a JSON escape);
UTF-8 cannot. Three ways server-side code puts one where a client will read it: a tool's
``ctx.progress(...)`` (message and nested data), a guardrail's ``info`` (the failure
reason) and ``run.cancel(reason)``. Each must be cleaned where it enters (U+FFFD), so
that every face can follow the run to its end and answer for it: REST SSE (plain and
``?tree=1``), ``GET /runs`` and ``GET /runs/{id}``, the websocket channel, the A2A stream
and ``GetTask`` / ``ListTasks``, and AG-UI. Real server: a ControlServer and the HTTP
faces of its host on loopback (Hypercorn), httpx and trio-websocket clients.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

import trio_agents as ta
from tests.support.a2a_support import SseReader, sse, text_message
from tests.support.control_support import answer, raw_client
from tests.support.core_trees import tool_turn
from tests.support.http_support import Served, blocker, client, messages, serving
from trio_agents.models import ScriptedModel, Turn

# A client that reads an SSE stream with httpx's line iterator and leaves it when the
# run ends abandons its nested body generators to the garbage collector, and Trio warns
# (CONVENTIONS, "httpx aiter_lines()"). Exactly those warnings, nothing else.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)\._[^']*' was garbage collected:ResourceWarning"
)

LONE = "\ud800"  # a high surrogate with nothing after it
CLEAN = "\ufffd"  # what it must become


@ta.function_tool
async def report(ctx: ta.ToolContext) -> str:
    """Report progress with hostile text, nested."""
    ctx.progress(f"half {LONE} way", found={f"k{LONE}": [f"v{LONE}", {"deep": "\udfff"}]})
    return "reported"


@ta.input_guardrail
async def refuse(_run: ta.Run, _items: Any) -> ta.GuardrailResult:
    return ta.GuardrailResult(tripped=True, info=f"bad {LONE} input")


@ta.output_guardrail(name=f"judge{LONE}")
async def judge(_run: ta.Run, _answer: Any) -> ta.GuardrailResult:
    raise RuntimeError("judge down")


def _agents() -> dict[str, ta.Agent]:
    sub = ta.Agent(name=f"sub{LONE}", model=ScriptedModel([], default=Turn(text="sub done")))
    return {
        "progress": ta.Agent(
            name="progress",
            model=ScriptedModel([Turn(tool_calls=[("report", {})]), Turn(text="ok")]),
            tools=[report],
        ),
        "guardrail": ta.Agent(
            name="guardrail",
            model=ScriptedModel([], default=Turn(text="never shown")),
            input_guardrails=[refuse],
        ),
        "cancel": blocker(),
        # A guardrail whose own name holds one, and that raises: the failure reason is
        # made of its name (GuardrailFault), not of a GuardrailTripped's cleaned info.
        "fault": ta.Agent(
            name="fault",
            model=ScriptedModel([], default=Turn(text="answer")),
            output_guardrails=[judge],
        ),
        # A sub-agent whose own name holds one (run.child events, the child's record).
        "parent": ta.Agent(
            name="parent",
            model=ScriptedModel([Turn(tool_calls=[("sub", {"input": "x"})]), Turn(text="ok")]),
            tools=[sub.as_tool(name="sub")],
        ),
    }


SCENARIOS = ["progress", "guardrail", "cancel", "fault"]
# What each scenario's hostile text must read as, somewhere in what a client gets.
SHOWN = {
    "progress": f"half {CLEAN} way",
    "guardrail": f"guardrail refuse: bad {CLEAN} input",
    "cancel": f"stop {CLEAN} now",
    "fault": f"guardrail judge{CLEAN} raised RuntimeError: judge down",
    "parent": f"sub{CLEAN}",
}
CANCEL_REASON = f"stop {LONE} now"


def _no_surrogate(value: Any) -> str:
    """``value`` (decoded JSON) as text; no str in it holds a surrogate (UTF-8 would
    refuse it)."""
    text = json.dumps(value, ensure_ascii=False)
    text.encode("utf-8")
    return text


def _shows(value: Any, scenario: str) -> None:
    """``value`` (decoded JSON) holds the scenario's hostile text, cleaned."""
    text = _no_surrogate(value)
    assert SHOWN[scenario] in text, text[:3000]


async def _cancel_at_tool(served: Served, run_id: str) -> None:
    """Server-side code cancels ``run_id`` with a hostile reason once its tool runs."""
    host = served.server.host
    async with host.events("alice", run_id) as events:
        async for hosted in events:
            if hosted.event["type"] == "tool.started":
                break
    await host.cancel("alice", run_id, CANCEL_REASON, "immediate")


@asynccontextmanager
async def _served() -> AsyncIterator[tuple[Served, httpx.AsyncClient]]:
    with trio.fail_after(60):
        async with serving(_agents()) as served, client(served.base) as http:
            yield served, http


async def _start(served: Served, http: httpx.AsyncClient, scenario: str) -> str:
    started = await http.post("/runs", json={"agent": scenario, "input": "go"})
    assert started.status_code == 201, started.text
    run_id: str = started.json()["run_id"]
    if scenario == "cancel":
        await _cancel_at_tool(served, run_id)
    return run_id


async def _sse(http: httpx.AsyncClient, path: str) -> list[Any]:
    """The messages of a whole SSE stream, which must end at the terminal update of the
    run (not be cut)."""
    async with http.stream("GET", path) as response:
        assert response.status_code == 200
        got = [message async for message in messages(response)]
    assert got
    assert got[-1].terminal, [m.data for m in got[-3:]]
    return [m.data for m in got]


@pytest.mark.parametrize("scenario", [*SCENARIOS, "parent"])
async def test_rest_streams_and_records_follow_the_run_to_its_end(scenario: str) -> None:
    async with _served() as (served, http):
        run_id = await _start(served, http, scenario)
        for query in ("", "?tree=1"):
            got = await _sse(http, f"/runs/{run_id}/events{query}")
            _shows(got, scenario)
        # Re-attaching (the replay holds the event too) gets to the end as well.
        async with http.stream(
            "GET", f"/runs/{run_id}/events", headers={"Last-Event-ID": "1"}
        ) as response:
            rest = [message async for message in messages(response)]
        assert rest[-1].terminal
        for path in (f"/runs/{run_id}", "/runs", "/runs?all=1"):
            answered = await http.get(path)
            assert answered.status_code == 200, (path, answered.text)
            _no_surrogate(answered.json())
        record = (await http.get(f"/runs/{run_id}")).json()["run"]
        if scenario in ("guardrail", "cancel", "fault"):
            assert record["reason"] == SHOWN[scenario]
        if scenario == "parent":
            (child,) = record["children"]
            child_record = (await http.get(f"/runs/{child}")).json()["run"]
            assert child_record["agent"] == SHOWN["parent"]
            _shows((await http.get("/runs?all=1")).json(), "parent")


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_the_websocket_channel_gets_clean_events(scenario: str) -> None:
    async with _served() as (served, _http), raw_client(served.ws_url) as ws:
        request = {"id": "1", "op": "run.start", "agent": scenario, "input": "go"}
        await ws.send_message(json.dumps({**request, "subscribe": "all"}))
        ack = await answer(ws)
        run_id = ack["run_id"]
        cancelling: list[bool] = []
        seen: list[Any] = []
        async with trio.open_nursery() as nursery:
            while True:
                frame = json.loads(await ws.get_message())
                seen.append(frame)
                event = frame.get("event", {})
                if scenario == "cancel" and event.get("type") == "tool.started" and not cancelling:
                    cancelling.append(True)
                    nursery.start_soon(
                        served.server.host.cancel, "alice", run_id, CANCEL_REASON, "immediate"
                    )
                if event.get("type") == "run.updated" and event["status"] in (
                    "completed",
                    "failed",
                    "cancelled",
                ):
                    break
        _shows(seen, scenario)
        await ws.send_message(json.dumps({"id": "2", "op": "run.get", "run_id": run_id}))
        got = await answer(ws)
        _no_surrogate(got)
        if scenario != "progress":
            assert got["run"]["reason"] == SHOWN[scenario]


async def _a2a_stream(
    served: Served, scenario: str, on_first: Callable[[str], Any] | None = None
) -> list[dict[str, Any]]:
    params = {"message": text_message("go"), "metadata": {"agent": scenario}}
    async with sse(served.base, "SendStreamingMessage", params) as stream:
        assert stream.status == 200
        reader: SseReader = stream
        first = await reader.next()
        assert first is not None
        assert "task" in first["result"], first
        got = [first]
        if on_first is not None:
            await on_first(first["result"]["task"]["id"])
        got.extend(await reader.rest())
    return got


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_a2a_stream_and_tasks_follow_the_run_to_its_end(scenario: str) -> None:
    async with _served() as (served, http):

        async def cancel(task_id: str) -> None:
            await _cancel_at_tool(served, task_id)

        got = await _a2a_stream(served, scenario, cancel if scenario == "cancel" else None)
        _no_surrogate(got)
        last = got[-1]["result"]["statusUpdate"]["status"]
        expected = {
            "progress": "COMPLETED",
            "guardrail": "FAILED",
            "cancel": "CANCELED",
            "fault": "FAILED",
        }
        assert last["state"] == f"TASK_STATE_{expected[scenario]}", last
        task_id = got[0]["result"]["task"]["id"]
        for method, params in (("GetTask", {"id": task_id}), ("ListTasks", {})):
            answered = await http.post(
                "/a2a", json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
            )
            assert answered.status_code == 200, answered.text
            body = answered.json()
            assert "result" in body, body
            _no_surrogate(body)
        if scenario != "progress":
            _shows(got[-1], scenario)


@pytest.mark.parametrize("scenario", SCENARIOS)
async def test_agui_follows_the_run_to_its_end(scenario: str) -> None:
    async with _served() as (served, http):
        body = {
            "threadId": "t1",
            "runId": f"ag-{scenario}",
            "messages": [{"id": "m1", "role": "user", "content": "go"}],
        }
        events: list[dict[str, Any]] = []
        async with http.stream("POST", f"/ag-ui/{scenario}", json=body) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[len("data: ") :])
                _no_surrogate(event)
                events.append(event)
                if scenario == "cancel" and event["type"] == "TOOL_CALL_START":
                    (info,) = await served.server.host.list("alice")
                    await served.server.host.cancel(
                        "alice", info.run_id, CANCEL_REASON, "immediate"
                    )
        assert events[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR"), events[-3:]
        if scenario == "progress":
            assert events[-1]["type"] == "RUN_FINISHED"
        else:
            _shows(events[-1], scenario)
        # Not cancelled by its own broken stream (AG-UI's default on_disconnect="cancel").
        (info,) = await served.server.host.list("alice")
        expected = {
            "progress": "completed",
            "guardrail": "failed",
            "cancel": "cancelled",
            "fault": "failed",
        }
        assert info.status == expected[scenario]
        if scenario == "progress":
            assert info.reason is None


async def test_a_handoff_to_an_agent_served_under_a_hostile_name_is_listed_clean() -> None:
    """The name an agent is served under is server-side text too: a handoff reaches
    that agent through no face's check, and the run's record names it."""
    helper = ta.Agent(name="helper", model=ScriptedModel([], default="from the helper"))
    switching = ScriptedModel([tool_turn(("transfer_to_helper", {}))])
    front = ta.Agent(name="front", model=switching, handoffs=[helper])
    with trio.fail_after(60):
        async with (
            serving({"front": front, f"helper{LONE}": helper}) as served,
            client(served.base) as http,
        ):
            run_id = await _start(served, http, "front")
            got = await _sse(http, f"/runs/{run_id}/events")
            assert got[-1]["event"]["status"] == "completed"
            for path in (f"/runs/{run_id}", "/runs", "/runs?all=1"):
                answered = await http.get(path)
                assert answered.status_code == 200, (path, answered.text)
                _no_surrogate(answered.json())
            record = (await http.get(f"/runs/{run_id}")).json()["run"]
            assert record["agent"] == f"helper{CLEAN}"


async def test_a_json_rpc_id_with_a_lone_surrogate_is_refused_not_a_server_error() -> None:
    """The one string a face must echo as given: A2A's JSON-RPC ``id`` (``"\\ud800"`` is
    valid JSON). It cannot be encoded in the answer, so the request is refused as
    invalid, answered with a null id (JSON-RPC 2.0 §5)."""
    async with _served() as (_, http):
        for method in ("GetTask", "SendStreamingMessage"):
            # Raw bytes: the id's escape is what a client sends (JSON allows it).
            request = {"jsonrpc": "2.0", "id": "r-id", "method": method, "params": {"id": "x"}}
            body = json.dumps(request).replace("r-id", "r\\ud800")
            answered = await http.post(
                "/a2a", content=body.encode(), headers={"content-type": "application/json"}
            )
            assert answered.status_code == 200, answered.text
            got = answered.json()
            assert got["id"] is None
            assert got["error"]["code"] == -32600
            assert "lone surrogate" in got["error"]["message"]
