"""The web UI's "Fork from here" (DESIGN §23), in a real headless Chromium (Debian's,
driven by Playwright) against a real HTTP face over a LocalHost: a button on an item of
a run that has a session forks the session there (``POST /sessions/{id}/fork`` at the
item's event) and starts a run on the fork with the new input, which the page opens.

The agent answers with every user message it was sent, so what the forked run's model
saw is on the page. The browser is waited for with Playwright's ``expect``, never with
sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.ui_browser import TIMEOUT_MS, browser
from tests.support.ui_support import (
    ALICE,
    GatedModel,
    Gates,
    UiServer,
    running_ui_server,
    saw_user_messages,
)
from trio_agents import Agent

# The rig's browser fixture (one per module), used by name.
__all__ = ["browser"]


def _agents(gates: Gates) -> dict[str, Agent]:
    return {"echo": Agent(name="echo", model=GatedModel([[saw_user_messages]], gates))}


@pytest.fixture(scope="module")
def server() -> Iterator[UiServer]:
    with running_ui_server(_agents) as server:
        yield server


@pytest.fixture
def page(browser: Browser, server: UiServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 820})
    context.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        yield page
        assert errors == []
    finally:
        context.close()


def test_fork_from_an_item_and_run_on_the_fork(page: Page, server: UiServer) -> None:
    page.goto(server.url + "/ui/")
    page.fill("#token", ALICE)
    page.click("#signin-form button")
    expect(page.locator('#start-agent option[value="echo"]')).to_have_count(1)
    page.fill("#start-input", "first question")
    page.fill("#start-session", "trip")
    page.click("#start-button")
    root = page.locator(".tree > .node")
    expect(root.locator(".msg.assistant")).to_have_text("saw: first question")
    expect(root.locator(":scope > .node-head .status")).to_have_text("completed")
    first = root.get_attribute("data-run")
    # The item's text is its own (the button's label is drawn by the stylesheet).
    user = root.locator(".msg.user")
    expect(user).to_have_text("first question")
    user.get_by_role("button", name="Fork from here").click()
    panel = root.locator(".fork-panel")
    expect(panel).to_be_visible()
    expect(panel.locator(".fork-where")).to_have_text("Fork after: first question")
    panel.locator(".fork-text").fill("second question")
    panel.get_by_role("button", name="Fork & run").click()
    # The page opens the run on the fork: its model saw the kept question and the new
    # one, not the first answer (the fork ends at the item the button was on).
    forked = page.locator(".tree > .node")
    expect(forked).not_to_have_attribute("data-run", first or "")
    expect(forked.locator(".msg.assistant")).to_have_text("saw: first question | second question")
    expect(forked.locator(":scope > .node-head .session")).to_contain_text("session trip-fork-")
    run_id = forked.get_attribute("data-run")
    assert run_id
    info = server.get(ALICE, run_id)
    assert info["session_id"].startswith("trip-fork-")
