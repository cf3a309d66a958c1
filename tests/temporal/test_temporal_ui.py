"""The web UI over the TemporalHost, in a real headless Chromium: the UI's own browser
tests (tests/faces/test_ui.py) that stream text, cancel one branch of a fan-out, approve
a call and inject a message, run here against a server whose host is a TemporalHost and
whose runs run on a worker embedded in the server's Trio program (``serve_worker``: the
tests' gates live in that loop), on a real Temporal dev server."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.support.temporal_support import embedded_temporal_host
from tests.support.ui_support import UiServer, chromium_available, running_ui_server
from trio_agents import Agent
from trio_agents.control import Limits

if not chromium_available():  # pragma: no cover - CI installs it (tests/faces/test_ui.py)
    pytest.skip("no /usr/bin/chromium: `make chromium`", allow_module_level=True)

# The UI's browser tests and fixtures, collected again here: ``server`` below is this
# module's (the TemporalHost), so they run against Temporal.
from tests.faces.test_ui import (
    browser,
    page,
    test_approve_a_waiting_call,
    test_cancel_one_branch_of_a_fan_out_and_the_root_goes_on,
    test_inject_a_message_and_the_next_turn_uses_it,
    test_start_a_run_from_the_page_and_see_its_text_stream_in,
    watched,
)

__all__ = [
    "browser",
    "page",
    "test_approve_a_waiting_call",
    "test_cancel_one_branch_of_a_fan_out_and_the_root_goes_on",
    "test_inject_a_message_and_the_next_turn_uses_it",
    "test_start_a_run_from_the_page_and_see_its_text_stream_in",
    "watched",
]


def _temporal_host(target: str, db: Path) -> Any:
    def serve(agents: Mapping[str, Agent], limits: Limits) -> AbstractAsyncContextManager[Any]:
        return embedded_temporal_host(target, db, agents, limits)

    return serve


@pytest.fixture(scope="module")
def server(temporal_server: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[UiServer]:
    db = tmp_path_factory.mktemp("ui-temporal") / "sessions.sqlite3"
    with running_ui_server(host=_temporal_host(temporal_server, db)) as served:
        yield served
