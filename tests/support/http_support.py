"""Support for the HTTP faces' tests: a real server (a ControlServer and its host, the
HTTP faces served by Hypercorn on loopback) and httpx clients; SSE parsing."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio

import trio_agents as ta
from trio_agents.control import ControlServer, open_control_server
from trio_agents.faces import HttpApp, HttpLimits, http_app, serve_http
from trio_agents.models import ScriptedModel, Turn

TOKENS = {"tok-alice": "alice", "tok-bob": "bob"}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@ta.function_tool
async def wait_forever() -> str:
    """Wait until the run is cancelled."""
    await trio.sleep_forever()
    raise AssertionError("unreachable")


def blocker() -> ta.Agent:
    """An agent whose every turn streams a little text, then calls a tool that never
    returns."""
    model = ScriptedModel(
        [], default=Turn(text="thinking it over", tool_calls=[("wait_forever", {})])
    )
    return ta.Agent(name="blocker", model=model, tools=[wait_forever])


def talker(words: int = 50) -> ta.Agent:
    """An agent that answers with ``words`` text deltas and ends."""
    model = ScriptedModel([], default=Turn(text=[f"w{i} " for i in range(words)]))
    return ta.Agent(name="talker", model=model)


AGENTS = {"blocker": blocker(), "talker": talker()}


@attrs.frozen
class Served:
    server: ControlServer
    app: HttpApp
    base: str
    ws_url: str


@asynccontextmanager
async def serving(
    agents: Mapping[str, ta.Agent] = AGENTS,
    *,
    limits: HttpLimits | None = None,
    **kwargs: Any,
) -> AsyncIterator[Served]:
    """A ControlServer on loopback with the HTTP faces of its host on another port."""
    async with open_control_server(agents, auth=TOKENS, **kwargs) as server:
        app = http_app(server.host, auth=TOKENS, limits=limits)
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            yield Served(server, app, f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{server.port}/")
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def client(base: str, token: str | None = "tok-alice") -> AsyncIterator[httpx.AsyncClient]:
    headers = {} if token is None else bearer(token)
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=None) as http:
        yield http


@attrs.frozen
class Message:
    """One SSE message."""

    id: str | None
    data: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.data["event"]["type"])

    @property
    def terminal(self) -> bool:
        event = self.data["event"]
        return event["type"] == "run.updated" and event["status"] in (
            "completed",
            "failed",
            "cancelled",
        )


async def messages(response: httpx.Response) -> AsyncGenerator[Message]:
    """The SSE messages of a streamed response (comments skipped)."""
    event_id: str | None = None
    data: list[str] = []
    async for line in response.aiter_lines():
        if line == "":
            if data:
                yield Message(event_id, json.loads("\n".join(data)))
            event_id, data = None, []
        elif line.startswith(":"):
            continue
        elif line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            data.append(line[6:])


async def start(http: httpx.AsyncClient, agent: str = "blocker", **body: Any) -> str:
    answer = await http.post("/runs", json={"agent": agent, "input": "go", **body})
    assert answer.status_code == 201, answer.text
    run_id = answer.json()["run_id"]
    assert isinstance(run_id, str)
    return run_id


async def read_until_closed(stream: trio.SocketStream) -> bool:
    """Read until the server closes the connection (True), or fail at the caller's bound."""
    try:
        while await stream.receive_some():
            pass
    except trio.BrokenResourceError:  # a reset is a close too
        pass
    return True
