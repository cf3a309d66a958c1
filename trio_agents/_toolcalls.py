"""Running the tool calls of one turn: approvals, concurrency, timeouts, results.

The calls of a turn run concurrently in one nursery (bounded by
``max_concurrent_tools``). Each call ends with exactly one committed
:class:`ToolResult`, *persisted as soon as that tool finishes* (not when the turn
does), then its ``on_tool_end`` hook. A call still open when the run is cancelled is
answered by the repair instead.

Whatever a tool does becomes a result the model can read: invalid arguments, an unknown
tool name, an exception, a timeout, a rejection — and a stray ``trio.Cancelled`` (one
raised while nobody cancelled the call, e.g. re-raised from a service nursery the tool
shares), which would otherwise escape the run looking like an outer cancellation.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeAlias, final

import trio

from ._agent import Agent
from ._error_text import summarize
from ._events import RunStatus, ToolFinished, ToolProgress, ToolStarted
from ._inbox import Approvals, Parking
from ._items import ToolCall, ToolResult
from ._resume import Resume
from ._state import CallSoon, OpenCall, RunState, call_hook
from ._tools import (
    CallOutcome,
    Tool,
    ToolArgumentsError,
    ToolContext,
    mark_cancelled,
    needs_context,
    to_output,
)

__all__ = ["ToolFailure", "hand_off", "run_tools", "settle_resumed_calls"]

STRAY_CANCELLED = "error: the tool raised trio.Cancelled although nothing cancelled it"


class ToolFailure(Exception):
    """A tool raised and ``on_tool_error="fail"``: the run fails with this."""

    def __init__(self, call: ToolCall, error: Exception) -> None:
        super().__init__(f"tool {call.name!r} raised {summarize(error)}")
        self.error = error


def needs_approval(state: RunState, call: ToolCall) -> bool:
    tool = state.agent.get_tool(call.name)
    if tool is None or tool.needs_approval is False:
        return False
    if tool.needs_approval is True:
        return True
    try:
        arguments = tool.parse_arguments(call.arguments)
    except ToolArgumentsError:
        return False  # the call fails validation without running
    decision: object = tool.needs_approval(arguments)  # user code: trust no annotation
    if inspect.isawaitable(decision):  # an async callable object got past the check
        close = getattr(decision, "close", None)
        if callable(close):
            close()  # never awaited: no "coroutine was never awaited" warning later
        raise TypeError("needs_approval returned an awaitable, not a bool")
    return bool(decision)


def run_tools(
    state: RunState,
    calls: Sequence[ToolCall],
    approvals: Approvals,
    call_soon: CallSoon,
) -> Awaitable[None]:
    """Run one turn's calls concurrently; the awaitable returns once each has its result.

    A plain function returning the awaitable of the call path it picks (not a coroutine
    awaiting it): the frames of a running call are the turn loop's, the call's own
    (:func:`_invoke`) and the tool's, nothing in between (issue 18: per-run objects).
    """
    waiting: list[ToolCall] = []
    broken: dict[str, ToolResult] | None = None
    for call in calls:
        try:
            if needs_approval(state, call):
                waiting.append(call)
        except Exception as exc:
            # The predicate is user code: its failure is this call's error result (the
            # call does not run: nobody could say whether it needed approval), never
            # the run's, nor its sibling calls'.
            output = f"error: needs_approval raised {summarize(exc)}"
            if broken is None:
                broken = {}
            broken[call.call_id] = ToolResult(call.call_id, output, status="error")
    if waiting:
        approvals.open(waiting)
        resume = state.options.resume
        if resume is not None and (resume.approved or resume.rejected):
            waiting = _decided_before(approvals, resume, waiting)
    if waiting:
        state.show_approvals([call.call_id for call in waiting])
        if state.parking is not None:
            return _run_parkable(state, calls, approvals, call_soon, broken, state.parking)
    if len(calls) == 1:
        # One call: it runs in the model-stream task itself. A nursery and a task would
        # cost a spawn, two task steps and a cancel scope per turn and buy nothing: the
        # call is as cancellable here (every await in the run's scope is), its errors
        # reach the turn loop the same way, and the limiter always has a slot for it.
        if broken is not None:
            return end_tool(state, calls[0], broken[calls[0].call_id])
        return _run_one(state, approvals, None, call_soon, calls[0])
    return _run_all(state, calls, approvals, call_soon, broken)


async def _run_all(
    state: RunState,
    calls: Sequence[ToolCall],
    approvals: Approvals,
    call_soon: CallSoon,
    broken: dict[str, ToolResult] | None,
) -> None:
    shared = state.tool_limiter()
    async with trio.open_nursery() as nursery:
        for call in calls:
            if broken is not None and call.call_id in broken:
                await end_tool(state, call, broken[call.call_id])
                continue
            nursery.start_soon(
                _run_one, state, approvals, shared, call_soon, call, name=f"{state.run_id}:tool"
            )


async def _run_parkable(
    state: RunState,
    calls: Sequence[ToolCall],
    approvals: Approvals,
    call_soon: CallSoon,
    broken: dict[str, ToolResult] | None,
    parking: Parking,
) -> None:
    """A turn's calls, some waiting for approval, beside the ``park_after`` watch: it
    parks the run (cancelling its scope) once the wait lasted ``park_after`` seconds
    and nothing executes; it ends with the calls otherwise."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(parking.watch)
        if len(calls) == 1:
            await _run_one(state, approvals, None, call_soon, calls[0])
        else:
            await _run_all(state, calls, approvals, call_soon, broken)
        nursery.cancel_scope.cancel()


