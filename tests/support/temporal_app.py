"""The agents the Temporal tests' worker processes serve
(``--app tests.support.temporal_app:AGENTS``).

The model decides from the conversation alone (no script state), so any attempt on any
worker process answers the same conversation the same way:

- ``"block"``: call the ``block`` tool, which marks that it started (a file named
  ``<run id>.started`` holding the worker's pid, in ``$TRIO_AGENTS_TEST_MARKS``) and
  then waits forever;
- ``"guarded"``: call the ``guarded`` tool (id ``call_guarded``), which needs approval;
  ``"guarded again"``: the same, with the id ``call_guarded_<calls so far>``;
- ``"question"``: call the ``question`` tool (id ``call_question``), which asks a
  question whose answer has content (``{"color": str}``; its id
  ``call_question:ask-1``) and returns ``"color: <color>"``;
- ``"fail"``: the model raises (the run fails on its own);
- ``"tree"`` (the ``tree`` agent): call ``middle`` (id ``call_middle``), an agent tool
  whose model, on ``"nest"``, calls ``leaf`` (id ``call_leaf``), an agent tool whose
  model calls ``guarded``: a grandchild waits for approval;
- ``"slow"``: the answer ``"slow answer"`` streamed in 10 deltas 100 ms apart (a run in
  flight for a while, to race a cancel against its completion);
- ``"stream <token>"``: stream ``"partial <token> "`` and mark it (a file
  ``<token>.streaming`` holding the worker's pid), then wait forever mid-stream; once
  that mark exists (a later attempt, any worker), stream ``"streamed <token>"`` and stop;
- anything else: the answer ``"echo: <text>"``; after a tool result, ``"done: <output>"``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import trio

import trio_agents as ta
from trio_agents.models import Finish, ModelEvent, TextDelta, ToolCallDone


class RuleModel:
    """A deterministic model that answers by the rules in the module docstring."""

    def stream(
        self, request: ta.ModelRequest
    ) -> AbstractAsyncContextManager[AsyncIterator[ModelEvent]]:
        return self._stream(request)

    @asynccontextmanager
    async def _stream(self, request: ta.ModelRequest) -> AsyncIterator[AsyncIterator[ModelEvent]]:
        last = request.items[-1]
        events: list[ModelEvent] = []
        if isinstance(last, ta.ToolResult):
            events.append(TextDelta(f"done: {last.output}"))
        elif isinstance(last, ta.UserMessage) and last.content == "fail":
            raise ta.ModelError("the rule model fails on 'fail'")
        elif isinstance(last, ta.UserMessage) and last.content == "guarded":
            events.append(ToolCallDone(ta.ToolCall("call_guarded", "guarded", "{}")))
        elif isinstance(last, ta.UserMessage) and last.content == "guarded again":
            calls = sum(isinstance(item, ta.ToolCall) for item in request.items)
            events.append(ToolCallDone(ta.ToolCall(f"call_guarded_{calls}", "guarded", "{}")))
        elif isinstance(last, ta.UserMessage) and last.content == "question":
            events.append(ToolCallDone(ta.ToolCall("call_question", "question", "{}")))
        elif isinstance(last, ta.UserMessage) and last.content == "tree":
            events.append(ToolCallDone(ta.ToolCall("call_middle", "middle", '{"input": "nest"}')))
        elif isinstance(last, ta.UserMessage) and last.content == "nest":
            events.append(ToolCallDone(ta.ToolCall("call_leaf", "leaf", '{"input": "guarded"}')))
        elif isinstance(last, ta.UserMessage) and last.content == "slow":
            yield _slow()
            return
        elif isinstance(last, ta.UserMessage) and last.content.startswith("stream "):
            yield _stream(last.content.removeprefix("stream "))
            return
        elif isinstance(last, ta.UserMessage) and last.content == "block":
            turn = sum(isinstance(item, ta.ToolCall) for item in request.items)
            events.append(ToolCallDone(ta.ToolCall(f"call_block_{turn}", "block", "{}")))
        else:
            content = last.content if isinstance(last, ta.UserMessage) else "?"
            events.append(TextDelta(f"echo: {content}"))
        events.append(Finish("tool_calls" if isinstance(events[0], ToolCallDone) else "stop"))

        async def play() -> AsyncIterator[ModelEvent]:
            for event in events:
                await trio.lowlevel.checkpoint()
                yield event

        yield play()


async def _slow() -> AsyncIterator[ModelEvent]:
    for piece in ["slow", " ", "ans", "w", "e", "r", "", "", "", ""]:
        await trio.sleep(0.1)
        yield TextDelta(piece)
    yield Finish("stop")


async def _stream(token: str) -> AsyncIterator[ModelEvent]:
    """The ``"stream <token>"`` rule: stuck mid-stream until a later attempt."""
    mark = Path(os.environ["TRIO_AGENTS_TEST_MARKS"]) / f"{token}.streaming"
    if mark.exists():
        yield TextDelta(f"streamed {token}")
        yield Finish("stop")
        return
    yield TextDelta(f"partial {token} ")
    await trio.lowlevel.checkpoint()
    mark.with_suffix(".tmp").write_text(str(os.getpid()))
    mark.with_suffix(".tmp").rename(mark)  # whole, for a reader that polls for it
    await trio.sleep_forever()


@ta.function_tool
async def block(ctx: ta.ToolContext) -> str:
    """Mark that the call started, then wait until cancelled."""
    marks = Path(os.environ["TRIO_AGENTS_TEST_MARKS"])
    path = marks / f"{ctx.run_id}.started"
    path.with_suffix(".tmp").write_text(str(os.getpid()))
    path.with_suffix(".tmp").rename(path)  # whole, for a reader that polls for it
    await trio.sleep_forever()
    raise AssertionError("unreachable")


@ta.function_tool(needs_approval=True)
async def guarded() -> str:
    """Run only once approved."""
    return "guarded ran"


@ta.function_tool
async def question(ctx: ta.ToolContext) -> str:
    """Ask which color, for an answer with content; return it."""
    schema = {"type": "object", "properties": {"color": {"type": "string"}}, "required": ["color"]}
    decision = await ctx.request_approval("which color?", schema=schema)
    if not decision.approved or decision.content is None:
        return f"refused: {decision.message}"
    return f"color: {decision.content['color']}"


_LEAF = ta.Agent(name="leaf", instructions="", model=RuleModel(), tools=[guarded])
_MIDDLE = ta.Agent(name="middle", instructions="", model=RuleModel(), tools=[_LEAF.as_tool()])

AGENTS = {
    "rules": ta.Agent(
        name="rules", instructions="", model=RuleModel(), tools=[block, guarded, question]
    ),
    "tree": ta.Agent(name="tree", instructions="", model=RuleModel(), tools=[_MIDDLE.as_tool()]),
}
