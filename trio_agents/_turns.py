"""The turn engine: the run's model-stream task, as a loop of model turns.

:func:`drive` is the whole loop; it returns what ended the run as an outcome value
(:class:`Completed`, :class:`Failed`, :class:`Stopped`) and never sets a field for
someone else to read back. A cancellation of the run's scope is not an outcome: it
propagates, and the handle reads it from the scope.

One iteration is one *safe point* followed by one model turn:

1. ``cancel(mode="after_turn")`` takes effect here, and only here.
2. Deliverable injections enter the conversation (never between a call and its result).
3. ``max_turns`` is checked.
4. The conversation is checked against the validity invariant: an invalid request is
   never sent; the run fails with the reason instead.
5. :func:`model_turn` streams one response, validating every event as it arrives.
6. Tool calls run (``_toolcalls.py``); a final answer completes the run only if the
   inbox can be closed with nothing in it.

With an ``output_type`` (``_output.py``), a final answer is a text answer or a
``final_answer`` tool call, and it must validate before it can complete the run. One
that does not is sent back to the model — as the call's error result, or as a user
message after a text answer — and the loop goes on, at most ``agent.output_retries``
times; then the run fails with ``"output validation failed: …"``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeAlias, final

import attrs
import trio

from ._events import InboxDelivered, InboxInjected, ResponseTextDelta, RunStatus
from ._exceptions import ModelError
from ._inbox import Approvals, Inbox, Injection
from ._items import AssistantMessage, Item, ToolCall, ToolResult, UserMessage
from ._model import (
    FINAL_ANSWER_TOOL,
    Finish,
    ModelRequest,
    TextDelta,
    ToolCallDone,
    ToolSpec,
    Usage,
)
from ._output import Accepted, Attempt, OutputType, Rejected
from ._state import CallSoon, HookError, OpenCall, RunState, SessionError, call_hook
from ._toolcalls import ToolFailure, finish_call, run_tools
from ._util import summarize
from .sessions._repair import repair_loaded

__all__ = ["Completed", "Failed", "Outcome", "Stopped", "announce", "drive", "load_session"]

# Finish reasons of a complete answer; any other cuts it (kept as incomplete).
STRAY_CANCELLED_RUN = "a model, hook or session raised trio.Cancelled although nothing cancelled it"
_COMPLETE_FINISHES = frozenset({"stop", "tool_calls", "end_turn", "tool_use"})


@final
@attrs.frozen
class Completed:
    """The model gave a final answer and nothing was pending.

    ``output`` is the answer's text, or the parsed value with an ``output_type``.
    """

    output: Any


@final
@attrs.frozen
class Failed:
    """The run cannot go on (``reason`` is the terminal reason)."""

    reason: str
    error: BaseException | None = None


@final
@attrs.frozen
class Stopped:
    """``cancel(mode="after_turn")`` stopped the run at a safe point."""


Outcome: TypeAlias = Completed | Failed | Stopped


class InvalidConversation(Exception):
    """The conversation broke the validity invariant before a model call."""


@final
@attrs.frozen
class _Answer:
    text: str


@final
@attrs.frozen
class _Calls:
    calls: tuple[ToolCall, ...]


@final
@attrs.frozen
class _Interrupted:
    pass


_TurnOutcome: TypeAlias = _Answer | _Calls | _Interrupted


def failure(exc: Exception) -> Failed:
    """The terminal reason for an exception that ended the turn loop."""
    if isinstance(exc, ExceptionGroup):
        tools = [e for e in exc.exceptions if isinstance(e, ToolFailure)]
        if tools and len(tools) == len(exc.exceptions):
            return Failed("tool error: " + "; ".join(str(e) for e in tools), exc)
        if len(exc.exceptions) == 1 and isinstance(exc.exceptions[0], Exception):
            return failure(exc.exceptions[0])
    if isinstance(exc, ToolFailure):
        return Failed(f"tool error: {exc}", exc.error)
    if isinstance(exc, HookError):
        return Failed(f"hook error: {exc}", exc.error)
    if isinstance(exc, SessionError):
        return Failed(f"session error: {exc}", exc.error)
    if isinstance(exc, InvalidConversation):
        return Failed(f"invalid conversation: {exc}", exc)
    return Failed(summarize(exc), exc)


async def drive(
    state: RunState,
    inbox: Inbox,
    approvals: Approvals,
    stop_requested: Callable[[], bool],
    call_soon: CallSoon,
) -> Outcome:
    """The model-stream task: run turns until an outcome (see the module docstring)."""
    await trio.lowlevel.checkpoint_if_cancelled()  # cancelled before start: no model call
    state.emit_status(RunStatus.RUNNING)
    limiter = trio.CapacityLimiter(state.options.max_concurrent_tools)
    try:
        if state.hooks is not None:
            state.run_span_open = True
            await call_hook("on_run_start", state.hooks.on_run_start(state.handle))
        await load_session(state)
        idle = False
        rejected = 0  # final answers that did not validate (output_type only)
        while True:
            await trio.lowlevel.checkpoint()
            if stop_requested():
                return Stopped()
            deliver(state, inbox, idle=idle)
            if state.turn >= state.max_turns:
                return Failed("max_turns")
            problems = state.conversation_problems()
            if problems:
                raise InvalidConversation("; ".join(problems[:3]))
            turn = await model_turn(state, inbox)
            output = state.agent._output
            attempt: Attempt | None = None
            if type(turn) is _Calls:
                answers = [c for c in turn.calls if c.name == FINAL_ANSWER_TOOL]
                if output is None or not answers:
                    await run_tools(state, turn.calls, approvals, limiter, call_soon)
                    idle = False
                    continue
                # The other calls of the turn run first: the model asked for them, and
                # their results must be in before the turn can end.
                others = [c for c in turn.calls if c.name != FINAL_ANSWER_TOOL]
                if others:
                    await run_tools(state, others, approvals, limiter, call_soon)
                attempt = await _take_tool_answer(state, output, answers)
            elif type(turn) is _Answer:
                attempt = Accepted(turn.text) if output is None else output.take_text(turn.text)
            else:
                idle = False  # interrupted by a when="now" injection
                continue
            if type(attempt) is Rejected:
                assert output is not None
                rejected += 1
                if rejected > state.agent.output_retries:
                    return Failed(f"output validation failed: {attempt.problem}")
                if type(turn) is _Answer:
                    # The tool path answered in the call's result already.
                    await _ask_again(state, output, attempt)
                idle = False
                continue
            assert type(attempt) is Accepted
            if inbox.close_if_empty(RunStatus.COMPLETED.value):
                return Completed(attempt.value)
            idle = True  # something is pending: one more turn with it
    except Exception as exc:
        return failure(exc)
    except trio.Cancelled as exc:
        # -inf: the run (or an outer scope) really is cancelled. Otherwise a model, hook
        # or session raised a Cancelled that nothing asked for: a fault, not a cancel.
        if trio.current_effective_deadline() != -math.inf:
            return Failed(STRAY_CANCELLED_RUN, exc)
        raise


async def _take_tool_answer(
    state: RunState, output: OutputType, answers: list[ToolCall]
) -> Attempt:
    """Check the answer of a turn's ``final_answer`` call(s) and answer each call.

    Every call gets its result here, committed and persisted before anything else can
    happen (the validity invariant: no call is left unanswered): the first call's says
    whether the answer was accepted (the model reads why not), any later one is refused.
    A cancellation before this point leaves the calls open, and the repair answers them.
    """
    attempt = output.take_arguments(answers[0].arguments)
    if type(attempt) is Accepted:
        first = ToolResult(answers[0].call_id, "final answer accepted")
    else:
        assert type(attempt) is Rejected
        first = ToolResult(
            answers[0].call_id,
            f"invalid final answer: {attempt.problem}. Call {FINAL_ANSWER_TOOL} again"
            " with arguments that match its schema.",
            status="error",
        )
    finish_call(state, answers[0], first)
    for extra in answers[1:]:
        refused = f"ignored: {FINAL_ANSWER_TOOL} was called more than once in one turn"
        finish_call(state, extra, ToolResult(extra.call_id, refused, status="error"))
    await state.persist()
    return attempt


async def _ask_again(state: RunState, output: OutputType, attempt: Rejected) -> None:
    """After a text answer that did not validate: tell the model why, as a user message
    (it becomes part of the conversation, like any other turn)."""
    if FINAL_ANSWER_TOOL in {spec.name for spec in _request_tools(state)}:
        how = f"Give your final answer by calling the {FINAL_ANSWER_TOOL} tool."
    else:
        how = f"Answer again with only a JSON value matching the schema {output.spec.name!r}."
    state.commit(UserMessage(f"Your final answer is not valid: {attempt.problem}. {how}"))
    await state.persist()


def _request_tools(state: RunState) -> tuple[ToolSpec, ...]:
    """The agent's tools, plus the final-answer tool when the agent has an output type
    and the model has no native structured output (``native_output``)."""
    agent = state.agent
    tools = agent.tool_specs()
    output = agent._output
    if output is not None and getattr(agent.model, "native_output", False) is not True:
        tools = (*tools, output.tool_spec())
    return tools


async def load_session(state: RunState) -> None:
    """Load (and repair) the session's history, then commit the input, once.

    The input is committed even when loading fails, so it is in ``new_items``.

    Raises:
        SessionError: the session raised (the input is then not written to it).
    """
    if state.input_committed:
        return
    error: SessionError | None = None
    if state.session is not None and not state.history_loaded:
        try:
            stored = await state.session.get_items()
            repaired = repair_loaded(stored)  # raises TypeError for garbage
        except Exception as exc:
            error = SessionError(exc)
            state.drop_session()  # never write to a session we could not read
        else:
            state.load_history(repaired)
            if repaired != stored:
                await _write_back(state, stored, repaired)
    state.input_committed = True
    for item in state.input:
        state.commit(item)
    if error is not None:
        raise error
    problems = state.conversation_problems(allow_open_calls=True)
    if problems:
        state.drop_session()  # refuse to store an invalid conversation
        raise InvalidConversation(f"the input does not fit the stored conversation: {problems[0]}")
    await state.persist()


async def _write_back(state: RunState, stored: list[Item], repaired: list[Item]) -> None:
    """Write a load repair back, so the stored rows are valid again — atomically only: a
    repair that just appends (results for calls left open at the end, the usual crash)
    is one ``add_items``; any other goes through the session's ``replace_items`` if it
    has one (a clear followed by an append could lose the history halfway). A session
    with neither is repaired again at every load."""
    session = state.session
    assert session is not None
    try:
        if repaired[: len(stored)] == stored:
            await session.add_items(repaired[len(stored) :])
            return
        replace = getattr(session, "replace_items", None)
        if replace is not None:
            await replace(repaired)
    except Exception as exc:
        state.drop_session()
        raise SessionError(exc) from exc


def announce(state: RunState, injections: list[Injection]) -> None:
    for injection in injections:
        state.log.append(
            InboxInjected(
                run_id=state.run_id,
                seq=state.log.next_seq,
                injection_id=injection.id,
                when=injection.when,
                items=injection.items,
            )
        )


def deliver(state: RunState, inbox: Inbox, *, idle: bool) -> None:
    """A safe point: move deliverable injections into the conversation."""
    announce(state, inbox.announce())
    taken = inbox.take(idle=idle)
    for index, injection in enumerate(taken):
        clash = [
            i.call_id
            for i in injection.items
            if type(i) is ToolCall and i.call_id in state.call_ids
        ]
        if clash:
            # Accepted before the history was loaded, or the model used the id since:
            # unconsumed, never delivered into an invalid conversation.
            state.undelivered.extend(taken[index:])
            raise InvalidConversation(
                f"injected call id {clash[0]!r} is already in the conversation"
            )
        for item in injection.items:
            state.commit(item)
        state.log.append(
            InboxDelivered(
                run_id=state.run_id,
                seq=state.log.next_seq,
                injection_id=injection.id,
                turn=state.turn + 1,
            )
        )


async def model_turn(state: RunState, inbox: Inbox) -> _TurnOutcome:
    """One model call: stream it, validate its events, commit what it produced."""
    state.turn += 1
    turn = state.turn
    agent = state.agent
    output = agent._output
    request = ModelRequest(
        instructions=agent.instructions,
        items=tuple(state.conversation),
        tools=_request_tools(state),
        settings=agent.model_settings,
        output=output.spec if output is not None else None,
    )
    partial: list[str] = []
    state.partial_text = partial
    state.finish_reason = None
    calls: list[ToolCall] = []
    # The stream's scope exists before the start hook runs, so a when="now" injection
    # that arrives while the call is being opened interrupts it (never lost between).
    with trio.CancelScope() as stream_scope:
        state.stream_scope = stream_scope
        if inbox.wants_interrupt():
            stream_scope.cancel(reason="interrupted by injection")
        hooks = state.hooks
        if hooks is not None:
            handle = state.handle
            await state.spans.start(
                "model",
                call_hook("on_model_start", hooks.on_model_start(handle, turn, request)),
                lambda: hooks.on_model_end(handle, turn, "cancelled"),
            )
        log, run_id = state.log, state.run_id
        async with agent.model.stream(request) as stream:
            async for event in stream:
                # The hot path, inline: a text delta whose text is text.
                if type(event) is TextDelta and type(event.text) is str:
                    if event.text:
                        partial.append(event.text)
                        log.append(
                            ResponseTextDelta(
                                run_id=run_id, seq=log.next_seq, turn=turn, text=event.text
                            )
                        )
                else:
                    _accept(state, event, turn, partial, calls)
    state.stream_scope = None
    if stream_scope.cancelled_caught:
        state.keep_partial_text()
        await _end_model_span(state, turn, "interrupted")
        await state.persist()
        return _Interrupted()
    text = "".join(partial)
    state.partial_text = None
    if text or not calls:
        cut = _cut_short(state.finish_reason)
        state.commit(
            AssistantMessage(text, status="incomplete" if cut and not calls else "completed")
        )
    for call in calls:
        state.commit(call)
        state.open_calls[call.call_id] = OpenCall(call)
    await _end_model_span(state, turn, "completed")
    await state.persist()
    return _Calls(tuple(calls)) if calls else _Answer(text)


def _cut_short(finish_reason: str | None) -> bool:
    """Whether an answer that finished this way was cut (``"length"``, a filter, ...)."""
    return finish_reason is not None and finish_reason not in _COMPLETE_FINISHES


async def _end_model_span(state: RunState, turn: int, outcome: str) -> None:
    if state.spans.pop("model") is not None:
        assert state.hooks is not None
        await call_hook("on_model_end", state.hooks.on_model_end(state.handle, turn, outcome))


def _accept(
    state: RunState, event: object, turn: int, partial: list[str], calls: list[ToolCall]
) -> None:
    """Validate one model event and take it in (raises ModelError for a bad one)."""
    kind = type(event)
    if kind is TextDelta:
        assert isinstance(event, TextDelta)
        text = event.text
        if type(text) is not str:
            raise ModelError(f"model yielded a TextDelta whose text is {type(text).__name__}")
        if text:
            partial.append(text)
            state.log.append(
                ResponseTextDelta(run_id=state.run_id, seq=state.log.next_seq, turn=turn, text=text)
            )
    elif kind is ToolCallDone:
        assert isinstance(event, ToolCallDone)
        call = event.call
        if not isinstance(call, ToolCall):
            raise ModelError(f"model yielded a ToolCallDone holding {type(call).__name__}")
        if call.call_id in state.call_ids or any(c.call_id == call.call_id for c in calls):
            raise ModelError(f"model returned a duplicate tool call id {call.call_id!r}")
        calls.append(call)
    elif kind is Usage:
        assert isinstance(event, Usage)
        counts = (event.input_tokens, event.output_tokens)
        if any(type(n) is not int or n < 0 for n in counts):
            raise ModelError(f"model yielded an invalid usage: {event!r}")
        state.usage = event if state.usage is None else state.usage + event
    elif kind is Finish:
        assert isinstance(event, Finish)
        if type(event.reason) is not str:
            raise ModelError(f"model yielded a finish reason of {type(event.reason).__name__}")
        state.finish_reason = event.reason
    else:
        raise ModelError(f"model yielded an unknown event: {event!r:.200}")
