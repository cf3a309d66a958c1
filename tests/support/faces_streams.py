"""The stream context of the hand-written test models the faces' tests serve (the web
UI's gated model, the cluster's scenario model): what their ``stream()`` returns."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import final

import trio

from trio_agents.models import ModelEvent


@final
class EventStream(AbstractAsyncContextManager[AsyncIterator[ModelEvent]]):
    """A model stream over ``events``: entering is a checkpoint, as opening a real
    model's stream is; leaving has nothing to close and never blocks (as
    ``ScriptedModel``'s: a cancelled exit must not raise)."""

    def __init__(self, events: AsyncIterator[ModelEvent]) -> None:
        self._events = events

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        await trio.lowlevel.checkpoint()
        return self._events

    async def __aexit__(self, *exc_info: object) -> None:
        return None
