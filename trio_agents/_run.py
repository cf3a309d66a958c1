"""The run: one agent answering one input, as one Trio nursery.

A run owns a cancel scope and, inside it, a nursery holding the model-stream task (the
turn loop, which also spawns the tool tasks of each turn in a child nursery) and the
inbox task. ``Run.cancel()`` cancels that scope (with Trio's own cancel reason), so a
cancel reaches every await in the run at once; no flag is polled. After the scope is
left, for whatever reason, a shielded repair bounded by ``cleanup_timeout`` leaves a
valid conversation, persists it, balances the hooks, and only then emits the one
terminal ``run.updated``.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from typing import Any, Literal, NewType, TypeAlias, final

import attrs
import trio

from ._agent import Agent
from ._events import (
    InboxDelivered,
    InboxInjected,
    ResponseTextDelta,
    RunItemEvent,
    RunStatus,
    RunUpdated,
    ToolFinished,
    ToolProgress,
    ToolStarted,
)
from ._exceptions import (
    InboxFullError,
    RunClosedError,
    RunFailedError,
    UnknownCallError,
)
from ._hooks import RunHooks
from ._items import (
    AssistantMessage,
    Item,
    ToolCall,
    ToolResult,
    coerce_items,
)
from ._log import EventCursor, EventLog, UpdatedStream
from ._model import Finish, ModelRequest, TextDelta, ToolCallDone, Usage
from ._session_lock import OnBusy, SessionClaim, session_key
from ._tools import ToolArgumentsError, ToolContext
from .sessions._base import Session
from .sessions._repair import repair_loaded

__all__ = [
    "CancelMode",
    "InjectWhen",
    "InjectionId",
    "Run",
    "RunResult",
    "open_run",
    "run",
    "serve_run",
]

logger = logging.getLogger("trio_agents")

InjectionId = NewType("InjectionId", str)
"""The id ``Run.inject`` returns; echoed by ``inbox.injected`` / ``inbox.delivered``."""

CancelMode: TypeAlias = Literal["immediate", "after_turn"]
InjectWhen: TypeAlias = Literal["next_turn", "now", "when_idle"]
OnToolError: TypeAlias = Literal["return", "fail"]

_CANCEL_MODES = ("immediate", "after_turn")
_INJECT_WHENS = ("next_turn", "now", "when_idle")


@attrs.frozen
class RunResult:
    """The outcome of a run; ``Run.result`` once the run is terminal.

    Attributes:
        run_id: the run's id.
        status: ``completed``, ``failed`` or ``cancelled``.
        reason: why it failed or was cancelled (``"max_turns"``, the cancel reason,
            ``"parent cancelled"``, an error summary); None when completed.
        final_output: the text of the final answer (None unless completed).
        new_items: the items this run added to the conversation (input included).
        conversation: history + new items: valid model input.
        usage: token usage summed over the run's model calls.
        turns: the number of model calls started.
        unconsumed: injected items that no turn consumed, in injection order.
        error: the exception behind a failure, if there was one.
    """

    run_id: str
    status: RunStatus
    reason: str | None
    final_output: str | None
    new_items: tuple[Item, ...]
    conversation: tuple[Item, ...]
    usage: Usage
    turns: int
    unconsumed: tuple[Item, ...] = ()
    error: BaseException | None = attrs.field(default=None, eq=False)

    @property
    def ok(self) -> bool:
        """True when the run completed."""
        return self.status is RunStatus.COMPLETED

    def raise_for_status(self) -> RunResult:
        """Raise :class:`RunFailedError` if the run failed; otherwise return ``self``.

        A cancelled run is not an error: check ``status`` for it.
        """
        if self.status is RunStatus.FAILED:
            raise RunFailedError(self) from self.error
        return self


def _check_positive(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a number")
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0")


def _check_count(_instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int")
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1")


def _check_hooks(_instance: object, _attribute: object, value: Any) -> None:
    if value is not None and not isinstance(value, RunHooks):
        raise TypeError("hooks must be a RunHooks instance")


@attrs.frozen(kw_only=True)
class _RunOptions:
    """The ``**options`` of ``open_run``/``run``/``serve_run`` (validated here)."""

    cleanup_timeout: float = attrs.field(default=5.0, validator=_check_positive)
    max_concurrent_tools: int = attrs.field(default=8, validator=_check_count)
    inbox_capacity: int = attrs.field(default=1024, validator=_check_count)
    event_retention: int = attrs.field(default=65536, validator=_check_count)
    on_tool_error: OnToolError = attrs.field(
        default="return", validator=attrs.validators.in_(("return", "fail"))
    )
    hooks: RunHooks | None = attrs.field(default=None, validator=_check_hooks)
    thread_limiter: trio.CapacityLimiter | None = None
    max_turns: int | None = None
    on_busy: OnBusy = attrs.field(
        default="reject", validator=attrs.validators.in_(("reject", "interrupt", "enqueue"))
    )


def _make_options(options: Mapping[str, Any]) -> _RunOptions:
    known = {field.name for field in attrs.fields(_RunOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(
            f"unknown run option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return _RunOptions(**options)


@attrs.define(eq=False)
class _OpenCall:
    """A committed tool call that has no result yet."""

    call: ToolCall
    started: bool = False
    ctx: ToolContext | None = None


@attrs.define(eq=False)
class _Injection:
    id: InjectionId
    items: tuple[Item, ...]
    when: InjectWhen
    announced: bool = False


@attrs.define(eq=False)
class _Approval:
    call: ToolCall
    event: trio.Event = attrs.field(factory=trio.Event)
    decided: bool = False
    approved: bool = False
    message: str | None = None


class _ToolFailure(Exception):
    """A tool raised and ``on_tool_error="fail"``: the run fails with this."""

    def __init__(self, call: ToolCall, error: Exception) -> None:
        super().__init__(f"tool {call.name!r} raised {type(error).__name__}: {error}")
        self.error = error


def _summarize(exc: BaseException) -> str:
    """A one-line summary of an error for ``RunResult.reason``."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, _ToolFailure):
        return f"tool error: {exc}"
    text = str(exc)
    summary = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return summary if len(summary) <= 500 else summary[:497] + "..."


