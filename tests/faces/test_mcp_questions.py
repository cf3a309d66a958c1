"""The MCP face asks its client a question a running tool call asks
(``ctx.request_approval``) as an elicitation whose message is the question's and whose
``requestedSchema`` is the question's form; the accepted content is the approval's
content, which reaches the tool (``ApprovalDecision.content``). The official ``mcp``
client over Streamable HTTP, in both protocol eras (an ``elicitation/create`` request;
2026-07-28's ``InputRequiredResult`` and the retried call)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import mcp.types as types
import pytest
import trio
from mcp import Client
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client

import trio_agents as ta
from tests.support.http_support import Served, serving
from trio_agents.models import ScriptedModel, Turn

pytestmark = [
    pytest.mark.trio,
    # As in test_mcp_http.py: the SDK's transport leaves response-body generators to
    # the garbage collector. Only that warning, only from httpx2/httpcore2.
    pytest.mark.filterwarnings(
        r"ignore:Async generator 'http(core|x)2\.[^']*' was garbage collected:ResourceWarning"
    ),
]

SEAT_FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "seat": {"type": "string", "enum": ["aisle", "window"], "title": "Seat"},
        "bags": {"type": "integer", "default": 1},
    },
    "required": ["seat"],
}


def booker(decisions: list[ta.ApprovalDecision], schema: Any) -> dict[str, ta.Agent]:
    @ta.function_tool
    async def book(ctx: ta.ToolContext) -> str:
        """Book a seat once a person picked one."""
        decision = await ctx.request_approval("Which seat on flight 42?", schema=schema)
        decisions.append(decision)
        return "booked" if decision.approved else "not booked"

    model = ScriptedModel([Turn(tool_calls=[("book", {})]), Turn(text="done")])
    return {"booker": ta.Agent(name="booker", model=model, tools=[book])}


@asynccontextmanager
async def mcp_client(served: Served, *, mode: str, **options: Any) -> AsyncIterator[Client]:
    headers = {"Authorization": "Bearer tok-alice"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=None)) as http:
        transport = streamable_http_client(served.base + "/mcp", http_client=http)
        async with Client(transport, mode=mode, **options) as mcp:
            yield mcp


def answering(
    action: str, content: dict[str, Any] | None
) -> tuple[Any, list[types.ElicitRequestFormParams]]:
    asked: list[types.ElicitRequestFormParams] = []

    async def elicitation(
        _context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestFormParams)
        asked.append(params)
        return types.ElicitResult(action=action, content=content)  # type: ignore[arg-type]

    return elicitation, asked


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_question_is_elicited_with_its_form_and_the_content_answers_it(
    mode: str,
) -> None:
    decisions: list[ta.ApprovalDecision] = []
    elicitation, asked = answering("accept", {"seat": "window", "bags": 0})
    with trio.fail_after(30):
        async with (
            serving(booker(decisions, SEAT_FORM)) as served,
            mcp_client(served, mode=mode, elicitation_callback=elicitation) as mcp,
        ):
            result = await mcp.call_tool("booker", {"input": "book"})
    assert not result.is_error
    (params,) = asked
    assert params.message == "Which seat on flight 42?"
    assert params.requested_schema == SEAT_FORM
    assert decisions == [ta.ApprovalDecision(True, None, {"seat": "window", "bags": 0})]


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_question_without_a_form_asks_for_a_note_and_decline_rejects(mode: str) -> None:
    decisions: list[ta.ApprovalDecision] = []
    elicitation, asked = answering("decline", {"message": "not today"})
    with trio.fail_after(30):
        async with (
            serving(booker(decisions, None)) as served,
            mcp_client(served, mode=mode, elicitation_callback=elicitation) as mcp,
        ):
            await mcp.call_tool("booker", {"input": "book"})
    (params,) = asked
    assert params.message == "Which seat on flight 42?"
    assert list(params.requested_schema["properties"]) == ["message"]
    assert decisions == [ta.ApprovalDecision(False, "not today", None)]


class _Seen(logging.Handler):
    """Sets ``event`` when the MCP face logs a message containing ``text`` (the face
    runs in this test's Trio thread)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.event = trio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


async def test_content_holding_nul_is_refused_at_the_edge_and_the_question_waits() -> None:
    decisions: list[ta.ApprovalDecision] = []
    elicitation, asked = answering("accept", {"seat": "win\x00dow"})
    seen = _Seen("NUL or a lone surrogate")
    face_log = logging.getLogger("trio_agents.faces.mcp")
    level = face_log.level
    face_log.setLevel(logging.INFO)
    face_log.addHandler(seen)
    try:
        with trio.fail_after(30):
            async with (
                serving(booker(decisions, SEAT_FORM)) as served,
                mcp_client(served, mode="legacy", elicitation_callback=elicitation) as mcp,
                httpx.AsyncClient(
                    base_url=served.base, headers={"Authorization": "Bearer tok-alice"}
                ) as http,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(mcp.call_tool, "booker", {"input": "book"})
                await seen.event.wait()  # the face read the answer and refused it
                [record] = (await http.get("/runs")).json()["runs"]
                assert record["status"] == "awaiting_approval"
                assert decisions == []
                # Still answerable, here from REST.
                answer = await http.post(
                    f"/runs/{record['run_id']}/approve",
                    json={"call_id": "call_1_0:ask-1", "content": {"seat": "window"}},
                )
                assert answer.status_code == 200, answer.text
    finally:
        face_log.removeHandler(seen)
        face_log.setLevel(level)
    assert len(asked) == 1
    assert decisions == [ta.ApprovalDecision(True, None, {"seat": "window"})]
