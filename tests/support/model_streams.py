"""Driving a model's stream by hand, for the provider tests: one request, and the
events it gives (all of them, or those before an exception)."""

from __future__ import annotations

from typing import Any, Final

from trio_agents import ModelRequest, UserMessage
from trio_agents.models import ModelEvent

REQUEST: Final = ModelRequest(instructions="Be brief.", items=(UserMessage("hi"),))


async def collect(model: Any, request: ModelRequest = REQUEST) -> list[ModelEvent]:
    async with model.stream(request) as stream:
        return [event async for event in stream]


async def collect_into(got: list[ModelEvent], model: Any, request: ModelRequest = REQUEST) -> None:
    """Like :func:`collect`, but keeps what arrived before an exception."""
    async with model.stream(request) as stream:
        async for event in stream:
            got.append(event)
