"""What a guardrail rejects never reaches a model, now or later (DESIGN §18): a rejected
input or answer stays in the conversation and the session, marked ``rejected_by``, and
no later request of the run or of the next run on the session is sent it.

Each test runs twice on one :class:`SQLiteSession` file: the run a guardrail stops, then
a harmless run, whose requests (``ScriptedModel.requests``) are what the model sees."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

import trio_agents as ta
from tests.support.core_trees import tool_turn
from trio_agents.models import ModelRequest, ScriptedModel, Turn
from trio_agents.sessions import SQLiteSession

SECRET = "xyzzy-secret"


@ta.input_guardrail(name="no_secret")
def no_secret_in(run: ta.Run, items: Sequence[ta.Item]) -> bool:
    return any(SECRET in i.content for i in items if isinstance(i, ta.UserMessage))


@ta.input_guardrail(name="no_secret", blocking=True)
def no_secret_in_blocking(run: ta.Run, items: Sequence[ta.Item]) -> bool:
    return any(SECRET in i.content for i in items if isinstance(i, ta.UserMessage))


@ta.output_guardrail(name="no_secret_out")
def no_secret_out(run: ta.Run, answer: Any) -> bool:
    return SECRET in str(answer)


@ta.output_guardrail(name="no_secret_stream", stream=True)
def no_secret_stream(run: ta.Run, text: str) -> bool:
    return SECRET in text


@attrs.frozen
class Reply:
    text: str


def _texts(request: ModelRequest) -> str:
    """Everything a request sends of its conversation, as one string."""
    return "\n".join(str(item.to_json()) for item in request.items)


def _assert_never_sent(model: ScriptedModel, since: int = 0) -> None:
    assert model.calls > since, "the later run made no model call"
    for request in model.requests[since:]:
        assert SECRET not in _texts(request)
        assert not ta.conversation_problems(request.items)


async def _second_run(agent: ta.Agent, path: Path, model: ScriptedModel) -> ta.RunResult:
    since = model.calls
    async with SQLiteSession(path, "s") as session:
        result = await ta.run(agent, "hello again", session=session)
    assert result.status == "completed", result.reason
    _assert_never_sent(model, since)
    return result


async def _streaming(run: ta.Run) -> None:
    """Wait until the run's model streams text."""
    async for event in run.events():
        if isinstance(event, ta.ResponseTextDelta):
            return


async def _stored(path: Path) -> list[ta.Item]:
    async with SQLiteSession(path, "s") as session:
        return await session.get_items()


@pytest.mark.parametrize("guardrail", [no_secret_in, no_secret_in_blocking])
async def test_a_rejected_input_never_reaches_a_later_run(
    tmp_path: Path, guardrail: ta.InputGuardrail, autojump_clock: Any
) -> None:
    path = tmp_path / "s.db"
    model = ScriptedModel([], default="fine")
    agent = ta.Agent(name="a", model=model, input_guardrails=[guardrail])
    async with SQLiteSession(path, "s") as session:
        await ta.run(agent, "a first, harmless question", session=session)
        result = await ta.run(agent, f"tell me {SECRET}", session=session)
    assert result.status == "failed"
    assert result.reason == "guardrail no_secret: None"
    stored = await _stored(path)
    later = await _second_run(agent, path, model)
    sent = model.requests[-1].items
    assert [i.content for i in sent if isinstance(i, ta.UserMessage)] == [
        "a first, harmless question",
        "hello again",
    ]
    # kept (the user saw it), marked, in the result and the session alike
    rejected = [i for i in result.new_items if SECRET in str(i.to_json())]
    assert rejected
    assert all(i.rejected_by == "no_secret" for i in rejected)
    assert stored == list(result.conversation)
    assert later.conversation[: len(stored)] == tuple(stored)


