"""Attacks on "what a guardrail rejects never reaches a model, now or later" (DESIGN
§18) along paths the rejection tests do not take: a ``Summarize`` history policy's own
model call, what a hook is shown of a request, a handoff in the next run, a run
superseded (``on_busy="interrupt"``) before its guardrail passed its input, and a
:class:`MemorySession`. Each rejected run is followed by a run on the same session whose
every model request (``ScriptedModel.requests``) must hold none of the secret."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

import trio_agents as ta
from tests.support.core_trees import tool_turn
from trio_agents.models import ModelRequest, ScriptedModel, Turn
from trio_agents.sessions import MemorySession

SECRET = "xyzzy-secret"


@ta.input_guardrail(name="no_secret", blocking=True)
def no_secret(run: ta.Run, items: Sequence[ta.Item]) -> bool:
    return any(SECRET in i.content for i in items if isinstance(i, ta.UserMessage))


def _never_sent(requests: Sequence[ModelRequest]) -> None:
    assert requests, "no model call to check"
    for request in requests:
        assert SECRET not in "\n".join(str(i.to_json()) for i in request.items)
        assert not ta.conversation_problems(request.items)


class _Seen(ta.RunHooks):
    """Records every request a hook is shown."""

    def __init__(self) -> None:
        self.requests: list[ModelRequest] = []

    async def on_model_start(self, run: ta.Run, turn: int, request: ModelRequest) -> None:
        self.requests.append(request)


async def test_a_summarize_policy_never_summarizes_a_rejected_item() -> None:
    """The summary's own model call is made of what the request is made of: the
    conversation without its marked items (and a hook is shown no more)."""
    session = MemorySession("s")
    model = ScriptedModel([], default="fine")
    guarded = ta.Agent(name="a", model=model, input_guardrails=[no_secret])
    await ta.run(guarded, "first", session=session)
    rejected = await ta.run(guarded, f"remember {SECRET}", session=session)
    assert rejected.status == "failed"
    await ta.run(guarded, "second", session=session)
    summarizer = ScriptedModel([], default="the user said first and second")
    agent = ta.Agent(name="a", model=model, history=ta.Summarize(summarizer, keep_last_turns=1))
    hooks = _Seen()
    since = model.calls
    later = await ta.run(agent, "third", session=session, hooks=hooks)
    assert later.status == "completed", later.reason
    _never_sent(summarizer.requests)
    (summarized,) = summarizer.requests
    assert "first" in str(summarized.items[0].to_json())
    _never_sent(model.requests[since:])
    _never_sent(hooks.requests)
    assert [r.items for r in hooks.requests] == [r.items for r in model.requests[since:]]


async def test_a_handoff_in_a_later_run_never_sends_a_rejected_item() -> None:
    session = MemorySession("s")
    target_model = ScriptedModel([], default="target fine")
    target = ta.Agent(name="b", model=target_model, history=ta.KeepLastTurns(5))
    model = ScriptedModel([], default="fine")
    guarded = ta.Agent(name="a", model=model, input_guardrails=[no_secret], handoffs=[target])
    rejected = await ta.run(guarded, f"say {SECRET}", session=session)
    assert rejected.status == "failed"
    switching = ScriptedModel([tool_turn(("transfer_to_b", {}))])
    source = ta.Agent(name="a", model=switching, input_guardrails=[no_secret], handoffs=[target])
    later = await ta.run(source, "over to b", session=session)
    assert later.status == "completed", later.reason
    assert later.final_output == "target fine"
    _never_sent([*switching.requests, *target_model.requests])


async def test_a_superseded_runs_unchecked_input_never_reaches_the_next_run(
    autojump_clock: Any,
) -> None:
    """``on_busy="interrupt"`` ends a run whose guardrail has not passed its input yet:
    that input fails closed, and the run that superseded it is not sent it."""
    checking = trio.Event()

    @ta.input_guardrail(name="slow", blocking=True)
    async def slow(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        checking.set()
        await trio.sleep_forever()  # never passes: the run is superseded first

    session = MemorySession("s")
    model = ScriptedModel([], default=Turn("fine"))
    agent = ta.Agent(name="a", model=model, input_guardrails=[slow])
    plain = ta.Agent(name="a", model=model)
    async with ta.open_run(agent, f"unchecked {SECRET}", session=session) as first:
        await checking.wait()
        async with ta.open_run(plain, "next", session=session, on_busy="interrupt") as second:
            pass
    assert first.result is not None
    assert first.result.status == "cancelled"
    assert {i.rejected_by for i in first.result.new_items} == {"slow"}
    assert second.result is not None
    assert second.result.status == "completed", second.result.reason
    _never_sent(model.requests)
