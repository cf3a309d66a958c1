"""Crash safety for real: a process running an agent on a SQLite session is killed with
SIGKILL in the middle of a tool call; the session it leaves behind loads repaired and
the next run on it completes with a valid conversation."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel
from trio_agents.sessions import SQLiteSession

CHILD = textwrap.dedent(
    """
    import sys
    import trio
    import trio_agents as ta
    from trio_agents.models import ScriptedModel, Turn
    from trio_agents.sessions import SQLiteSession

    @ta.function_tool
    async def lookup(city: str) -> str:
        "Look a city up (the first call answers, the second hangs)."
        if city == "Oslo":
            return "Oslo: 4 C"
        print("tool started", flush=True)
        await trio.sleep_forever()
        return "unreachable"

    async def main(path: str) -> None:
        model = ScriptedModel([
            Turn(text="Checking Oslo.", tool_calls=[("lookup", {"city": "Oslo"})]),
            Turn(text="Now Paris.", tool_calls=[("lookup", {"city": "Paris"})]),
            "unreached",
        ])
        agent = ta.Agent(name="crashy", model=model, tools=[lookup])
        async with SQLiteSession(path, "s1") as session:
            await ta.run(agent, "weather in Oslo and Paris?", session=session)

    trio.run(main, sys.argv[1])
    """
)


async def test_sigkill_mid_tool_loses_nothing_finalised(tmp_path: Path) -> None:
    db = tmp_path / "crash.db"
    with trio.fail_after(30):
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", CHILD, str(db)], stdout=subprocess.PIPE
        )
        assert process.stdout is not None
        try:
            seen = b""
            while b"tool started" not in seen:
                chunk = await process.stdout.receive_some()
                assert chunk, "the child exited before its tool started"
                seen += chunk
            process.send_signal(signal.SIGKILL)
            assert await process.wait() == -signal.SIGKILL
        finally:
            process.kill()  # a no-op once it is dead
            await process.wait()
            await process.stdout.aclose()

        async with SQLiteSession(db, "s1") as session:
            loaded = await session.get_items()
            # Everything finalised before the kill, then the repair of the open call.
            assert loaded == [
                ta.UserMessage("weather in Oslo and Paris?"),
                ta.AssistantMessage("Checking Oslo."),
                ta.ToolCall("call_1_0", "lookup", '{"city": "Oslo"}'),
                ta.ToolResult("call_1_0", "Oslo: 4 C"),
                ta.AssistantMessage("Now Paris."),
                ta.ToolCall("call_2_0", "lookup", '{"city": "Paris"}'),
                ta.ToolResult("call_2_0", "cancelled: interrupted", status="cancelled"),
            ]
            model = ScriptedModel(["Sorry, the Paris lookup was interrupted."])
            result = await ta.run(ta.Agent(name="after", model=model), "and now?", session=session)
        assert result.status == "completed"
        (request,) = model.requests
        assert request.items == (*loaded, ta.UserMessage("and now?"))
        assert ta.conversation_problems(request.items) == []

        async with SQLiteSession(db, "s1") as reopened:
            stored = await reopened.get_items()
        assert stored == list(result.conversation)
        assert ta.conversation_problems(stored) == []
