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

import inspect
import math
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any, TypeAlias, final

import attrs
import trio

from ._agent import Agent, compiled_output
from ._answer import Answers, final_answer_offered
from ._error_text import summarize
from ._events import InboxDelivered, InboxInjected, RunStatus
from ._exceptions import GuardrailTripped, InvalidConversationError, ModelError
from ._guardrails import (
    GuardrailFault,
    StreamGate,
    check_input,
    check_output,
    gate_task,
    input_guardrails_done,
)
from ._handoffs import switch_agent
from ._inbox import Approvals, Inbox, Injection
from ._items import (
    AssistantMessage,
    Item,
    ToolCall,
    ToolResult,
    conversation_problems,
    sendable,
)
from ._limits import StreamMeter
from ._model import (
    FINAL_ANSWER_TOOL,
    Finish,
    Model,
    ModelRequest,
    TextDelta,
    ToolCallDone,
    ToolSpec,
    Usage,
)
from ._output import Accepted, Rejected
from ._session_load import load_session
from ._state import (
    CallSoon,
    HookError,
    OpenCall,
    RunState,
    SessionError,
    call_hook,
)
from ._text_cleaning import TextJoiner
from ._toolcalls import ToolFailure, settle_resumed_calls
from ._window import HistoryError, apply_history

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
    if isinstance(exc, InvalidConversationError):
        return Failed(f"invalid conversation: {exc}", exc)
    if isinstance(exc, GuardrailTripped):
        return Failed(str(exc), exc)
    if isinstance(exc, GuardrailFault):
        return Failed(str(exc), exc.error)
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
    try:
        pending = await _start(state)
        answers = Answers(state, approvals, call_soon)

        idle = False
        while True:
            # A cancel point, not a schedule point: every turn awaits its model stream
            # (and its tools), which yield, so a yield here only cost a scheduler pass
            # per turn. Other threads' requests need none: the cancel mode and the inbox
            # are read under their locks, right here.
            await trio.lowlevel.checkpoint_if_cancelled()
            if stop_requested():
                return Stopped()
            if pending:
                turn: _TurnOutcome = _Calls(pending)
                pending = ()
            else:
                deliver(state, inbox, idle=idle)
                if state.turn >= state.max_turns:
                    return Failed("max_turns")
                _check_conversation(state)
                turn = await model_turn(state, inbox)
            if type(turn) is _Interrupted:
                idle = False  # a when="now" injection: the next turn starts at once
                continue
            if type(turn) is _Calls:
                attempt = await answers.take_calls(turn.calls)
                if state.handoff_to is not None:
                    switch_agent(state)  # a transfer_to_<name> call: the next turn is theirs
            else:
                assert type(turn) is _Answer
                attempt = await answers.take_text(turn.text)
            if attempt is None or type(attempt) is Rejected:
                if answers.exhausted:
                    assert attempt is not None
                    return Failed(f"output validation failed: {attempt.problem}")
                idle = False  # tools ran, or the model is asked again
                continue
            assert type(attempt) is Accepted
            agent = state.agent
            if state.guardrails_running or agent.output_guardrails:
                # Never complete before every input guardrail passed, nor with an answer
                # an output guardrail refuses (a trip raises: the run fails, and the
                # answer, still held, is marked rejected by the repair).
                await input_guardrails_done(state)
                if agent.output_guardrails:
                    await check_output(state, attempt.value, *_answer_items(state, turn))
            # A hook (on_model_end, say) or session that swallowed the run's Cancelled
            # must not let the run complete: the cancel wins (DESIGN §5).
            await trio.lowlevel.checkpoint_if_cancelled()
            if inbox.close_if_empty(RunStatus.COMPLETED.value):
                return Completed(attempt.value)
            idle = True  # something is pending: one more turn with it
    except Exception as exc:
        return failure(exc)
    except trio.Cancelled:
        # -inf: the run (or an outer scope) really is cancelled. Otherwise a model, hook
        # or session raised a Cancelled that nothing asked for: a fault, not a cancel.
        # (No "as exc": re-raising from it would enter one more handler, two Python
        # calls per run of a cancelled tree on CPython 3.11, B8.)
        if trio.current_effective_deadline() != -math.inf:
            return Failed(STRAY_CANCELLED_RUN, sys.exception())
        raise


