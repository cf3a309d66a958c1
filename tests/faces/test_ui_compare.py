"""The web UI's comparison of two runs and replay of a recorded model call (DESIGN §23),
in a real headless Chromium (Debian's, driven by Playwright) against a real HTTP face
over a LocalHost whose runs record their requests (``record_requests=True``).

- **Compare…** shows two runs' conversations in two aligned columns: the common prefix
  marked the same, the first differing item and everything after it highlighted. A
  run on a fork starts with the history its first recorded request sent.
- **Model calls** lists a run's recorded requests, each with what the model answered
  and a **Replay** on a served agent's model (``POST /runs/{id}/replay``), whose answer
  is shown beside the original.

The browser is waited for with Playwright's ``expect``, never with sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.ui_browser import TIMEOUT_MS, browser, shot
from tests.support.ui_support import (
    ALICE,
    Call,
    GatedModel,
    Gates,
    UiServer,
    running_ui_server,
    saw_user_messages,
)
from trio_agents import Agent
from trio_agents.control import Limits
from trio_agents.models import ScriptedModel, Turn, Usage

# The rig's browser fixture (one per module), used by name.
__all__ = ["browser"]


def _agents(gates: Gates) -> dict[str, Agent]:
    return {
        "echo": Agent(
            name="echo", instructions="Echo.", model=GatedModel([[saw_user_messages]], gates)
        ),
        # A tree: a root whose sub-agent's model call is replayed from the timeline.
        "boss": Agent(
            name="boss",
            model=GatedModel([[Call("helper", {"input": "dig"})], ["done"]], gates),
            tools=[
                Agent(
                    name="helper",
                    model=ScriptedModel([], default=Turn("helped", usage=Usage(3, 1))),
                ).as_tool(name="helper")
            ],
        ),
        # What a replay may be sent to instead: another served agent's model.
        "critic": Agent(
            name="critic",
            model=ScriptedModel([], default=Turn("A second opinion.", usage=Usage(12, 4))),
        ),
    }


def _recording_host(
    agents: Mapping[str, Agent], limits: Limits
) -> AbstractAsyncContextManager[Any]:
    from trio_agents.hosting import LocalHost

    return LocalHost(agents, limits=limits, run_options={"record_requests": True}).running()


@pytest.fixture(scope="module")
def server() -> Iterator[UiServer]:
    with running_ui_server(_agents, host=_recording_host) as server:
        yield server


@pytest.fixture
def page(browser: Browser, server: UiServer) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 820})
    context.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    requested: list[str] = []
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("request", lambda request: requested.append(request.url))
    try:
        yield page
        assert errors == []
        # Never a token in a URL, never another host.
        assert all(ALICE not in url and url.startswith(server.url) for url in requested)
    finally:
        context.close()


def _sign_in(page: Page, server: UiServer) -> None:
    page.goto(server.url + "/ui/")
    page.fill("#token", ALICE)
    page.click("#signin-form button")
    expect(page.locator('#start-agent option[value="echo"]')).to_have_count(1)


def _open(page: Page, server: UiServer, run_id: str) -> None:
    page.goto(f"{server.url}/ui/#/runs/{run_id}")
    expect(page.locator(f'.tree > .node[data-run="{run_id}"]')).to_have_count(1)
    expect(page.locator(".tree > .node > .node-head .status")).to_have_text("completed")


def test_compare_a_run_with_the_run_on_its_fork(page: Page, server: UiServer) -> None:
    _sign_in(page, server)
    page.select_option("#start-agent", "echo")
    page.fill("#start-input", "first question")
    page.fill("#start-session", "trip")
    page.click("#start-button")
    root = page.locator(".tree > .node")
    expect(root.locator(".msg.assistant")).to_have_text("saw: first question")
    original = root.get_attribute("data-run")
    assert original
    # Fork after the question, with another one: the page opens the run on the fork.
    root.locator(".msg.user").get_by_role("button", name="Fork from here").click()
    root.locator(".fork-panel .fork-text").fill("second question")
    root.locator(".fork-panel").get_by_role("button", name="Fork & run").click()
    forked = page.locator(".tree > .node")
    expect(forked).not_to_have_attribute("data-run", original)
    expect(forked.locator(".msg.assistant")).to_have_text("saw: first question | second question")
    page.click(".run-head .compare-toggle")
    panel = page.locator(".compare")
    expect(panel.locator(f'.compare-other option[value="{original}"]')).to_have_count(1)
    panel.locator(".compare-other").select_option(original)
    panel.get_by_role("button", name="Compare").click()
    rows = panel.locator(".diff-row")
    expect(rows).to_have_count(3)
    # The fork's first request sent the kept question: the same as the original's.
    expect(panel.locator(".diff-summary")).to_have_text(
        "The same for the first 1 item; they differ from item 2 on."
    )
    expect(rows.nth(0)).to_have_class("diff-row same")
    expect(rows.nth(0).locator(".diff-text")).to_have_text(["first question", "first question"])
    expect(rows.nth(0).locator(".diff-kind").first).to_have_text("user · history")
    expect(rows.nth(1)).to_have_class("diff-row differs first-difference")
    expect(rows.nth(1).locator(".diff-text")).to_have_text(
        ["second question", "saw: first question"]
    )
    expect(rows.nth(2)).to_have_class("diff-row differs")
    expect(rows.nth(2).locator(".diff-text")).to_have_text("saw: first question | second question")
    expect(rows.nth(2).locator(".diff-cell.missing")).to_have_count(1)
    shot(page, "ui-compare.png")


def test_compare_two_runs_that_said_the_same(page: Page, server: UiServer) -> None:
    first = server.start(ALICE, "echo", "same words")
    second = server.start(ALICE, "echo", "same words")
    _sign_in(page, server)
    _open(page, server, second)
    page.click(".run-head .compare-toggle")
    panel = page.locator(".compare")
    panel.locator(".compare-other").select_option(first)
    panel.get_by_role("button", name="Compare").click()
    expect(panel.locator(".diff-summary")).to_have_text("The same 2 items.")
    expect(panel.locator(".diff-row.same")).to_have_count(2)
    expect(panel.locator(".diff-row.differs")).to_have_count(0)
    # Toggling closes the panel.
    page.click(".run-head .compare-toggle")
    expect(page.locator(".compare")).to_have_count(0)


def test_replay_a_recorded_model_call_on_a_chosen_agents_model(
    page: Page, server: UiServer
) -> None:
    run_id = server.start(ALICE, "echo", "hello there")
    _sign_in(page, server)
    _open(page, server, run_id)
    page.click(".run-head .calls-toggle")
    panel = page.locator(".model-calls")
    call = panel.locator(".call-row")
    expect(call).to_have_count(1)
    expect(call.locator(".call-turn")).to_have_text("turn 1")
    original = call.locator(".call-original")
    expect(original.locator(".call-text")).to_have_text("saw: hello there")
    expect(original.locator(".call-usage")).to_have_text("15 tokens")
    # Another served agent's model: its answer beside the original.
    expect(call.locator(".call-agent option")).to_have_text(["boss", "critic", "echo"])
    expect(call.locator(".call-agent")).to_have_value("echo")  # the run's own, first
    call.locator(".call-agent").select_option("critic")
    call.get_by_role("button", name="Replay").click()
    replayed = call.locator(".call-replay-answer")
    expect(replayed.locator(".call-text")).to_have_text("A second opinion.")
    expect(replayed.locator(".call-answer-title")).to_have_text(
        "replayed on critic (ScriptedModel)"
    )
    expect(replayed.locator(".call-usage")).to_have_text("16 tokens")
    shot(page, "ui-replay.png")
    # The same request on the model that answered it: the same answer again.
    call.locator(".call-agent").select_option("echo")
    call.get_by_role("button", name="Replay").click()
    expect(replayed.locator(".call-text")).to_have_text("saw: hello there")
    page.click(".run-head .calls-toggle")
    expect(page.locator(".model-calls")).to_have_count(0)


def test_the_timeline_opens_the_replay_of_a_model_call(page: Page, server: UiServer) -> None:
    run_id = server.start(ALICE, "echo", "from the timeline")
    _sign_in(page, server)
    _open(page, server, run_id)
    page.click(".run-head .timeline-toggle")
    model_row = page.locator('.tl-row[data-kind="model"]')
    expect(model_row).to_have_count(1)
    model_row.get_by_role("button", name="replay…").click()
    call = page.locator(".model-calls .call-row.picked")
    expect(call).to_have_count(1)
    expect(call).to_have_attribute("data-turn", "1")
    call.locator(".call-agent").select_option("critic")
    call.get_by_role("button", name="Replay").click()
    expect(call.locator(".call-replay-answer .call-text")).to_have_text("A second opinion.")
    # The timeline stays open beside it.
    expect(page.locator(".timeline")).to_have_count(1)


def test_the_timeline_replays_a_sub_agents_model_call(page: Page, server: UiServer) -> None:
    run_id = server.start(ALICE, "boss", "delegate")
    _sign_in(page, server)
    _open(page, server, run_id)
    child = server.get(ALICE, run_id)["children"][0]
    page.click(".run-head .timeline-toggle")
    child_call = page.locator('.tl-row[data-kind="model"][data-name="ScriptedModel"]')
    expect(child_call).to_have_count(1)
    child_call.get_by_role("button", name="replay…").click()
    panel = page.locator(".model-calls")
    # The sub-agent's own recorded call, replayed on its run.
    expect(panel.locator(".calls-run")).to_have_text(child)
    call = panel.locator(".call-row.picked")
    expect(call.locator(".call-original .call-text")).to_have_text("helped")
    call.locator(".call-agent").select_option("critic")
    call.get_by_role("button", name="Replay").click()
    expect(call.locator(".call-replay-answer .call-text")).to_have_text("A second opinion.")
