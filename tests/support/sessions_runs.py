"""What the tests of runs on stored sessions share: a plain agent, a model that streams
given events, the tools and agent of the resume tests (an idempotent call, one never
run twice, one that needs approval), and the items a PostgreSQL session has stored.

``make_agent``, ``EventsModel``, ``resume_tools``/``resume_agent`` and ``by_call`` are
copies of the helpers of tests/core/test_run_faults.py and tests/core/internals/
test_resume.py, kept here so that no test file imports another; those files can switch
to these."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.lowlevel

import trio_agents as ta
from tests.support.sessions_sql import postgres_sql


def make_agent(model: ta.Model, tools: Sequence[ta.Tool] = (), **kw: Any) -> ta.Agent:
    return ta.Agent(name="t", instructions="", model=model, tools=list(tools), **kw)


class EventsModel:
    """Yields the given events per call (the last list repeats); records requests."""

    def __init__(self, *turns: Sequence[object], block: bool = False) -> None:
        self.turns = list(turns)
        self.requests: list[ta.ModelRequest] = []
        self.block = block

    @asynccontextmanager
    async def stream(self, request: ta.ModelRequest) -> AsyncIterator[AsyncIterator[Any]]:
        self.requests.append(request)
        events = self.turns[min(len(self.requests), len(self.turns)) - 1]

        async def gen() -> AsyncIterator[Any]:
            for event in events:
                await trio.lowlevel.checkpoint()
                yield event
            if self.block:
                await trio.sleep_forever()

        yield gen()


def fast_and_slow(release: trio.Event) -> list[ta.Tool]:
    """``fast`` answers "fast done" at once, ``slow`` answers "slow done" once
    ``release`` is set: a turn's results finishing apart."""

    @ta.function_tool
    async def fast() -> str:
        """Answers at once."""
        return "fast done"

    @ta.function_tool
    async def slow() -> str:
        """Answers when the test says so."""
        await release.wait()
        return "slow done"

    return [fast, slow]


def resume_tools(ran: list[str]) -> list[ta.Tool]:
    """``lookup`` (idempotent), ``charge`` (never run twice), ``delete`` (needs
    approval); each records its call id in ``ran``."""

    @ta.function_tool(idempotent=True)
    async def lookup(ctx: ta.ToolContext) -> str:
        """Read something (safe to repeat)."""
        ran.append(ctx.call_id)
        return "looked up"

    @ta.function_tool
    async def charge(ctx: ta.ToolContext) -> str:
        """Charge a card (never twice)."""
        ran.append(ctx.call_id)
        return "charged"

    @ta.function_tool(needs_approval=True)
    async def delete(ctx: ta.ToolContext) -> str:
        """Delete a file, once approved."""
        ran.append(ctx.call_id)
        return "deleted"

    return [lookup, charge, delete]


def resume_agent(model: ta.Model, ran: list[str]) -> ta.Agent:
    return make_agent(model, resume_tools(ran))


def by_call(items: Any) -> dict[str, ta.ToolResult]:
    """The tool results among ``items``, by call id."""
    return {item.call_id: item for item in items if isinstance(item, ta.ToolResult)}


def items_of(dsn: str, session_id: str) -> list[ta.Item]:
    """The items stored for ``session_id`` in the PostgreSQL database ``dsn``, as stored."""
    return [item for _, item in postgres_sql(dsn).stored(session_id)]
