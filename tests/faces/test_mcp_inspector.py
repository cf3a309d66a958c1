"""The MCP face as the protocol's reference client sees it: the MCP Inspector's CLI
(npm ``@modelcontextprotocol/inspector``, its ``--cli`` mode) lists and calls the tools
over stdio (``trio-agents mcp``) and over Streamable HTTP (``/mcp`` with a token).

The Inspector is a Node package, never fetched by the tests: they use
``$MCP_INSPECTOR`` (the path of its ``mcp-inspector`` script), or one on ``PATH``, or
``node_modules/.bin/mcp-inspector`` in the repository (``npm install
@modelcontextprotocol/inspector@0.17``); without one they are skipped, with the reason.
(CI has no step installing it yet: until it has, these are not run there.)"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.cli_support import ROOT, cli_env
from tests.support.http_support import serving
from tests.support.mcp_face_app import agents


def _inspector() -> str | None:
    for candidate in (
        os.environ.get("MCP_INSPECTOR"),
        shutil.which("mcp-inspector"),
        str(ROOT / "node_modules" / ".bin" / "mcp-inspector"),
    ):
        if candidate and Path(candidate).is_file() and shutil.which("node"):
            return candidate
    return None


INSPECTOR = _inspector()
if INSPECTOR is None:
    message = (
        "no MCP Inspector: `.ci/inspector.sh` (make test runs it) installs"
        " @modelcontextprotocol/inspector@0.17 into the repository, or set MCP_INSPECTOR"
    )
    if os.environ.get("CI"):  # CI installs it (make test): missing there is a failure
        pytest.fail(message, pytrace=False)
    pytest.skip(message, allow_module_level=True)


async def inspect(*args: str) -> Any:
    """Run the Inspector's CLI; its JSON answer."""
    assert INSPECTOR is not None
    done = await trio.run_process(
        [INSPECTOR, "--cli", *args],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        env=cli_env(),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return json.loads(done.stdout)


def stdio_server(db: Path) -> list[str]:
    app = "tests.support.mcp_face_app:AGENTS"
    return [sys.executable, "-m", "trio_agents", "mcp", "--app", app, "--db", str(db)]


async def test_the_inspector_lists_and_calls_the_tools_over_stdio(tmp_path: Path) -> None:
    server = stdio_server(tmp_path / "s.db")
    listed = await inspect(*server, "--method", "tools/list")
    called = await inspect(
        *server, "--method", "tools/call", "--tool-name", "point", "--tool-arg", "input=where?"
    )
    broken = await inspect(
        *server, "--method", "tools/call", "--tool-name", "broken", "--tool-arg", "input=hi"
    )
    assert {tool["name"] for tool in listed["tools"]} == set(agents())
    assert called["structuredContent"] == {"x": 1, "y": 2}
    assert called["isError"] is False
    assert broken["isError"] is True


async def test_the_inspector_lists_and_calls_the_tools_over_http() -> None:
    async with serving(agents()) as served:
        where = [f"{served.base}/mcp", "--transport", "http"]
        token = ["--header", "Authorization: Bearer tok-alice"]
        listed = await inspect(*where, *token, "--method", "tools/list")
        called = await inspect(
            *where,
            *token,
            "--method",
            "tools/call",
            "--tool-name",
            "echo",
            "--tool-arg",
            "input=hi",
        )
        (run,) = await served.server.host.list("alice")
    assert {tool["name"] for tool in listed["tools"]} == set(agents())
    assert called["content"] == [{"type": "text", "text": "hello from echo"}]
    assert (run.agent, run.status.value) == ("echo", "completed")
