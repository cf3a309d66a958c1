"""``FallbackModel``: the next model answers when one fails before its first output.

DESIGN §21. A request goes to the primary model; if it fails in a way ``on`` selects
(by default a retryable :class:`~trio_agents.ModelError`: 408/429/5xx/529, a refused
connection, a timeout — once the provider's own retries are spent) *before its first
output* (a ``TextDelta`` or ``ToolCallDone``), the stream is closed and the same request
goes to the next model. Once output began, the §8 rule holds: the error is raised as
is, because the run has already shown text or taken a call from the failed model and a
second model would not continue that answer.

Until the first output, the events a member yields (``Usage``, ``Finish``) are held
back, so a member that fails is never half-counted. Every ``Usage`` passed on names the
member that served it (``Usage.model``), which is how a run tells which model answered
without any shared "last model" state (runs of one ``FallbackModel`` run concurrently).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from decimal import Decimal
from types import TracebackType
from typing import Self, TypeAlias, cast, final

import attrs
import trio

from .._exceptions import ModelError
from .._model import Model, ModelEvent, ModelRequest, TextDelta, ToolCallDone, Usage

__all__ = ["FallbackError", "FallbackModel", "FallbackOn"]

FallbackOn: TypeAlias = (
    "Callable[[Exception], bool] | type[Exception] | tuple[type[Exception], ...] | None"
)
"""What ``FallbackModel(on=...)`` accepts: a predicate over the exception, an exception
type or a tuple of them, or ``None`` (a retryable ``ModelError``)."""


def _retryable(error: Exception) -> bool:
    """The default ``on``: a :class:`ModelError` the provider marked retryable."""
    return isinstance(error, ModelError) and error.retryable


class FallbackError(ModelError):
    """Every model of a :class:`FallbackModel` failed; one exception naming each failure.

    Attributes:
        failures: ``(model, exception)`` for each model tried, in order; ``model`` is the
            member's name (see :attr:`FallbackModel.names`).
        status_code: the last failure's, when it was an HTTP status.
        retryable: whether every failure was one ``on`` selects (so an enclosing
            ``FallbackModel`` may try its next model).
    """

    def __init__(self, failures: Sequence[tuple[str, Exception]], *, retryable: bool) -> None:
        self.failures: tuple[tuple[str, Exception], ...] = tuple(failures)
        listed = "; ".join(
            f"{index}. {name}: {type(error).__name__}: {error}"
            for index, (name, error) in enumerate(self.failures, 1)
        )
        last = self.failures[-1][1] if self.failures else None
        status = last.status_code if isinstance(last, ModelError) else None
        super().__init__(
            f"all {len(self.failures)} models failed: {listed}",
            status_code=status,
            retryable=retryable,
        )


def _named(usage: Usage, name: str) -> Usage:
    """``usage`` naming the model that served it (built directly: ``attrs.evolve`` costs
    several times as much, on every request)."""
    if type(usage) is Usage:
        return Usage(
            usage.input_tokens,
            usage.output_tokens,
            name,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            cost=usage.cost,
        )
    return attrs.evolve(usage, model=name)


def _name_of(member: Model | str, model: Model) -> str:
    if isinstance(member, str):
        return member
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else type(model).__name__


def _predicate(on: FallbackOn) -> Callable[[Exception], bool]:
    if on is None:
        return _retryable
    if isinstance(on, type) and issubclass(on, BaseException):
        kind = on
        return lambda error: isinstance(error, kind)
    if isinstance(on, tuple):
        if not on or not all(isinstance(t, type) and issubclass(t, Exception) for t in on):
            raise TypeError("on= as a tuple must hold exception types")
        kinds = on
        return lambda error: isinstance(error, kinds)
    if callable(on):
        return cast("Callable[[Exception], bool]", on)
    raise TypeError(
        "on= must be a predicate, an exception type, a tuple of them or None,"
        f" not {type(on).__name__}"
    )


@final
class FallbackModel:
    """A model that tries ``primary``, then each of ``fallbacks``, until one answers.

    A request that fails in a way ``on`` selects *before its first output* (text or a
    tool call) is sent to the next model; once output began, an error is the run's
    (DESIGN §8: no retry, a clear ``failed`` reason). A failure ``on`` does not select
    (a 400, a 401: the request or the key is wrong, and another model would not fix it)
    is raised at once. When every model failed, :class:`FallbackError` names each
    failure. Cancelling the run stops whichever model is streaming; a cancelled request
    never starts the next model.

    Each ``Usage`` a member reports is passed on with ``Usage.model`` set to the
    member's name (unless it already names one), so ``RunResult.usage.model`` tells
    which model answered (``None`` when several did, over the turns of a run).

    Used as ``async with FallbackModel(...):`` it enters every member that is an async
    context manager (the HTTP providers' pooled clients) and leaves them at the end.

    Args:
        primary: the model tried first: any :class:`~trio_agents.Model`, or a spec
            string for :func:`~trio_agents.models.from_string` (``"openai:gpt-4o-mini"``).
        *fallbacks: the models tried next, in order (models or spec strings).
        on: which failures fall back: ``None`` (the default) for a retryable
            :class:`~trio_agents.ModelError` (408, 429, 5xx, Anthropic's 529, refused
            connections, timeouts, a drop before any output, after the provider's own
            retries); an exception type or a tuple of them; or a predicate called with
            the exception. ``trio.Cancelled`` never falls back.

    Raises:
        TypeError: a member is neither a model nor a str, or ``on`` is of the wrong type.
        ValueError: a spec string is not one ``from_string`` accepts.
    """

    def __init__(self, primary: Model | str, *fallbacks: Model | str, on: FallbackOn = None):
        from ._model_string import from_string

        members: list[tuple[str, Model]] = []
        for member in (primary, *fallbacks):
            if isinstance(member, str):
                model: Model = from_string(member)
            elif callable(getattr(member, "stream", None)):
                model = member
            else:
                raise TypeError(
                    f"a FallbackModel member must be a model or a spec str, not"
                    f" {type(member).__name__}"
                )
            members.append((_name_of(member, model), model))
        self._members: tuple[tuple[str, Model], ...] = tuple(members)
        self._on = _predicate(on)
        self._exit_stack: AsyncExitStack | None = None

    @property
    def models(self) -> tuple[Model, ...]:
        """The members, in the order they are tried."""
        return tuple(model for _, model in self._members)

    @property
    def names(self) -> tuple[str, ...]:
        """The members' names (``Usage.model``, :attr:`FallbackError.failures`): a spec
        string as given, else the model's ``model`` attribute, else its class name."""
        return tuple(name for name, _ in self._members)

    @property
    def native_output(self) -> bool:
        """Whether every member has native structured output. Else the run offers the
        ``final_answer`` tool, which every model can use, and the members that have
        native output are sent the request without its ``output`` so they use it too."""
        return all(getattr(model, "native_output", False) is True for _, model in self._members)

    def __repr__(self) -> str:
        return f"FallbackModel({', '.join(repr(model) for _, model in self._members)})"

    async def __aenter__(self) -> Self:
        """Enter every member that is an async context manager (in order)."""
        if self._exit_stack is not None:
            raise RuntimeError("this FallbackModel is already entered")
        stack = AsyncExitStack()
        try:
            for _, model in self._members:
                if hasattr(model, "__aenter__") and hasattr(model, "__aexit__"):
                    await stack.enter_async_context(model)  # type: ignore[arg-type]
        except BaseException:
            await stack.aclose()
            raise
        self._exit_stack = stack
        await trio.lowlevel.checkpoint()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Leave the members entered by :meth:`__aenter__` (in reverse order)."""
        stack, self._exit_stack = self._exit_stack, None
        if stack is not None:
            await stack.__aexit__(exc_type, exc_value, traceback)

    def estimate_cost(self, request: ModelRequest) -> Decimal | None:
        """The first member's estimate of ``request``'s cost in USD (it is asked first;
        checked against ``UsageLimits(cost=...)`` before the request), or ``None`` when
        it makes none. A request answered by a fallback is counted at that member's
        real price once its usage arrives."""
        model = self._members[0][1]
        method = getattr(model, "estimate_cost", None)
        # (The member may get it without its `output` spec: estimated a little over.)
        return None if method is None else method(request)

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        """Open a stream for ``request`` on the first member that answers.

        Raises:
            ModelError: (on entering or while iterating) a member's failure that does
                not fall back, or :class:`FallbackError` once every member failed.
        """
        return _FallbackStream(self._members, self._on, request)


@attrs.define(eq=False)
class _Current:
    """The member streaming now: its name, its context manager and its iterator."""

    name: str
    manager: AbstractAsyncContextManager[AsyncIterator[ModelEvent]]
    events: AsyncIterator[ModelEvent]


@final
class _FallbackStream(AbstractAsyncContextManager[AsyncIterator[ModelEvent]]):
    """One request's stream over the members: enters the next member when the current
    one fails before its first output."""

    def __init__(
        self,
        members: tuple[tuple[str, Model], ...],
        on: Callable[[Exception], bool],
        request: ModelRequest,
    ) -> None:
        self._members = members
        self._on = on
        self._request = request
        self._next = 0
        self._current: _Current | None = None
        self._failures: list[tuple[str, Exception]] = []
        self._held: deque[ModelEvent] = deque()
        self._output_began = False
        self._ended = False
        self._state = "new"

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        if self._state != "new":
            raise RuntimeError("a model stream can only be entered once")
        self._state = "open"
        await self._enter_next()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._state = "closed"
        await self._leave_current(exc_value)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ModelEvent:
        current = self._current
        if self._output_began and not self._held and current is not None:
            # The hot path, once output began: nothing falls back any more, so the
            # member's events and errors (its end included) pass straight through.
            event = await current.events.__anext__()
            if isinstance(event, Usage) and event.model is None:
                event = _named(event, current.name)
            return event
        if self._state != "open":
            raise RuntimeError("the model stream was read outside its `async with` block")
        while True:
            if self._held and (self._output_began or self._ended):
                return self._held.popleft()
            if self._ended:
                raise StopAsyncIteration
            current = self._current
            assert current is not None
            try:
                event = await current.events.__anext__()
            except StopAsyncIteration:
                self._ended = True
                continue
            except Exception as error:
                if self._output_began:
                    raise  # §8: output began, so this member's failure is the run's
                await self._fail_current(error)
                continue
            if isinstance(event, Usage) and event.model is None:
                event = _named(event, current.name)
            self._held.append(event)
            if isinstance(event, TextDelta | ToolCallDone):
                self._output_began = True

    async def _enter_next(self) -> None:
        """Enter the next member; a failure it selects moves on, until one enters."""
        while True:
            if self._next >= len(self._members):
                raise self._all_failed()
            # A cancelled request never starts the next model, even between two whose
            # own code would not have reached a checkpoint yet.
            await trio.lowlevel.checkpoint_if_cancelled()
            name, model = self._members[self._next]
            self._next += 1
            try:
                manager = model.stream(self._request_for(model))
                events = await manager.__aenter__()
            except Exception as error:
                self._record(name, error)
                continue
            self._current = _Current(name, manager, events)
            return

    def _request_for(self, model: Model) -> ModelRequest:
        """The request as ``model`` gets it. When not every member has native structured
        output, the run offers the ``final_answer`` tool (``native_output`` is False):
        a member that has it gets no ``output``, so it answers with that tool as the
        others do instead of with JSON text the run would not take as the answer."""
        request = self._request
        if request.output is None or getattr(model, "native_output", False) is not True:
            return request
        if all(getattr(m, "native_output", False) is True for _, m in self._members):
            return request
        return attrs.evolve(request, output=None)

    async def _fail_current(self, error: Exception) -> None:
        """The current member failed before its first output: close it, try the next."""
        current = self._current
        assert current is not None
        await self._leave_current(error)
        self._held.clear()
        self._record(current.name, error)
        await self._enter_next()

    def _record(self, name: str, error: Exception) -> None:
        """Keep ``error`` for the final report, or raise it when it does not fall back."""
        selected = self._on(error)
        self._failures.append((name, error))
        if not selected:
            if len(self._failures) == 1:
                raise error
            raise FallbackError(self._failures, retryable=False) from error

    def _all_failed(self) -> FallbackError:
        last = self._failures[-1][1]
        error = FallbackError(self._failures, retryable=True)
        error.__cause__ = last
        return error

    async def _leave_current(self, error: BaseException | None) -> None:
        current, self._current = self._current, None
        if current is not None:
            kind = type(error) if error is not None else None
            tb = error.__traceback__ if error is not None else None
            await current.manager.__aexit__(kind, error, tb)