def _only_cancelled(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return all(_only_cancelled(e) for e in exc.exceptions)
    return False


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


_ids = itertools.count(1)


@final
class Run:
    """The handle of a running agent: watch it, steer it, stop it.

    Get one from :func:`open_run` or ``await nursery.start(serve_run, ...)``. Every
    method except :meth:`wait` is synchronous; :meth:`cancel`, :meth:`inject`,
    :meth:`withdraw`, :meth:`approve` and :meth:`reject` are also safe to call from
    any other thread.
    """

    def __init__(
        self,
        agent: Agent,
        input: str | Item | Mapping[str, Any] | Iterable[Any],
        *,
        session: Session | None = None,
        run_id: str | None = None,
        options: _RunOptions,
    ) -> None:
        if not isinstance(agent, Agent):
            raise TypeError(f"agent must be an Agent, not {type(agent).__name__}")
        if run_id is not None and (not isinstance(run_id, str) or not run_id):
            raise ValueError("run_id must be a non-empty str")
        if session is not None and not isinstance(session, Session):
            raise TypeError("session must implement the Session protocol")
        self._input = tuple(coerce_items(input))
        self.id: str = run_id or f"run_{uuid.uuid4().hex}"
        self.agent = agent
        self.session = session
        self._options = options
        self._max_turns = options.max_turns or agent.max_turns
        self._hooks = options.hooks
        self._log = EventLog(self.id, options.event_retention)
        self._scope = trio.CancelScope()
        self._done = trio.Event()
        self._tool_limiter = trio.CapacityLimiter(options.max_concurrent_tools)

        # Cross-thread state, guarded by _lock.
        self._lock = threading.Lock()
        self._closing = False
        self._cancel_reason: str | None = None
        self._cancel_mode: CancelMode | None = None
        self._inbox: list[_Injection] = []
        self._inbox_size = 0
        self._approvals: dict[str, _Approval] = {}

        # Trio-thread state.
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread_id: int | None = None
        self._status = RunStatus.QUEUED
        self._turn = 0
        self._history: list[Item] = []
        self._conversation: list[Item] = []
        self._new_items: list[Item] = []
        self._unpersisted: list[Item] = []
        self._open_calls: dict[str, _OpenCall] = {}
        self._partial_text: list[str] | None = None
        self._stream_scope: trio.CancelScope | None = None
        self._stop_after_turn = False
        self._usage = Usage()
        self._final_output: str | None = None
        self._failure: tuple[str, BaseException | None] | None = None
        self._open_spans: dict[str, Callable[[str], Awaitable[None]]] = {}
        self._run_span_open = False
        self._input_committed = False
        self._inbox_wakeup = trio.Event()
        self._result: RunResult | None = None
        self._claim: SessionClaim | None = None
        if session is not None:
            self._claim = SessionClaim(session_key(session), session.session_id, self)
        self._emit_status(RunStatus.QUEUED)

    # ------------------------------------------------------------------ public API

    @property
    def status(self) -> RunStatus:
        """The current status."""
        return self._status

    @property
    def result(self) -> RunResult | None:
        """The :class:`RunResult`, once the run is terminal; None before."""
        return self._result

    @property
    def turn(self) -> int:
        """The number of model calls started so far."""
        return self._turn

    @property
    def updated(self) -> UpdatedStream:
        """Status updates: ``async for update in run.updated``.

        Each ``async for`` is an independent subscriber: it first receives the current
        status, then every change, and ends after the terminal one. A subscriber that
        never reads never slows the run.
        """
        return UpdatedStream(self._log)

    def events(self, from_seq: int | None = None) -> EventCursor:
        """Every event of the run, replayable from the run's bounded log.

        ``from_seq`` is inclusive; None means the oldest retained event. The iterator
        ends after the terminal ``run.updated``; one that falls behind retention gets an
        ``events.dropped`` marker instead of the missing events.
        """
        return EventCursor(self._log, from_seq)

    async def wait(self) -> RunResult:
        """Wait for the run to end and return its result (never raises for a failed or
        cancelled run: see ``result.status``)."""
        await self._done.wait()
        assert self._result is not None
        return self._result

    def cancel(self, reason: str | None = None, *, mode: CancelMode = "immediate") -> None:
        """Cancel the run. Sync, idempotent, never blocks, safe from any thread.

        ``mode="immediate"`` cancels the run's scope: every await in the run is
        cancelled at once, then the bounded repair runs. ``mode="after_turn"`` lets the
        current turn (model and tools) finish and stops before the next model call. The
        first call's reason is kept; a later immediate cancel escalates an after_turn one.
        """
        if mode not in _CANCEL_MODES:
            raise ValueError(f"mode must be 'immediate' or 'after_turn', not {mode!r}")
        if reason is not None and not isinstance(reason, str):
            raise TypeError("reason must be a str or None")
        with self._lock:
            if self._closing or self._cancel_mode == "immediate":
                return
            if self._cancel_mode == "after_turn" and mode == "after_turn":
                return
            if self._cancel_reason is None:
                self._cancel_reason = reason or "cancelled"
            self._cancel_mode = mode
        self._call_soon(self._apply_cancel)

    def inject(
        self,
        items: str | Item | Mapping[str, Any] | Iterable[Any],
        *,
        when: InjectWhen = "next_turn",
    ) -> InjectionId:
        """Add items to the running conversation. Sync, safe from any thread.

        ``when="next_turn"`` delivers them at the next safe point (before the next model
        call, after every result of the current turn); ``"now"`` also interrupts a
        streaming model response; ``"when_idle"`` waits until the model gives a final
        answer. Items are validated before anything is queued.

        Raises:
            TypeError, ValueError: an item is malformed (nothing queued).
            RunClosedError: the run is terminal (nothing queued).
            InboxFullError: the inbox is full (nothing queued).
        """
        if when not in _INJECT_WHENS:
            raise ValueError(f"when must be one of {', '.join(_INJECT_WHENS)}; got {when!r}")
        converted = tuple(coerce_items(items))
        if not converted:
            raise ValueError("inject() needs at least one item")
        for item in converted:
            if isinstance(item, ToolResult | ToolCall):
                self._check_injected_pairs(converted)
                break
        with self._lock:
            if self._closing:
                raise RunClosedError(self.id, str(self._status))
            if self._inbox_size + len(converted) > self._options.inbox_capacity:
                raise InboxFullError(self._options.inbox_capacity)
            injection = _Injection(InjectionId(f"inj_{next(_ids)}"), converted, when)
            self._inbox.append(injection)
            self._inbox_size += len(converted)
        self._call_soon(self._wake_inbox)
        return injection.id

    def withdraw(self, injection_id: InjectionId | str) -> bool:
        """Take back an injection that was not delivered yet. Returns True if it was."""
        with self._lock:
            for index, injection in enumerate(self._inbox):
                if injection.id == injection_id:
                    del self._inbox[index]
                    self._inbox_size -= len(injection.items)
                    return True
        return False

    def approve(self, call_id: str) -> None:
        """Let a tool call that waits for approval run. Sync, safe from any thread.

        Raises:
            UnknownCallError: no call with this id is waiting for approval.
            RunClosedError: the run is terminal.
        """
        self._decide(call_id, approved=True, message=None)

    def reject(self, call_id: str, *, message: str | None = None) -> None:
        """Refuse a tool call that waits for approval; the model reads ``message``.

        Raises:
            UnknownCallError: no call with this id is waiting for approval.
            RunClosedError: the run is terminal.
        """
        if message is not None and not isinstance(message, str):
            raise TypeError("message must be a str or None")
        self._decide(call_id, approved=False, message=message)

    def statistics(self) -> RunStatistics:
        """A snapshot of the run's internals, for monitoring."""
        with self._lock:
            inbox = self._inbox_size
            pending = tuple(c for c, a in self._approvals.items() if not a.decided)
        return RunStatistics(
            status=self._status,
            turn=self._turn,
            last_seq=self._log.next_seq - 1,
            open_tool_calls=len(self._open_calls),
            inbox_items=inbox,
            pending_approvals=pending,
        )

    def __repr__(self) -> str:
        return f"<Run {self.id} {self._status.value} turn={self._turn}>"

    # ------------------------------------------------------------ thread plumbing

    def _call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the run's Trio thread: now if we're on it, else soon."""
        if self._token is None or threading.get_ident() == self._thread_id:
            fn()
            return
        with suppress(trio.RunFinishedError):
            self._token.run_sync_soon(fn)

    def _apply_cancel(self) -> None:
        with self._lock:
            mode, reason = self._cancel_mode, self._cancel_reason
        if self._done.is_set():
            return
        if mode == "immediate":
            self._scope.cancel(reason=reason)
        elif mode == "after_turn":
            self._stop_after_turn = True

    def _decide(self, call_id: str, *, approved: bool, message: str | None) -> None:
        with self._lock:
            if self._closing:
                raise RunClosedError(self.id, str(self._status))
            approval = self._approvals.get(call_id)
            if approval is None or approval.decided:
                raise UnknownCallError(call_id)
            approval.decided = True
            approval.approved = approved
            approval.message = message
        self._call_soon(approval.event.set)

    # ------------------------------------------------------------------- events

    def _emit_status(
        self, status: RunStatus, reason: str | None = None, detail: Mapping[str, Any] | None = None
    ) -> None:
        self._status = status
        self._log.append(
            RunUpdated(
                run_id=self.id,
                seq=self._log.next_seq,
                status=status,
                reason=reason,
                turn=self._turn,
                at=time.time(),
                detail=detail or {},
            )
        )

    def _commit(self, item: Item) -> None:
        """An item entered the conversation: record it, queue it for the session."""
        self._conversation.append(item)
        self._new_items.append(item)
        self._unpersisted.append(item)
        self._log.append(
            RunItemEvent(run_id=self.id, seq=self._log.next_seq, turn=self._turn, item=item)
        )

    def _emit_progress(self, call: ToolCall, message: str, data: Mapping[str, Any]) -> None:
        def emit() -> None:
            if call.call_id in self._open_calls and not self._log.closed:
                self._log.append(
                    ToolProgress(
                        run_id=self.id,
                        seq=self._log.next_seq,
                        call_id=call.call_id,
                        name=call.name,
                        message=message,
                        data=dict(data),
                    )
                )

        self._call_soon(emit)

    def _holds_session(self) -> bool:
        # A run cancelled while it waited for its session never touches it.
        return self._claim is None or self._claim.held

    def _claim_session(self) -> None:
        """Claim the session before the run starts (raises for ``on_busy="reject"``)."""
        if self._claim is not None:
            self._claim.claim_now(self._options.on_busy)

    async def _flush(self) -> None:
        """Write the items finalised so far to the session."""
        if self.session is None or not self._holds_session() or not self._unpersisted:
            self._unpersisted.clear()
            return
        batch = list(self._unpersisted)
        await self.session.add_items(batch)
        del self._unpersisted[: len(batch)]

    # -------------------------------------------------------------------- hooks

    async def _open_span(
        self, key: str, start: Awaitable[None], end: Callable[[str], Awaitable[None]]
    ) -> None:
        """Await a start hook, its end hook registered first: every start that was
        called gets its end, even if the start itself was interrupted."""
        self._open_spans[key] = end
        await start

    async def _close_span(self, key: str, outcome: str) -> None:
        end = self._open_spans.pop(key, None)
        if end is not None:
            await end(outcome)

    # ---------------------------------------------------------------- lifecycle

    async def _serve(
        self, go: trio.Event | None = None, *, task_status: trio.TaskStatus[Run]
    ) -> None:
        """The run's task. With ``go``, the run stays queued until ``go`` is set."""
        self._token = trio.lowlevel.current_trio_token()
        self._thread_id = threading.get_ident()
        task_status.started(self)
        escaped: BaseException | None = None
        error: BaseException | None
        try:
            with self._scope:
                if go is not None:
                    await go.wait()
                if self._claim is not None:
                    await self._claim.wait()  # queued behind the session's active run
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._inbox_task, name=f"{self.id}:inbox")
                    await self._drive()
                    nursery.cancel_scope.cancel()
        except BaseException as exc:
            escaped = exc
        drive_finished = self._final_output is not None
        if escaped is not None and not _only_cancelled(escaped):
            if isinstance(escaped, Exception):
                status, reason, error = (
                    RunStatus.FAILED,
                    f"internal error: {_summarize(escaped)}",
                    escaped,
                )
                logger.error("run %s crashed", self.id, exc_info=escaped)
                escaped = None
            else:  # KeyboardInterrupt, SystemExit, ...
                status, reason, error = RunStatus.CANCELLED, type(escaped).__name__, escaped
        elif self._failure is not None:
            status, (reason, error) = RunStatus.FAILED, self._failure
        elif drive_finished:
            status, reason, error = RunStatus.COMPLETED, None, None
        elif escaped is not None:
            status, reason, error = RunStatus.CANCELLED, "parent cancelled", None
        else:  # our own scope was cancelled, or after_turn stopped the run
            with self._lock:
                reason = self._cancel_reason or "cancelled"
            status, error = RunStatus.CANCELLED, None
        await self._finish(status, reason, error)
        if escaped is not None:
            raise escaped

    async def _drive(self) -> None:
        """The model-stream task: the turn loop."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._emit_status(RunStatus.RUNNING)
        try:
            if self._hooks is not None:
                self._run_span_open = True
                await self._hooks.on_run_start(self)
            await self._start_conversation()
            idle = False
            while True:
                await trio.lowlevel.checkpoint()
                if self._stop_after_turn:
                    return
                self._deliver_inbox(idle=idle)
                if self._turn >= self._max_turns:
                    self._failure = ("max_turns", None)
                    return
                text, calls = await self._model_turn()
                if calls is None:  # interrupted by a when="now" injection
                    idle = False
                    continue
                if calls:
                    await self._run_tools(calls)
                    idle = False
                    continue
                if self._has_pending(idle=True):
                    idle = True
                    continue
                self._final_output = text
                return
        except Exception as exc:
            self._failure = (_summarize(exc), exc)

    async def _start_conversation(self) -> None:
        """Load the session's history and commit the input (once)."""
        if self._input_committed:
            return
        if self.session is not None and self._holds_session():
            # Sessions are loaded repaired: a crashed run's dangling calls get results.
            self._history = repair_loaded(await self.session.get_items())
            self._conversation = list(self._history)
        self._input_committed = True
        for item in self._input:
            self._commit(item)
        await self._flush()

    async def _model_turn(self) -> tuple[str, list[ToolCall] | None]:
        """Run one model call. Returns (text, calls); calls is None if interrupted."""
        self._turn += 1
        turn = self._turn
        request = ModelRequest(
            instructions=self.agent.instructions,
            items=tuple(self._conversation),
            tools=self.agent.tool_specs(),
            settings=self.agent.model_settings,
        )
        if self._hooks is not None:
            hooks = self._hooks
            await self._open_span(
                "model",
                hooks.on_model_start(self, turn, request),
                lambda outcome: hooks.on_model_end(self, turn, outcome),
            )
        self._partial_text = partial = []
        calls: list[ToolCall] = []
        finish: str | None = None
        with trio.CancelScope() as stream_scope:
            self._stream_scope = stream_scope
            async with self.agent.model.stream(request) as stream:
                async for event in stream:
                    kind = type(event)
                    if kind is TextDelta:
                        assert isinstance(event, TextDelta)
                        if event.text:
                            partial.append(event.text)
                            self._log.append(
                                ResponseTextDelta(
                                    run_id=self.id,
                                    seq=self._log.next_seq,
                                    turn=turn,
                                    text=event.text,
                                )
                            )
                    elif kind is ToolCallDone:
                        assert isinstance(event, ToolCallDone)
                        calls.append(event.call)
                    elif kind is Usage:
                        assert isinstance(event, Usage)
                        self._usage = self._usage + event
                    elif kind is Finish:
                        assert isinstance(event, Finish)
                        finish = event.reason
                    else:
                        raise TypeError(f"model yielded an unknown event: {event!r}")
        self._stream_scope = None
        text = "".join(partial)
        self._partial_text = None
        if stream_scope.cancelled_caught:
            if text:
                self._commit(AssistantMessage(text, status="incomplete"))
            await self._close_span("model", "interrupted")
            await self._flush()
            return text, None
        del finish  # the loop decides by whether tool calls came back
        seen = {item.call_id for item in self._conversation if isinstance(item, ToolCall)}
        for call in calls:
            if call.call_id in seen:
                raise ValueError(f"model returned a duplicate tool call id {call.call_id!r}")
            seen.add(call.call_id)
        await self._close_span("model", "completed")
        if text or not calls:
            self._commit(AssistantMessage(text))
        for call in calls:
            self._commit(call)
            self._open_calls[call.call_id] = _OpenCall(call)
        await self._flush()
        return text, calls

    async def _run_tools(self, calls: Sequence[ToolCall]) -> None:
        needs_approval = [call for call in calls if self._needs_approval(call)]
        if needs_approval:
            with self._lock:
                for call in needs_approval:
                    self._approvals[call.call_id] = _Approval(call)
            self._emit_status(
                RunStatus.AWAITING_APPROVAL,
                detail={"pending": [call.call_id for call in needs_approval]},
            )
        async with trio.open_nursery() as nursery:
            for call in calls:
                nursery.start_soon(self._run_tool, call, name=f"{self.id}:tool:{call.name}")
        await self._flush()

    def _needs_approval(self, call: ToolCall) -> bool:
        tool = self.agent.get_tool(call.name)
        if tool is None or tool.needs_approval is False:
            return False
        if tool.needs_approval is True:
            return True
        try:
            arguments = tool.parse_arguments(call.arguments)
        except ToolArgumentsError:
            return False  # the call will fail validation without running
        return bool(tool.needs_approval(arguments))

    async def _await_approval(self, call: ToolCall) -> ToolResult | None:
        """Wait for a decision on ``call``; return a rejection result or None."""
        approval = self._approvals[call.call_id]
        await approval.event.wait()
        with self._lock:
            self._approvals.pop(call.call_id, None)
            undecided = any(not a.decided for a in self._approvals.values())
        if not undecided and self._status is RunStatus.AWAITING_APPROVAL:
            self._emit_status(RunStatus.RUNNING)
        if approval.approved:
            return None
        message = approval.message or "the user rejected this tool call"
        return ToolResult(call.call_id, f"rejected: {message}", status="error")

    async def _run_tool(self, call: ToolCall) -> None:
        open_call = self._open_calls[call.call_id]
        if call.call_id in self._approvals:
            rejection = await self._await_approval(call)
            if rejection is not None:
                await self._end_tool(call, rejection)
                return
        async with self._tool_limiter:
            tool = self.agent.get_tool(call.name)
            open_call.started = True
            self._log.append(
                ToolStarted(
                    run_id=self.id,
                    seq=self._log.next_seq,
                    call_id=call.call_id,
                    name=call.name,
                    arguments=call.arguments,
                )
            )
            if self._hooks is not None:
                hooks = self._hooks
                await self._open_span(
                    f"tool:{call.call_id}",
                    hooks.on_tool_start(self, call),
                    lambda outcome: hooks.on_tool_end(
                        self, call, ToolResult(call.call_id, outcome, status="cancelled")
                    ),
                )
            if tool is None:
                names = ", ".join(t.name for t in self.agent.tools) or "none"
                result = ToolResult(
                    call.call_id,
                    f"unknown tool {call.name!r}; available tools: {names}",
                    status="error",
                )
                await self._end_tool(call, result)
                return
            ctx = ToolContext(
                run_id=self.id,
                call_id=call.call_id,
                tool_name=call.name,
                cancelled=threading.Event(),
                on_progress=lambda message, data: self._emit_progress(call, message, data),
            )
            open_call.ctx = ctx
            timeout = tool.timeout if tool.timeout is not None else math.inf
            try:
                with trio.move_on_after(timeout) as timer:
                    output = await tool.invoke(
                        ctx, call.arguments, limiter=self._options.thread_limiter
                    )
            except ToolArgumentsError as exc:
                result = ToolResult(call.call_id, str(exc), status="error")
            except Exception as exc:
                if self._options.on_tool_error == "fail":
                    raise _ToolFailure(call, exc) from exc
                result = ToolResult(call.call_id, f"error: {_summarize(exc)}", status="error")
            else:
                if timer.cancelled_caught:
                    ctx.cancelled.set()
                    result = ToolResult(
                        call.call_id, f"timed out after {tool.timeout:g} s", status="error"
                    )
                else:
                    result = ToolResult(call.call_id, output)
        await self._end_tool(call, result)

    async def _end_tool(self, call: ToolCall, result: ToolResult) -> None:
        open_call = self._open_calls.pop(call.call_id)
        self._commit(result)
        if open_call.started:
            self._log.append(
                ToolFinished(
                    run_id=self.id,
                    seq=self._log.next_seq,
                    call_id=call.call_id,
                    name=call.name,
                    status=result.status,
                    output=result.output,
                )
            )
        key = f"tool:{call.call_id}"
        if self._hooks is not None and key in self._open_spans:
            del self._open_spans[key]
            await self._hooks.on_tool_end(self, call, result)

    # -------------------------------------------------------------------- inbox

    async def _inbox_task(self) -> None:
        """Announce accepted injections (``inbox.injected``); interrupt for ``now``."""
        while True:
            await self._inbox_wakeup.wait()
            self._inbox_wakeup = trio.Event()
            self._announce_injections()

    def _wake_inbox(self) -> None:
        self._inbox_wakeup.set()

    def _announce_injections(self) -> None:
        with self._lock:
            fresh = [inj for inj in self._inbox if not inj.announced]
            for injection in fresh:
                injection.announced = True
        for injection in fresh:
            self._log.append(
                InboxInjected(
                    run_id=self.id,
                    seq=self._log.next_seq,
                    injection_id=injection.id,
                    when=injection.when,
                    items=injection.items,
                )
            )
            if injection.when == "now" and self._stream_scope is not None:
                self._stream_scope.cancel(reason="interrupted by injection")

    def _has_pending(self, *, idle: bool) -> bool:
        with self._lock:
            return any(idle or inj.when != "when_idle" for inj in self._inbox)

    def _deliver_inbox(self, *, idle: bool) -> None:
        """Move deliverable injections into the conversation (a safe point)."""
        self._announce_injections()
        with self._lock:
            steering = [inj for inj in self._inbox if inj.when != "when_idle"]
            deliver = steering if steering or not idle else list(self._inbox)
            for injection in deliver:
                self._inbox.remove(injection)
                self._inbox_size -= len(injection.items)
        for injection in deliver:
            for item in injection.items:
                self._commit(item)
            self._log.append(
                InboxDelivered(
                    run_id=self.id,
                    seq=self._log.next_seq,
                    injection_id=injection.id,
                    turn=self._turn + 1,
                )
            )

    @staticmethod
    def _check_injected_pairs(items: Sequence[Item]) -> None:
        calls = {item.call_id for item in items if isinstance(item, ToolCall)}
        results = [item.call_id for item in items if isinstance(item, ToolResult)]
        if sorted(calls) != sorted(results) or len(set(results)) != len(results):
            raise ValueError(
                "injected tool calls and results must come as complete pairs"
                " (each function_call with exactly one function_call_output)"
            )

    # ------------------------------------------------------------------- repair

    async def _finish(
        self, status: RunStatus, reason: str | None, error: BaseException | None
    ) -> None:
        """Repair, persist, close spans, then emit the terminal update (bounded)."""
        with self._lock:
            self._closing = True
            leftovers = list(self._inbox)
            self._inbox.clear()
            self._inbox_size = 0
            for approval in self._approvals.values():
                approval.decided = True
            self._approvals.clear()
        detail: dict[str, Any] = {}
        with trio.move_on_after(self._options.cleanup_timeout, shield=True) as cleanup:
            # 0. A run cancelled while queued still records its input.
            try:
                await self._start_conversation()
            except Exception as exc:
                logger.exception("could not load the session of run %s", self.id)
                detail["persist_error"] = _summarize(exc)
            # 1. Keep what the user already saw: partial text, as an incomplete message.
            if self._partial_text:
                self._commit(AssistantMessage("".join(self._partial_text), status="incomplete"))
            self._partial_text = None
            # 2. Every open call gets a result; started ones get their tool.finished.
            outcome = "failed" if status is RunStatus.FAILED else "cancelled"
            cancel_output = f"cancelled: {reason}"
            for open_call in list(self._open_calls.values()):
                if open_call.ctx is not None:
                    open_call.ctx.cancelled.set()
                repaired = ToolResult(open_call.call.call_id, cancel_output, status="cancelled")
                try:
                    await self._end_tool(open_call.call, repaired)
                except Exception:
                    logger.exception("on_tool_end hook failed during repair of %s", self.id)
                    self._open_calls.pop(open_call.call.call_id, None)
            # 3. Injections nobody consumed are announced (if not yet) and returned.
            for injection in leftovers:
                if not injection.announced:
                    self._log.append(
                        InboxInjected(
                            run_id=self.id,
                            seq=self._log.next_seq,
                            injection_id=injection.id,
                            when=injection.when,
                            items=injection.items,
                        )
                    )
            # 4. Balance the remaining hooks (the model call's, if it is open).
            for key in list(self._open_spans):
                try:
                    await self._close_span(key, outcome)
                except Exception:
                    logger.exception("end hook %s failed during repair of %s", key, self.id)
            # 5. Persist.
            try:
                await self._flush()
            except Exception as exc:
                logger.exception("could not persist run %s", self.id)
                detail["persist_error"] = _summarize(exc)
                if status is not RunStatus.FAILED:
                    status, reason, error = (
                        RunStatus.FAILED,
                        f"session error: {_summarize(exc)}",
                        exc,
                    )
        result = RunResult(
            run_id=self.id,
            status=status,
            reason=reason,
            final_output=self._final_output if status is RunStatus.COMPLETED else None,
            new_items=tuple(self._new_items),
            conversation=tuple(self._conversation),
            usage=self._usage,
            turns=self._turn,
            unconsumed=tuple(item for inj in leftovers for item in inj.items),
            error=error,
        )
        if self._run_span_open and self._hooks is not None:
            self._run_span_open = False
            with trio.move_on_after(self._options.cleanup_timeout, shield=True):
                try:
                    await self._hooks.on_run_end(self, result)
                except Exception:
                    logger.exception("on_run_end hook failed for %s", self.id)
        if cleanup.cancelled_caught:
            detail["cleanup_timed_out"] = True
        self._result = result
        if self._claim is not None:
            # After the repair is persisted, before the terminal update: whoever sees
            # the update can start the next run on the session at once.
            self._claim.release()
        self._emit_status(status, reason, detail)
        self._log.close()
        self._done.set()


