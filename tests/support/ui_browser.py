"""The web UI's browser rig (Debian's Chromium driven by Playwright): the server,
browser and page fixtures and the page helpers that the UI's test modules share.

Importing this module skips the importing test module when there is no Chromium (an
error under CI, where .ci/chromium.sh installs it). Test modules import the fixtures
by name (pytest finds fixtures in a module's namespace).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.support.ui_support import (
    ALICE,
    BOB,
    CHROMIUM,
    CHROMIUM_ARGS,
    UiServer,
    chromium_available,
    running_ui_server,
)
from trio_agents.control import Limits

if not chromium_available():
    if os.environ.get("CI"):
        raise RuntimeError(
            "the web UI's browser tests need Debian's chromium; .ci/chromium.sh installs it"
        )
    pytest.skip(
        "no /usr/bin/chromium: `make chromium` (apt-get install chromium) to run the"
        " web UI's browser tests",
        allow_module_level=True,
    )

from playwright.sync_api import Browser, ConsoleMessage, Page, Request, expect, sync_playwright

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
TIMEOUT_MS = 15_000
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest) -> Iterator[UiServer]:
    """The UI's server over a LocalHost; with ``indirect`` parametrization
    (:data:`OVER_EVERY_HOST`) also over a TemporalHost on a real dev server, its runs
    run by a worker embedded in the server's Trio program (the gates live in that loop)."""
    if getattr(request, "param", "local") == "temporal":
        target = request.getfixturevalue("temporal_server")
        tmp = request.getfixturevalue("tmp_path_factory").mktemp("ui-temporal")
        with running_ui_server(host=_over_temporal(target, tmp / "sessions.sqlite3")) as served:
            served.host = "temporal"
            yield served
        return
    with running_ui_server() as served:
        yield served


def _over_temporal(target: str, db: Path) -> Any:
    from tests.support.temporal_support import embedded_temporal_host

    def serve(agents: Mapping[str, Any], limits: Limits) -> AbstractAsyncContextManager[Any]:
        return embedded_temporal_host(target, db, agents, limits)

    return serve


# The UI's main scenarios run over every kind of host (issue 38: every face over the
# TemporalHost): a face never knows which host it talks to.
OVER_EVERY_HOST = pytest.mark.parametrize("server", ["local", "temporal"], indirect=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            browser.close()


class Watched:
    """A page and every request it made (to check no token ever travels in a URL)."""

    def __init__(self, page: Page) -> None:
        self.page = page
        self.requests: list[Request] = []
        self.console_errors: list[str] = []
        page.on("request", self._seen)
        page.on("console", self._logged)
        page.on("pageerror", lambda error: self.console_errors.append(f"pageerror: {error}"))

    def _seen(self, request: Request) -> None:
        self.requests.append(request)

    def _logged(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.console_errors.append(f"{message.text} ({message.location})")


@pytest.fixture
def watched(browser: Browser, server: UiServer) -> Iterator[Watched]:
    context = browser.new_context(viewport={"width": 1280, "height": 820})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    watched = Watched(page)
    try:
        yield watched
        # Wherever the test went: the token was never in a URL, never in localStorage,
        # never in a cookie; other hosts were never asked for anything.
        for request in watched.requests:
            for token in (ALICE, BOB):
                assert token not in request.url
            assert request.url.startswith(server.url), request.url
        assert page.evaluate("localStorage.length") == 0
        assert context.cookies() == []
    finally:
        context.close()


@pytest.fixture
def page(watched: Watched) -> Page:
    return watched.page


def sign_in(page: Page, server: UiServer, token: str = ALICE) -> None:
    page.goto(server.url + "/ui/")
    page.fill("#token", token)
    page.click("#signin-form button")
    expect(page.locator("#app")).to_be_visible()


def start_from_page(page: Page, agent: str, text: str) -> str:
    expect(page.locator(f'#start-agent option[value="{agent}"]')).to_have_count(1)
    page.select_option("#start-agent", agent)
    page.fill("#start-input", text)
    page.click("#start-button")
    root = page.locator(".tree > .node")
    expect(root).to_have_count(1)
    run_id = root.get_attribute("data-run")
    assert run_id
    return run_id


def node(page: Page, agent: str) -> Any:
    return page.locator(f'.node[data-agent="{agent}"]')


def head(locator: Any, selector: str) -> Any:
    """``selector`` in the node's own head (not a descendant node's)."""
    return locator.locator(f":scope > .node-head {selector}")


def shot(page: Page, name: str, server: UiServer | None = None) -> None:
    """Screenshot this state into docs/images/ in CI and under ``make screenshots``
    (``UPDATE_SCREENSHOTS=1``), so the guide's pictures are made by the tests; a local
    test run takes the picture too (it must not fail) but leaves the tree clean."""
    over_local = server is None or server.host == "local"
    if over_local and (os.environ.get("CI") or os.environ.get("UPDATE_SCREENSHOTS")):
        IMAGES.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(IMAGES / name))
    else:
        page.screenshot()