def _decided_before(
    approvals: Approvals, resume: Resume, waiting: list[ToolCall]
) -> list[ToolCall]:
    """Answer the calls an earlier attempt of a resumed run had a decision for (so
    its client is not asked twice); return those still to be asked."""
    undecided = []
    for call in waiting:
        if call.call_id in resume.approved:
            approvals.decide(call.call_id, approved=True, message=None).set()
        elif call.call_id in resume.rejected:
            message = resume.rejected[call.call_id]
            approvals.decide(call.call_id, approved=False, message=message).set()
        else:
            undecided.append(call)
    return undecided


def _run_one(
    state: RunState,
    approvals: Approvals,
    limiter: trio.CapacityLimiter | None,
    call_soon: CallSoon,
    call: ToolCall,
) -> Awaitable[None]:
    """One call, from its approval (if it needs one) to its committed result."""
    if call.call_id in approvals:
        return _approve_then_invoke(state, approvals, limiter, call_soon, call)
    return _invoke(state, call, call_soon, limiter)


async def _approve_then_invoke(
    state: RunState,
    approvals: Approvals,
    limiter: trio.CapacityLimiter | None,
    call_soon: CallSoon,
    call: ToolCall,
) -> None:
    approval, undecided = await approvals.wait(call.call_id)
    if not undecided and state.status is RunStatus.AWAITING_APPROVAL:
        state.show_approvals(())  # running again, unless calls below still wait
    if not approval.approved:
        message = approval.message or "the user rejected this tool call"
        await end_tool(state, call, ToolResult(call.call_id, f"rejected: {message}", "error"))
        return
    await _invoke(state, call, call_soon, limiter)


async def _invoke(
    state: RunState, call: ToolCall, call_soon: CallSoon, limiter: trio.CapacityLimiter | None
) -> None:
    """Run an (approved) call and commit its result; ``limiter`` bounds the turn's calls.

    The tool's awaitable is awaited right here (not in a helper, nor in
    :meth:`Tool.invoke`): while a call runs, its frames are this one and the tool's.
    """
    if limiter is not None:
        await limiter.acquire()
    try:
        ready = await _prepare(state, call, call_soon)
        if type(ready) is ToolResult:
            result = ready
        else:
            assert type(ready) is tuple
            tool, ctx, args, kwargs = ready
            del ready  # not held while the tool runs
            # A tool without a timeout gets no scope of its own (a cancel scope per call
            # is a CancelScope, a CancelStatus and two sets that live as long as the call).
            timer = None if tool.timeout is None else trio.move_on_after(tool.timeout)
            threads = state.options.thread_limiter
            try:
                # Made here, run (awaited) within the timer: making the coroutine or the
                # thread's awaitable runs none of the tool. The call holds its own
                # arguments: not this frame too while it runs (W3 memory).
                started = tool._start(args, kwargs, threads)
                del args, kwargs
                if timer is None:
                    value = await started
                else:
                    with timer:
                        value = await started
            except trio.Cancelled:
                # Whenever the call ends with an exception, its context says so first
                # (what Tool.invoke does): a sync tool's abandoned thread polls it.
                if ctx is not None:
                    mark_cancelled(ctx)
                # -inf: some scope around us (the run's) really is cancelled: it goes
                # on up (the timeout's own cancellation never gets here: its scope
                # catches it). (Its own clause, with no "as": a re-raise from an "except ...
                # as" enters one more handler, two Python calls per call of a cancelled
                # tree on CPython 3.11, B8.) Otherwise nothing cancelled this call.
                if trio.current_effective_deadline() == -math.inf:
                    # Marked: the repair, which closes this call (still open), need not
                    # mark it again (a lock round-trip per open call of a cancelled tree).
                    state.open_calls[call.call_id].ctx = None
                    raise
                result = ToolResult(call.call_id, STRAY_CANCELLED, status="error")
            except BaseException as exc:
                if ctx is not None:
                    mark_cancelled(ctx)
                failed = _failed(state, call, exc)
                if failed is None:
                    raise
                result = failed
            else:
                if timer is not None and timer.cancelled_caught:
                    if ctx is not None:
                        mark_cancelled(ctx)
                    output = f"timed out after {tool.timeout:g} s"
                    result = ToolResult(call.call_id, output, status="error")
                elif type(value) is CallOutcome:
                    result = ToolResult(call.call_id, value.output, status=value.status)
                else:
                    try:
                        result = ToolResult(call.call_id, to_output(value))
                    except Exception as exc:  # a value whose str() or JSON raises
                        failed = _failed(state, call, exc)
                        assert failed is not None
                        result = failed
    finally:
        if limiter is not None:
            limiter.release()
    await end_tool(state, call, result)