@attrs.frozen
class RunStatistics:
    """A snapshot of a run's internals, from :meth:`Run.statistics`."""

    status: RunStatus
    turn: int
    last_seq: int
    open_tool_calls: int
    inbox_items: int
    pending_approvals: tuple[str, ...]


# ---------------------------------------------------------------------- entry points


async def serve_run(
    agent: Agent,
    input: str | Item | Mapping[str, Any] | Iterable[Any],
    *,
    session: Session | None = None,
    run_id: str | None = None,
    task_status: trio.TaskStatus[Run] = trio.TASK_STATUS_IGNORED,
    **options: Any,
) -> RunResult:
    """Run ``agent`` on ``input`` as a task: ``run = await nursery.start(serve_run, ...)``.

    The nursery-passing form of :func:`open_run`: ``task_status.started`` hands back the
    :class:`Run`, and the task ends when the run does, returning its result. If the
    nursery's scope is cancelled, the run records ``cancelled`` / ``"parent
    cancelled"`` after its bounded repair and ``trio.Cancelled`` propagates.
    """
    handle = Run(agent, input, session=session, run_id=run_id, options=_make_options(options))
    handle._claim_session()
    await handle._serve(task_status=task_status)
    assert handle.result is not None
    return handle.result


@asynccontextmanager
async def open_run(
    agent: Agent,
    input: str | Item | Mapping[str, Any] | Iterable[Any],
    *,
    session: Session | None = None,
    run_id: str | None = None,
    **options: Any,
) -> AsyncIterator[Run]:
    """Start a run and yield its :class:`Run` handle.

    Leaving the block normally waits for the run to end. An exception other than
    ``trio.Cancelled`` leaving the block cancels the run (reason ``"caller exited"``),
    waits for its repair, and propagates. A cancellation from an enclosing scope ends
    the run with reason ``"parent cancelled"`` and propagates. A failed or cancelled run
    is never raised: see ``run.result.status``.

    Options (keyword arguments): ``cleanup_timeout`` (5 s), ``max_concurrent_tools`` (8),
    ``inbox_capacity`` (1024 items), ``event_retention`` (65536 events),
    ``on_tool_error`` (``"return"`` or ``"fail"``), ``hooks`` (:class:`RunHooks`),
    ``thread_limiter`` (for sync tools), ``max_turns`` (overrides the agent's),
    ``on_busy`` (when ``session`` already has an active run in this process:
    ``"reject"`` raises :class:`SessionBusyError` at once, ``"interrupt"`` cancels that
    run with reason ``"superseded"`` and starts once its repair is persisted,
    ``"enqueue"`` waits for it to end; the run is ``queued`` while it waits, and a run
    cancelled while it waits leaves the session untouched).

    Raises:
        SessionBusyError: ``on_busy="reject"`` and the session is busy.
    """
    handle = Run(agent, input, session=session, run_id=run_id, options=_make_options(options))
    handle._claim_session()
    body_error: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            go = trio.Event()
            await nursery.start(handle._serve, go)
            # The run starts at the body's first checkpoint: a cancel() on the body's
            # first line is guaranteed to come before any model call.
            go.set()
            try:
                yield handle
            except BaseException as exc:
                body_error = exc
                if not isinstance(exc, trio.Cancelled):
                    handle.cancel("caller exited")
    except BaseExceptionGroup as group:
        # Our run task raises only Cancelled (an outer cancellation) or a
        # BaseException like KeyboardInterrupt; never unwrap several real errors.
        if body_error is None:
            if _only_cancelled(group):
                raise _first_leaf(group) from None
            raise
        if not _only_cancelled(group):
            raise
    if body_error is not None:
        raise body_error


async def run(
    agent: Agent,
    input: str | Item | Mapping[str, Any] | Iterable[Any],
    *,
    session: Session | None = None,
    run_id: str | None = None,
    **options: Any,
) -> RunResult:
    """Run ``agent`` on ``input`` to the end and return the :class:`RunResult`.

    Never raises for a failed or cancelled run: call ``result.raise_for_status()``.
    """
    async with open_run(agent, input, session=session, run_id=run_id, **options) as handle:
        pass
    assert handle.result is not None
    return handle.result
