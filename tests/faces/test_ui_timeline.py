"""The web UI's timeline view (DESIGN §23), in a real headless Chromium: a Gantt-like chart
of a run tree — every run, model call and tool call, with its status, duration, tokens
and cost — read from ``GET /runs/{id}/timeline`` while the tree is live and once it ends.
The fixtures and helpers are tests/support/ui_browser.py's (one server and one browser
per module)."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from tests.support.ui_browser import browser, head, page, server, shot, sign_in, watched
from tests.support.ui_support import ALICE, UiServer

# The rig's fixtures (one server and one browser for this module too), used by name.
__all__ = ["browser", "page", "server", "watched"]


def _open_timeline(page: Page, server: UiServer, run_id: str) -> None:
    sign_in(page, server)
    page.goto(f"{server.url}/ui/#/runs/{run_id}")
    expect(page.locator(".tree > .node")).to_have_count(1)
    page.click(".run-head .timeline-toggle")
    expect(page.locator(".timeline .tl-row").first).to_be_visible()


def test_the_timeline_of_a_live_tree_then_of_the_finished_one(page: Page, server: UiServer) -> None:
    run_id = server.start(ALICE, "timed", "Find out about trio")
    _open_timeline(page, server, run_id)
    rows = page.locator(".timeline .tl-row")
    child_call = page.locator('.tl-row[data-kind="model"].open')
    # Live: the sub-agent's model call streams (its gate is shut), open in the chart.
    expect(child_call).to_have_count(1)
    expect(page.locator('.tl-row[data-kind="run"][data-name="timed_child"]')).to_have_class(
        "tl-row tl-run open"
    )
    expect(page.locator('.tl-row[data-kind="tool"][data-name="lookup"] .tl-status')).to_have_text(
        "ok"
    )
    server.open_gate("timed")
    # The chart reads the tree again until its root is terminal: every span closed.
    root = page.locator('.tl-row[data-kind="run"][data-name="timed"]')
    expect(root.locator(".tl-status")).to_have_text("completed")
    expect(page.locator(".timeline .tl-row.open")).to_have_count(0)
    # In tree order: the root; its first call; its tool calls, the sub-agent (and its
    # call) under the call it runs in; its second call.
    expect(rows).to_have_count(7)
    kinds = [(row.get_attribute("data-kind"), row.get_attribute("data-name")) for row in rows.all()]
    assert kinds[0] == ("run", "timed")
    assert kinds[1] == ("model", "ScriptedModel")
    assert kinds[-1] == ("model", "ScriptedModel")
    assert set(kinds[2:6]) == {
        ("tool", "timed_child"),
        ("run", "timed_child"),
        ("model", "GatedModel"),
        ("tool", "lookup"),
    }
    assert kinds.index(("run", "timed_child")) == kinds.index(("tool", "timed_child")) + 1
    # Tokens and cost per node: the root's two priced calls; the sub-agent's unpriced one.
    expect(root.locator(".tl-usage")).to_have_text("300 tokens · $0.00024")
    expect(
        page.locator('.tl-row[data-kind="run"][data-name="timed_child"] .tl-usage')
    ).to_have_text("15 tokens")
    expect(page.locator(".tl-head .tl-usage")).to_have_text("tree: 315 tokens · $0.00024")
    # The numbers are the server's timeline, shown as they are.
    assert server.get(ALICE, run_id)["status"] == "completed"
    shot(page, "ui-timeline.png")


def test_a_cancelled_tree_shows_every_span_closed(page: Page, server: UiServer) -> None:
    # "lead" fans out to two branches: one never ends, the other waits at its gate.
    run_id = server.start(ALICE, "lead", "Research, then cancel")
    _open_timeline(page, server, run_id)
    expect(page.locator('.tl-row[data-kind="run"].open')).to_have_count(3)
    root = page.locator(".tree > .node")
    head(root, ".cancel-open").click()
    root.locator(":scope > .cancel-panel .cancel-confirm").click()
    expect(head(root, ".status")).to_have_text("cancelled")
    expect(page.locator(".timeline .tl-row.open")).to_have_count(0)
    runs = page.locator('.tl-row[data-kind="run"] .tl-status')
    expect(runs).to_have_text(["cancelled", "cancelled", "cancelled"])
    branches = page.locator('.tl-row[data-kind="tool"] .tl-status')
    expect(branches).to_have_text(["cancelled", "cancelled"])
    # Toggling closes the chart.
    page.click(".run-head .timeline-toggle")
    expect(page.locator(".timeline")).to_have_count(0)
