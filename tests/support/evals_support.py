"""Offline models and agents for the evals tests (tests/evals/).

:class:`RoutedModel` answers each request with the :class:`~trio_agents.models.Turn` its
route picks from the request (the conversation so far), so cases that run concurrently
against one agent each get their own, deterministic script, whatever order the
scheduler runs them in.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import attrs

import trio_agents as ta
from trio_agents.models import ModelEvent, ModelRequest, ScriptedModel, Turn

__all__ = ["RoutedModel", "first_user_text", "user_texts"]


def user_texts(request: ModelRequest) -> list[str]:
    """The user messages of the request's conversation, in order."""
    return [i.content for i in request.items if isinstance(i, ta.UserMessage)]


def first_user_text(request: ModelRequest) -> str:
    texts = user_texts(request)
    return texts[0] if texts else ""


@attrs.define(eq=False)
class RoutedModel:
    """A :class:`~trio_agents.Model` whose every response is ``route(request)``, played
    by a one-turn :class:`ScriptedModel` (so tool call ids stay unique per run)."""

    route: Callable[[ModelRequest], Turn | str]
    requests: list[ModelRequest] = attrs.field(factory=list)

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        self.requests.append(request)
        return ScriptedModel([self.route(request)]).stream(request)
