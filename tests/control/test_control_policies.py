"""Run policies over the control channel (DESIGN §18), end to end over loopback
websockets: ``run.start``'s ``limits`` within the server's maximum, the server's
``context`` hook, and limit and guardrail failures as the client sees them."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import attrs
import pytest
import trio

import trio_agents as ta
from tests.support.control_support import ask, raw_client, serving
from trio_agents.control import ControlError, Limits, RunStartInfo, connect
from trio_agents.models import ScriptedModel, Turn


@ta.function_tool
async def ping() -> str:
    """Answer pong."""
    return "pong"


def looping_agent(model: ScriptedModel | None = None) -> ta.Agent:
    """An agent whose model calls a tool three times before it answers."""
    if model is None:
        model = ScriptedModel([Turn(tool_calls=[("ping", {})])] * 3 + ["done"])
    return ta.Agent(name="a", instructions="test", model=model, tools=[ping])


async def test_limits_in_run_start_fail_the_run_with_the_limit_as_reason() -> None:
    model = ScriptedModel([Turn(tool_calls=[("ping", {})])] * 3 + ["done"])
    with trio.fail_after(20):
        async with (
            serving({"a": looping_agent(model)}) as (_, url),
            connect(url, token="tok-alice") as client,
        ):
            run = await client.start("a", "go", limits=ta.UsageLimits(requests=2))
            terminal = await run.wait()
            info = await run.get()
    assert (terminal.status, terminal.reason) == ("failed", "usage limit: requests 3/2")
    assert (info.status, info.reason) == ("failed", "usage limit: requests 3/2")
    # The budget bar travels in the terminal update's detail, decoded as sent.
    assert terminal.detail["limits"] == {"requests": {"used": 3, "limit": 2}}
    assert len(model.requests) == 2  # the request past the limit was never sent


async def test_the_servers_maximum_refuses_more_and_is_the_default() -> None:
    maximum = ta.UsageLimits(requests=2, deadline=60.0, wrap_up=10.0)
    with trio.fail_after(20):
        async with (
            serving({"a": looping_agent()}, limits=Limits(max_run_limits=maximum)) as (_, url),
            connect(url, token="tok-alice") as client,
        ):
            with pytest.raises(ControlError) as refused:
                await client.start("a", "go", limits={"requests": 3})
            assert refused.value.code == "invalid_request"
            assert "limits.requests 3 is above the server's maximum 2" in str(refused.value)
            assert await client.list_runs() == []
            # Asking nothing: the maximum applies.
            run = await client.start("a", "go")
            terminal = await run.wait()
            assert (terminal.status, terminal.reason) == ("failed", "usage limit: requests 3/2")
            # Asking less: the client's own limit, the maximum's others still apply.
            run = await client.start("a", "go", limits={"requests": 1, "deadline": 30})
            terminal = await run.wait()
            assert (terminal.status, terminal.reason) == ("failed", "usage limit: requests 2/1")


async def test_a_cost_limit_travels_exactly_and_within_the_servers_maximum() -> None:
    # Each request costs 0.1 USD (as the script says): the third passes 0.25.
    priced = Turn(tool_calls=[("ping", {})], usage=ta.Usage(1, 1, cost=Decimal("0.1")))
    model = ScriptedModel([priced] * 3 + ["done"])
    maximum = ta.UsageLimits(cost="1")
    with trio.fail_after(20):
        async with (
            serving({"a": looping_agent(model)}, limits=Limits(max_run_limits=maximum)) as (
                _,
                url,
            ),
            connect(url, token="tok-alice") as client,
        ):
            with pytest.raises(ControlError) as refused:
                await client.start("a", "go", limits=ta.UsageLimits(cost="1.5"))
            assert "limits.cost 1.5 is above the server's maximum 1" in str(refused.value)
            run = await client.start("a", "go", limits=ta.UsageLimits(cost=Decimal("0.25")))
            terminal = await run.wait()
    assert (terminal.status, terminal.reason) == ("failed", "usage limit: cost 0.3/0.25")
    assert terminal.detail["limits"] == {"cost": {"used": 0.3, "limit": 0.25}}


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        ([1], "limits must be an object"),
        ({"requests": 1, "budget": 2}, "unknown field(s) in limits: 'budget'"),
        ({"cost": -1}, "limits.cost must be a number of USD >= 0"),
        ({"cost": "lots"}, "limits.cost must be a number of USD >= 0"),
        ({"cost": True}, "limits.cost must be a number of USD >= 0"),
        ({"requests": -1}, "limits.requests must be an integer >= 0 or null"),
        ({"tool_calls": 1.5}, "limits.tool_calls must be an integer >= 0 or null"),
        ({"total_tokens": True}, "limits.total_tokens must be an integer >= 0 or null"),
        ({"deadline": 0}, "limits.deadline must be a number of seconds > 0 or null"),
        ({"deadline": "5"}, "limits.deadline must be a number of seconds > 0 or null"),
        ({"wrap_up": 5}, "limits: wrap_up needs a deadline"),
        ({"deadline": 5, "wrap_up": 5}, "limits: wrap_up (5 s) must be shorter than the deadline"),
    ],
)
async def test_invalid_limits_answer_invalid_request_naming_the_field(
    limits: Any, message: str
) -> None:
    model = ScriptedModel(["done"])
    with trio.fail_after(20):
        async with serving({"a": looping_agent(model)}) as (server, url), raw_client(url) as ws:
            frame = {"id": 1, "op": "run.start", "agent": "a", "input": "go", "limits": limits}
            answer = await ask(ws, frame)
            assert answer["code"] == "invalid_request"
            assert message in answer["message"]
            assert server.statistics().active_runs == 0
            assert (await ask(ws, {"id": 2, "op": "runs.list"}))["runs"] == []
    assert model.requests == []


async def test_null_limits_are_not_asked() -> None:
    with trio.fail_after(20):
        async with serving({"a": looping_agent()}) as (_, url), raw_client(url) as ws:
            frame = {
                "id": 1,
                "op": "run.start",
                "agent": "a",
                "input": "go",
                "limits": {"requests": None, "tool_calls": 1},
                "subscribe": "status",
            }
            answer = await ask(ws, frame)
            assert answer["type"] == "ack"
            while True:
                text = str(await ws.get_message())
                if '"status":"failed"' in text:
                    break
    assert "usage limit: tool_calls 2/1" in text


@attrs.frozen
class Deps:
    principal: str
    info: RunStartInfo


async def test_the_context_hooks_object_reaches_the_tool() -> None:
    seen: list[Any] = []

    @ta.function_tool
    async def whoami(ctx: ta.ToolContext[Deps]) -> str:
        """Who is asking."""
        seen.append(ctx.context)
        return ctx.context.principal

    async def context(principal: str, info: RunStartInfo) -> Deps:
        await trio.lowlevel.checkpoint()
        return Deps(principal, info)

    model = ScriptedModel([Turn(tool_calls=[("whoami", {})]), "done"])
    agent = ta.Agent(name="a", instructions="test", model=model, tools=[whoami])
    with trio.fail_after(20):
        async with (
            serving({"a": agent}, context=context) as (_, url),
            connect(url, token="tok-bob") as client,
        ):
            run = await client.start(
                "a", "go", session_id="s1", limits=ta.UsageLimits(tool_calls=5)
            )
            terminal = await run.wait()
    assert terminal.status == "completed"
    [deps] = seen
    assert deps.principal == "bob"
    info = deps.info
    assert (info.run_id, info.agent, info.session_id, info.resumed) == (run.id, "a", "s1", False)
    assert [item.to_json() for item in info.input] == [ta.UserMessage("go").to_json()]
    assert info.limits == ta.UsageLimits(tool_calls=5)


async def test_a_raising_context_hook_starts_nothing(caplog: pytest.LogCaptureFixture) -> None:
    def context(principal: str, info: RunStartInfo) -> object:
        raise RuntimeError("no database")

    model = ScriptedModel(["done"])
    with trio.fail_after(20):
        async with (
            serving({"a": looping_agent(model)}, context=context) as (server, url),
            connect(url, token="tok-alice") as client,
        ):
            with pytest.raises(ControlError) as failed:
                await client.start("a", "go", session_id="s1")
            assert failed.value.code == "internal"
            assert await client.list_runs(all=True) == []
            assert server.statistics().active_runs == 0
            assert server.principal_statistics("alice").active_runs == 0
    assert model.requests == []
    assert "the context hook raised" in caplog.text


def test_the_context_hook_must_be_callable_and_run_options_cannot_bypass_it() -> None:
    from trio_agents.control import ControlServer

    agents = {"a": looping_agent()}
    with pytest.raises(TypeError, match="context must be a callable"):
        ControlServer(agents, auth={}, context=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=re.escape("Limits(max_run_limits=...)")):
        ControlServer(agents, auth={}, run_options={"limits": ta.UsageLimits(requests=1)})
    with pytest.raises(TypeError, match=re.escape("ControlServer(context=...)")):
        ControlServer(agents, auth={}, run_options={"context": 1})
    with pytest.raises(TypeError):
        Limits(max_run_limits={"requests": 1})  # type: ignore[arg-type]


async def test_a_guardrail_trip_reaches_the_client_as_is() -> None:
    @ta.input_guardrail
    async def no_secrets(run: ta.Run, items: Any) -> ta.GuardrailResult:
        return ta.GuardrailResult(True, {"found": "password"})

    model = ScriptedModel([Turn(text="thinking", delay=1.0), "done"])
    agent = ta.Agent(name="a", instructions="test", model=model, input_guardrails=[no_secrets])
    with trio.fail_after(20):
        async with (
            serving({"a": agent}) as (_, url),
            connect(url, token="tok-alice") as client,
        ):
            run = await client.start("a", "my password is 123")
            terminal = await run.wait()
    assert terminal.status == "failed"
    assert terminal.reason == "guardrail no_secrets: {'found': 'password'}"
