"""Final answers of agents with an ``output_type`` (DESIGN §15): the turn loop hands
each model turn here, and gets back what the turn amounts to.

Without an output type every answer is accepted as text. With one, the answer comes as
text (native structured output) or as a call of the ``final_answer`` tool the run adds;
either way it is validated, and an invalid one goes back to the model, at most
``Agent.output_retries`` times.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import final

from ._agent import compiled_output
from ._inbox import Approvals
from ._items import ToolCall, ToolResult, UserMessage
from ._model import FINAL_ANSWER_TOOL
from ._output import Accepted, Attempt, OutputType, Rejected
from ._state import CallSoon, RunState
from ._toolcalls import finish_call, run_tools

__all__ = ["Answers", "final_answer_offered"]


def final_answer_offered(state: RunState) -> bool:
    """Whether the model is offered the ``final_answer`` tool: the agent has an output
    type and the model has no native structured output (``native_output``)."""
    agent = state.agent
    return (
        compiled_output(agent) is not None
        and getattr(agent.model, "native_output", False) is not True
    )


@final
class Answers:
    """What the model's turns amount to, and how many answers were rejected.

    It runs a turn's tool calls itself (with the run's approvals and ``call_soon``),
    rather than being handed a partial of :func:`run_tools`: one object per run in
    flight, not four (W3 memory)."""

    __slots__ = ("_approvals", "_call_soon", "_rejected", "_state")

    def __init__(self, state: RunState, approvals: Approvals, call_soon: CallSoon) -> None:
        self._state = state
        self._approvals = approvals
        self._call_soon = call_soon
        self._rejected = 0

    @property
    def exhausted(self) -> bool:
        """More answers were rejected than ``Agent.output_retries`` allows."""
        return self._rejected > self._state.agent.output_retries

    def take_calls(self, calls: Sequence[ToolCall]) -> Awaitable[Attempt | None]:
        """A turn of tool calls: run them; the awaitable gives None unless one was a
        final answer. Without a final answer it is :func:`run_tools`' own awaitable (one
        coroutine frame less while the tools run)."""
        output = compiled_output(self._state.agent)
        if output is None or all(c.name != FINAL_ANSWER_TOOL for c in calls):
            return self._run_tools(calls)
        return self._take_answer_calls(calls, output)

    def _run_tools(self, calls: Sequence[ToolCall]) -> Awaitable[None]:
        return run_tools(self._state, calls, approvals=self._approvals, call_soon=self._call_soon)

    async def _take_answer_calls(self, calls: Sequence[ToolCall], output: OutputType) -> Attempt:
        answers = [c for c in calls if c.name == FINAL_ANSWER_TOOL]
        # The other calls of the turn run first: the model asked for them, and their
        # results must be in before the turn can end.
        others = [c for c in calls if c.name != FINAL_ANSWER_TOOL]
        if others:
            await self._run_tools(others)
        return self._count(await _take_tool_answer(self._state, output, answers))

    async def take_text(self, text: str) -> Attempt:
        """A turn that ended with text: the answer, checked if there is an output type."""
        output = compiled_output(self._state.agent)
        if output is None:
            return Accepted(text)
        attempt = self._count(output.take_text(text))
        if type(attempt) is Rejected and not self.exhausted:
            await _ask_again(self._state, output, attempt)
        return attempt

    def _count(self, attempt: Attempt) -> Attempt:
        if type(attempt) is Rejected:
            self._rejected += 1
        return attempt


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
    if final_answer_offered(state):
        how = f"Give your final answer by calling the {FINAL_ANSWER_TOOL} tool."
    else:
        how = f"Answer again with only a JSON value matching the schema {output.spec.name!r}."
    state.commit(UserMessage(f"Your final answer is not valid: {attempt.problem}. {how}"))
    await state.persist()
