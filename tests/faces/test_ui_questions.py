"""The web UI shows a question a running tool call asks (``ctx.request_approval``) as
what it asks, with a form built from its schema whose values are the approval's
content — in a real headless Chromium against a real HTTP face over a LocalHost.

A refused content (a required field left empty) shows the server's message and leaves
the question pending; the corrected form's values reach the tool as
``ApprovalDecision.content``, which the model's answer echoes onto the page.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import trio_agents as ta
from tests.support.ui_browser import browser, page, shot, sign_in, start_from_page, watched
from tests.support.ui_support import (
    ALICE,
    Call,
    GatedModel,
    Gates,
    UiServer,
    running_ui_server,
    tool_outputs,
)
from trio_agents import Agent

from playwright.sync_api import Page, expect  # isort: skip  (after ui_browser's skip)

__all__ = ["browser", "page", "watched"]  # the rig's fixtures, used by name

SEAT_FORM = {
    "type": "object",
    "properties": {
        "seat": {"type": "string", "enum": ["aisle", "window", "middle"], "title": "Seat"},
        "bags": {"type": "integer", "description": "checked bags"},
        "priority": {"type": "boolean", "default": False},
        "note": {"type": "string", "default": "none"},
    },
    "required": ["seat"],
}


def _agents(gates: Gates) -> dict[str, Agent]:
    @ta.function_tool
    async def book(ctx: ta.ToolContext) -> str:
        """Book a seat, once a person picked one."""
        decision = await ctx.request_approval("Which seat on flight 42?", schema=SEAT_FORM)
        return f"booked {decision.content}" if decision.approved else "not booked"

    model = GatedModel([[Call("book", {})], [tool_outputs]], gates)
    return {"booker": Agent(name="booker", model=model, tools=[book])}


@pytest.fixture(scope="module")
def server() -> Iterator[UiServer]:
    with running_ui_server(_agents) as served:
        yield served


def test_a_question_is_shown_and_its_form_is_the_content(page: Page, server: UiServer) -> None:
    sign_in(page, server)
    run_id = start_from_page(page, "booker", "Book me a seat")
    root = page.locator(".tree > .node")
    question = root.locator(".approval.question")
    expect(question.locator(".question-message")).to_have_text("Which seat on flight 42?")
    expect(question).to_contain_text("Question from book:")
    # One field per property, prefilled with its default; the required one marked.
    form = question.locator(".question-form")
    expect(form.locator("label.field")).to_have_count(4)
    expect(form.locator('label[data-field="seat"] .field-name')).to_have_text("Seat *")
    expect(form.locator('input[name="note"]')).to_have_value("none")
    expect(form.locator('input[name="priority"]')).not_to_be_checked()
    # The asking call shows as waiting too.
    expect(root.locator(".tool[data-call] .status")).to_have_text("awaiting approval")

    # The required seat left empty: the server refuses the content, nothing decided.
    question.locator(".approve").click()
    error = root.locator(":scope > .action-error")
    expect(error).to_contain_text("approve: content does not match")
    expect(error).to_contain_text("seat")
    assert server.get(ALICE, run_id)["status"] == "awaiting_approval"

    form.locator('select[name="seat"]').select_option(label="window")
    form.locator('input[name="bags"]').fill("2")
    form.locator('input[name="priority"]').check()
    shot(page, "ui-question.png", server)
    question.locator(".approve").click()
    expect(question).to_have_count(0)
    expect(root.locator(".msg.assistant").last).to_have_text(
        "booked {'seat': 'window', 'bags': 2, 'priority': True, 'note': 'none'}"
    )
