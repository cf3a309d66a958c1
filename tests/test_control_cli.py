"""``trio-agents ctl`` against a live server, and ``serve --app`` loading."""

from __future__ import annotations

import io
import json

import pytest
import trio

import trio_agents as ta
from trio_agents._cli import _ctl, _load_app, _parse
from trio_agents.models import ScriptedModel, Turn

from .control_support import serving

APP = {"a": ta.Agent(name="a", instructions="", model=ScriptedModel([], default=Turn(text="hi")))}


async def test_ctl_start_list_watch_cancel() -> None:
    with trio.fail_after(20):
        async with serving(APP) as (_, url):
            out = io.StringIO()
            code = await _ctl(_parse(["ctl", url, "--token", "tok-alice", "start", "a", "yo"]), out)
            assert code == 0
            lines = out.getvalue().splitlines()
            run_id = lines[0].split()[1]
            assert json.loads(lines[-1])["status"] == "completed"
            out = io.StringIO()
            await _ctl(_parse(["ctl", url, "--token", "tok-alice", "list"]), out)
            assert json.loads(out.getvalue())["run_id"] == run_id
            out = io.StringIO()
            await _ctl(_parse(["ctl", url, "--token", "tok-alice", "watch", run_id]), out)
            assert out.getvalue().splitlines() == lines[1:]
            with pytest.raises(ta.RunClosedError):
                await _ctl(_parse(["ctl", url, "--token", "tok-alice", "cancel", run_id]), out)


def test_serve_app_loading() -> None:
    assert _load_app("tests.test_control_cli:APP") is APP
    with pytest.raises(SystemExit):
        _load_app("tests.test_control_cli")
    with pytest.raises(SystemExit):
        _load_app("tests.test_control_cli:json")
