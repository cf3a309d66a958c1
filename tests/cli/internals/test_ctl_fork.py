"""``trio-agents ctl URL fork`` against a live in-process server (human and ``--json``
output, ``--at`` and ``--at-event``, errors)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import trio

import trio_agents as ta
from tests.support.control_support import serving
from trio_agents import UserMessage
from trio_agents._cli._args import parse
from trio_agents._cli._ctl import run_ctl
from trio_agents._cli._errors import explain
from trio_agents.models import ScriptedModel, Turn
from trio_agents.sessions import SQLiteSession

HANG_GUARD = 30  # seconds; a bound against hangs, never a wait


async def ctl(url: str, *argv: str) -> list[str]:
    out = io.StringIO()
    code = await run_ctl(parse(["ctl", url, "--token", "tok-alice", *argv]), out)
    assert code == 0
    return out.getvalue().splitlines()


def app() -> dict[str, ta.Agent]:
    return {"a": ta.Agent(name="a", model=ScriptedModel([], default=Turn(text="hi there")))}


async def test_fork_for_people_and_scripts(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with trio.fail_after(HANG_GUARD):
        async with serving(app(), sessions=path) as (_, url):
            events = [
                json.loads(x)
                for x in await ctl(url, "--json", "start", "a", "yo", "--session", "s1")
            ]
            run_id = events[0]["run_id"]
            assert await ctl(url, "fork", "s1", "s2") == ["session s1 forked into s2 (2 items)"]
            assert await ctl(url, "fork", "s1", "s3", "--at", "1", "--json") == [
                json.dumps({"session_id": "s3", "items": 1})
            ]
            user_seq = next(e["seq"] for e in events if e["type"] == "run.item")
            lines = await ctl(url, "fork", "s1", "s4", "--at-event", f"{run_id}:{user_seq}")
            assert lines == ["session s1 forked into s4 (1 items)"]
            with pytest.raises(BaseException) as caught:  # noqa: PT011 - a group
                await ctl(url, "fork", "nope", "s5")
    explained = explain(caught.value)
    assert explained is not None
    message, status = explained
    assert status == 1
    assert "no session 'nope'" in message
    async with SQLiteSession(path, json.dumps(["alice", "s4"])) as s4:
        assert await s4.get_items() == [UserMessage("yo")]


def test_bad_positions_are_usage_errors() -> None:
    for argv in (["--at", "-1"], ["--at", "x"], ["--at-event", "nocolon"], ["--at-event", "r:-2"]):
        with pytest.raises(SystemExit):
            parse(["ctl", "ws://127.0.0.1:1/", "fork", "a", "b", *argv])
    with pytest.raises(SystemExit):
        parse(["ctl", "ws://127.0.0.1:1/", "fork", "a", "b", "--at", "1", "--at-event", "r:1"])
