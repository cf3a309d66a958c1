"""Faults: models, hooks and sessions that misbehave on purpose, and what they saw.

A run must keep its promises whatever the code around it does (``DESIGN.md`` §5).
:class:`Faults` says which model turns, hooks and session calls of one example
misbehave; :func:`~trio_agents.testing.run_schedule` then wraps the example's model,
hooks and session in watchers that apply the faults and record every call, with its
Trio time and how it ended, for the checker. (Fault *tools* are ordinary fake tools:
see :func:`~trio_agents.testing.standard_tools` with ``faults=True``.)

Every fault is cancellable: "block" means "wait until cancelled". Something that
blocks *and* ignores cancellation forever can stop any run from ending; the finite
version of that, a shielded tool, is :func:`~trio_agents.testing.shielding_tool`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast, final

import attrs
import trio

from .. import Item, RunHooks, ToolCall, ToolResult
from ..models import ModelEvent, ModelRequest, ScriptedModel, TextDelta, ToolCallDone
from ..sessions import Session
from ._fakes import stray_cancelled

if TYPE_CHECKING:
    from .. import Run, RunResult

__all__ = [
    "HOOK_NAMES",
    "Faults",
    "HookCall",
    "HookFault",
    "HookName",
    "InjectedFault",
    "ModelFault",
    "ModelFaultKind",
    "SessionCall",
    "SessionFault",
    "SessionFaultKind",
    "StreamRecord",
]

ModelFaultKind: TypeAlias = Literal[
    "raise",
    "raise_on_open",
    "bytes_text",
    "unknown_event",
    "duplicate_id",
    "reused_id",
    "never_ends",
    "stray_cancel",
    "swallow_cancel",
    "swallow_cancel_on_exit",
]
"""How a model stream misbehaves (see :class:`ModelFault`)."""

MODEL_FAULT_KINDS: tuple[ModelFaultKind, ...] = (
    "raise",
    "raise_on_open",
    "bytes_text",
    "unknown_event",
    "duplicate_id",
    "reused_id",
    "never_ends",
    "stray_cancel",
    "swallow_cancel",
    "swallow_cancel_on_exit",
)

MALFORMED: frozenset[ModelFaultKind] = frozenset(
    {"bytes_text", "unknown_event", "duplicate_id", "reused_id"}
)
"""Model faults the run must turn into a ``failed`` run with a ``ModelError`` reason."""

HookName: TypeAlias = Literal[
    "on_run_start", "on_run_end", "on_model_start", "on_model_end", "on_tool_start", "on_tool_end"
]
HOOK_NAMES: tuple[HookName, ...] = (
    "on_run_start",
    "on_run_end",
    "on_model_start",
    "on_model_end",
    "on_tool_start",
    "on_tool_end",
)
START_HOOKS: frozenset[HookName] = frozenset({"on_run_start", "on_model_start", "on_tool_start"})

SessionFaultKind: TypeAlias = Literal[
    "raise_on_get", "raise_on_add", "block_on_add", "raise_after_add", "block_after_add"
]
SESSION_FAULT_KINDS: tuple[SessionFaultKind, ...] = (
    "raise_on_get",
    "raise_on_add",
    "block_on_add",
    "raise_after_add",
    "block_after_add",
)


class InjectedFault(Exception):
    """What a faulty model, hook or session raises (never a library exception)."""


@final
@attrs.frozen
class ModelFault:
    """Model call number ``turn`` (from 1) misbehaves after ``after`` events.

    ``kind`` is one of:

    - ``"raise"``: raise :class:`InjectedFault` (a stream that dies mid-way);
    - ``"raise_on_open"``: raise it when the stream is entered (``after`` is unused);
    - ``"bytes_text"``: yield ``TextDelta(b"...")``, text that is not a ``str``;
    - ``"unknown_event"``: yield an object that is no model event;
    - ``"duplicate_id"``: yield the same ``ToolCallDone`` twice in the turn;
    - ``"reused_id"``: yield a ``ToolCallDone`` reusing a call id of the conversation
      (a no-op when the conversation has no call yet);
    - ``"never_ends"``: stop sending and never end (until cancelled);
    - ``"stray_cancel"``: raise a ``trio.Cancelled`` that no scope of the run cancelled;
    - ``"swallow_cancel"``: stop sending and wait; when cancelled (the run, or a
      ``when="now"`` injection), end the stream as if it were complete instead;
    - ``"swallow_cancel_on_exit"``: stop sending and wait; when cancelled, let the
      ``Cancelled`` out of the iterator but swallow it in the stream's ``__aexit__``
      (which returns True).

    If the script's stream has fewer than ``after`` events, the fault comes at its end.
    """

    turn: int
    kind: ModelFaultKind
    after: int = 0

    def describe(self) -> str:
        """A short readable form."""
        return f"model call {self.turn}: {self.kind} after {self.after} event(s)"


@final
@attrs.frozen
class HookFault:
    """Hook ``hook`` raises :class:`InjectedFault` (``kind="raise"``) or blocks until
    cancelled (``"block"``) on its ``call``-th call (from 1) and every later one."""

    hook: HookName
    kind: Literal["raise", "block"]
    call: int = 1

    def describe(self) -> str:
        """A short readable form."""
        return f"{self.hook}: {self.kind} from call {self.call}"


@final
@attrs.frozen
class SessionFault:
    """The session misbehaves from its ``call``-th call (from 1) of the method on.

    ``kind``: ``"raise_on_get"`` (``get_items`` raises), ``"raise_on_add"``
    (``add_items`` raises, storing nothing), ``"block_on_add"`` (``add_items``
    waits until cancelled, storing nothing), ``"raise_after_add"`` (``add_items``
    stores the items, then raises: a commit whose answer was lost) or
    ``"block_after_add"`` (``add_items`` stores the items, then waits until cancelled:
    a cancel that lands on a write that has happened). The add faults apply to the
    optional ``replace_items`` too (the other write; its calls are counted on their
    own).
    """

    kind: SessionFaultKind
    call: int = 1

    def describe(self) -> str:
        """A short readable form."""
        return f"session: {self.kind} from call {self.call}"


@final
@attrs.frozen
class Faults:
    """The faults of one example: empty (the default) means none.

    Attributes:
        model: faults of model calls (at most one per call number is used).
        hooks: faults of hooks (the first matching one applies).
        session: a fault of the session (the run then gets a session).
    """

    model: tuple[ModelFault, ...] = ()
    hooks: tuple[HookFault, ...] = ()
    session: SessionFault | None = None

    def __bool__(self) -> bool:
        return bool(self.model or self.hooks or self.session)

    def describe(self) -> list[str]:
        """One line per fault."""
        lines = [f.describe() for f in self.model]
        lines += [f.describe() for f in self.hooks]
        if self.session is not None:
            lines.append(self.session.describe())
        return lines


# ------------------------------------------------------------------ the model


@final
@attrs.define(eq=False)
class StreamRecord:
    """What one model stream did.

    Attributes:
        number: the model call number (from 1).
        opened_at: Trio time ``stream()`` was entered (None: it was never entered).
        closed_at: Trio time it was left (None: still open).
        fault: the fault planned for this call, if any.
        fired_at: Trio time the fault reached the run (None: it never did).
        error: ``"Type: message"`` of an exception the stream raised into the run.
        error_at: Trio time of that exception.
    """

    number: int
    opened_at: float | None = None
    closed_at: float | None = None
    fault: ModelFault | None = None
    fired_at: float | None = None
    error: str | None = None
    error_at: float | None = None


class _UnknownEvent:
    """Not a model event."""

    def __repr__(self) -> str:
        return "<an unknown model event>"


@final
class _WatchedIterator:
    """Wraps a stream's iterator: applies the fault, records errors."""

    def __init__(
        self, inner: AsyncIterator[ModelEvent], record: StreamRecord, request: ModelRequest
    ) -> None:
        self._inner = inner
        self._record = record
        self._request = request
        self._position = 0
        self._pending: list[ModelEvent] = []
        self._done = False

    def __aiter__(self) -> _WatchedIterator:
        return self

    async def __anext__(self) -> ModelEvent:
        try:
            return await self._next()
        except StopAsyncIteration:
            raise
        except Exception as exc:
            self._error(exc)
            raise

    def _error(self, exc: BaseException) -> None:
        if self._record.error is None:
            self._record.error = _describe(exc)
            self._record.error_at = trio.current_time()

    async def _next(self) -> ModelEvent:
        if self._pending:
            event = self._pending.pop(0)
            if not self._pending:
                self._fired()
            return event
        fault = self._record.fault
        if fault is not None and self._record.fired_at is None and self._position >= fault.after:
            return await self._fire(fault)
        if self._done:
            raise StopAsyncIteration
        try:
            event = await self._inner.__anext__()
        except StopAsyncIteration:
            self._done = True
            if fault is not None and self._record.fired_at is None:
                return await self._fire(fault)
            raise
        self._position += 1
        return event

    def _fired(self) -> None:
        self._record.fired_at = trio.current_time()

    async def _fire(self, fault: ModelFault) -> ModelEvent:
        await trio.lowlevel.checkpoint()
        kind = fault.kind
        if kind in ("raise", "raise_on_open"):
            self._fired()
            raise InjectedFault(f"model call {self._record.number} fell over (fault)")
        if kind == "stray_cancel":
            stray = await stray_cancelled()
            self._fired()
            self._error(stray)
            raise stray
        if kind == "never_ends":
            self._fired()
            await trio.sleep_forever()
        if kind in SWALLOWING:
            self._fired()
            if kind == "swallow_cancel_on_exit":
                await trio.sleep_forever()  # its Cancelled is swallowed by __aexit__
            try:
                await trio.sleep_forever()
            except trio.Cancelled:
                self._done = True
            raise StopAsyncIteration  # the bug, on purpose: a cancel as a normal end
        if kind == "bytes_text":
            self._fired()
            return TextDelta(cast(str, b"bytes, not text"))
        if kind == "unknown_event":
            self._fired()
            return cast(ModelEvent, _UnknownEvent())
        name = self._request.tools[0].name if self._request.tools else "no_such_tool"
        if kind == "duplicate_id":
            call = ToolCall(f"dup_{self._record.number}", name, "{}")
            self._pending.append(ToolCallDone(call))  # the second copy fires the fault
            return ToolCallDone(call)
        # reused_id: an id the conversation already holds
        taken = [i.call_id for i in self._request.items if isinstance(i, ToolCall | ToolResult)]
        if not taken:
            self._record.fault = None  # nothing to reuse: no fault after all
            return await self._next()
        self._fired()
        return ToolCallDone(ToolCall(taken[0], name, "{}"))