def _check_conversation(state: RunState) -> None:
    """The validity invariant, before a model request: an invalid request is never
    sent. A function of its own so that no list of problems stays in the turn loop's
    frame while the turn runs (W3 memory)."""
    problems = state.conversation_problems()
    if problems:
        raise InvalidConversationError("; ".join(problems[:3]))


def _answer_items(state: RunState, turn: _TurnOutcome) -> tuple[tuple[int, ...], str | None]:
    """Where an accepted final answer is in the conversation, and its text if it never
    streamed: a text answer is the last item (nothing is committed after an accepted
    one) and streamed through the gate; a ``final_answer`` call's answer is the first
    such call and its result, and its arguments are the answer's text."""
    conversation = state.conversation
    if type(turn) is not _Calls:
        return (len(conversation) - 1,), None
    call = next(c for c in turn.calls if c.name == FINAL_ANSWER_TOOL)
    # The call and its result are among the turn's last items: search from the end.
    at: list[int] = []
    for index in range(len(conversation) - 1, -1, -1):
        item = conversation[index]
        if isinstance(item, ToolCall | ToolResult) and item.call_id == call.call_id:
            at.insert(0, index)
            if len(at) == 2:
                break
    output = compiled_output(state.agent)
    assert output is not None  # a final_answer call was accepted
    return tuple(at), output.text_of(call.arguments)


async def _start(state: RunState) -> tuple[ToolCall, ...]:
    """``running``, ``on_run_start``, the session loaded; returns the calls a resumed
    run must run before its first model call (those its earlier attempt left open)."""
    resume = state.options.resume
    state.emit_status(RunStatus.RUNNING, detail=resume.detail if resume is not None else None)
    if state.hooks is not None:
        state.run_span_open = True
        await call_hook("on_run_start", state.hooks.on_run_start(state.handle))
    left_open = await load_session(state)
    if resume is None:
        return ()  # a tuple: no list held by the turn loop for the whole run
    pending = settle_resumed_calls(state, resume, left_open)
    await state.persist()
    return tuple(pending)


def _request_tools(state: RunState) -> tuple[ToolSpec, ...]:
    """The agent's tools, plus the final-answer tool when the agent has an output type
    and the model has no native structured output (``native_output``)."""
    agent = state.agent
    # Shared by every run of the agent, never copied: the schemas are read-only
    # (_frozen.py), so no request can change what another run's model is told.
    tools = agent.tool_specs()
    if final_answer_offered(state):
        output = compiled_output(agent)
        assert output is not None
        tools = (*tools, output.tool_spec())
    return tools


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
            state.undelivered += tuple(taken[index:])
            raise InvalidConversationError(
                f"injected call id {clash[0]!r} is already in the conversation"
            )
        for item in injection.items:
            state.take_input(item)  # user messages: for the next turn's input guardrails
        state.log.append(
            InboxDelivered(
                run_id=state.run_id,
                seq=state.log.next_seq,
                injection_id=injection.id,
                turn=state.turn + 1,
            )
        )