# A call about to run: its tool, its context and its bound arguments (a tuple: made
# once per call, and unpacked at once).
_Ready: TypeAlias = tuple[Tool, ToolContext | None, tuple[Any, ...], dict[str, Any]]


async def _prepare(state: RunState, call: ToolCall, call_soon: CallSoon) -> ToolResult | _Ready:
    """Everything before the tool runs: ``before_tool``, ``tool.started``, the start
    hook, the tool's lookup and its arguments. A :class:`ToolResult` if the call ends
    here (not started, unknown tool, invalid arguments)."""
    if state.budgets and state.spend("tool_calls"):
        # Past a tool_calls limit: the call never runs (its run's scope is cancelled).
        await trio.lowlevel.checkpoint_if_cancelled()
    before_tool = state.options.before_tool
    if before_tool is not None:
        # A cluster records durably that the call starts, before it can have any effect:
        # if that fails, the tool must not run (a takeover would not know it ran).
        try:
            await before_tool(call)
        except Exception as exc:
            return ToolResult(call.call_id, f"not started: {summarize(exc)}", status="error")
    open_call = state.open_calls[call.call_id]
    open_call.started = True
    state.log.append(
        ToolStarted(
            run_id=state.run_id,
            seq=state.log.next_seq,
            call_id=call.call_id,
            name=call.name,
            arguments=call.arguments,
        )
    )
    hooks = state.hooks
    if hooks is not None:
        handle = state.handle
        await state.spans.start(
            f"tool:{call.call_id}",
            call_hook("on_tool_start", hooks.on_tool_start(handle, call)),
            # Replaced by the real result when the call ends (or by the repair's).
            lambda: hooks.on_tool_end(handle, call, ToolResult(call.call_id, "", "cancelled")),
        )
    agent = state.agent
    tool = agent.get_tool(call.name)
    if tool is None:
        handoffs = agent._handoff_index()
        target = handoffs.get(call.name)
        if target is not None:
            return hand_off(state, call, target)
        names = ", ".join([*(t.name for t in agent.tools), *handoffs]) or "none"
        output = f"unknown tool {call.name!r}; available tools: {names}"
        return ToolResult(call.call_id, output, status="error")
    ctx: ToolContext | None = None
    # An async function that takes no context can never read one (its progress, its
    # cancelled event, its child runs): none is made for it, nor its progress sink
    # (two objects per running call, W3 memory).
    if needs_context(tool):
        ctx = ToolContext(
            run_id=state.run_id,
            call_id=call.call_id,
            tool_name=call.name,
            on_progress=_ProgressSink(call_soon, state, open_call),
            handle=state.handle,
            children=state.child_starter,
        )
        open_call.ctx = ctx
    try:
        args, kwargs = tool._bind(ctx, call.arguments)
    except ToolArgumentsError as exc:
        return ToolResult(call.call_id, str(exc), status="error")
    return tool, ctx, args, kwargs


def _failed(state: RunState, call: ToolCall, exc: BaseException) -> ToolResult | None:
    """The result of a call whose tool raised ``exc`` (never a ``trio.Cancelled``: see
    :func:`_invoke`); None: ``exc`` must propagate."""
    if isinstance(exc, ToolArgumentsError):
        return ToolResult(call.call_id, str(exc), status="error")
    if isinstance(exc, Exception):
        if state.options.on_tool_error == "fail":
            raise ToolFailure(call, exc) from exc
        return ToolResult(call.call_id, f"error: {summarize(exc)}", status="error")
    return None  # KeyboardInterrupt and the like