@final
class _WatchedStream(AbstractAsyncContextManager[AsyncIterator[ModelEvent]]):
    def __init__(
        self,
        inner: AbstractAsyncContextManager[AsyncIterator[ModelEvent]],
        record: StreamRecord,
        request: ModelRequest,
    ) -> None:
        self._inner = inner
        self._record = record
        self._request = request

    async def __aenter__(self) -> AsyncIterator[ModelEvent]:
        fault = self._record.fault
        try:
            if fault is not None and fault.kind == "raise_on_open":
                await trio.lowlevel.checkpoint()
                self._record.fired_at = trio.current_time()
                raise InjectedFault(f"model call {self._record.number} could not connect (fault)")
            iterator = await self._inner.__aenter__()
        except Exception as exc:
            self._record.error = _describe(exc)
            self._record.error_at = trio.current_time()
            raise
        self._record.opened_at = trio.current_time()
        return _WatchedIterator(iterator, self._record, self._request)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        self._record.closed_at = trio.current_time()
        swallowed = await self._inner.__aexit__(exc_type, exc_value, traceback)
        fault = self._record.fault
        if (
            fault is not None
            and fault.kind == "swallow_cancel_on_exit"
            and self._record.fired_at is not None
            and _cancelled_only(exc_value)
        ):
            return True  # the bug, on purpose: the stream swallows its cancellation
        return swallowed


