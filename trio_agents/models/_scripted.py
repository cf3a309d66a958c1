"""``ScriptedModel``: a deterministic model that plays back a script of turns.

Made for tests (ours and users'): each call of :meth:`ScriptedModel.stream` consumes
the next :class:`Turn` of the script and streams exactly what the turn says, with
delays in Trio time (virtual under ``trio.testing.MockClock``), failures at chosen
points, deterministic tool call ids and usage. Every request is recorded.

The stream is a plain async context manager around a small iterator class, not an
async generator: a consumer that is cancelled mid-stream leaves nothing for the garbage
collector to finalise, so tests can run with warnings turned into errors.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, TypeAlias, cast, final

import attrs
import trio

from .._exceptions import ModelError
from .._items import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from .._model import Finish, ModelEvent, ModelRequest, TextDelta, ToolCallDone, ToolSpec, Usage
from ._ratelimit import RateLimit, RateLimitedStream

__all__ = ["ScriptedModel", "Turn"]

ScriptedCall: TypeAlias = ToolCall | tuple[str, str]
"""A tool call of a :class:`Turn` as stored: a full ``ToolCall`` or ``(name, json)``."""

_WORD = re.compile(r"\s*\S+\s*")


def _split_text(text: str) -> tuple[str, ...]:
    """Split ``text`` into word-ish chunks that keep their whitespace.

    ``"".join(_split_text(text)) == text`` always holds.
    """
    if not text:
        return ()
    chunks = tuple(_WORD.findall(text))
    return chunks or (text,)


def _approx_tokens(chars: int) -> int:
    """About four characters per token, at least one."""
    return max(1, math.ceil(chars / 4))


def _item_chars(item: Item) -> int:
    if isinstance(item, UserMessage | AssistantMessage):
        return len(item.content)
    if isinstance(item, ToolCall):
        return len(item.name) + len(item.arguments)
    return len(item.output)


# json.dumps(value, sort_keys=True, default=str), without building an encoder per call.
_schema_json = json.JSONEncoder(sort_keys=True, default=str).encode


def _tools_chars(tools: Sequence[ToolSpec]) -> int:
    """The characters the tool specs add to a request: names, descriptions, schemas."""
    return sum(
        len(spec.name) + len(spec.description) + len(_schema_json(spec.parameters))
        for spec in tools
    )


def _estimate_usage(
    request: ModelRequest,
    text: str,
    calls: Sequence[ToolCall],
    tools_chars: Callable[[Sequence[ToolSpec]], int] = _tools_chars,
) -> Usage:
    """A deterministic token estimate from character counts (about 4 chars per token)."""
    input_chars = len(request.instructions) + sum(_item_chars(item) for item in request.items)
    input_chars += tools_chars(request.tools)
    output_chars = len(text) + sum(len(call.name) + len(call.arguments) for call in calls)
    return Usage(
        input_tokens=_approx_tokens(input_chars), output_tokens=_approx_tokens(output_chars)
    )


# ------------------------------------------------------------------------ the stream


_Step: TypeAlias = tuple[float, ModelEvent | BaseException]
"""One step of a stream: sleep this long, then yield the event or raise the exception."""


@final
class _EventIterator:
    """Plays back a list of steps; an iterator class, not an async generator."""

    def __init__(self, steps: Sequence[_Step]) -> None:
        self._steps = list(steps)
        self._position = 0
        self.closed = False

    def __aiter__(self) -> _EventIterator:
        return self

    async def __anext__(self) -> ModelEvent:
        if self.closed:
            raise RuntimeError("the model stream was read after its `async with` block ended")
        if self._position >= len(self._steps):
            raise StopAsyncIteration
        delay, step = self._steps[self._position]
        await trio.sleep(delay)  # a checkpoint even when the delay is 0
        self._position += 1  # only now: a cancelled read loses nothing
        if isinstance(step, BaseException):
            self._position = len(self._steps)
            raise step
        return step


@final
class _EventStream(AbstractAsyncContextManager[AsyncIterator[ModelEvent]]):
    """The async context manager ``stream()`` returns; nothing is held across ``yield``.

    ``error`` (if set) is raised on entry, after a checkpoint. ``on_open`` runs once the
    stream is entered, ``on_close`` when it is left (normally, by an exception or by
    cancellation).
    """

    def __init__(
        self,
        steps: Sequence[_Step],
        *,
        error: BaseException | None = None,
        on_open: Callable[[], None] | None = None,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self._iterator = _EventIterator(steps)
        self._error = error
        self._on_open = on_open
        self._on_close = on_close
        self._entered = False

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        if self._entered:
            raise RuntimeError("a model stream can only be entered once")
        self._entered = True
        await trio.lowlevel.checkpoint()
        if self._error is not None:
            raise self._error
        if self._on_open is not None:
            self._on_open()
        return self._iterator

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # No await here: leaving must never block, and a cancelled exit must not raise.
        self._iterator.closed = True
        if self._on_close is not None:
            self._on_close()


# -------------------------------------------------------------------------- the turn


def _to_chunks(text: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(text, str):
        return _split_text(text)
    chunks = tuple(text)
    for index, chunk in enumerate(chunks):
        if not isinstance(chunk, str):
            raise TypeError(f"Turn.text[{index}] must be a str, not {type(chunk).__name__}")
    return chunks


def _to_calls(
    calls: Sequence[ToolCall | tuple[str, Mapping[str, Any] | str]],
) -> tuple[ScriptedCall, ...]:
    if isinstance(cast(object, calls), str | bytes):
        raise TypeError("Turn.tool_calls must be a sequence of calls, not a string")
    converted: list[ScriptedCall] = []
    for index, call in enumerate(calls):
        where = f"Turn.tool_calls[{index}]"
        if isinstance(call, ToolCall):
            converted.append(call)
            continue
        if not isinstance(call, tuple) or len(call) != 2:
            raise TypeError(f"{where} must be a ToolCall or a (name, arguments) tuple")
        name, arguments = call
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: the tool name must be a non-empty str")
        if isinstance(arguments, str):
            converted.append((name, arguments))
        elif isinstance(arguments, Mapping):
            try:
                converted.append((name, json.dumps(dict(arguments), ensure_ascii=False)))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{where}: arguments are not JSON-serialisable: {exc}") from None
        else:
            raise TypeError(
                f"{where}: arguments must be a dict or a JSON str, not {type(arguments).__name__}"
            )
    return tuple(converted)


def _check_delay(_instance: object, _attribute: object, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"Turn.delay must be a number, not {type(value).__name__}")
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"Turn.delay must be a finite number >= 0, got {value!r}")


def _check_fail(_instance: object, _attribute: object, value: BaseException | str | None) -> None:
    if value is not None and not isinstance(cast(object, value), str | BaseException):
        raise TypeError(
            f"Turn.fail must be an exception instance, a str or None, not {type(value).__name__}"
        )


def _check_fail_after(instance: Turn, _attribute: object, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"Turn.fail_after must be an int, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"Turn.fail_after must be >= 0, got {value}")
    if instance.fail is None:
        raise ValueError("Turn.fail_after needs Turn.fail (what to raise)")


@attrs.frozen
class Turn:
    """One model response of a :class:`ScriptedModel` script.

    Args:
        text: the assistant text. A str is split into word-ish chunks that keep their
            whitespace (``"".join(turn.text)`` is the str); a sequence of str is used as
            the chunks, one ``TextDelta`` each. Stored as a tuple of chunks.
        tool_calls: calls emitted (as ``ToolCallDone``) after the text. Each is a
            :class:`~trio_agents.ToolCall` (its id is kept) or a ``(name, arguments)``
            tuple whose arguments are a dict or a raw JSON str (kept as is, even if it
            is not valid JSON). Tuples get the id ``call_{n}_{i}``: ``n`` is the model
            call number (1 for the model's first call), ``i`` the index in this list.
            Stored as ``ToolCall`` or ``(name, json_str)``.
        delay: seconds to ``trio.sleep`` before each chunk and each tool call (virtual
            time under ``MockClock``).
        fail: raised instead of the rest of the stream: an exception instance as is,
            a str as :class:`~trio_agents.ModelError`.
        fail_after: how many chunks are streamed before ``fail`` is raised (default 0:
            before the first chunk). The failure comes without a delay of its own; a
            count of at least the number of chunks fails after all text, before any
            tool call.
        usage: the ``Usage`` to report; by default it is estimated from character
            counts (about four characters per token, at least one).
        finish: the ``Finish`` reason; by default ``"tool_calls"`` when the turn has
            calls, else ``"stop"``.
    """

    text: tuple[str, ...] = attrs.field(default=(), converter=_to_chunks)
    tool_calls: tuple[ScriptedCall, ...] = attrs.field(default=(), converter=_to_calls)
    delay: float = attrs.field(default=0.0, validator=_check_delay)
    fail: BaseException | str | None = attrs.field(default=None, validator=_check_fail)
    fail_after: int | None = attrs.field(default=None, validator=_check_fail_after)
    usage: Usage | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Usage))
    )
    finish: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )

    def _calls_for(self, number: int, taken: set[str]) -> list[ToolCall]:
        """The turn's calls for model call ``number``, avoiding the ids in ``taken``."""
        explicit = {call.call_id for call in self.tool_calls if isinstance(call, ToolCall)}
        calls: list[ToolCall] = []
        for index, call in enumerate(self.tool_calls):
            if isinstance(call, ToolCall):
                calls.append(call)
                continue
            name, arguments = call
            call_id = f"call_{number}_{index}"
            suffix = 2
            while call_id in taken or call_id in explicit:
                # only when the history already holds this id (say, a new model on an
                # old session): real models never repeat call ids, so neither do we
                call_id = f"call_{number}_{index}_{suffix}"
                suffix += 1
            taken.add(call_id)
            calls.append(ToolCall(call_id, name, arguments))
        return calls

    def _steps(
        self,
        request: ModelRequest,
        number: int,
        tools_chars: Callable[[Sequence[ToolSpec]], int] = _tools_chars,
    ) -> list[_Step]:
        """What a stream of this turn does, for model call ``number``."""
        taken = {item.call_id for item in request.items if isinstance(item, ToolCall | ToolResult)}
        calls = self._calls_for(number, taken)
        failure: BaseException | None = None
        if self.fail is not None:
            failure = ModelError(self.fail) if isinstance(self.fail, str) else self.fail
        fail_at = (self.fail_after or 0) if failure is not None else -1
        steps: list[_Step] = []
        for index, chunk in enumerate(self.text):
            if index == fail_at:
                break
            steps.append((self.delay, TextDelta(chunk)))
        if failure is not None:
            steps.append((0.0, failure))
            return steps
        steps.extend((self.delay, ToolCallDone(call)) for call in calls)
        usage = self.usage
        if usage is None:
            usage = _estimate_usage(request, "".join(self.text), calls, tools_chars)
        steps.append((0.0, usage))
        steps.append((0.0, Finish(self.finish or ("tool_calls" if calls else "stop"))))
        return steps


# --------------------------------------------------------------------- the model


def _to_turn(value: Turn | str) -> Turn:
    if isinstance(value, Turn):
        return value
    if isinstance(value, str):
        return Turn(text=value)
    raise TypeError(f"a script turn must be a Turn or a str, not {type(value).__name__}")


def _to_turns(turns: Sequence[Turn | str]) -> tuple[Turn, ...]:
    if isinstance(turns, str):
        raise TypeError("turns must be a sequence of turns; put a single answer in a list")
    return tuple(_to_turn(turn) for turn in turns)


def _to_default(value: Turn | str | None) -> Turn | None:
    return None if value is None else _to_turn(value)


@final
@attrs.define(eq=False)
class ScriptedModel:
    """A deterministic :class:`~trio_agents.Model` that plays back a script of turns.

    Each call of :meth:`stream` consumes the next turn (a str is shorthand for a
    text-only :class:`Turn`). When the script runs out, ``default`` is used for every
    further call; without one the stream raises
    ``ModelError("ScriptedModel script exhausted after N turns")``. Several runs may
    share one model: each call just takes the next turn.

    Structured output (``Agent(output_type=...)``): by default the model has no native
    structured output, so a run offers it the ``final_answer`` tool and a script
    answers with ``Turn(tool_calls=[("final_answer", {...})])``; with
    ``native_output=True`` the run expects the JSON as text, ``Turn('{"x": 1}')``.

    ``rate_limit=`` (a :class:`~trio_agents.models.RateLimit`) makes every stream wait
    for it as a provider's request would, to try throttling offline.

    Example::

        model = ScriptedModel([Turn(tool_calls=[("add", {"a": 2, "b": 3})]), "It is 5."])
        result = await trio_agents.run(agent_using(model), "2+3?")
        assert model.calls == 2
        assert model.requests[1].items[-1].output == "5"
    """

    _turns: tuple[Turn, ...] = attrs.field(converter=_to_turns)
    _default: Turn | None = attrs.field(default=None, kw_only=True, converter=_to_default)
    native_output: bool = attrs.field(
        default=False, kw_only=True, validator=attrs.validators.instance_of(bool)
    )
    rate_limit: RateLimit | None = attrs.field(
        default=None,
        kw_only=True,
        validator=attrs.validators.optional(attrs.validators.instance_of(RateLimit)),
    )
    _requests: list[ModelRequest] = attrs.field(init=False, factory=list)
    _open_streams: int = attrs.field(init=False, default=0)
    _closed_streams: int = attrs.field(init=False, default=0)
    # The last request's tool specs and their size: a run sends the same tuple every
    # turn, so the usage estimate encodes its schemas once per run, not once per turn.
    _last_tools: tuple[Sequence[ToolSpec], int] | None = attrs.field(init=False, default=None)

    @property
    def turns(self) -> tuple[Turn, ...]:
        """The script."""
        return self._turns

    @property
    def default(self) -> Turn | None:
        """The turn used once the script has run out (None: fail instead)."""
        return self._default

    @property
    def requests(self) -> list[ModelRequest]:
        """Every request made so far, in call order (a copy)."""
        return list(self._requests)

    @property
    def calls(self) -> int:
        """How many times :meth:`stream` has been called."""
        return len(self._requests)

    @property
    def open_streams(self) -> int:
        """How many streams are entered and not yet left."""
        return self._open_streams

    @property
    def closed_streams(self) -> int:
        """How many streams have been left (normally, by an error or by cancellation)."""
        return self._closed_streams

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        """Record ``request`` and return a stream of the next turn of the script.

        The result is an async context manager yielding an async iterator of model
        events: the text chunks, then the tool calls, then ``Usage`` and ``Finish``.
        """
        self._requests.append(request)
        number = len(self._requests)
        if number <= len(self._turns):
            turn: Turn | None = self._turns[number - 1]
        else:
            turn = self._default
        stream: AbstractAsyncContextManager[AsyncIterator[ModelEvent]]
        if turn is None:
            error = ModelError(f"ScriptedModel script exhausted after {len(self._turns)} turns")
            stream = _EventStream((), error=error)
        else:
            stream = _EventStream(
                turn._steps(request, number, self._tools_chars),
                on_open=self._opened,
                on_close=self._closed,
            )
        if self.rate_limit is not None:
            return RateLimitedStream(self.rate_limit, request, stream)
        return stream

    def _tools_chars(self, tools: Sequence[ToolSpec]) -> int:
        last = self._last_tools
        if last is not None and last[0] is tools:
            return last[1]
        chars = _tools_chars(tools)
        _set(self, "_last_tools", (tools, chars))
        return chars

    # The counters are written with object.__setattr__: attrs routes every assignment
    # through a Python __setattr__ that runs the validators (of other fields).
    def _opened(self) -> None:
        _set(self, "_open_streams", self._open_streams + 1)

    def _closed(self) -> None:
        _set(self, "_open_streams", self._open_streams - 1)
        _set(self, "_closed_streams", self._closed_streams + 1)


_set = object.__setattr__
