"""Tools: Python functions a model may call, and the context a call runs in.

:func:`function_tool` turns a function (``async def`` or plain ``def``) into a
:class:`Tool`: name, description and JSON schema come from the signature, the type
hints and the docstring. A run calls :meth:`Tool.invoke` with a :class:`ToolContext`;
async functions run in the run's task tree, sync functions in a worker thread that is
abandoned (and told so through ``ctx.cancelled``) when the call is cancelled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import inspect
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, final, overload

import attrs
import trio

# PEP 696's default: a bare ``ToolContext`` is ``ToolContext[Any]`` (no error under
# mypy --strict); typing has it from Python 3.13 only.
from typing_extensions import TypeVar

from ._error_text import describe_error
from ._exceptions import TrioAgentsError
from ._frozen import freeze_json
from ._limits import StreamMeter
from ._model import Model, ModelEvent, ModelRequest, TextDelta, ToolSpec, Usage
from ._question_schema import schema_problems
from ._signatures import FunctionSchema, function_schema
from ._text_cleaning import clean_text, clean_value
from ._typeschema import ArgumentConversionError
from ._validator import loads_json, validate

if TYPE_CHECKING:
    from ._agent import Agent
    from ._result import RunResult
    from ._run import Run
    from ._state import RunState

__all__ = [
    "ApprovalDecision",
    "CallOutcome",
    "ChildStarter",
    "Tool",
    "ToolArgumentsError",
    "ToolContext",
    "function_tool",
    "mark_cancelled",
    "needs_context",
    "to_output",
]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolArgumentsError(TrioAgentsError, ValueError):
    """The arguments of a tool call are not valid JSON or do not fit the tool's schema.

    The message is written for the model, which gets it back as the (error) result of
    its call, e.g. ``"invalid arguments for tool 'add': $.b: expected integer, got
    string"``.

    Attributes:
        tool_name: the name of the tool that was called.
        errors: one message per problem, each starting with a JSON path.
    """

    def __init__(self, tool_name: str, errors: Sequence[str]) -> None:
        self.tool_name = tool_name
        self.errors = list(errors)
        super().__init__(f"invalid arguments for tool {tool_name!r}: {'; '.join(self.errors)}")


def _json_object(name: str, value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A plain-JSON copy of ``value`` (it travels in status updates to every face)."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping or None, not {type(value).__name__}")
    try:
        copy: dict[str, Any] = json.loads(json.dumps(dict(value), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be JSON-serialisable: {exc}") from None
    return copy


# A question travels in every status update of its run and of the run's ancestors, to
# every face: bounded (ToolContext.request_approval documents the figures).
_MAX_QUESTION_MESSAGE = 8_192  # characters
_MAX_QUESTION_BYTES = 65_536  # of JSON, data and schema together


def _check_question(
    message: str, data: Mapping[str, Any] | None, schema: Mapping[str, Any] | None
) -> None:
    """Refuse a question that could not be answered safely, or is too large to be shown
    in every status update of its run and of the run's ancestors (``ValueError``)."""
    if len(message) > _MAX_QUESTION_MESSAGE:
        raise ValueError(
            f"a question's message has at most {_MAX_QUESTION_MESSAGE} characters,"
            f" this one {len(message)}"
        )
    size = len(json.dumps([data, schema], ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > _MAX_QUESTION_BYTES:
        raise ValueError(
            f"a question's data and schema hold at most {_MAX_QUESTION_BYTES} bytes of JSON,"
            f" these {size}"
        )
    if schema is not None:
        problems = schema_problems(schema)
        if problems:
            raise ValueError("the question's schema cannot check an answer: " + "; ".join(problems))


def _no_progress(message: str, data: Mapping[str, Any]) -> None:
    """The default progress callback: progress goes nowhere."""


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    # ProcessLookupError: the group is gone. PermissionError: its id is someone else's.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@attrs.define(eq=False)
class _ProcessRecorder:
    """A :class:`trio.TaskStatus` that only remembers the process ``run_process`` started."""

    process: trio.Process | None = None

    def started(self, value: trio.Process | None = None) -> None:
        self.process = value


ContextT = TypeVar("ContextT", default=Any)
"""The type of a run's ``context=`` object, as ``ctx: ToolContext[MyDeps]`` declares it."""


class ChildStarter(Protocol):
    """How the calls of a run start child runs (``ctx.run``, ``ctx.open_run``; DESIGN §17).

    The run hands it to each call's :class:`ToolContext`, as Trio hands a task its
    nursery: tools sit below the runs in the core's chain (docs/architecture.md), so
    a call cannot import what starts runs; it is given it. ``_children.CHILDREN``
    is the one implementation.
    """

    async def run(
        self,
        ctx: ToolContext[Any],
        agent: Agent,
        input: Any,
        *,
        session: Any,
        run_id: str | None,
        options: Mapping[str, Any],
    ) -> RunResult:
        """Run ``agent`` as a child of the run making ``ctx``'s call, in the calling
        task, to its end."""
        ...

    def open_run(
        self,
        ctx: ToolContext[Any],
        agent: Agent,
        input: Any,
        *,
        session: Any,
        run_id: str | None,
        options: Mapping[str, Any],
    ) -> AbstractAsyncContextManager[Run]:
        """Start a child run in a nursery of the calling tool; hold it while the block
        runs."""
        ...


@final
@attrs.frozen
class ApprovalDecision:
    """The answer to :meth:`ToolContext.request_approval`.

    Attributes:
        approved: True for ``run.approve(id)``, False for ``run.reject(id, ...)``.
        message: the rejection's ``message`` (None when approved, or rejected
            without one).
        content: the approval's ``content`` (``run.approve(id, content=...)``), a
            JSON object that matched the question's ``schema``; None when approved
            without any (and when rejected).
    """

    approved: bool
    message: str | None = None
    content: Mapping[str, Any] | None = None


@final
@attrs.frozen(eq=False)
class ToolContext(Generic[ContextT]):
    """What a tool call knows about itself; pass it as the tool's first parameter.

    A tool function whose first parameter is named ``ctx`` (or annotated
    ``ToolContext``) receives one per call::

        @function_tool
        def crunch(ctx: ToolContext, n: int) -> int:
            for i in range(n):
                if ctx.cancelled.is_set():
                    return -1  # the result is discarded anyway
                ctx.progress(f"step {i}", step=i)
            ...

    To unit-test such a function, build a context yourself:
    ``ToolContext(run_id="r", call_id="c", tool_name="crunch", context=deps)``.

    Attributes:
        run_id: the id of the run making the call.
        call_id: the id of the tool call (from the model).
        tool_name: the name of the tool.
        cancelled: set when the call is cancelled or times out (and whenever the call
            ends with an exception). A sync tool runs in a thread that is abandoned at
            that moment, and the event is set at once: poll it (or
            ``cancelled.wait(timeout)``) and return early. An async tool gets
            ``trio.Cancelled`` instead, and the event is set as that leaves the
            function; an async tool that hands ``ctx`` to a worker thread should
            start it with ``abandon_on_cancel=True`` so the cancellation arrives.
    """

    run_id: str
    call_id: str
    tool_name: str
    # The event behind ``cancelled``, made on first read: a threading.Event is a
    # Condition, a lock, a deque and two dicts, which most calls (async tools that
    # never look at it) would hold for nothing. ``cancelled=`` still passes one in.
    _event: threading.Event | None = attrs.field(default=None, alias="cancelled", repr=False)
    _on_progress: Callable[[str, Mapping[str, Any]], None] = attrs.field(
        default=_no_progress, repr=False, kw_only=True
    )
    # The run making the call (None for a context built by hand): what ctx.run() and
    # ctx.open_run() start their child runs under.
    _handle: Run | None = attrs.field(default=None, kw_only=True, repr=False, alias="handle")
    # What starts those child runs: the run's, handed down with the handle (None for a
    # context built by hand).
    _children: ChildStarter | None = attrs.field(
        default=None, kw_only=True, repr=False, alias="children"
    )
    # The context of a ToolContext built by hand (a run's calls read the run's).
    _context: Any = attrs.field(default=None, kw_only=True, repr=False, alias="context")
    # Set by mark_cancelled() before any event exists; the event copies it when made.
    _is_cancelled: bool = attrs.field(default=False, init=False, repr=False)

    @property
    def context(self) -> ContextT:
        """The run's ``context=`` object (DESIGN §18): the dependencies a tool needs (a
        database pool, the user, settings). Annotate the parameter as
        ``ctx: ToolContext[MyDeps]`` for type checkers. None when the run has none."""
        if self._handle is not None:
            value: ContextT = self._handle.context
            return value
        own: ContextT = self._context
        return own

    @property
    def parent(self) -> Run:
        """The :class:`~trio_agents.Run` making this call.

        Raises:
            RuntimeError: the context was built by hand, not by a run.
        """
        if self._handle is None:
            raise self._not_made_by_a_run()
        return self._handle

    async def run(
        self,
        agent: Agent,
        input: Any,
        *,
        session: Any = "inherit",
        run_id: str | None = None,
        **options: Any,
    ) -> RunResult:
        """Run ``agent`` on ``input`` as a child of the run making this call; return
        its :class:`~trio_agents.RunResult` (DESIGN §17).

        The child lives in this call: cancelling the call (or any ancestor) cancels it
        and waits for its repair; cancelling the child alone (``run.find(id).cancel()``)
        ends only its subtree, and this returns its ``cancelled`` result. Options are
        those of :func:`~trio_agents.open_run`; ``cleanup_timeout``,
        ``max_concurrent_tools``, ``inbox_capacity``, ``event_retention``,
        ``on_tool_error``, ``hooks``, ``thread_limiter``, ``context`` and ``max_depth``
        default to the parent's.
        ``session="inherit"`` (the default) stores the child's conversation in the
        parent's session store under ``"<parent session id>/<call id>"`` (see
        docs/multi-agent.md); ``None`` for none, or any :class:`Session`.

        Raises:
            MaxDepthExceeded: the child would be more levels below this run (or an
                ancestor) than its ``max_depth`` allows; nothing of it was started.
        """
        return await self._starter().run(
            self, agent, input, session=session, run_id=run_id, options=options
        )

    def open_run(
        self,
        agent: Agent,
        input: Any,
        *,
        session: Any = "inherit",
        run_id: str | None = None,
        **options: Any,
    ) -> AbstractAsyncContextManager[Run]:
        """``async with ctx.open_run(agent, input) as child:`` — start a child run and
        hold its handle, as :func:`~trio_agents.open_run` does; several may be open at
        once (fan-out). Leaving the block waits for the child to end. Same options and
        session rule as :meth:`run`."""
        return self._starter().open_run(
            self, agent, input, session=session, run_id=run_id, options=options
        )

    @property
    def model(self) -> Model:
        """The model of the run making this call (its current agent's), as a
        :class:`~trio_agents.models.Model` whose calls are the run's own: each request
        counts against the run's limits (``UsageLimits``: requests, tokens, cost) and its usage is
        added to the run's :attr:`~trio_agents.Run.usage` (so ``RunResult.usage``).
        What serves an MCP server's sampling request (docs/mcp.md). Nothing of such a
        call enters the conversation or the run's events; it is cancelled with whatever
        scope the caller runs it in (the call's own task: with the call).

        Raises:
            RuntimeError: the context was built by hand, not by a run.
        """
        if self._handle is None:
            raise self._not_made_by_a_run()
        return _RunModel(self._handle)

    async def request_approval(
        self,
        message: str,
        *,
        data: Mapping[str, Any] | None = None,
        schema: Mapping[str, Any] | None = None,
    ) -> ApprovalDecision:
        """Wait, in the middle of the call, for a person to approve or reject
        something the tool is about to do; return the decision.

        The question is pending in the run making the call as a call waiting for
        approval is: the run's status is ``awaiting_approval`` with the question's id in
        ``detail["pending"]`` and what it asks in ``detail["questions"]`` (``{"id",
        "call_id", "name", "message", "data"}``); an ancestor lists it in
        ``detail["waiting"]`` (with ``"question"``). ``run.approve(id)`` and
        ``run.reject(id, message=...)`` answer it, and so every face that answers
        approvals (docs/tools.md). The wait is the call's: cancelling the run or the
        call (its ``timeout``) ends it at once (``trio.Cancelled``), and the question
        is withdrawn (a late answer raises ``UnknownCallError``).

        Args:
            message: what is asked, for a person to read.
            data: JSON-serialisable details a face may show (say, a form's schema).
            schema: a JSON schema for an answer with content: ``run.approve(id,
                content=...)`` is then accepted only with a JSON object matching it
                (``type``, ``properties``, ``required``, ``additionalProperties``,
                ``items``, ``enum``, ``const``, ``anyOf``, ``oneOf``, ``minLength``,
                ``maxLength``, ``minimum``, ``maximum`` and their exclusive forms,
                ``minItems``, ``maxItems``; annotations such as ``title``,
                ``description``, ``default`` and ``format`` are shown, not checked)
                and the decision carries it.
                None (the default): approving takes no content.

        Raises:
            RuntimeError: the context was built by hand, not by a run, or its call
                is not running any more.
            RunClosedError: the run is terminal.
            TypeError: ``message`` is not a str, or ``data`` or ``schema`` not a JSON
                mapping.
            ValueError: ``schema`` uses what an answer could not be checked against
                (a keyword other than those above, a sub-schema that is not an
                object), or the question is too large (``message`` over
                8,192 characters, ``data`` and ``schema`` over 64 KiB of JSON): it travels in every status
                update of the run and of its ancestors.
        """
        if not isinstance(message, str):
            raise TypeError(f"message must be a str, not {type(message).__name__}")
        data = _json_object("data", data)
        schema = _json_object("schema", schema)
        _check_question(message, data, schema)
        if self._handle is None:
            raise self._not_made_by_a_run()
        answer = await self._handle._ask(
            self.call_id, clean_text(message), None if data is None else clean_value(data), schema
        )
        return ApprovalDecision(answer.approved, answer.message, answer.content)

    def _starter(self) -> ChildStarter:
        # A run hands its starter to every call it makes: only a context built by hand
        # has none.
        if self._children is None:
            raise self._not_made_by_a_run()
        return self._children

    def _not_made_by_a_run(self) -> RuntimeError:
        return RuntimeError(
            f"this ToolContext (call {self.call_id!r}) was not made by a run:"
            " ctx.parent, ctx.run() and ctx.open_run() need the run making the call"
        )

    @property
    def cancelled(self) -> threading.Event:
        """A :class:`threading.Event`, set when the call is cancelled (see above)."""
        event = self._event
        if event is None:
            # Under the lock that mark_cancelled() takes: either the event is made
            # after the call was marked cancelled (and is made set), or mark_cancelled()
            # finds it and sets it. A thread reading this as the call is cancelled
            # never misses the cancellation.
            with _EVENT_LOCK:
                event = self._event
                if event is None:
                    event = threading.Event()
                    if self._is_cancelled:
                        event.set()
                    object.__setattr__(self, "_event", event)
        return event

    def progress(self, message: str, **data: Any) -> None:
        """Report progress: emits a ``tool.progress`` event with ``message`` and ``data``.

        Thread-safe (call it from a sync tool's thread) and non-blocking. ``data``
        should be JSON-serialisable; it travels to event subscribers as is, except
        that the message and every str in ``data`` (keys too, through nested dicts,
        lists and tuples) are cleaned as items are: a lone surrogate becomes U+FFFD.
        """
        if not isinstance(message, str):
            raise TypeError(f"progress message must be a str, not {type(message).__name__}")
        self._on_progress(message, data)

    async def run_process(
        self,
        argv: str | Sequence[str | bytes | os.PathLike[str] | os.PathLike[bytes]],
        *,
        check: bool = True,
        grace: float = 0.5,
        **kwargs: Any,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a subprocess that dies with the call; return its captured output.

        Like :func:`trio.run_process` with ``capture_stdout=True`` and
        ``capture_stderr=True`` (unless ``stdout``/``stderr`` are given; other keyword
        arguments, such as ``cwd``, ``env`` or ``stdin``, are passed through). The
        process starts in a new session, so it and its children form their own process
        group. If the call is cancelled or times out, the whole group gets ``SIGTERM``,
        then ``SIGKILL`` after ``grace`` seconds if the process is still alive; and
        when this returns or raises, whatever is left in the group (a background child
        that outlived its parent, say) is killed. POSIX only.

        Raises:
            subprocess.CalledProcessError: the process exited with a non-zero status
                and ``check`` is true.
        """
        if not isinstance(grace, int | float) or isinstance(grace, bool) or not grace >= 0:
            raise ValueError(f"grace must be a number >= 0, not {grace!r}")
        for name in ("start_new_session", "process_group", "deliver_cancel", "task_status"):
            if name in kwargs:
                raise TypeError(f"run_process() does not accept {name}=")
        if "stdout" not in kwargs:
            kwargs.setdefault("capture_stdout", True)
        if "stderr" not in kwargs:
            kwargs.setdefault("capture_stderr", True)

        async def deliver_cancel(process: trio.Process) -> None:
            _signal_group(process.pid, signal.SIGTERM)
            await trio.sleep(grace)
            _signal_group(process.pid, signal.SIGKILL)

        recorder = _ProcessRecorder()
        try:
            result: subprocess.CompletedProcess[bytes] = await trio.run_process(
                argv,
                check=check,
                start_new_session=True,
                deliver_cancel=deliver_cancel,
                task_status=recorder,
                **kwargs,
            )
        finally:
            if recorder.process is not None:
                _signal_group(recorder.process.pid, signal.SIGKILL)
        return result


class _RunModel:
    """``ToolContext.model``: the run's current model, metered as the run's own calls
    (as a ``Summarize`` history's call is, in ``_window.py``)."""

    __slots__ = ("_run",)

    def __init__(self, run: Run) -> None:
        self._run = run

    def __repr__(self) -> str:
        return f"<the model of run {self._run.id!r}>"

    @contextlib.asynccontextmanager
    async def stream(self, request: ModelRequest) -> AsyncIterator[AsyncIterator[ModelEvent]]:
        state = self._run._state
        # The model is read at the call, not when ctx.model was: a handoff since changes it.
        model = state.agent.model
        if state.budgets and state.spend("requests"):
            # Past a limit: the run's scope is cancelled; this call (perhaps outside the
            # run's tasks) is refused rather than made.
            raise RuntimeError(f"run {state.run_id!r} passed a usage limit")
        meter = StreamMeter(state.budgets) if state.budgets else None
        try:
            async with model.stream(request) as events:
                metered = _metered(state, events, meter)
                try:
                    yield metered
                finally:
                    # Closed here, not left to the garbage collector, whoever stopped
                    # reading it early.
                    await metered.aclose()
        finally:
            if meter is not None:
                meter.close()  # an estimate no usage replaced counts as the usage


async def _metered(
    state: RunState, events: AsyncIterator[ModelEvent], meter: StreamMeter | None
) -> AsyncGenerator[ModelEvent, None]:
    """``events`` as they come, each charged to the run: text against its limits (as an
    estimate), usage added to its usage (replacing the estimate)."""
    async for event in events:
        stop = False
        if isinstance(event, Usage):
            state.charge(event)
            if meter is not None:
                stop = meter.usage(event)
        elif meter is not None and isinstance(event, TextDelta) and isinstance(event.text, str):
            stop = meter.text(event.text)
        yield event
        if stop:
            raise RuntimeError(f"run {state.run_id!r} passed a usage limit")


# Guards the making of every ToolContext's event against mark_cancelled(): one lock
# for all contexts (a lock per context would cost what the lazy event saves), held for
# a few bytecodes, and only by a first read of ``cancelled`` or by a cancellation.
_EVENT_LOCK = threading.Lock()


def needs_context(tool: Tool) -> bool:
    """Whether a call of ``tool`` needs its :class:`ToolContext`: the function takes
    one, or it runs in a worker thread, whose context's ``cancelled`` flag the repair
    sets when the thread is abandoned (and ``trio_agents.testing`` reads to find a
    thread that ignored its cancel). An async function that takes none can never read
    one, so the run makes none for its calls (W3 memory)."""
    return tool.takes_context or not tool._is_async


def mark_cancelled(ctx: ToolContext) -> None:
    """Set ``ctx.cancelled``, without making the event if nobody has read it yet.

    Thread-safe; see :attr:`ToolContext.cancelled` for the other half of the protocol.
    """
    with _EVENT_LOCK:
        object.__setattr__(ctx, "_is_cancelled", True)
        event = ctx._event
    if event is not None:
        event.set()


@final
@attrs.frozen
class CallOutcome:
    """A tool's return value that sets its result's status as well as its output (what
    ``Agent.as_tool`` returns for a child run that was cancelled or failed)."""

    output: str
    status: Literal["ok", "error", "cancelled"] = "ok"


def _check_timeout(_instance: object, _attribute: object, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"timeout must be a number of seconds or None, not {value!r}")
    if math.isnan(value) or value <= 0:
        raise TypeError(f"timeout must be > 0 seconds, not {value!r}")


def _check_name(_instance: object, _attribute: object, value: Any) -> None:
    if not isinstance(value, str) or not _NAME.match(value):
        raise TypeError(
            f"invalid tool name {value!r}: use 1-64 letters, digits, '_' or '-'"
            " (pass name=... to function_tool)"
        )


def _check_needs_approval(_instance: object, _attribute: object, value: Any) -> None:
    if not isinstance(value, bool) and not callable(value):
        raise TypeError(
            "needs_approval must be a bool or a callable taking the arguments,"
            f" not {type(value).__name__}"
        )
    if inspect.iscoroutinefunction(_unwrap_callable(value)):
        # Its coroutine would be truthy (every call would wait) and never awaited.
        raise TypeError("needs_approval must be a plain function returning a bool, not async")


def _check_str(_instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be a str, not {type(value).__name__}")


def _output_default(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if attrs.has(type(value)):
        return attrs.asdict(value)  # type: ignore[arg-type]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, set | frozenset):
        return list(value)
    return str(value)


def to_output(value: object) -> str:
    """Turn a tool's return value into the text the model reads."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return ""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, Mapping | list | tuple | set | frozenset | int | float) or (
        attrs.has(type(value)) or (dataclasses.is_dataclass(value) and not isinstance(value, type))
    ):
        try:
            return json.dumps(
                dict(value) if isinstance(value, Mapping) else value,
                default=_output_default,
                ensure_ascii=False,
            )
        except (TypeError, ValueError, RecursionError):
            pass
    return str(value)


@final
@attrs.frozen(eq=False)
class Tool:
    """A function the model may call. Create one with :func:`function_tool`.

    A tool is immutable and holds no per-call state: one tool may serve any number of
    concurrent runs. Calling the tool (``tool(...)``) calls the original function, so
    tool functions stay easy to unit-test. ``attrs.evolve(tool, timeout=...)`` makes a
    copy with other options.

    Attributes:
        name: the name the model calls the tool by.
        description: what the model is told the tool does.
        parameters: the JSON schema of the arguments (an object schema), read-only:
            a frozen copy of the one given, shared by every run (``copy.deepcopy``
            gives a plain, mutable copy).
        fn: the wrapped function.
        timeout: seconds a call may take before it is cancelled and the model gets
            ``"timed out after N s"``; None for no limit.
        needs_approval: whether a call waits for ``run.approve()``/``run.reject()``;
            a callable decides per call from the (validated) arguments.
        idempotent: whether running a call twice is harmless. A cluster node that takes
            over a run whose owner died runs such a call again; any other call that had
            started gets an ``"interrupted: …"`` error result instead (see
            docs/cluster.md). Has no effect in a single process.
    """

    name: str = attrs.field(validator=_check_name)
    description: str = attrs.field(validator=_check_str)
    # Frozen once here (a read-only copy), then shared by every run and request.
    parameters: Mapping[str, Any] = attrs.field(repr=False, converter=freeze_json)
    fn: Callable[..., Any] = attrs.field(repr=False)
    timeout: float | None = attrs.field(default=None, validator=_check_timeout)
    needs_approval: bool | Callable[[Mapping[str, Any]], bool] = attrs.field(
        default=False, validator=_check_needs_approval
    )
    idempotent: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    _schema: FunctionSchema = attrs.field(repr=False, kw_only=True)
    _is_async: bool = attrs.field(repr=False, kw_only=True)
    # from_schema: fn takes (ctx, arguments) rather than one keyword per parameter.
    _raw: bool = attrs.field(default=False, repr=False, kw_only=True)
    # Agent.as_tool: the agent each call runs as a child run. A resumed run runs such a
    # call again, and the call resumes its child from the child's session (§17).
    _child_agent: Any = attrs.field(default=None, repr=False, kw_only=True, alias="child_agent")
    _spec: ToolSpec = attrs.field(init=False, repr=False)

    @_spec.default
    def _make_spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    @classmethod
    def from_schema(
        cls,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        fn: Callable[[ToolContext, dict[str, Any]], Awaitable[Any]],
        *,
        timeout: float | None = None,
        needs_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
        idempotent: bool = False,
    ) -> Tool:
        """A tool whose JSON schema is given, not read from a signature: for tools
        defined elsewhere (an MCP server's, say).

        ``fn`` is an ``async def fn(ctx, arguments)``: it gets the call's
        :class:`ToolContext` and the arguments, decoded and validated against
        ``parameters``, as one dict. Its return value becomes the output as for
        :func:`function_tool`; an exception becomes an error result.

        Raises:
            TypeError: ``fn`` is not an async function, ``parameters`` is not an object
                schema, or an option is invalid.
        """
        if not inspect.iscoroutinefunction(_unwrap_callable(fn)):
            raise TypeError("Tool.from_schema() needs an async function fn(ctx, arguments)")
        if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
            raise TypeError("parameters must be a JSON schema of type 'object'")
        schema = dict(parameters)
        schema.setdefault("type", "object")
        return cls(
            name=name,
            description=description,
            parameters=schema,
            fn=fn,
            timeout=timeout,
            needs_approval=needs_approval,
            idempotent=idempotent,
            schema=FunctionSchema(
                description=description, parameters=schema, takes_context=True, params=()
            ),
            is_async=True,
            raw=True,
        )

    @property
    def takes_context(self) -> bool:
        """Whether the function takes a :class:`ToolContext` as its first parameter."""
        return self._schema.takes_context

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        """The wrapped function (lets :func:`inspect.signature` see its signature)."""
        return self.fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly (no validation, no thread, no context)."""
        return self.fn(*args, **kwargs)

    def spec(self) -> ToolSpec:
        """Return what the model is told about this tool.

        Always the same object, shared by every run: its ``parameters`` (like
        :attr:`parameters`) is read-only, and changing it raises ``TypeError``;
        ``copy.deepcopy(spec.parameters)`` is a plain, mutable copy.
        """
        return self._spec

    def parse_arguments(self, arguments: str) -> dict[str, Any]:
        """Decode and validate the model's JSON ``arguments``; return them as a dict.

        Raises:
            ToolArgumentsError: ``arguments`` is not JSON, not a JSON object, or does
                not fit :attr:`parameters`.
        """
        if not isinstance(arguments, str | bytes | bytearray):
            raise ToolArgumentsError(
                self.name, [f"arguments must be a JSON string, not {type(arguments).__name__}"]
            )
        if not arguments.strip():
            arguments = "{}"  # some models send nothing for a tool without parameters
        try:
            value = loads_json(arguments)
        except (ValueError, RecursionError) as exc:
            raise ToolArgumentsError(self.name, [f"invalid JSON: {exc}"]) from None
        try:
            errors = validate(self.parameters, value)
        except RecursionError:  # decodable, but too deep for the checker's recursion
            raise ToolArgumentsError(self.name, ["$: nested too deeply"]) from None
        if errors or not isinstance(value, dict):
            raise ToolArgumentsError(self.name, errors or ["$: expected object"])
        return value

    async def invoke(
        self,
        ctx: ToolContext,
        arguments: str,
        *,
        limiter: trio.CapacityLimiter | None = None,
    ) -> str:
        """Call the tool with the model's JSON ``arguments``; return the output text.

        The arguments are validated and converted before the function is called.
        Async functions are awaited in the calling task; sync functions run in a
        worker thread (``limiter`` bounds them) that is abandoned on cancellation.
        Whenever the call ends with an exception, cancellation included,
        ``ctx.cancelled`` is set first. The return value becomes text: a ``str`` as
        is, ``None`` as ``""``, anything else as JSON (attrs instances and dataclasses
        as objects, enums by value), or ``str(value)`` if it is not serialisable.

        Raises:
            ToolArgumentsError: the arguments are invalid; the function was not called.
            Exception: whatever the tool function raised, unchanged.
        """
        args, kwargs = self._bind(ctx, arguments)
        try:
            value = await self._start(args, kwargs, limiter)
        except BaseException:
            mark_cancelled(ctx)
            raise
        return to_output(value)

    # invoke() in two halves, for the run's own call path (_toolcalls.py), which awaits
    # _start()'s awaitable in its own frame: one coroutine frame less per running call.

    def _bind(
        self, ctx: ToolContext | None, arguments: str
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Validate and convert the model's ``arguments``: the function's arguments
        (``ctx`` may be None for a function that takes no context).

        Raises:
            ToolArgumentsError: the arguments are invalid.
        """
        parsed = self.parse_arguments(arguments)
        if self._raw:
            return (ctx, parsed), {}
        kwargs = self.convert_arguments(parsed)
        return ((ctx,) if self._schema.takes_context else ()), kwargs

    def _start(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        limiter: trio.CapacityLimiter | None,
    ) -> Awaitable[Any]:
        """The call of the function, to await: the coroutine of an async function, or
        a worker thread (abandoned on cancellation) running a sync one."""
        if self._is_async:
            awaitable: Awaitable[Any] = self.fn(*args, **kwargs)
            return awaitable
        return trio.to_thread.run_sync(
            functools.partial(self.fn, *args, **kwargs),
            abandon_on_cancel=True,
            limiter=limiter,
        )

    def convert_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Turn validated arguments into the keyword arguments of the function.

        ``Enum`` parameters get members, attrs classes instances, tuples tuples and
        floats floats.

        Raises:
            ToolArgumentsError: a nested object could not be constructed (for instance
                an attrs validator rejected a value).
        """
        try:
            return self._schema.convert(arguments)
        except ArgumentConversionError as exc:
            raise ToolArgumentsError(self.name, exc.errors) from exc
        except RecursionError:
            raise ToolArgumentsError(self.name, ["$: nested too deeply"]) from None
        except Exception as exc:
            # Converting runs code we do not own (a class's __init__, an enum's lookup):
            # whatever fails in it, the arguments could not become the function's.
            raise ToolArgumentsError(self.name, [f"$: {describe_error(exc)}"]) from exc


def _unwrap_callable(fn: object) -> object:
    while isinstance(fn, functools.partial):
        fn = fn.func
    if callable(fn) and not inspect.isroutine(fn) and not inspect.isclass(fn):
        return type(fn).__call__
    return fn


def _make_tool(
    fn: object,
    *,
    name: str | None,
    description: str | None,
    timeout: float | None,
    needs_approval: bool | Callable[[Mapping[str, Any]], bool],
    idempotent: bool,
    localns: Mapping[str, Any] | None,
) -> Tool:
    if isinstance(fn, Tool):
        raise TypeError(
            f"{fn.name!r} is already a Tool; use attrs.evolve(tool, ...) to change its options"
        )
    if not callable(fn):
        raise TypeError(f"function_tool() needs a function, not {type(fn).__name__}")
    if inspect.isclass(fn):
        raise TypeError("function_tool() needs a function, not a class")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if description is not None and not isinstance(description, str):
        raise TypeError(f"description must be a str, not {type(description).__name__}")
    target = _unwrap_callable(fn)
    if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
        raise TypeError(
            f"{_display_name(fn)} is a generator function; tools must return their result"
        )
    schema = function_schema(fn, context_type=ToolContext, localns=localns)
    return Tool(
        name=name if name is not None else _display_name(fn),
        description=description if description is not None else schema.description,
        parameters=schema.parameters,
        fn=fn,
        timeout=timeout,
        needs_approval=needs_approval,
        idempotent=idempotent,
        schema=schema,
        is_async=inspect.iscoroutinefunction(target),
    )


def _display_name(fn: object) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__name__", None)
    return name if isinstance(name, str) else type(fn).__name__


def _caller_locals() -> Mapping[str, Any] | None:
    """The local namespace of whoever applied the decorator (for local types)."""
    try:
        return sys._getframe(2).f_locals
    except ValueError:
        return None


@overload
def function_tool(
    fn: Callable[..., Any],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    needs_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
    idempotent: bool = False,
) -> Tool: ...


@overload
def function_tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    needs_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
    idempotent: bool = False,
) -> Callable[[Callable[..., Any]], Tool]: ...


def function_tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
    needs_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
    idempotent: bool = False,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a :class:`Tool`; use as ``@function_tool`` or with options.

    ::

        @function_tool
        async def add(a: int, b: int) -> int:
            \"\"\"Add two integers.

            Args:
                a: the first number.
                b: the second number.
            \"\"\"
            return a + b

        @function_tool(timeout=30, needs_approval=True)
        def delete_file(ctx: ToolContext, path: str) -> None:
            \"\"\"Delete a file.\"\"\"

    The name defaults to the function's name and the description to the first
    paragraph of its docstring; parameter descriptions come from its ``Args:``
    section (or ``:param name:`` fields) and ``Annotated[T, "description"]``. An
    optional first parameter ``ctx`` (or annotated :class:`ToolContext`) receives the
    call's context. Sync functions run in a worker thread.

    Args:
        fn: the function (``async def`` or plain ``def``).
        name: the tool name (1-64 letters, digits, ``_`` or ``-``).
        description: what the model is told the tool does.
        timeout: seconds a call may take; None for no limit.
        needs_approval: True to make every call wait for ``run.approve()``, or a
            callable that decides from the validated arguments.
        idempotent: True if running a call twice is harmless: a cluster node that
            takes over a dead node's run runs it again (see :attr:`Tool.idempotent`).

    Raises:
        TypeError: ``fn`` is not a function, is a generator function, takes
            ``*args``, ``**kwargs`` or positional-only parameters, has an annotation
            that cannot be turned into a JSON schema; or an option is invalid
            (such as ``timeout <= 0``).
    """
    if fn is None:

        def decorate(fn: Callable[..., Any]) -> Tool:
            return _make_tool(
                fn,
                name=name,
                description=description,
                timeout=timeout,
                needs_approval=needs_approval,
                idempotent=idempotent,
                localns=_caller_locals(),
            )

        return decorate
    return _make_tool(
        fn,
        name=name,
        description=description,
        timeout=timeout,
        needs_approval=needs_approval,
        idempotent=idempotent,
        localns=_caller_locals(),
    )