@final
@attrs.define(eq=False)
class WatchedModel:
    """The model an example's agent gets: the :class:`ScriptedModel`, watched (and
    faulted as :class:`Faults` says). ``requests`` and ``open_streams`` are the
    scripted model's."""

    scripted: ScriptedModel
    faults: Sequence[ModelFault] = ()
    streams: list[StreamRecord] = attrs.Factory(list)

    @property
    def requests(self) -> list[ModelRequest]:
        """Every request made so far."""
        return self.scripted.requests

    @property
    def open_streams(self) -> int:
        """Streams entered and not left."""
        return self.scripted.open_streams

    @property
    def native_output(self) -> bool:
        """The scripted model's: whether it answers structured output natively."""
        return self.scripted.native_output

    @native_output.setter
    def native_output(self, value: bool) -> None:
        self.scripted.native_output = value

    def stream(
        self, request: ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        """The scripted stream, watched."""
        record = StreamRecord(len(self.streams) + 1)
        record.fault = next((f for f in self.faults if f.turn == record.number), None)
        self.streams.append(record)
        return _WatchedStream(self.scripted.stream(request), record, request)


# ------------------------------------------------------------------ hooks


@final
@attrs.define(eq=False)
class HookCall:
    """One call of a hook.

    Attributes:
        hook: its name.
        key: what it is about: ``"run"``, ``"model:<turn>"`` or ``"tool:<call id>"``.
        at: Trio time of the call.
        fault: ``"raise"`` or ``"block"`` if it misbehaved on purpose.
        outcome: ``"returned"``, ``"raised"``, ``"cancelled"`` (or None while running).
        ended_at: Trio time it ended.
        stored: for ``on_run_end``: whether the session already held
            ``result.conversation`` when it was called (None without a session).
    """

    hook: HookName
    key: str
    at: float
    fault: Literal["raise", "block"] | None = None
    outcome: Literal["returned", "raised", "cancelled"] | None = None
    ended_at: float | None = None
    stored: bool | None = None


@final
class WatchedHooks(RunHooks):
    """Calls the user's hooks (if any), applies hook faults, records every call."""

    def __init__(
        self,
        inner: RunHooks | None,
        faults: Sequence[HookFault] = (),
        stored: Callable[[], Awaitable[Sequence[Item]]] | None = None,
    ) -> None:
        self.inner = inner
        self.faults = tuple(faults)
        self.calls: list[HookCall] = []
        self._counts: dict[str, int] = {}
        self._stored = stored

    async def _call(
        self, hook: HookName, key: str, inner: Callable[[RunHooks], Any], stored: bool | None
    ) -> None:
        number = self._counts[hook] = self._counts.get(hook, 0) + 1
        record = HookCall(hook, key, trio.current_time(), stored=stored)
        self.calls.append(record)
        fault = next((f for f in self.faults if f.hook == hook and number >= f.call), None)
        try:
            if self.inner is not None:
                await inner(self.inner)
            if fault is not None:
                record.fault = fault.kind
                if fault.kind == "raise":
                    raise InjectedFault("the hook failed on purpose")
                await trio.sleep_forever()
        except BaseException as exc:
            only_cancelled = isinstance(exc, trio.Cancelled) or (
                isinstance(exc, BaseExceptionGroup)
                and exc.subgroup(lambda e: not isinstance(e, trio.Cancelled)) is None
            )
            record.outcome = "cancelled" if only_cancelled else "raised"
            record.ended_at = trio.current_time()
            raise
        record.outcome = "returned"
        record.ended_at = trio.current_time()

    async def on_run_start(self, run: Run) -> None:
        await self._call("on_run_start", "run", lambda h: h.on_run_start(run), None)

    async def on_run_end(self, run: Run, result: RunResult) -> None:
        stored = None
        if self._stored is not None:
            # A probe, not part of the hook: it must not be cut by the run's deadline.
            with trio.CancelScope(shield=True):
                stored = tuple(await self._stored()) == tuple(result.conversation)
        await self._call("on_run_end", "run", lambda h: h.on_run_end(run, result), stored)

    async def on_model_start(self, run: Run, turn: int, request: ModelRequest) -> None:
        await self._call(
            "on_model_start",
            f"model:{turn}",
            lambda h: h.on_model_start(run, turn, request),
            None,
        )

    async def on_model_end(self, run: Run, turn: int, outcome: str) -> None:
        await self._call(
            "on_model_end", f"model:{turn}", lambda h: h.on_model_end(run, turn, outcome), None
        )

    async def on_tool_start(self, run: Run, call: ToolCall) -> None:
        await self._call(
            "on_tool_start", f"tool:{call.call_id}", lambda h: h.on_tool_start(run, call), None
        )

    async def on_tool_end(self, run: Run, call: ToolCall, result: ToolResult) -> None:
        await self._call(
            "on_tool_end",
            f"tool:{call.call_id}",
            lambda h: h.on_tool_end(run, call, result),
            None,
        )


# ------------------------------------------------------------------ the session


@final
@attrs.define(eq=False)
class SessionCall:
    """One call of the session.

    Attributes:
        method: ``"get_items"``, ``"add_items"``, ``"replace_items"`` or ``"clear"``.
        at: Trio time of the call.
        items: how many items ``add_items`` was given.
        fault: True if it misbehaved on purpose.
        stored: True if the write stored its items (it may still have raised or been
            interrupted, after: the ``*_after_add`` faults).
        outcome: ``"ok"``, ``"raised"`` or ``"interrupted"`` (cancelled) — None while
            running.
        ended_at: Trio time it ended.
    """

    method: str
    at: float
    items: int = 0
    fault: bool = False
    stored: bool = False
    outcome: Literal["ok", "raised", "interrupted"] | None = None
    ended_at: float | None = None


_Misbehaviour: TypeAlias = Literal["raise", "block", "raise_after", "block_after"] | None
# What a write (add_items, replace_items) does under each session fault kind.
_WRITE_FAULTS: dict[SessionFaultKind, _Misbehaviour] = {
    "raise_on_add": "raise",
    "block_on_add": "block",
    "raise_after_add": "raise_after",
    "block_after_add": "block_after",
}


@final
class WatchedSession:
    """A :class:`~trio_agents.sessions.Session` around another: applies the session
    fault, records every call. It is its own lock key, so nothing an example leaves
    claimed can touch another example. :meth:`heal` turns the fault off."""

    def __init__(self, inner: Session, fault: SessionFault | None = None) -> None:
        self.inner = inner
        self.fault = fault
        self.calls: list[SessionCall] = []
        self._counts: dict[str, int] = {}

    @property
    def session_id(self) -> str:
        """The wrapped session's id."""
        return self.inner.session_id

    @property
    def lock_key(self) -> object:
        """This object: one run at a time per watched session."""
        return self

    def heal(self) -> None:
        """From now on, no fault."""
        self.fault = None

    @property
    def rewritable(self) -> bool:
        """Whether the wrapped session has the optional atomic ``replace_items``
        (what a run uses to write a load repair back)."""
        return callable(getattr(self.inner, "replace_items", None))

    def __getattr__(self, name: str) -> Any:
        # The wrapped session's optional capabilities (replace_items, aclose, ...): a run
        # looks them up with getattr, so the wrapper must neither hide nor invent them.
        value = getattr(self.inner, name)
        if name != "replace_items":
            return value

        async def replace_items(items: Sequence[Item]) -> None:
            batch = list(items)
            await self._call(
                "replace_items", len(batch), self._faulty("replace_items"), lambda: value(batch)
            )

        return replace_items

    async def _call(self, method: str, items: int, faulty: _Misbehaviour, inner: Any) -> Any:
        record = SessionCall(method, trio.current_time(), items, fault=faulty is not None)
        self.calls.append(record)
        try:
            if faulty == "raise":
                await trio.lowlevel.checkpoint()
                raise InjectedFault(f"{method} failed on purpose")
            if faulty == "block":
                await trio.sleep_forever()
            value = await inner()
            record.stored = method in ("add_items", "replace_items")
            if faulty == "raise_after":
                raise InjectedFault(f"{method} stored its items, then failed on purpose")
            if faulty == "block_after":
                await trio.sleep_forever()
        except BaseException as exc:
            record.outcome = "interrupted" if isinstance(exc, trio.Cancelled) else "raised"
            record.ended_at = trio.current_time()
            raise
        record.outcome = "ok"
        record.ended_at = trio.current_time()
        return value

    def _faulty(self, method: str) -> _Misbehaviour:
        number = self._counts[method] = self._counts.get(method, 0) + 1
        fault = self.fault
        if fault is None or number < fault.call:
            return None
        if method == "get_items":
            return "raise" if fault.kind == "raise_on_get" else None
        return _WRITE_FAULTS.get(fault.kind)

    async def get_items(self) -> list[Item]:
        """The wrapped session's items (or the fault)."""
        result: list[Item] = await self._call(
            "get_items", 0, self._faulty("get_items"), self.inner.get_items
        )
        return result

    async def add_items(self, items: Sequence[Item]) -> None:
        """Append to the wrapped session (or the fault)."""
        batch = list(items)
        await self._call(
            "add_items", len(batch), self._faulty("add_items"), lambda: self.inner.add_items(batch)
        )

    async def clear(self) -> None:
        """Clear the wrapped session."""
        await self._call("clear", 0, None, self.inner.clear)


def _describe(exc: BaseException) -> str:
    """``"Type: message"`` of an exception the model raised into the run; its ``str()``
    is the model's code, and may raise (the harness must not)."""
    try:
        text = str(exc)
    except Exception as inner:
        text = f"<str() raised {type(inner).__name__}>"
    return f"{type(exc).__name__}: {text}"


SWALLOWING: frozenset[ModelFaultKind] = frozenset({"swallow_cancel", "swallow_cancel_on_exit"})
"""Model faults that swallow the stream's cancellation: the run must still end
``cancelled`` when it was cancelled, and a ``when="now"`` injection still interrupts."""


def _cancelled_only(exc: BaseException | None) -> bool:
    """Whether ``exc`` is a ``trio.Cancelled`` (or a group of nothing else)."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(lambda e: not isinstance(e, trio.Cancelled)) is None
    return False