async def model_turn(state: RunState, inbox: Inbox) -> _TurnOutcome:
    """One model call: stream it, validate its events, commit what it produced.

    The steps, each its own function: the fresh input's guardrails
    (:func:`_check_fresh_input`), the request (:func:`_request`), opening the call
    (:func:`_open_call`), the stream (:func:`_stream`) and committing or keeping what
    it produced (:func:`_finish`). This function owns the stream's scope, the meter and
    the gate, and closes the last two whatever happens.
    """
    state.turn += 1
    state.turn_usage = None
    turn = state.turn
    agent = state.agent
    if state.fresh_input:
        await _check_fresh_input(state)
    request = await _request(state, agent)
    partial: list[str] = []
    state.partial_text = partial
    state.finish_reason = None
    calls: list[ToolCall] = []
    # The stream's scope exists before the start hook runs, so a when="now" injection
    # that arrives while the call is being opened interrupts it (never lost between).
    # A run no injection can reach (state.interruptible) needs no scope: entering and
    # leaving one is the largest cost of a turn in our code (issue 18, W2).
    stream_scope = trio.CancelScope() if state.interruptible else _NO_SCOPE
    meter = StreamMeter(state.budgets) if state.budgets else None
    gate = _gate(state, turn, partial)
    try:
        with stream_scope:
            if type(stream_scope) is trio.CancelScope:
                state.stream_scope = stream_scope
                if inbox.wants_interrupt():
                    stream_scope.cancel(reason="interrupted by injection")
            await _open_call(state, turn, request, agent.model)
            await _stream(state, agent.model, request, turn, partial, calls, meter, gate)
    finally:
        if meter is not None:
            meter.close()  # an estimate no usage replaced counts as the usage
        if gate is not None:
            gate.close()  # nothing still held is ever published
    state.stream_scope = None
    # A model may swallow the Cancelled (its iterator ends the stream on it, or its
    # __aexit__ returns True): the stream then "ends" with the cut-off text. The run's
    # own cancellation is re-raised here, so a cancelled run never turns that text
    # into a final answer (DESIGN §5); an interruption counts as one whether or not
    # the scope caught its Cancelled.
    await trio.lowlevel.checkpoint_if_cancelled()
    return await _finish(state, turn, stream_scope.cancel_called, partial, calls)


async def _check_fresh_input(state: RunState) -> None:
    """Run the input guardrails on the input that arrived since the last turn (it and
    all after it are held from later models until they all passed it)."""
    fresh, state.fresh_input = state.fresh_input or [], None
    hold, state.fresh_hold = state.fresh_hold, None
    blocking = hold is not None and hold.blocking
    if state.agent.input_guardrails:
        # Beside the model call (side tasks), or before it for blocking ones (all of
        # them for a resumed run's stored input: it is not sent before they passed).
        await check_input(state, fresh, hold, blocking=blocking)
    elif hold is not None:
        state.release(hold)  # no guardrail of this agent's to pass it


async def _request(state: RunState, agent: Agent) -> ModelRequest:
    """The turn's request: the instructions and history (either may be computed by the
    agent's callables), the tools, the settings and the output spec."""
    output = compiled_output(agent)
    instructions = agent.instructions
    if not isinstance(instructions, str):
        instructions = await _instructions(state, instructions)
    # The one place model input is made of the conversation: what a guardrail
    # rejected (marked ``rejected_by``, in this run or one before it on the session)
    # never reaches a model, nor a history policy that could put it back.
    items = tuple(state.conversation) if not state.rejected else _sendable(state)
    if agent.history is not None:
        items = await _history(state, agent.history, items)
    return ModelRequest(
        instructions=instructions,
        items=items,
        tools=_request_tools(state),
        settings=agent.model_settings,
        output=output.spec if output is not None else None,
        # A model that holds the request back (its RateLimit) tells the run, which
        # shows it on its `running` update (DESIGN §21).
        on_wait=state.show_throttled,
    )


def _sendable(state: RunState) -> tuple[Item, ...]:
    """The conversation without its rejected items, checked (DESIGN §4): a rejected
    item's call and result are marked together, so this holds unless the stored marks
    were tampered with — then the run fails rather than send it."""
    items = sendable(state.conversation)
    problems = conversation_problems(items)
    if problems:
        raise InvalidConversationError(f"without its rejected items: {problems[0]}")
    return items


