"""The web UI at /ui, in a real headless Chromium (Debian's, driven by Playwright).

One server (a real HTTP face over a LocalHost, in its own thread) and one browser serve
the whole module; each test gets a fresh browser context (its own sessionStorage). The
agents' streams wait at named gates the test opens, so every state a test looks at —
mid-stream, waiting for approval, one branch cancelled while the root runs — holds
until the test moves on; the browser is waited for with Playwright's ``expect`` (which
polls the page), never with sleeps.

The screenshots in docs/images/ are written by these tests, so docs/ui.md shows what the
page really looks like.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import httpx
from playwright.sync_api import Browser, Page, Request, expect

from tests.support.cli_support import ROOT, cli_argv, cli_env
from tests.support.ui_browser import (
    OVER_EVERY_HOST,
    Watched,
    browser,
    head,
    node,
    page,
    server,
    shot,
    sign_in,
    start_from_page,
    watched,
)
from tests.support.ui_support import ALICE, BOB, ESSAY, UiServer

# The rig's fixtures, used by name by the tests below.
__all__ = ["browser", "page", "server", "watched"]


def test_the_page_loads_and_runs_without_a_console_error(
    watched: Watched, server: UiServer
) -> None:
    """Loading the page, signing in and following a run logs no error in the console
    (a browser asks for /favicon.ico unless the page names an icon: behind the auth
    layer that was a 401, logged on every load)."""
    page = watched.page
    sign_in(page, server)
    start_from_page(page, "quick", "hello?")
    expect(head(node(page, "quick"), ".status")).to_have_text("completed")
    page.reload()
    expect(page.locator("#app")).to_be_visible()
    assert watched.console_errors == []
    assert not [r.url for r in watched.requests if r.url.endswith("/favicon.ico")]


@OVER_EVERY_HOST
def test_start_a_run_from_the_page_and_see_its_text_stream_in(page: Page, server: UiServer) -> None:
    sign_in(page, server)
    run_id = start_from_page(page, "writer", "Tell me a story")
    root = page.locator(".tree > .node")
    text = root.locator(".msg.assistant")
    # mid-stream: the first words are on the page while the model still streams
    expect(text).to_have_text("Once upon a time")
    expect(head(root, ".status")).to_have_text("running")
    expect(root.locator(".msg.user")).to_have_text("Tell me a story")
    expect(page.locator(f'#runs tr[data-run="{run_id}"]')).to_have_count(1)
    shot(page, "ui-streaming.png", server)
    server.open_gate("write")
    expect(text).to_have_text("Once upon a time, a run streamed to the end.")
    expect(head(root, ".status")).to_have_text("completed")
    expect(page.locator(f'#runs tr[data-run="{run_id}"] .status')).to_have_text("completed")


@OVER_EVERY_HOST
def test_cancel_one_branch_of_a_fan_out_and_the_root_goes_on(page: Page, server: UiServer) -> None:
    sign_in(page, server)
    start_from_page(page, "lead", "Research structured concurrency")
    root = page.locator(".tree > .node")
    branch_a, branch_b = node(page, "branch_a"), node(page, "branch_b")
    expect(branch_a.locator(".msg.assistant")).to_have_text("Reading the archive")
    expect(branch_b.locator(".msg.assistant")).to_have_text("Reading sources")
    head(branch_a, ".cancel-open").click()
    branch_a.locator(":scope > .cancel-panel .cancel-reason").fill("not needed")
    branch_a.locator(":scope > .cancel-panel .cancel-confirm").click()
    expect(head(branch_a, ".status")).to_have_text("cancelled")
    expect(head(branch_a, ".reason")).to_have_text("not needed")
    # the root and the other branch go on
    expect(root.locator(":scope > .transcript .tool[data-call] .out").first).to_contain_text(
        "sub-agent branch_a cancelled: not needed"
    )
    expect(head(root, ".status")).to_have_text("running")
    expect(head(branch_b, ".status")).to_have_text("running")
    shot(page, "ui-fanout-cancel.png", server)
    server.open_gate("fanout_b")
    expect(head(branch_b, ".status")).to_have_text("completed")
    expect(head(root, ".status")).to_have_text("completed")
    expect(root.locator(":scope > .transcript .msg.assistant").last).to_contain_text(
        "sub-agent branch_a cancelled: not needed"
    )


@OVER_EVERY_HOST
def test_approve_a_waiting_call(page: Page, server: UiServer) -> None:
    sign_in(page, server)
    start_from_page(page, "careful", "Clean up my notes")
    root = page.locator(".tree > .node")
    approval = root.locator(".approval")
    expect(approval).to_contain_text('delete_file({"path": "notes.txt"})')
    expect(head(root, ".status")).to_have_text("awaiting_approval")
    shot(page, "ui-approval.png", server)
    approval.locator(".approve").click()
    expect(approval).to_have_count(0)
    expect(root.locator(".tool[data-call] .out")).to_have_text("→ deleted notes.txt")
    expect(root.locator(".msg.assistant").last).to_have_text("Deleted notes.txt.")
    expect(head(root, ".status")).to_have_text("completed")


@OVER_EVERY_HOST
def test_inject_a_message_and_the_next_turn_uses_it(page: Page, server: UiServer) -> None:
    sign_in(page, server)
    start_from_page(page, "chatty", "Write about birds")
    root = page.locator(".tree > .node")
    expect(root.locator(".msg.assistant").first).to_have_text("Working on it")
    head(root, ".inject-open").click()
    root.locator(":scope > .inject-panel .inject-text").fill("Also mention penguins")
    root.locator(":scope > .inject-panel .inject-when").select_option("next_turn")
    root.locator(":scope > .inject-panel .inject-send").click()
    note = root.locator(".msg.note[data-injection]")
    expect(note).to_contain_text("injected (next_turn): Also mention penguins")
    server.open_gate("inject")
    expect(root.locator(".msg.assistant").last).to_have_text("You asked: Also mention penguins")
    expect(note).to_contain_text("delivered")
    expect(head(root, ".status")).to_have_text("completed")
    shot(page, "ui-inject.png")


def test_usage_against_the_limits_set_and_a_handoff(page: Page, server: UiServer) -> None:
    sign_in(page, server)
    page.click("#start-form summary")
    page.fill("#limit-requests", "5")
    page.fill("#limit-total_tokens", "1000")
    start_from_page(page, "triage", "My printer is on fire")
    root = page.locator(".tree > .node")
    expect(head(root, ".status")).to_have_text("completed")
    # the same run, now the specialist's: the handoff is marked where it happened
    expect(head(root, ".agent")).to_have_text("specialist")
    expect(root.locator(".msg.handoff")).to_have_text("handoff: triage → specialist")
    expect(root.locator(".msg.assistant").last).to_have_text("Specialist here: all sorted.")
    expect(root.locator('.limit[data-limit="requests"]')).to_have_text("requests  2 / 5")
    expect(root.locator('.limit[data-limit="total_tokens"]')).to_have_text(
        "total_tokens  30 / 1000"
    )
    shot(page, "ui-limits-handoff.png")


def test_each_node_shows_its_tokens_and_cost_and_the_root_the_trees_exact_total(
    watched: Watched, server: UiServer
) -> None:
    """Once terminal, every node shows its own usage from its record; the root adds the
    tree's total, summed exactly (as decimals, never floats); a reload shows the same
    without asking the server again."""
    page = watched.page
    sign_in(page, server)
    run_id = start_from_page(page, "priced", "Answer in two parts")
    root = page.locator(".tree > .node")
    expect(head(root, ".status")).to_have_text("completed")
    # the root's own: two calls of 150 tokens at 0.00012 USD each
    expect(head(root, ".usage")).to_have_text("300 tokens · $0.00024")
    expect(head(node(page, "pricey_a"), ".usage")).to_have_text("50 tokens · $0.0000333")
    expect(head(node(page, "pricey_b"), ".usage")).to_have_text("7 tokens · $0.0000007")
    # 0.00024 + 0.0000333 + 0.0000007 is 0.00027400000000000005 in floats
    expect(head(root, ".tree-usage")).to_have_text("tree: 357 tokens · $0.000274")
    expect(head(node(page, "pricey_a"), ".tree-usage")).to_have_text("")
    # the records the page read say the same, exactly
    record = server.get(ALICE, run_id)
    assert record["usage"]["cost"] == "0.00024"
    shot(page, "ui-cost.png")
    watched.requests.clear()
    page.reload()
    expect(head(root, ".tree-usage")).to_have_text("tree: 357 tokens · $0.000274")
    expect(head(node(page, "pricey_b"), ".usage")).to_have_text("7 tokens · $0.0000007")
    asked = [r.url for r in watched.requests if "/runs/" in r.url and "/events" not in r.url]
    assert asked == [f"{server.url}/runs/{run_id}"]  # the root's agent and session only


def test_a_run_waiting_for_its_rate_limit_shows_throttled_until_its_request_goes_out(
    page: Page, server: UiServer
) -> None:
    """A ``running`` update with ``detail={"throttled": "rate limit"}`` marks the node;
    the next one without it (the request went out) clears the mark."""
    hog = server.start(ALICE, "hog", "hold the slot")
    assert server.get(ALICE, hog)["status"] == "running"
    sign_in(page, server)
    metered = start_from_page(page, "metered", "wait your turn")
    root = page.locator(".tree > .node")
    expect(head(root, ".throttled")).to_have_text("throttled: rate limit")
    expect(root).to_have_attribute("data-throttled", "rate limit")
    expect(head(root, ".status")).to_have_text("running")
    assert server.get(ALICE, metered)["detail"] == {"throttled": "rate limit"}
    shot(page, "ui-throttled.png")
    server.cancel(ALICE, hog)  # its slot is free: the metered request goes out
    expect(head(root, ".throttled")).to_have_text("")
    expect(root).not_to_have_attribute("data-throttled", re.compile(".*"))
    expect(head(root, ".status")).to_have_text("running")
    assert "throttled" not in server.get(ALICE, metered)["detail"]
    server.cancel(ALICE, metered)
    expect(head(root, ".status")).to_have_text("cancelled")
    expect(head(root, ".throttled")).to_be_hidden()


def test_a_node_names_the_model_that_answered_it(page: Page, server: UiServer) -> None:
    """The primary of a FallbackModel is overloaded, its backup answers: the node shows
    the backup's name beside its tokens and cost (its record's ``usage.model``)."""
    sign_in(page, server)
    run_id = start_from_page(page, "fallback", "Who answers?")
    root = page.locator(".tree > .node")
    expect(head(root, ".status")).to_have_text("completed")
    expect(head(root, ".usage")).to_have_text("69 tokens · $0.00005 · backup-model")
    assert server.get(ALICE, run_id)["usage"]["model"] == "backup-model"


def test_a_long_answer_stays_whole_and_in_order(page: Page, server: UiServer) -> None:
    """Past 4 KiB the page sets streamed text into blocks that never change again (so
    layout per frame stays small): the text shown is still exactly the answer."""
    run_id = server.start(ALICE, "essay", "write a lot")
    sign_in(page, server)
    page.goto(f"{server.url}/ui/#/runs/{run_id}")
    root = page.locator(".tree > .node")
    answer = root.locator(".msg.assistant")
    # Shown live first (held at 2.8 KB by the gate), so the rest streams in as appends.
    expect(answer).to_contain_text("line 100 of a long answer")
    assert answer.locator(".sealed").count() == 0
    server.open_gate("essay")
    expect(head(root, ".status")).to_have_text("completed")
    # One seal per frame past 4 KiB: at least one block, however many frames it took.
    assert answer.locator(".sealed").count() >= 1
    assert answer.inner_text().rstrip("\n") == "".join(ESSAY).rstrip("\n")


def test_reload_mid_run_sees_no_event_twice_or_missing(watched: Watched, server: UiServer) -> None:
    page = watched.page
    run_id = server.start(ALICE, "long", "count")
    sign_in(page, server)
    page.goto(f"{server.url}/ui/#/runs/{run_id}")
    text = page.locator(".tree > .node .msg.assistant")
    first_half = "".join(f"w{i:02d} " for i in range(1, 21))
    expect(text).to_have_text(first_half)
    before = page.evaluate("window.trioAgentsUI.stats()")
    assert before["duplicates"] == 0
    assert before["gaps"] == 0
    watched.requests.clear()
    page.reload()
    # the view came back from the tab's storage, and the stream re-attached after it
    expect(text).to_have_text(first_half)
    expect(page.locator("#conn")).to_have_text("live")
    attaches = [r for r in watched.requests if "/events" in r.url]
    assert attaches, "the page did not re-attach"
    assert attaches[0].headers.get("last-event-id"), "re-attached without Last-Event-ID"
    server.open_gate("reload")
    expect(text).to_have_text("".join(f"w{i:02d} " for i in range(1, 41)))
    expect(page.locator(".tree > .node > .node-head .status")).to_have_text("completed")
    after = page.evaluate("window.trioAgentsUI.stats()")
    seqs = page.evaluate("window.trioAgentsUI.seqs()")
    assert after["duplicates"] == 0
    assert after["gaps"] == 0
    # every event of the run was applied exactly once, across the reload
    final = server.get(ALICE, run_id)
    assert seqs == {run_id: final["seq"]}
    assert after["events"] == final["seq"]
    assert after["attaches"] == before["attaches"] + 1


def test_a_wrong_token_sees_nothing(watched: Watched, server: UiServer) -> None:
    page = watched.page
    server.start(ALICE, "quick", "something to see")
    page.goto(server.url + "/ui/")
    page.fill("#token", "not-a-token")
    page.click("#signin-form button")
    expect(page.locator("#signin-error")).to_contain_text("refused")
    expect(page.locator("#app")).to_be_hidden()
    expect(page.locator("#runs tbody tr")).to_have_count(0)
    assert page.evaluate("sessionStorage.length") == 0
    shot(page, "ui-signin-refused.png")
    for request in watched.requests:
        assert "not-a-token" not in request.url


def test_another_principals_runs_never_appear(page: Page, server: UiServer) -> None:
    bobs = server.start(BOB, "quick", "bob's secret")
    alices = server.start(ALICE, "quick", "alice's own")
    sign_in(page, server)
    expect(page.locator(f'#runs tr[data-run="{alices}"]')).to_have_count(1)
    expect(page.locator(f'#runs tr[data-run="{bobs}"]')).to_have_count(0)
    page.goto(f"{server.url}/ui/#/runs/{bobs}")
    expect(page.locator(".run-error")).to_contain_text(f"no run '{bobs}'")
    expect(page.locator(".tree .node")).to_have_count(0)
    assert "bob's secret" not in page.content()
    # and the API agrees: alice's list has no trace of bob's run
    with httpx.Client(base_url=server.url) as client:
        listed = client.get("/runs", headers={"Authorization": f"Bearer {ALICE}"}).json()
    assert bobs not in str(listed)


def test_trio_agents_serve_prints_the_ui_url_and_the_demo_runs_in_it(
    browser: Browser, tmp_path: Path
) -> None:
    """``trio-agents serve`` (the demo agent on the offline DemoModel) prints the web
    UI's URL; the page there signs in, starts a demo run and shows it to the end."""
    process = subprocess.Popen(
        cli_argv("serve", "--port", "0", "--db", tmp_path / "s.db", "--token", "demo-tok-1"),
        env=cli_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines: list[str] = []  # up to "serving ...", which says all is up
        while not lines or not lines[-1].startswith("serving "):
            line = process.stdout.readline()
            assert line, f"serve exited: {lines}"
            lines.append(line)
        (shown,) = [line for line in lines if line.startswith("web UI: ")]
        url = shown.split()[2]
        assert url.startswith("http://127.0.0.1:")
        assert url.endswith("/ui/")
        assert "demo-tok-1" not in "".join(lines)
        context = browser.new_context()
        try:
            page = context.new_page()
            page.goto(url)
            page.fill("#token", "demo-tok-1")
            page.click("#signin-form button")
            expect(page.locator("#start-agent")).to_have_value("demo")
            page.fill("#start-input", "What is 2 + 3?")
            page.click("#start-button")
            root = page.locator(".tree > .node")
            expect(head(root, ".status")).to_have_text("completed")
            expect(root.locator(".msg.assistant").last).not_to_be_empty()
        finally:
            context.close()
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert "server stopped" in out


def test_a_dropped_connection_reattaches_from_the_last_event(
    browser: Browser, server: UiServer
) -> None:
    # this page goes through the proxy, whose connections the test cuts
    context = browser.new_context()
    try:
        page = context.new_page()
        run_id = server.start(ALICE, "long_drop", "count")
        page.goto(server.proxy_url + "/ui/")
        page.fill("#token", ALICE)
        page.click("#signin-form button")
        page.goto(f"{server.proxy_url}/ui/#/runs/{run_id}")
        text = page.locator(".tree > .node .msg.assistant")
        expect(text).to_have_text("".join(f"w{i:02d} " for i in range(1, 21)))
        expect(page.locator("#conn")).to_have_text("live")
        last = page.evaluate("window.trioAgentsUI.stats()")["lastId"]
        requests: list[Request] = []
        page.on("request", lambda request: requests.append(request))
        server.sever()
        page.wait_for_function("() => window.trioAgentsUI.stats().attaches === 2")  # re-attached
        (again,) = [r for r in requests if "/events" in r.url]
        assert again.headers["last-event-id"] == last  # the id of the last event it got
        server.open_gate("drop")
        expect(text).to_have_text("".join(f"w{i:02d} " for i in range(1, 41)))
        expect(page.locator(".tree > .node > .node-head .status")).to_have_text("completed")
        stats = page.evaluate("window.trioAgentsUI.stats()")
        assert (stats["duplicates"], stats["gaps"]) == (0, 0)
        assert stats["attaches"] == 2
        assert stats["events"] == server.get(ALICE, run_id)["seq"]
    finally:
        context.close()
