"""Hostile text through every HTTP provider and a real SQLite session file.

A Python str can hold what UTF-8 cannot: lone surrogates (a file name decoded with
``os.fsdecode``, a server streaming an emoji's surrogate halves as two escaped deltas).
Such text must never reach a request body or a session as is: the request would fail to
encode, and every later run on the session with it. Each test runs a first run that
meets the text, then a second run on the same session, which must succeed.

The servers are real loopback HTTP servers speaking each provider's wire format
(``sse_server.py``); the session is a real SQLite file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest

import trio_agents as ta
from tests.support import chat_wire, responses_wire
from tests.support.anthropic_wire import (
    message_end,
    message_start,
    text_block,
    tool_block,
)
from tests.support.sse_server import Reply, SSEServer
from trio_agents.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel
from trio_agents.sessions import SQLiteSession

FILE_NAME = "r\udce9sum\udce9.pdf"  # os.fsdecode(b"r\xe9sum\xe9.pdf") on a UTF-8 system
SHOWN = "r\ufffdsum\ufffd.pdf"


@attrs.frozen
class Wire:
    """One provider: how to build its model, and its replies on the wire."""

    name: str
    model: Callable[[str], ta.Model]
    text: Callable[[list[str]], Reply]  # text streamed in these deltas
    call: Callable[[str, str, str], Reply]  # one tool call (id, name, arguments)


def _anthropic_text(parts: list[str]) -> Reply:
    return Reply(events=[message_start(), *text_block(0, *parts), *message_end()])


def _anthropic_call(call_id: str, name: str, arguments: str) -> Reply:
    events = [message_start(), *tool_block(0, call_id, name, arguments)]
    return Reply(events=[*events, *message_end("tool_use")])


WIRES = [
    Wire(
        "chat",
        lambda url: OpenAIChatModel("gpt-test", base_url=f"{url}/v1", api_key="k"),
        lambda parts: chat_wire.text_reply(*parts),
        lambda call_id, name, arguments: chat_wire.tool_reply((call_id, name, arguments)),
    ),
    Wire(
        "responses",
        lambda url: OpenAIResponsesModel("gpt-test", base_url=f"{url}/v1", api_key="k"),
        lambda parts: responses_wire.text_response(*parts),
        responses_wire.tool_response,
    ),
    Wire(
        "anthropic",
        lambda url: AnthropicModel("claude-test", base_url=url, api_key="k"),
        _anthropic_text,
        _anthropic_call,
    ),
]


@pytest.fixture(params=WIRES, ids=[wire.name for wire in WIRES])
def wire(request: pytest.FixtureRequest) -> Wire:
    wire: Wire = request.param
    return wire


def sent_texts(body: Any) -> list[str]:
    """Every str in a request body (JSON), depth first."""
    if isinstance(body, str):
        return [body]
    if isinstance(body, list):
        return [text for value in body for text in sent_texts(value)]
    if isinstance(body, dict):
        return [text for value in body.values() for text in sent_texts(value)]
    return []


async def two_runs(
    wire: Wire,
    server: SSEServer,
    directory: Path,
    tools: list[ta.Tool],
    inputs: tuple[Any, Any] = ("go", "again"),
) -> tuple[ta.RunResult, ta.RunResult, list[ta.Item]]:
    """Two runs on ``inputs`` of an agent with ``tools`` on one SQLite session in
    ``directory``, both completed; and the items the session then holds."""
    agent = ta.Agent("a", model=wire.model(server.base_url), tools=tools)
    async with SQLiteSession(directory / "s.db", "s") as session:
        first = await ta.run(agent, inputs[0], session=session)
        assert first.status == "completed", first.reason
        second = await ta.run(agent, inputs[1], session=session)
        assert second.status == "completed", second.reason
        return first, second, await session.get_items()


def assert_encodable(server: SSEServer) -> None:
    """Every request body was valid UTF-8 JSON with no surrogate left in it."""
    for request in server.requests:
        for text in sent_texts(json.loads(request.body.decode("utf-8"))):
            text.encode("utf-8")  # raises on a lone surrogate


@ta.function_tool
async def list_files() -> str:
    """List the files."""
    return f"files: {FILE_NAME}"


async def test_a_tool_output_with_lone_surrogates_reaches_the_model_and_the_session(
    wire: Wire, server: SSEServer, tmp_path: Path
) -> None:
    server.add(
        wire.call("call_1", "list_files", "{}"),
        wire.text(["found ", "it"]),
        wire.text(["again"]),
    )
    agent = ta.Agent("a", model=wire.model(server.base_url), tools=[list_files])
    db = tmp_path / "s.db"
    async with SQLiteSession(db, "s") as session:
        first = await ta.run(agent, "list", session=session)
        assert first.status == "completed", first.reason
        second = await ta.run(agent, "and now?", session=session)
        assert second.status == "completed", second.reason
        assert second.final_output == "again"
    assert_encodable(server)
    assert len(server.requests) == 3
    assert f"files: {SHOWN}" in sent_texts(server.requests[2].json)
    async with SQLiteSession(db, "s") as session:
        stored = await session.get_items()
    assert ta.ToolResult("call_1", f"files: {SHOWN}") in stored


async def test_surrogate_halves_streamed_apart_join_into_the_character(
    wire: Wire, server: SSEServer, tmp_path: Path
) -> None:
    # An emoji's halves in two deltas (joined), a lone low one and a high one the stream
    # ends on (each replaced).
    server.add(
        wire.text(["smile \ud83d", "\ude00 and \udce9 then \ud83d"]),
        wire.text(["ok"]),
    )
    agent = ta.Agent("a", model=wire.model(server.base_url))
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        async with ta.open_run(agent, "hi", session=session) as run:
            deltas = [e.text async for e in run.events() if isinstance(e, ta.ResponseTextDelta)]
            first = await run.wait()
        assert first.status == "completed", first.reason
        expected = "smile \U0001f600 and \ufffd then \ufffd"
        assert first.final_output == expected
        assert "".join(deltas) == expected
        second = await ta.run(agent, "again", session=session)
        assert second.status == "completed", second.reason
        assert ta.AssistantMessage(expected) in await session.get_items()
    assert_encodable(server)
    assert expected in sent_texts(server.requests[1].json)


async def test_tool_arguments_with_lone_surrogates_are_sent_back_encodable(
    wire: Wire, server: SSEServer, tmp_path: Path
) -> None:
    @ta.function_tool
    async def echo(text: str) -> str:
        """Echo."""
        return text

    # A raw lone surrogate in the arguments' text (not a JSON escape of one).
    server.add(wire.call("call_1", "echo", '{"text": "x\udce9"}'), wire.text(["done"]))
    server.add(wire.text(["ok"]))
    first, _, _ = await two_runs(wire, server, tmp_path, [echo])
    assert_encodable(server)
    assert ta.ToolResult("call_1", "x\ufffd") in first.new_items


async def test_nul_is_kept_and_sent_escaped(wire: Wire, server: SSEServer, tmp_path: Path) -> None:
    @ta.function_tool
    async def read() -> str:
        """Read."""
        return "a\x00b"

    server.add(wire.call("call_1", "read", "{}"), wire.text(["done"]), wire.text(["ok"]))
    _, _, stored = await two_runs(wire, server, tmp_path, [read])
    assert ta.ToolResult("call_1", "a\x00b") in stored
    assert b"a\\u0000b" in server.requests[1].body
    assert "a\x00b" in sent_texts(server.requests[2].json)


async def test_input_items_with_lone_surrogates(
    wire: Wire, server: SSEServer, tmp_path: Path
) -> None:
    server.add(wire.text(["one"]), wire.text(["two"]))
    inputs = ([{"role": "user", "content": FILE_NAME}], ta.UserMessage(f"and {FILE_NAME}"))
    await two_runs(wire, server, tmp_path, [], inputs)
    assert_encodable(server)
    assert f"and {SHOWN}" in sent_texts(server.requests[1].json)


async def test_an_injection_with_lone_surrogates(
    wire: Wire, server: SSEServer, tmp_path: Path
) -> None:
    server.add(wire.text(["one"]), wire.text(["two"]))
    agent = ta.Agent("a", model=wire.model(server.base_url))
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        async with ta.open_run(agent, "hi", session=session) as run:
            run.inject({"role": "user", "content": FILE_NAME})  # delivered before turn 1
            first = await run.wait()
        assert first.status == "completed", first.reason
        second = await ta.run(agent, "again", session=session)
        assert second.status == "completed", second.reason
    assert_encodable(server)
    assert SHOWN in sent_texts(server.requests[0].json)


async def test_a_rejection_message_with_lone_surrogates(
    wire: Wire, server: SSEServer, tmp_path: Path
) -> None:
    @ta.function_tool(needs_approval=True)
    async def delete() -> str:
        """Delete."""
        return "deleted"

    server.add(wire.call("call_1", "delete", "{}"), wire.text(["fine"]), wire.text(["ok"]))
    agent = ta.Agent("a", model=wire.model(server.base_url), tools=[delete])
    async with SQLiteSession(tmp_path / "s.db", "s") as session:
        async with ta.open_run(agent, "go", session=session) as run:
            async for update in run.updated:
                if update.status is ta.RunStatus.AWAITING_APPROVAL:
                    run.reject("call_1", message=f"not {FILE_NAME}")
                    break
            first = await run.wait()
        assert first.status == "completed", first.reason
        second = await ta.run(agent, "again", session=session)
        assert second.status == "completed", second.reason
    assert_encodable(server)
    assert ta.ToolResult("call_1", f"rejected: not {SHOWN}", "error") in first.new_items


async def test_hostile_text_on_a_postgres_session(server: SSEServer, pg_dsn: str) -> None:
    """The same through PostgreSQL, whose ``TEXT`` cannot hold NUL raw: a first run
    meets lone surrogates and NUL, a second run on the session sends them back."""
    from trio_agents.sessions import PostgresSession

    @ta.function_tool
    async def read() -> str:
        """Read."""
        return f"{FILE_NAME} \x00 end"

    wire = WIRES[0]
    server.add(wire.call("call_1", "read", "{}"), wire.text(["\ud83d", "\ude00"]))
    server.add(wire.text(["ok"]))
    agent = ta.Agent("a", model=wire.model(server.base_url), tools=[read])
    async with PostgresSession(pg_dsn, "s") as session:
        first = await ta.run(agent, "go", session=session)
        assert first.status == "completed", first.reason
        second = await ta.run(agent, "again", session=session)
        assert second.status == "completed", second.reason
        stored = await session.get_items()
    assert ta.ToolResult("call_1", f"{SHOWN} \x00 end") in stored
    assert ta.AssistantMessage("\U0001f600") in stored
    assert_encodable(server)


async def test_a_session_poisoned_by_an_earlier_version_heals_on_load(
    wire: Wire, server: SSEServer, tmp_path: Path
) -> None:
    """Rows written before items were cleaned hold lone surrogates as JSON escapes (the
    stored JSON is ASCII): loading them cleans them, so the next request encodes."""
    import sqlite3

    db = tmp_path / "s.db"
    async with SQLiteSession(db, "s") as session:
        await session.add_items([ta.UserMessage("hello")])
    row = json.dumps({"type": "function_call_output", "call_id": "c", "output": "x"})
    poisoned = [
        json.dumps({"type": "function_call", "call_id": "c", "name": "ls", "arguments": "{}"}),
        row.replace('"x"', '"r\\udce9sum\\udce9.pdf"'),
        json.dumps({"type": "message", "role": "assistant", "content": "\ud83d"}),
    ]
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO items (session_id, position, data, created_at) VALUES ('s', ?, ?, 0)",
            list(enumerate(poisoned, 1)),
        )
    conn.close()
    server.add(wire.text(["fine"]))
    agent = ta.Agent("a", model=wire.model(server.base_url))
    async with SQLiteSession(db, "s") as session:
        result = await ta.run(agent, "and now?", session=session)
    assert result.status == "completed", result.reason
    assert_encodable(server)
    assert SHOWN in sent_texts(server.requests[0].json)