async def _open_call(state: RunState, turn: int, request: ModelRequest, model: Model) -> None:
    """Before the call is opened: the start hook, then the last chances to stop it."""
    hooks = state.hooks
    if hooks is not None:
        handle = state.handle
        await state.spans.start(
            "model",
            call_hook("on_model_start", hooks.on_model_start(handle, turn, request)),
            lambda: hooks.on_model_end(handle, turn, "cancelled"),
        )
    # A when="now" injection accepted while the start hook ran (or a cancel the
    # hook swallowed) must stop the call before it is opened: the hook may not
    # have awaited since, and a model's stream need not checkpoint before its
    # first events (DESIGN §6, last bullet).
    await trio.lowlevel.checkpoint_if_cancelled()
    # A request counts against the limits only now that it is really sent (one
    # interrupted or refused before this point was never made); the one that
    # would pass a requests limit, or a cost budget on its model's estimate, is not
    # sent: its run's scope is cancelled.
    if state.budgets and (state.refuse_estimate(model, request) or state.spend("requests")):
        await trio.lowlevel.checkpoint_if_cancelled()
    if state.options.record_requests:
        state.record_request(request, model)  # the request as it goes out (DESIGN §23)


async def _stream(
    state: RunState,
    model: Model,
    request: ModelRequest,
    turn: int,
    partial: list[str],
    calls: list[ToolCall],
    meter: StreamMeter | None,
    gate: StreamGate | None,
) -> None:
    """Stream the call: publish its text (through the gate, if any) and collect its
    calls into ``calls``; the meter charges what streams against the limits."""
    log = state.log
    # Streamed text is cleaned as it comes (a surrogate pair split across deltas
    # is joined, a lone surrogate replaced): the deltas sent out are what is
    # committed.
    joiner = TextJoiner()
    async with model.stream(request) as stream:
        async for event in stream:
            text: str | None
            # The hot path, inline: a text delta whose text is ASCII text.
            if type(event) is TextDelta and type(event.text) is str:
                text = event.text
                if not text.isascii() or joiner.held:
                    text = joiner.feed(text)
            else:
                # Any other event (a TextDelta subclass's text comes back).
                text = _accept(state, event, calls, joiner)
                if meter is not None and type(event) is Usage and meter.usage(event):
                    await trio.lowlevel.checkpoint_if_cancelled()
            if text:
                if gate is None:
                    partial.append(text)
                    log.append_text(turn, text)
                elif gate.push(text):  # published once the guardrails pass it
                    await gate.settle()  # a trip (raises the run's Cancelled), or an await
                if meter is not None and meter.text(text):
                    # Past a limit: its run's scope is cancelled; cut here.
                    await trio.lowlevel.checkpoint_if_cancelled()
    tail = joiner.flush()  # a high surrogate the stream ended on: lone
    if tail:
        if gate is None:
            partial.append(tail)
            log.append_text(turn, tail)
        elif gate.push(tail):
            await gate.settle()
    if gate is not None:
        gate.end()
        await gate.drained()  # every delta checked and published, or a trip


async def _finish(
    state: RunState, turn: int, interrupted: bool, partial: list[str], calls: list[ToolCall]
) -> _TurnOutcome:
    """After the stream: keep an interrupted call's text, or commit the response."""
    if interrupted:
        state.keep_partial_text()
        await _end_model_span(state, turn, "interrupted")
        await state.persist()
        return _Interrupted()
    text = _commit_response(state, partial, calls)
    await _end_model_span(state, turn, "completed")
    await state.persist()
    return _Calls(tuple(calls)) if calls else _Answer(text)


def _gate(state: RunState, turn: int, partial: list[str]) -> StreamGate | None:
    """The turn's stream gate, if its agent has streaming output guardrails. Plain
    functions are checked inline, in the stream loop; any ``async def`` one puts the
    checks in a checker task beside the stream, a side task of the run."""
    guardrails = [g for g in state.agent.output_guardrails if g.stream]
    if not guardrails:
        return None
    gate = StreamGate(state, turn, guardrails, partial)
    if not gate.inline:
        if state.side is None:
            # needs_side_tasks() saw this agent (every agent a run can hand off to):
            # never stream past its guardrails for want of a nursery.
            raise RuntimeError(f"no side nursery for agent {state.agent.name!r}'s gate")
        state.side.start_soon(gate_task, gate, state)
    return gate


async def _instructions(state: RunState, make: Callable[[Any], Any]) -> str:
    """Call an agent's callable instructions with the run (DESIGN §18); what it raises
    (or returns that is not a str) fails the run, naming it, as a hook's would."""
    text: list[str] = []
    await call_hook("instructions", _call_instructions(make, state.handle, text))
    return text[0]


