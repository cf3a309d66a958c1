"""History policies (DESIGN §18): what each model request is sent, never what is stored.

``Agent(history=...)`` is a callable ``(items) -> items`` (sync or async) or one of the
built-ins: :class:`KeepLastTurns`, :class:`TokenWindow`, :class:`Summarize`. A *turn*
starts at a user message (input or injected) and runs to the next one; the built-ins
keep or drop whole turns, so a call and its result are always kept or dropped together.
What a policy returns is checked like any request (§4): one that is not a valid
conversation fails the run (``"invalid conversation: history …"``) and is never sent.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeAlias, final

import attrs
import trio

from ._items import AssistantMessage, Item, ToolCall, ToolResult, UserMessage, conversation_problems
from ._limits import StreamMeter, estimate_tokens
from ._model import Finish, Model, ModelRequest, TextDelta, Usage

if TYPE_CHECKING:
    from ._state import RunState

__all__ = [
    "SUMMARY_PREFIX",
    "HistoryError",
    "HistoryPolicy",
    "KeepLastTurns",
    "Summarize",
    "TokenWindow",
    "apply_history",
]

SUMMARY_PREFIX: Final = "Summary of the earlier conversation:"
"""How the message :class:`Summarize` puts in place of what it drops starts."""

SUMMARY_INSTRUCTIONS: Final = (
    "Summarize the conversation below for the assistant that will continue it: keep every"
    " fact, decision, open question and tool result it may need; be brief."
)


def _turn_starts(items: Sequence[Item]) -> list[int]:
    """The index of each turn's first item: index 0, and every user message after."""
    starts = [0] if items else []
    starts.extend(i for i, item in enumerate(items) if type(item) is UserMessage and i > 0)
    return starts


def _check_positive_int(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, got {value!r}")


@final
@attrs.frozen
class KeepLastTurns:
    """Send the last ``n`` turns, whole (a turn starts at a user message)."""

    n: int = attrs.field(validator=_check_positive_int)

    def __call__(self, items: Sequence[Item]) -> list[Item]:
        starts = _turn_starts(items)
        if len(starts) <= self.n:
            return list(items)
        return list(items[starts[-self.n] :])


def _item_tokens(item: Item) -> int:
    if isinstance(item, UserMessage | AssistantMessage):
        chars = len(item.content)
    elif isinstance(item, ToolCall):
        chars = len(item.name) + len(item.arguments)
    else:
        chars = len(item.output)
    return estimate_tokens(chars) + 4  # a few tokens of framing per item


@final
@attrs.frozen
class TokenWindow:
    """Send the most recent whole turns that fit in ``max_tokens`` (estimated at four
    characters a token); the last turn is always sent, even if it alone is larger."""

    max_tokens: int = attrs.field(validator=_check_positive_int)

    def __call__(self, items: Sequence[Item]) -> list[Item]:
        starts = _turn_starts(items)
        total = sum(_item_tokens(item) for item in items)
        first = 0
        for index in range(len(starts) - 1):
            if total <= self.max_tokens:
                break
            end = starts[index + 1]
            total -= sum(_item_tokens(item) for item in items[starts[index] : end])
            first = end
        return list(items[first:])


def _check_model(_instance: object, _attribute: object, value: Any) -> None:
    if not callable(getattr(value, "stream", None)):
        raise TypeError(f"Summarize needs a Model (with stream()), not {type(value).__name__}")


@final
@attrs.frozen
class Summarize:
    """Send the last ``keep_last_turns`` turns whole, and in place of everything before
    them one user message starting ``"Summary of the earlier conversation:"``, written
    by ``model`` (its own model call: cancelled with the run, counted in its usage and
    limits). The summary is made again only when more is dropped (cached per run)."""

    model: Model = attrs.field(validator=_check_model)
    keep_last_turns: int = attrs.field(default=2, validator=_check_positive_int)


HistoryPolicy: TypeAlias = (
    KeepLastTurns
    | TokenWindow
    | Summarize
    | Callable[[Sequence[Item]], Sequence[Item] | Awaitable[Sequence[Item]]]
)
"""What ``Agent(history=...)`` takes."""


class HistoryError(Exception):
    """A history policy returned something that cannot be sent."""


def _transcript(items: Sequence[Item]) -> str:
    lines = []
    for item in items:
        if isinstance(item, UserMessage):
            lines.append(f"user: {item.content}")
        elif isinstance(item, AssistantMessage):
            lines.append(f"assistant: {item.content}")
        elif isinstance(item, ToolCall):
            lines.append(f"tool call {item.name}({item.arguments})")
        elif isinstance(item, ToolResult):
            lines.append(f"tool result [{item.status}]: {item.output}")
    return "\n".join(lines)


async def _summarize(state: RunState, policy: Summarize, dropped: Sequence[Item]) -> str:
    """One model call writing the summary of ``dropped``, counted like the run's own."""
    if state.budgets and state.spend("requests"):
        await trio.lowlevel.checkpoint_if_cancelled()
    request = ModelRequest(
        instructions=SUMMARY_INSTRUCTIONS,
        items=(UserMessage(_transcript(dropped)),),
        tools=(),
        settings={},
    )
    meter = StreamMeter(state.budgets) if state.budgets else None
    parts: list[str] = []
    try:
        async with policy.model.stream(request) as stream:
            async for event in stream:
                if isinstance(event, TextDelta) and isinstance(event.text, str):
                    parts.append(event.text)
                    if meter is not None:
                        meter.text(event.text)
                elif isinstance(event, Usage):
                    state.charge(event)
                    if meter is not None:
                        meter.usage(event)
                elif not isinstance(event, Finish):
                    raise HistoryError(f"the summary model yielded {event!r:.100}")
    finally:
        if meter is not None:
            meter.close()
    return "".join(parts).strip()


async def apply_history(state: RunState, policy: Any, items: tuple[Item, ...]) -> tuple[Item, ...]:
    """What the next request is sent under ``policy``.

    Raises:
        HistoryError: the policy's result is not a valid conversation (the caller
            fails the run with ``"invalid conversation: history …"``).
        Exception: whatever the policy (or the summary's model) raised.
    """
    result: object
    if isinstance(policy, Summarize):
        result = await _apply_summary(state, policy, items)
    else:
        result = policy(items)
        if inspect.isawaitable(result):
            result = await result
    if isinstance(result, str | bytes) or not isinstance(result, Sequence):
        raise HistoryError(f"returned {type(result).__name__}, not a list of items")
    sent = tuple(result)
    bad = next((item for item in sent if not isinstance(item, _ITEM_TYPES)), None)
    if bad is not None:
        raise HistoryError(f"returned a {type(bad).__name__} among the items")
    if not sent and items:
        raise HistoryError("returned no items")
    problems = conversation_problems(sent)
    if problems:
        raise HistoryError(f"returned an invalid conversation: {problems[0]}")
    return sent


_ITEM_TYPES = (UserMessage, AssistantMessage, ToolCall, ToolResult)


async def _apply_summary(state: RunState, policy: Summarize, items: tuple[Item, ...]) -> list[Item]:
    starts = _turn_starts(items)
    if len(starts) <= policy.keep_last_turns:
        return list(items)
    cut = starts[-policy.keep_last_turns]
    cache = state.summaries
    if cache is None:
        cache = state.summaries = {}
    key = id(policy)
    cached = cache.get(key)
    if cached is None or cached[0] != cut:
        text = await _summarize(state, policy, items[:cut])
        cached = (cut, UserMessage(f"{SUMMARY_PREFIX} {text}"))
        cache[key] = cached
    return [cached[1], *items[cut:]]