@final
class _ProgressSink:
    """A running call's ``ToolContext.progress`` (from any thread): a ``tool.progress``
    event on the run's thread. One slotted object per call, where a partial with its
    arguments was three (held while the call runs: W3 memory)."""

    __slots__ = ("_call_soon", "_open_call", "_state")

    def __init__(self, call_soon: CallSoon, state: RunState, open_call: OpenCall) -> None:
        self._call_soon = call_soon
        self._state = state
        self._open_call = open_call

    def __call__(self, message: str, data: Mapping[str, Any]) -> None:
        state, open_call = self._state, self._open_call
        self._call_soon(lambda: _progress(state, open_call, message, data))


def _progress(state: RunState, open_call: OpenCall, message: str, data: Mapping[str, Any]) -> None:
    # Progress can arrive from a thread after the call (or the run) ended: drop it then,
    # so a tool.progress never follows its tool.finished or the terminal update.
    if state.open_calls.get(open_call.call.call_id) is open_call and not state.log.closed:
        state.log.append(
            ToolProgress(
                run_id=state.run_id,
                seq=state.log.next_seq,
                call_id=open_call.call.call_id,
                name=open_call.call.name,
                message=message,
                data=dict(data),
            )
        )


def finish_call(state: RunState, call: ToolCall, result: ToolResult) -> OpenCall:
    """Commit ``result`` for an open call (and its ``tool.finished``, if it started)."""
    open_call = state.open_calls.pop(call.call_id)
    # Its context's progress callback holds the open call: break that cycle, or every
    # finished run would wait for the garbage collector (which the cycle kept alive).
    open_call.ctx = None
    state.commit(result)
    if open_call.started:
        state.log.append(
            ToolFinished(
                run_id=state.run_id,
                seq=state.log.next_seq,
                call_id=call.call_id,
                name=call.name,
                status=result.status,
                output=result.output,
            )
        )
    hooks = state.hooks
    if hooks is not None:
        handle = state.handle
        state.spans.rebind(f"tool:{call.call_id}", lambda: hooks.on_tool_end(handle, call, result))
    return open_call


async def end_tool(state: RunState, call: ToolCall, result: ToolResult) -> None:
    """A call ended: commit and persist its result, then close its hook span."""
    finish_call(state, call, result)
    await state.persist()
    if state.parking is not None:
        state.parking.call_ended()  # what executed may have been the last: park now?
    end = state.spans.pop(f"tool:{call.call_id}")
    if end is not None:
        await call_hook("on_tool_end", end())


def hand_off(state: RunState, call: ToolCall, target: Agent) -> ToolResult:
    """A ``transfer_to_<name>`` call: answer it, and hand the run to ``target`` once the
    turn's calls are done (the turn loop does: ``_turns.switch_agent``). The first
    handoff of a turn wins; another in the same turn is an error the model reads.

    Past ``max_handoffs`` switches (agents that keep handing the conversation back and
    forth), the call is refused with an error the model reads, rather than failing the
    run: the current agent still holds the whole conversation and can answer it
    itself, and a model that insists is still stopped by ``max_turns``."""
    if state.handoff_to is not None and state.handoff_to is not target:
        output = f"not transferred: this turn already transferred to {state.handoff_to.name}"
        return ToolResult(call.call_id, output, status="error")
    limit = state.options.max_handoffs
    if state.handoff_to is None and state.handoffs_made >= limit:
        output = (
            f"not transferred to {target.name}: max_handoffs {limit} reached;"
            f" answer as {state.agent.name}"
        )
        return ToolResult(call.call_id, output, status="error")
    state.handoff_to = target
    return ToolResult(call.call_id, f"transferred to {target.name}")


def settle_resumed_calls(state: RunState, resume: Resume, calls: list[ToolCall]) -> list[ToolCall]:
    """A resumed run's calls left open: answer those that may not run again with
    ``interrupted`` (they started, and their tool is not idempotent); return the others,
    to run as a turn's calls (approval included) before the first model call."""
    again: list[ToolCall] = []
    for call in calls:
        tool = state.agent.get_tool(call.name)
        if call.call_id not in resume.started or (
            tool is not None and (tool.idempotent or tool._child_agent is not None)
        ):
            # An agent tool's call runs again too: it resumes its child run from the
            # child's session, whose own tools keep this same rule (_children.py).
            again.append(call)
            continue
        state.open_calls[call.call_id].started = True  # its tool.started was sent before
        result = ToolResult(call.call_id, f"interrupted: {resume.reason}", status="error")
        finish_call(state, call, result)
    return again