async def _history(state: RunState, policy: Any, items: tuple[Item, ...]) -> tuple[Item, ...]:
    """What the agent's history policy sends of ``items`` (DESIGN §18); an invalid result
    fails the run as an invalid conversation, a raising policy naming it."""
    sent: list[tuple[Item, ...]] = []

    async def apply() -> None:
        try:
            sent.append(await apply_history(state, policy, items))
        except HistoryError as exc:
            raise InvalidConversationError(f"history {exc}") from exc

    try:
        await call_hook("history", apply())
    except HookError as exc:
        if isinstance(exc.error, InvalidConversationError):
            raise exc.error from None
        raise
    return sent[0]


async def _call_instructions(make: Callable[[Any], Any], run: Any, into: list[str]) -> None:
    value = make(run)
    if inspect.isawaitable(value):
        value = await value
    if not isinstance(value, str):
        raise TypeError(f"returned {type(value).__name__}, not str")
    into.append(value)


@final
class _NoScope:
    """Stands in for the stream's cancel scope in a run no injection can reach: nothing
    can cancel it, so it never catches anything. Stateless: one serves every run."""

    __slots__ = ()
    cancel_called = False

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


_NO_SCOPE = _NoScope()


def _commit_response(state: RunState, partial: list[str], calls: list[ToolCall]) -> str:
    """Commit a finished response: its text (incomplete if cut short), then its calls
    (open until their results come). Returns the text."""
    text = "".join(partial)
    state.partial_text = None
    if text or not calls:
        cut = _cut_short(state.finish_reason)
        state.commit(
            AssistantMessage(text, status="incomplete" if cut and not calls else "completed"),
            state.response_usage(),
        )
    # The response's usage is on its first run.item only (its text's, else its first
    # call's): each request's usage is in the log once (DESIGN §23).
    usage = None if text or not calls else state.response_usage()
    for call in calls:
        state.commit(call, usage)
        usage = None
        state.open_calls[call.call_id] = OpenCall(call)
    return text


def _cut_short(finish_reason: str | None) -> bool:
    """Whether an answer that finished this way was cut (``"length"``, a filter, ...)."""
    return finish_reason is not None and finish_reason not in _COMPLETE_FINISHES


async def _end_model_span(state: RunState, turn: int, outcome: str) -> None:
    if state.spans.pop("model") is not None:
        assert state.hooks is not None
        await call_hook("on_model_end", state.hooks.on_model_end(state.handle, turn, outcome))


def _valid_cost(cost: object) -> bool:
    """A cost is a finite, non-negative :class:`~decimal.Decimal` (exact sums)."""
    return isinstance(cost, Decimal) and cost.is_finite() and cost >= 0


def _accept(
    state: RunState, event: object, calls: list[ToolCall], joiner: TextJoiner
) -> str | None:
    """Validate one model event and take it in (raises ModelError for a bad one); a
    text delta's cleaned text is returned for the caller to publish."""
    kind = type(event)
    if kind is TextDelta:
        assert isinstance(event, TextDelta)
        text = event.text
        if type(text) is not str:
            raise ModelError(f"model yielded a TextDelta whose text is {type(text).__name__}")
        return joiner.feed(text)
    if kind is ToolCallDone:
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
        cached = (event.cache_read_tokens, event.cache_write_tokens)
        if (
            any(type(n) is not int or n < 0 for n in counts)
            or any(n is not None and (type(n) is not int or n < 0) for n in cached)
            or (event.cost is not None and not _valid_cost(event.cost))
        ):
            raise ModelError(f"model yielded an invalid usage: {event!r}")
        state.charge(event)
        turn_usage = state.turn_usage
        state.turn_usage = event if turn_usage is None else turn_usage + event
    elif kind is Finish:
        assert isinstance(event, Finish)
        if type(event.reason) is not str:
            raise ModelError(f"model yielded a finish reason of {type(event.reason).__name__}")
        state.finish_reason = event.reason
    else:
        raise ModelError(f"model yielded an unknown event: {event!r:.200}")
    return None
