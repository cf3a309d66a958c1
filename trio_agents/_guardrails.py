"""Guardrails (DESIGN §18): checks beside the model, with the power to stop the run.

- **Input guardrails** (``@input_guardrail``) are called as ``await g(run, items)`` with
  the new user items of every turn that has some (the first turn; turns with injected
  user items), *concurrently with that turn's model call*, as tasks of the run
  (``_side.py``). A trip cancels the run's scope — the model stream and any tool
  started since — and the run ends ``failed``. ``blocking=True`` runs one before the
  model call instead. A run never completes while one is still running.
- **Output guardrails** (``@output_guardrail``) are called as ``await g(run, answer)``
  with the final answer (its text, or the parsed ``final_output``), after any
  ``output_type`` validation, before the run completes. With ``stream=True`` one is
  called with the whole text streamed so far, again each time more arrives, and
  **gates** the stream (:class:`StreamGate`): a ``response.text.delta`` is published
  only once every streaming guardrail has passed the text holding it; a trip cuts the
  stream, and only released text is kept (as an incomplete message). An answer that
  never streamed — a ``final_answer`` call's arguments — is checked by them whole.

What guardrails have not passed is *held* (``_state.Hold``): fresh user input with
everything after it, until every input guardrail passed it; an accepted answer, until
every output guardrail did. Whatever is still held when the run ends — tripped on,
failed on, or never finished with — is marked ``rejected_by`` by the repair, and the
request builder (``_turns._request``) never sends a marked item: not in this run, not in
a later one on the session.

Any trip ends the run ``failed`` with reason ``"guardrail <name>: <info>"`` and a
:class:`~trio_agents.GuardrailTripped` as ``result.error``. A guardrail that raises (a
stray ``trio.Cancelled`` included) fails the run too (``"guardrail <name> raised …"``);
one that hangs holds the run (a cancel still ends it): never a pass.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, overload

import attrs
import trio

from ._error_text import summarize
from ._exceptions import GuardrailTripped
from ._handoffs import reachable

if TYPE_CHECKING:
    from ._state import Hold, RunState

__all__ = [
    "GuardrailFault",
    "GuardrailResult",
    "InputGuardrail",
    "OutputGuardrail",
    "StreamGate",
    "check",
    "check_input",
    "check_output",
    "input_guardrail",
    "input_guardrails_done",
    "needs_side_tasks",
    "output_guardrail",
    "stop_run",
]


@attrs.frozen
class GuardrailResult:
    """What a guardrail returns: ``tripped`` stops the run; ``info`` says why (it is in
    the failure reason and on :class:`GuardrailTripped`). A guardrail may return a
    bool instead: ``True`` means tripped."""

    tripped: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    info: Any = None


class GuardrailFault(Exception):
    """A guardrail raised, or returned something that is not a result (the run fails
    with ``"guardrail <name> raised …"``, never treats it as a pass)."""

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(f"guardrail {name} raised {summarize(error)}")
        self.name = name
        self.error = error


def _check_name(_instance: object, _attribute: object, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise TypeError(f"a guardrail's name must be a non-empty str, not {value!r}")


@attrs.frozen(eq=False)
class InputGuardrail:
    """An input guardrail: ``fn(run, items)``; made with :func:`input_guardrail`."""

    fn: Callable[[Any, Sequence[Any]], Any] = attrs.field(repr=False)
    name: str = attrs.field(validator=_check_name)
    blocking: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


@attrs.frozen(eq=False)
class OutputGuardrail:
    """An output guardrail: ``fn(run, answer)``; made with :func:`output_guardrail`."""

    fn: Callable[[Any, Any], Any] = attrs.field(repr=False)
    name: str = attrs.field(validator=_check_name)
    stream: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))


def _name_of(fn: object) -> str:
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) and name else type(fn).__name__


@overload
def input_guardrail(fn: Callable[..., Any], /) -> InputGuardrail: ...
@overload
def input_guardrail(
    *, name: str | None = None, blocking: bool = False
) -> Callable[[Callable[..., Any]], InputGuardrail]: ...
def input_guardrail(
    fn: Callable[..., Any] | None = None, /, *, name: str | None = None, blocking: bool = False
) -> InputGuardrail | Callable[[Callable[..., Any]], InputGuardrail]:
    """Make an input guardrail of ``fn(run, items)`` (async or sync), returning a
    :class:`GuardrailResult` or a bool; as ``@input_guardrail`` or with options.

    Args:
        name: the name in failure reasons (default: the function's name).
        blocking: run before the model call instead of beside it.
    """

    def make(fn: Callable[..., Any]) -> InputGuardrail:
        if not callable(fn):
            raise TypeError(f"input_guardrail needs a function, not {type(fn).__name__}")
        return InputGuardrail(fn, name if name is not None else _name_of(fn), blocking)

    return make if fn is None else make(fn)


@overload
def output_guardrail(fn: Callable[..., Any], /) -> OutputGuardrail: ...
@overload
def output_guardrail(
    *, name: str | None = None, stream: bool = False
) -> Callable[[Callable[..., Any]], OutputGuardrail]: ...
def output_guardrail(
    fn: Callable[..., Any] | None = None, /, *, name: str | None = None, stream: bool = False
) -> OutputGuardrail | Callable[[Callable[..., Any]], OutputGuardrail]:
    """Make an output guardrail of ``fn(run, answer)`` (async or sync), returning a
    :class:`GuardrailResult` or a bool; as ``@output_guardrail`` or with options.

    Args:
        name: the name in failure reasons (default: the function's name).
        stream: check the text as it streams and gate it (see the module docs).
    """

    def make(fn: Callable[..., Any]) -> OutputGuardrail:
        if not callable(fn):
            raise TypeError(f"output_guardrail needs a function, not {type(fn).__name__}")
        return OutputGuardrail(fn, name if name is not None else _name_of(fn), stream)

    return make if fn is None else make(fn)


async def check(name: str, fn: Callable[[Any, Any], Any], run: Any, value: Any) -> None:
    """Call one guardrail.

    Raises:
        GuardrailTripped: it tripped.
        GuardrailFault: it raised (a stray ``trio.Cancelled`` too) or returned garbage.
    """
    try:
        result = fn(run, value)
    except Exception as exc:
        raise GuardrailFault(name, exc) from exc
    except trio.Cancelled as exc:
        _raise_cancelled(name, exc)
    await _outcome(name, result)


async def _outcome(name: str, result: Any) -> None:
    """A guardrail's return value (awaited if awaitable), judged (see :func:`check`)."""
    if inspect.isawaitable(result):
        try:
            result = await result
        except Exception as exc:
            raise GuardrailFault(name, exc) from exc
        except trio.Cancelled as exc:
            _raise_cancelled(name, exc)
    _judge(name, result)


def _raise_cancelled(name: str, exc: trio.Cancelled) -> NoReturn:
    """A guardrail raised ``Cancelled``: the run's (re-raised) if the run really is
    cancelled, else a stray one that nothing asked for, a fault."""
    if trio.current_effective_deadline() != -math.inf:
        raise GuardrailFault(name, exc) from exc
    raise exc


def _judge(name: str, result: object) -> None:
    """What a guardrail returned, as a pass (returns) or a trip or fault (raises)."""
    if result is False:
        return  # a pass, the common case: no result object to build (P1)
    if result is True:
        raise GuardrailTripped(name, None)
    if not isinstance(result, GuardrailResult):
        error = TypeError(f"returned {type(result).__name__}, not a GuardrailResult or bool")
        raise GuardrailFault(name, error)
    if result.tripped:
        raise GuardrailTripped(name, result.info)


def _is_async(fn: object) -> bool:
    """Whether calling ``fn`` makes a coroutine (an ``async def``, a partial of one, an
    object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        inspect.getattr_static(type(fn), "__call__", None)
    )


class StreamGate:
    """Holds a response's text deltas until every streaming output guardrail has passed
    the text holding them; then publishes them (``response.text.delta``) and keeps them
    as the turn's partial text. One per model turn of an agent with such guardrails.

    Two ways to check, chosen once per turn:

    - **Inline** (every streaming guardrail is a plain function, not ``async def``):
      :meth:`push` calls them with the text so far in the stream loop itself, as each
      delta arrives, and publishes the delta at once if they pass. Nothing can arrive
      while sync code runs, so a checker task would only add a task step per check
      (P1: the gate's cost per delta, issue 43). A trip stops the run from the stream
      loop (:meth:`push` returns True and :meth:`settle` raises the run's Cancelled):
      the delta that tripped is never published.
    - **Beside the stream** (any ``async def`` guardrail): the checker (:meth:`run`) is a
      task of the run; each round it takes the text streamed so far, calls every
      streaming guardrail with it, and releases what they passed; deltas that arrive
      meanwhile wait for the next round (so a fast stream costs one round per batch of
      deltas, not one per delta).
    """

    __slots__ = (
        "_append",
        "_checked",
        "_closed",
        "_ended",
        "_guardrails",
        "_handle",
        "_held",
        "_idle",
        "_live",
        "_more",
        "_partial",
        "_pending",
        "_state",
        "_stopped",
        "_turn",
        "inline",
    )

    def __init__(
        self, state: RunState, turn: int, guardrails: Sequence[OutputGuardrail], partial: list[str]
    ) -> None:
        self._state = state
        self._turn = turn
        self._guardrails = guardrails
        self._partial = partial  # what the turn keeps: released text only
        # The text every guardrail has passed (all released text), kept whole: a check
        # appends what arrived since instead of joining every delta again (P1).
        self._checked = ""
        self._held: list[str] = []  # pushed, not yet released (nor, but the round
        # under way's, checked): the text so far is what was checked plus these
        self.inline = not any(_is_async(g.fn) for g in guardrails)
        # Inline: a check a plain function handed back as an awaitable, for settle().
        self._pending: tuple[Any, int, str, str] | None = None
        self._stopped = False  # inline: a guardrail tripped or failed; publish no more
        # Inline, neither stopped nor closed: push()'s one test on its hot path (one
        # call per delta, W1), with what that path reads kept at hand.
        self._live = self.inline
        self._handle = state.handle
        self._append = state.log.append_text
        self._more = trio.Event()
        self._idle = trio.Event()
        self._idle.set()
        self._ended = False
        self._closed = False

    def push(self, text: str) -> bool:
        """A delta arrived: check it now (inline) or hold it until the checker has.

        Returns True when the stream loop must ``await`` :meth:`settle` before the next
        delta: an inline guardrail tripped or failed (the run is being stopped), or a
        plain function gave back an awaitable to finish.
        """
        if not self._live:
            if not (self.inline or self._closed):
                self._held.append(text)
                self._idle = trio.Event() if self._idle.is_set() else self._idle
                self._more.set()
            return False  # held for the checker; or stopped or closed: nothing published
        whole = self._checked + text
        handle = self._handle
        index = -1  # a counter, not enumerate(): one guardrail is the common case
        for guardrail in self._guardrails:
            index += 1
            try:
                result = guardrail.fn(handle, whole)
            except (Exception, trio.Cancelled) as exc:
                return self._fault(guardrail.name, exc)
            if result is not False and self._judged(index, result, whole, text):
                return True
        # Passed (False: a pass, the common case): released at once, as _release() does.
        self._checked = whole
        self._partial.append(text)
        self._append(self._turn, text)
        return False

    def _judged(self, index: int, result: object, whole: str, text: str) -> bool:
        """The inline guardrail at ``index`` returned something other than False: whether
        push() must return True (an awaitable to finish in settle(), which then checks
        the guardrails after ``index``; or a trip or fault, the run being stopped);
        False if it passed."""
        if inspect.isawaitable(result):
            self._pending = (result, index, whole, text)
            return True
        try:
            _judge(self._guardrails[index].name, result)
        except (GuardrailTripped, GuardrailFault) as exc:
            return self._stop(exc)
        return False

    async def settle(self) -> None:
        """After :meth:`push` returned True: finish the check a plain function handed
        back as an awaitable (and the guardrails after it), then publish the delta; or,
        if a guardrail tripped or failed, raise the run's ``Cancelled`` here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            awaitable, index, whole, text = pending
            guardrail = self._guardrails[index]
            try:
                await _outcome(guardrail.name, awaitable)
                for later in self._guardrails[index + 1 :]:
                    await check(later.name, later.fn, self._handle, whole)
            except (GuardrailTripped, GuardrailFault) as exc:
                self._stop(exc)
            else:
                if not self._closed:
                    self._release(whole, text)
                return
        # stop_run cancelled the run's scope: this raises its Cancelled, and the stream
        # ends here, the rejected delta unpublished.
        await trio.lowlevel.checkpoint_if_cancelled()

    def _fault(self, name: str, exc: BaseException) -> bool:
        """An inline guardrail raised ``exc`` (in push()'s handler): a fault stops the
        run; the run's own ``Cancelled`` propagates (see :func:`_raise_cancelled`)."""
        try:
            if isinstance(exc, trio.Cancelled):
                _raise_cancelled(name, exc)
            raise GuardrailFault(name, exc) from exc
        except GuardrailFault as fault:
            return self._stop(fault)

    def _stop(self, error: GuardrailTripped | GuardrailFault) -> bool:
        self._stopped = True
        self._live = False
        stop_run(self._state, error)
        return True

    def _release(self, whole: str, text: str) -> None:
        self._checked = whole
        self._partial.append(text)
        self._append(self._turn, text)

    def end(self) -> None:
        """The stream ended: the checker stops once everything held is checked."""
        self._ended = True
        self._more.set()

    def is_closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """The turn is over (however it ended): release nothing more, stop checking."""
        self._closed = True
        self._live = False
        self._held.clear()
        self._more.set()
        pending, self._pending = self._pending, None
        if pending is not None and inspect.iscoroutine(pending[0]):
            pending[0].close()  # never awaited: the turn ended before settle()

    async def drained(self) -> None:
        """Wait until every delta pushed so far is checked and released."""
        while self._held:
            await self._idle.wait()

    async def run(self) -> None:
        """The checker task (see the class docstring). A trip or fault raises (the run
        fails): nothing still held is ever published."""
        while True:
            await self._more.wait()
            self._more = trio.Event()
            held = self._held
            count = len(held)
            if self._closed:
                return
            if count:
                text = self._checked + (held[0] if count == 1 else "".join(held))
                for guardrail in self._guardrails:
                    await check(guardrail.name, guardrail.fn, self._handle, text)
                if self.is_closed():
                    return  # the turn ended while checking: nothing more is published
                self._checked = text
                released, self._held = held[:count], held[count:]
                for piece in released:
                    self._partial.append(piece)
                    self._append(self._turn, piece)
                if self._held:
                    self._more.set()  # more arrived while checking: another round
                else:
                    self._idle.set()
            elif self._ended:
                return


def needs_side_tasks(agent: Any) -> bool:
    """Whether ``agent`` or any agent it can hand off to has guardrails that run as
    tasks beside the turn loop: non-blocking input ones, and ``async def`` streaming
    output ones (plain functions are checked inline, :class:`StreamGate`)."""
    return any(
        any(not g.blocking for g in current.input_guardrails)
        or any(g.stream and _is_async(g.fn) for g in current.output_guardrails)
        for current in reachable(agent)
    )


def stop_run(state: RunState, error: GuardrailTripped | GuardrailFault) -> None:
    """A guardrail task tripped or failed: the run fails now (its scope is cancelled)."""
    handle = state.handle
    if handle is None:
        return  # the run already ended
    if isinstance(error, GuardrailFault):
        handle._fail_now(str(error), error.error)
    else:
        handle._fail_now(str(error), error)


async def input_task(
    state: RunState, guardrail: InputGuardrail, items: Sequence[Any], hold: Hold | None
) -> None:
    """A non-blocking input guardrail, beside the model call (a task of the run)."""
    try:
        await check(guardrail.name, guardrail.fn, state.handle, items)
    except (GuardrailTripped, GuardrailFault) as exc:
        stop_run(state, exc)
    else:
        if hold is not None:
            state.passed(hold, guardrail.name)
    finally:
        state.guardrails_running -= 1
        if not state.guardrails_running and state.guardrails_idle is not None:
            state.guardrails_idle.set()


async def gate_task(gate: StreamGate, state: RunState) -> None:
    """A turn's stream gate checker (a task of the run)."""
    try:
        await gate.run()
    except (GuardrailTripped, GuardrailFault) as exc:
        stop_run(state, exc)


async def check_input(
    state: RunState, items: Sequence[Any], hold: Hold | None, *, blocking: bool = False
) -> None:
    """The agent's input guardrails on the fresh input ``items``: its non-blocking ones
    start as side tasks, beside the model call (unless ``blocking``: all are awaited);
    its blocking ones are awaited here, before it. Each that passes releases its part
    of ``hold`` (the items held from the model until all of them passed).

    Raises:
        GuardrailTripped, GuardrailFault: a blocking one tripped or failed.
    """
    awaited = []
    for guardrail in state.agent.input_guardrails:
        if blocking or guardrail.blocking or state.side is None:
            awaited.append(guardrail)
            continue
        if not state.guardrails_running:
            state.guardrails_idle = trio.Event()
        state.guardrails_running += 1
        state.side.start_soon(input_task, state, guardrail, items, hold)
    for guardrail in awaited:
        await check(guardrail.name, guardrail.fn, state.handle, items)
        if hold is not None:
            state.passed(hold, guardrail.name)


async def input_guardrails_done(state: RunState) -> None:
    """Wait for the input guardrails still running (a run never completes before they
    all passed)."""
    while state.guardrails_running:
        assert state.guardrails_idle is not None
        await state.guardrails_idle.wait()


async def check_output(
    state: RunState, answer: Any, held: tuple[int, ...], text: str | None
) -> None:
    """The agent's output guardrails on the final answer, held from the model (the
    conversation's items at ``held``) until every one passed it.

    The non-streaming ones get ``answer`` (the text, or the parsed value). The
    streaming ones saw a text answer as it streamed, through the gate; an answer that
    never streamed — ``text``, the arguments of a ``final_answer`` call — they get here,
    whole, as if it had.

    Raises:
        GuardrailTripped, GuardrailFault: as :func:`check`.
    """
    guardrails = [g for g in state.agent.output_guardrails if text is not None or not g.stream]
    if not guardrails:
        return
    hold = state.hold(held[0], [g.name for g in guardrails], only=held)
    for guardrail in guardrails:
        value = text if guardrail.stream else answer
        await check(guardrail.name, guardrail.fn, state.handle, value)
        state.passed(hold, guardrail.name)