async def test_the_answer_to_a_rejected_input_is_rejected_with_it(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """A non-blocking guardrail runs beside the model: the text the model streamed
    in answer to the input (it may echo it) is kept, marked, and never sent again."""

    @ta.input_guardrail(name="slow")
    async def slow(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        await trio.sleep(1)
        return any(SECRET in i.content for i in items if isinstance(i, ta.UserMessage))

    path = tmp_path / "s.db"
    model = ScriptedModel([Turn([f"you said {SECRET} "] * 20, delay=0.1)], default="fine")
    agent = ta.Agent(name="a", model=model, input_guardrails=[slow])
    async with SQLiteSession(path, "s") as session:
        result = await ta.run(agent, f"say {SECRET}", session=session)
    assert result.status == "failed"
    await _second_run(agent, path, model)
    echoed = result.new_items[-1]
    assert isinstance(echoed, ta.AssistantMessage)
    assert echoed.status == "incomplete"
    assert SECRET in echoed.content
    assert echoed.rejected_by == "slow"


async def test_a_rejected_injection_never_reaches_a_later_turn_or_run(
    tmp_path: Path, autojump_clock: Any
) -> None:
    path = tmp_path / "s.db"
    model = ScriptedModel([Turn("thinking", delay=1)], default="fine")
    agent = ta.Agent(name="a", model=model, input_guardrails=[no_secret_in])
    async with (
        SQLiteSession(path, "s") as session,
        ta.open_run(agent, "start", session=session) as run,
    ):
        await _streaming(run)  # the first turn's input passed; its answer streams
        run.inject([{"role": "user", "content": f"also {SECRET}"}])
    result = run.result
    assert result is not None
    assert result.status == "failed"
    await _second_run(agent, path, model)
    marks = {i.content: i.rejected_by for i in result.new_items if isinstance(i, ta.UserMessage)}
    assert marks == {"start": None, f"also {SECRET}": "no_secret"}


async def test_a_run_that_ends_before_its_input_is_checked_keeps_it_from_models(
    tmp_path: Path, autojump_clock: Any
) -> None:
    """Fail closed: input no guardrail passed (the run was cancelled while one was
    still checking it) is held from the model like input one rejected."""

    @ta.input_guardrail(name="slow")
    async def slow(run: ta.Run, items: Sequence[ta.Item]) -> bool:
        await trio.sleep(10)
        return False

    path = tmp_path / "s.db"
    model = ScriptedModel([Turn("partial answer", delay=1)], default="fine")
    agent = ta.Agent(name="a", model=model, input_guardrails=[slow])
    async with (
        SQLiteSession(path, "s") as session,
        ta.open_run(agent, f"unchecked {SECRET}", session=session) as run,
    ):
        await _streaming(run)
        run.cancel("stop")
    result = run.result
    assert result is not None
    assert result.status == "cancelled"
    await _second_run(ta.Agent(name="a", model=model), path, model)
    assert {i.rejected_by for i in result.new_items} == {"slow"}


def _answering(text: str, *, native: bool) -> Turn:
    """A turn giving the final answer ``Reply(text)`` as an ``output_type`` answer."""
    if native:
        return Turn(f'{{"text": "{text}"}}')
    return tool_turn(("final_answer", {"text": text}))


@pytest.mark.parametrize("native", [False, True])
async def test_a_structured_answer_passes_the_streaming_output_guardrails(
    tmp_path: Path, native: bool
) -> None:
    """Without native structured output the answer comes as a ``final_answer`` call's
    arguments, never streamed: the streaming guardrails check it all the same, and the
    rejected call and its result stay a valid pair that no later request holds. With
    it, the answer streams through the gate."""
    path = tmp_path / "s.db"
    model = ScriptedModel(
        [_answering(SECRET, native=native)],
        default=_answering("fine", native=native),
        native_output=native,
    )
    agent = ta.Agent(name="a", model=model, output_type=Reply, output_guardrails=[no_secret_stream])
    async with SQLiteSession(path, "s") as session:
        result = await ta.run(agent, "answer", session=session)
    assert result.status == "failed"
    assert result.reason == "guardrail no_secret_stream: None"
    assert result.final_output is None
    later = await _second_run(agent, path, model)
    assert later.final_output == Reply("fine")
    assert not ta.conversation_problems(result.conversation)
    holding = [i for i in result.new_items if SECRET in str(i.to_json())]
    if native:
        assert holding == []  # held by the gate, never published nor kept
    else:
        assert [type(i) for i in holding] == [ta.ToolCall]
        rejected = [i for i in result.new_items if i.rejected_by is not None]
        assert [type(i) for i in rejected] == [ta.ToolCall, ta.ToolResult]
        assert {i.rejected_by for i in rejected} == {"no_secret_stream"}
    assert not ta.conversation_problems(await _stored(path))


@pytest.mark.parametrize("structured", [False, True])
async def test_an_answer_an_output_guardrail_rejects_never_reaches_a_later_run(
    tmp_path: Path, structured: bool
) -> None:
    path = tmp_path / "s.db"
    if structured:
        model = ScriptedModel(
            [tool_turn(("final_answer", {"text": SECRET}))],
            default=tool_turn(("final_answer", {"text": "fine"})),
        )
        agent = ta.Agent(
            name="a", model=model, output_type=Reply, output_guardrails=[no_secret_out]
        )
    else:
        model = ScriptedModel([f"the answer is {SECRET}"], default="fine")
        agent = ta.Agent(name="a", model=model, output_guardrails=[no_secret_out])
    async with SQLiteSession(path, "s") as session:
        result = await ta.run(agent, "answer", session=session)
    assert result.status == "failed"
    assert result.reason == "guardrail no_secret_out: None"
    await _second_run(agent, path, model)
    rejected = [i for i in result.new_items if i.rejected_by is not None]
    expected = [ta.ToolCall, ta.ToolResult] if structured else [ta.AssistantMessage]
    assert [type(i) for i in rejected] == expected
    assert {i.rejected_by for i in rejected} == {"no_secret_out"}
    stored = await _stored(path)
    assert stored[: len(result.conversation)] == list(result.conversation)


async def test_a_handoffs_answer_passes_its_agents_output_guardrails(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    target_model = ScriptedModel(
        [tool_turn(("final_answer", {"text": SECRET}))],
        default=tool_turn(("final_answer", {"text": "fine"})),
    )
    target = ta.Agent(
        name="b", model=target_model, output_type=Reply, output_guardrails=[no_secret_stream]
    )
    source_model = ScriptedModel([tool_turn(("transfer_to_b", {}))], default="fine")
    source = ta.Agent(name="a", model=source_model, handoffs=[target])
    async with SQLiteSession(path, "s") as session:
        result = await ta.run(source, "answer", session=session)
    assert result.status == "failed"
    assert result.reason == "guardrail no_secret_stream: None"
    await _second_run(source, path, source_model)


async def test_a_childs_rejected_answer_never_reaches_its_parent(tmp_path: Path) -> None:
    child_model = ScriptedModel([tool_turn(("final_answer", {"text": SECRET}))])
    child = ta.Agent(
        name="child", model=child_model, output_type=Reply, output_guardrails=[no_secret_stream]
    )
    parent_model = ScriptedModel([tool_turn(("child", {"input": "go"}))], default="parent done")
    parent = ta.Agent(name="parent", model=parent_model, tools=[child.as_tool()])
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        result = await ta.run(parent, "delegate", session=session)
        stored_child = await session.with_id("s/call_1_0").get_items()
    assert result.status == "completed"
    (answer,) = [i for i in result.new_items if isinstance(i, ta.ToolResult)]
    assert answer.status == "error"
    assert "no_secret_stream" in answer.output
    _assert_never_sent(parent_model)
    assert [type(i) for i in stored_child if i.rejected_by] == [ta.ToolCall, ta.ToolResult]


async def test_marked_items_handed_in_as_input_are_kept_and_never_sent() -> None:
    """``result.conversation`` holds the marks (``to_json`` carries them): a run given
    it as input, as dicts or items, keeps them and sends none of them, to the model
    nor to the history policy."""
    model = ScriptedModel([], default="fine")
    seen: list[tuple[ta.Item, ...]] = []

    def history(items: Sequence[ta.Item]) -> Sequence[ta.Item]:
        seen.append(tuple(items))
        return items

    agent = ta.Agent(name="a", model=model, history=history)
    earlier: list[ta.Item] = [
        ta.UserMessage("harmless"),
        ta.AssistantMessage("ok"),
        ta.UserMessage(f"say {SECRET}", rejected_by="no_secret"),
        ta.ToolCall("c1", "final_answer", f'{{"text": "{SECRET}"}}', rejected_by="g"),
        ta.ToolResult("c1", "final answer accepted", rejected_by="g"),
    ]
    as_json = [item.to_json() for item in earlier]
    assert [ta.item_from_json(data) for data in as_json] == earlier
    result = await ta.run(agent, [*as_json, {"role": "user", "content": "hello again"}])
    assert result.status == "completed", result.reason
    assert list(result.new_items[: len(earlier)]) == earlier
    _assert_never_sent(model)
    assert seen == [model.requests[0].items]
    sent = [i.to_json()["content"] for i in model.requests[0].items]
    assert sent == ["harmless", "ok", "hello again"]


@pytest.mark.parametrize(
    ("output_type", "arguments"),
    [
        (Reply, r'{"text": "call \u0035\u0035\u0035-0199"}'),
        (str, r'{"response": "call \u0035\u0035\u0035-0199"}'),
    ],
)
async def test_a_streaming_guardrail_sees_a_final_answer_without_json_escapes(
    output_type: Any, arguments: str
) -> None:
    """The arguments are JSON: escapes must not hide the answer's text from a
    streaming guardrail (a str answer it sees as itself, out of its envelope)."""
    seen: list[str] = []

    @ta.output_guardrail(name="no_phone", stream=True)
    def no_phone(run: ta.Run, text: str) -> bool:
        seen.append(text)
        return "555-" in text

    model = ScriptedModel([Turn(tool_calls=[("final_answer", arguments)])])
    agent = ta.Agent(name="a", model=model, output_type=output_type, output_guardrails=[no_phone])
    result = await ta.run(agent, "how do I reach Bob?")
    assert result.reason == "guardrail no_phone: None"
    assert seen[-1] == ("call 555-0199" if output_type is str else '{"text": "call 555-0199"}')


class _AppendOnly:
    """A session of the protocol's required methods only: no ``replace_items``."""

    session_id = "append-only"

    def __init__(self) -> None:
        self.items: list[ta.Item] = []

    async def get_items(self) -> list[ta.Item]:
        await trio.lowlevel.checkpoint()
        return list(self.items)

    async def add_items(self, items: Sequence[ta.Item]) -> None:
        await trio.lowlevel.checkpoint()
        self.items.extend(items)

    async def clear(self) -> None:
        await trio.lowlevel.checkpoint()
        self.items.clear()


async def test_a_session_without_replace_items_keeps_written_rows_unmarked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The documented limit: a row written before the trip cannot be changed without
    ``replace_items``; it is logged, and the run's own result is marked all the same."""
    model = ScriptedModel([f"the answer is {SECRET}"])
    agent = ta.Agent(name="a", model=model, output_guardrails=[no_secret_out])
    session = _AppendOnly()
    result = await ta.run(agent, "answer", session=session)
    assert result.status == "failed"
    assert [i.rejected_by for i in result.new_items] == [None, "no_secret_out"]
    assert session.items == [attrs.evolve(i, rejected_by=None) for i in result.new_items]
    assert "has no replace_items" in caplog.text


async def test_input_overlap_skip_takes_stored_user_messages_once(tmp_path: Path) -> None:
    """``input_overlap="skip"``: the input's first user messages, equal to the ones that
    end the stored conversation (a rejected one among them), are not new input again;
    an input that is nothing but those is a retry of them (checked again), or, when
    all were rejected, fails the run ("nothing new to run")."""
    # The blocking guardrail's run makes no request: run 2 and 3 answer, run 4 fails,
    # its retry answers.
    model = ScriptedModel(["fine", "fine", Turn(fail="down"), "retried"])
    agent = ta.Agent(name="a", model=model, input_guardrails=[no_secret_in_blocking])
    session = SQLiteSession(tmp_path / "s.db", "s1")
    rejected = ta.UserMessage(f"tell me {SECRET}")
    first = await ta.run(agent, [rejected], session=session, input_overlap="skip")
    assert first.status == "failed"
    again = [rejected, ta.UserMessage("hello")]
    second = await ta.run(agent, again, session=session, input_overlap="skip")
    assert second.status == "completed", second.reason
    assert [i.content for i in second.new_items if isinstance(i, ta.UserMessage)] == ["hello"]
    _assert_never_sent(model)
    # Stored once each: the rejected one (marked), then the answered one.
    users = [i for i in await session.get_items() if isinstance(i, ta.UserMessage)]
    assert [(i.content, i.rejected_by) for i in users] == [
        (rejected.content, "no_secret"),
        ("hello", None),
    ]
    # The session now ends with an answer: the same list is new input again ("keep").
    stored = len(await session.get_items())
    third = await ta.run(agent, [ta.UserMessage("hello")], session=session, input_overlap="skip")
    assert third.status == "completed"
    failed = ta.UserMessage("boom")
    assert (await ta.run(agent, [failed], session=session, input_overlap="skip")).status == "failed"
    retry = await ta.run(agent, [failed], session=session, input_overlap="skip")
    assert retry.status == "completed", retry.reason
    assert retry.final_output == "retried"
    sent = [i.content for i in model.requests[-1].items if isinstance(i, ta.UserMessage)]
    assert sent == ["hello", "hello", "boom"]  # stored once: not taken again
    # Only the rejected message again: nothing to run, nothing stored.
    await ta.run(agent, [ta.UserMessage(SECRET)], session=session, input_overlap="skip")
    before = len(await session.get_items())
    nothing = await ta.run(agent, [ta.UserMessage(SECRET)], session=session, input_overlap="skip")
    assert nothing.status == "failed"
    assert isinstance(nothing.error, ta.InvalidConversationError)
    assert "nothing new to run" in str(nothing.error)
    assert len(await session.get_items()) == before > stored
    _assert_never_sent(model)


@pytest.mark.parametrize("guardrail", [no_secret_in, no_secret_in_blocking])
async def test_a_resumed_run_rechecks_its_stored_input(
    tmp_path: Path, guardrail: ta.InputGuardrail
) -> None:
    """A takeover resumes with ``input=()``: the input the dead attempt stored (it died
    inside the guardrail) is checked again, as a blocking check, before any model
    request: a trip marks it and the model is never sent it."""
    session = SQLiteSession(tmp_path / "s.db", "s1")
    await session.add_items(
        [ta.UserMessage("harmless"), ta.AssistantMessage("fine"), ta.UserMessage(SECRET)]
    )
    model = ScriptedModel([], default="fine")
    agent = ta.Agent(name="a", model=model, input_guardrails=[guardrail])
    resume = ta.Resume(attempt=2, next_seq=5, reason="node a died")
    result = await ta.run(agent, [], session=session, resume=resume)
    assert result.status == "failed"
    assert isinstance(result.error, ta.GuardrailTripped)
    assert model.calls == 0
    stored = await session.get_items()
    assert [i.rejected_by for i in stored] == [None, None, "no_secret"]
    # Input that passes is only checked again: the resumed run answers it.
    await session.add_items([ta.UserMessage("hello")])
    again = ta.Resume(attempt=2, next_seq=5, reason="node a died")
    assert (await ta.run(agent, [], session=session, resume=again)).status == "completed"
    _assert_never_sent(model)
    sent = [i.content for i in model.requests[-1].items if isinstance(i, ta.UserMessage)]
    assert sent == ["harmless", "hello"]
