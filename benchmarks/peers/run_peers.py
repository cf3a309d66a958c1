"""The peer frameworks on W1-W5 (issue 18), with fake in-process models.

``python run_peers.py PEER`` inside that peer's own venv (``.venv-PEER``, made by
install.sh): ``make bench-peers`` runs all four (openai-agents, strands, pydantic-ai,
adk). Never part of ``make bench`` or CI. Each peer's rows replace its old ones in
``benchmarks/peers/results.jsonl``, which ``make bench`` folds into RESULTS.md.

Every peer runs on asyncio, its native loop, and gets the same fake model shape as
trio_agents' benchmarks: every model event is preceded by one ``asyncio.sleep(0)`` (our
``ScriptedModel`` checkpoints once per event), the tool call is ``add(a=1, b=2)`` and
the answer is the tool's output. The asyncio floor of the same process is recorded
too (``asyncio.sleep(0)``, and task.cancel() -> the awaiting task resumes).

- W1: seconds per streamed text delta, one run of 2000 deltas, the deltas consumed as
  the framework streams them (model cost included).
- W2: one 2-turn run (tool call, then the answer), sequential, objects built first.
- W3: 1000 concurrent 2-turn runs whose tool sleeps 50 ms: wall time and peak RSS
  growth per run (``VmHWM`` after a reset to the current RSS).
- W4: ``task.cancel()`` while the run is in a tool that sleeps an hour -> the task
  that awaited the run resumes (p50/p99 over 1000).
- W5: the same while the model is streaming (5 deltas sent, the 6th never comes).

W4/W5 stop the peer's run with asyncio's own cancellation, its fastest way; none of
them emits a terminal status or repairs its conversation on that path.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DIST = {
    "pydantic-ai": "pydantic-ai-slim",
    "openai-agents": "openai-agents",
    "strands": "strands-agents",
    "adk": "google-adk",
}
ROWS: list[dict[str, Any]] = []
DELTAS = 2000
RUNS = int(os.environ.get("PEERS_RUNS", 200))
CONCURRENT = int(os.environ.get("PEERS_CONCURRENT", 1000))
CANCELS = int(os.environ.get("PEERS_CANCELS", 1000))
WARMUP = 20
HOLD = 5


def record(
    framework: str, bench: str, value: float, unit: str, note: str = "", **extra: Any
) -> None:
    row = {
        "framework": framework,
        "version": metadata.version(DIST[framework])
        if framework in DIST
        else platform.python_version(),
        "bench": bench,
        "value": round(value, 4),
        "unit": unit,
        "note": note,
        **extra,
    }
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99 + 0.999999) - 1)]


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


# ------------------------------------------------------------------ the shapes


class Peer:
    """One framework: the runs the shapes need."""

    name = ""

    async def stream(self, deltas: int) -> int:
        """One run streaming ``deltas`` text deltas, consumed as they come; returns how
        many were seen."""
        raise NotImplementedError

    def tool_run(self, sleep: float = 0.0) -> Callable[[], Awaitable[str]]:
        """Build (outside any timing) one 2-turn run; calling it runs it -> the answer."""
        raise NotImplementedError

    def nap_run(self, started: asyncio.Event) -> Callable[[], Awaitable[Any]]:
        """A run whose tool sets ``started`` and sleeps an hour."""
        raise NotImplementedError

    def hold_run(self, started: asyncio.Event) -> Callable[[], Awaitable[Any]]:
        """A run whose model streams HOLD deltas, sets ``started``, then hangs."""
        raise NotImplementedError


async def floor() -> None:
    n = 20_000
    start = time.perf_counter()
    for _ in range(n):
        await asyncio.sleep(0)
    record(
        "asyncio floor", "sleep0", (time.perf_counter() - start) / n * 1e6, "us", "asyncio.sleep(0)"
    )
    latencies = []
    for _ in range(CANCELS):
        task = asyncio.create_task(asyncio.sleep(3600))
        await asyncio.sleep(0)
        t0 = time.perf_counter()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        latencies.append(time.perf_counter() - t0)
    record(
        "asyncio floor",
        "cancel",
        p99(latencies) * 1e3,
        "ms p99",
        "task.cancel() -> the awaiting task resumes",
        p50_ms=round(statistics.median(latencies) * 1e3, 4),
    )


async def shapes(peer: Peer) -> None:
    name = peer.name
    # W1
    await peer.stream(50)
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        seen = await peer.stream(DELTAS)
        samples.append((time.perf_counter() - start) / DELTAS)
        assert seen >= DELTAS, seen
    record(
        name,
        "W1.run_per_delta",
        statistics.median(samples) * 1e6,
        "us",
        f"{DELTAS} deltas, model cost included",
    )
    # W2
    for _ in range(5):
        await peer.tool_run()()
    samples = []
    for _ in range(5):
        runs = [peer.tool_run() for _ in range(RUNS)]
        start = time.perf_counter()
        for one in runs:
            answer = await one()
            assert answer.strip() == "3", answer
        samples.append((time.perf_counter() - start) / RUNS)
    record(name, "W2.tool_turn_per_run", statistics.median(samples) * 1e3, "ms")
    # W3
    runs = [peer.tool_run(sleep=0.05) for _ in range(CONCURRENT)]
    gc.collect()
    before = _status_kb("VmRSS")
    _reset_peak()
    start = time.perf_counter()
    answers = await asyncio.gather(*(one() for one in runs))
    wall = time.perf_counter() - start
    growth = _status_kb("VmHWM") - before
    assert all(a.strip() == "3" for a in answers)
    record(name, "W3.wall_1000_concurrent", wall, "s", "tool sleeps 50 ms")
    record(
        name,
        "W3.rss_per_run_1000",
        growth / CONCURRENT,
        "KB",
        "peak RSS growth / runs (agents built first)",
    )
    del runs, answers
    # W4, W5
    for bench, make in (
        ("W4.cancel_mid_tool", peer.nap_run),
        ("W5.cancel_mid_stream", peer.hold_run),
    ):
        latencies = []
        for i in range(WARMUP + CANCELS):
            started = asyncio.Event()
            task = asyncio.create_task(make(started)())
            await started.wait()
            t0 = time.perf_counter()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            if i >= WARMUP:
                latencies.append(time.perf_counter() - t0)
        record(
            name,
            bench,
            p99(latencies) * 1e3,
            "ms p99",
            "task.cancel() -> the awaiting task resumes",
            p50_ms=round(statistics.median(latencies) * 1e3, 4),
        )


# ------------------------------------------------------------------ pydantic-ai


class PydanticAI(Peer):
    name = "pydantic-ai"

    def __init__(self) -> None:
        from pydantic_ai import Agent
        from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
        from pydantic_ai.models.function import FunctionModel

        self.Agent, self.FunctionModel = Agent, FunctionModel
        self.ModelResponse, self.TextPart = ModelResponse, TextPart
        self.ToolCallPart, self.ToolReturnPart = ToolCallPart, ToolReturnPart

    async def stream(self, deltas: int) -> int:
        async def stream_x(messages: Any, info: Any) -> Any:
            for _ in range(deltas):
                await asyncio.sleep(0)
                yield "x"

        agent = self.Agent(self.FunctionModel(stream_function=stream_x))
        seen = 0
        async with agent.run_stream("go") as result:
            async for _ in result.stream_text(delta=True, debounce_by=None):
                seen += 1
        return seen

    def _agent(self, tool: Callable[..., Any], name: str, args: dict[str, Any]) -> Any:
        async def answer(messages: Any, info: Any) -> Any:
            await asyncio.sleep(0)
            last = messages[-1].parts[-1]
            if isinstance(last, self.ToolReturnPart):
                return self.ModelResponse(parts=[self.TextPart(str(last.content))])
            return self.ModelResponse(parts=[self.ToolCallPart(name, args)])

        agent = self.Agent(self.FunctionModel(answer))
        agent.tool_plain(tool)
        return agent

    def tool_run(self, sleep: float = 0.0) -> Callable[[], Awaitable[str]]:
        async def add(a: int, b: int) -> int:
            """Add two integers."""
            if sleep:
                await asyncio.sleep(sleep)
            return a + b

        agent = self._agent(add, "add", {"a": 1, "b": 2})

        async def one() -> str:
            return str((await agent.run("1 + 2?")).output)

        return one

    def nap_run(self, started: asyncio.Event) -> Callable[[], Awaitable[Any]]:
        async def nap() -> str:
            """Sleep for an hour."""
            started.set()
            await asyncio.sleep(3600)
            return "rested"

        agent = self._agent(nap, "nap", {})
        return lambda: agent.run("go")

    def hold_run(self, started: asyncio.Event) -> Callable[[], Awaitable[Any]]:
        async def hold(messages: Any, info: Any) -> Any:
            for _ in range(HOLD):
                await asyncio.sleep(0)
                yield "x"
            await asyncio.sleep(3600)
            yield "never"

        agent = self.Agent(self.FunctionModel(stream_function=hold))

        async def one() -> None:
            seen = 0
            async with agent.run_stream("go") as result:
                async for _ in result.stream_text(delta=True, debounce_by=None):
                    seen += 1
                    if seen == HOLD:
                        started.set()

        return one


# ------------------------------------------------------------- OpenAI Agents SDK


class OpenAIAgents(Peer):
    name = "openai-agents"

    def __init__(self) -> None:
        from agents import Agent, Runner, function_tool, set_tracing_disabled
        from agents.items import ModelResponse
        from agents.models.interface import Model
        from agents.usage import Usage
        from openai.types.responses import (
            ResponseCompletedEvent,
            ResponseFunctionToolCall,
            ResponseOutputMessage,
            ResponseOutputText,
            ResponseTextDeltaEvent,
        )

        set_tracing_disabled(True)
        self.Agent, self.Runner, self.function_tool = Agent, Runner, function_tool
        peer = self

        def message(text: str) -> Any:
            part = ResponseOutputText(type="output_text", text=text, annotations=[])
            return ResponseOutputMessage(
                id="msg", type="message", role="assistant", status="completed", content=[part]
            )

        class FakeModel(Model):
            def __init__(
                self,
                tool: str = "add",
                args: str = '{"a": 1, "b": 2}',
                deltas: int = 0,
                hold: asyncio.Event | None = None,
            ) -> None:
                self.tool, self.args, self.deltas, self.hold = tool, args, deltas, hold

            async def get_response(
                self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
            ) -> Any:
                await asyncio.sleep(0)
                items = input if isinstance(input, list) else []
                last = items[-1] if items else {}
                if isinstance(last, dict) and last.get("type") == "function_call_output":
                    return ModelResponse(
                        output=[message(str(last["output"]))], usage=Usage(), response_id=None
                    )
                call = ResponseFunctionToolCall(
                    type="function_call",
                    call_id=f"call_{len(items)}",
                    name=self.tool,
                    arguments=self.args,
                )
                return ModelResponse(output=[call], usage=Usage(), response_id=None)

            async def stream_response(self, *args: Any, **kwargs: Any) -> Any:
                for i in range(self.deltas):
                    await asyncio.sleep(0)
                    yield ResponseTextDeltaEvent(
                        type="response.output_text.delta",
                        delta="x",
                        item_id="msg",
                        output_index=0,
                        content_index=0,
                        sequence_number=i,
                        logprobs=[],
                    )
                if self.hold is not None:
                    await asyncio.sleep(3600)
                from openai.types.responses import Response

                response = Response(
                    id="r",
                    created_at=0,
                    model="fake",
                    object="response",
                    output=[message("x" * self.deltas)],
                    parallel_tool_calls=False,
                    tool_choice="auto",
                    tools=[],
                )
                yield ResponseCompletedEvent(
                    type="response.completed", response=response, sequence_number=self.deltas
                )

        self.FakeModel = FakeModel
        _ = peer

    async def _stream(self, model: Any, hold: asyncio.Event | None = None) -> int:
        agent = self.Agent(name="b1", model=model)
        result = self.Runner.run_streamed(agent, "go")
        seen = 0
        async for event in result.stream_events():
            if (
                event.type == "raw_response_event"
                and getattr(event.data, "type", "") == "response.output_text.delta"
            ):
                seen += 1
                if hold is not None and seen == HOLD:
                    hold.set()
        return seen

    async def stream(self, deltas: int) -> int:
        return await self._stream(self.FakeModel(deltas=deltas))

    def tool_run(self, sleep: float = 0.0) -> Callable[[], Awaitable[str]]:
        @self.function_tool
        async def add(a: int, b: int) -> int:
            """Add two integers."""
            if sleep:
                await asyncio.sleep(sleep)
            return a + b

        agent = self.Agent(name="b2", model=self.FakeModel(), tools=[add])

        async def one() -> str:
            return str((await self.Runner.run(agent, "1 + 2?")).final_output)

        return one

    def nap_run(self, started: asyncio.Event) -> Callable[[], Awaitable[Any]]:
        @self.function_tool
        async def nap() -> str:
            """Sleep for an hour."""
            started.set()
            await asyncio.sleep(3600)
            return "rested"

        agent = self.Agent(name="b4", model=self.FakeModel(tool="nap", args="{}"), tools=[nap])
        return lambda: self.Runner.run(agent, "go")

    def hold_run(self, started: asyncio.Event) -> Callable[[], Awaitable[Any]]:
        model = self.FakeModel(deltas=HOLD, hold=started)
        return lambda: self._stream(model, started)


# ------------------------------------------------------------------ Strands


class Strands(Peer):
    name = "strands"

    def __init__(self) -> None:
        from strands import Agent, tool
        from strands.models.model import Model

        self.Agent, self.tool = Agent, tool

        class Fake(Model):
            def __init__(
                self,
                deltas: int = 0,
                tool: str = "add",
                args: str = '{"a": 1, "b": 2}',
                hold: asyncio.Event | None = None,
            ) -> None:
                self.deltas, self.tool_name, self.args, self.hold = deltas, tool, args, hold

            def update_config(self, **kw: Any) -> None:
                pass

            def get_config(self) -> Any:
                return {}

            async def structured_output(self, *a: Any, **k: Any) -> Any:
                raise NotImplementedError
                yield

            async def stream(
                self, messages: Any, tool_specs: Any = None, system_prompt: Any = None, **kw: Any
            ) -> Any:
                results = [c["toolResult"] for c in messages[-1]["content"] if "toolResult" in c]
                await asyncio.sleep(0)
                yield {"messageStart": {"role": "assistant"}}
                if self.deltas or results:
                    text = (
                        [str(results[0]["content"][0]["text"])] if results else ["x"] * self.deltas
                    )
                    yield {"contentBlockStart": {"start": {}}}
                    for t in text:
                        await asyncio.sleep(0)
                        yield {"contentBlockDelta": {"delta": {"text": t}}}
                    if self.hold is not None:
                        await asyncio.sleep(3600)
                    yield {"contentBlockStop": {}}
                    yield {"messageStop": {"stopReason": "end_turn"}}
                else:
                    start = {
                        "toolUse": {"name": self.tool_name, "toolUseId": f"call_{len(messages)}"}
                    }
                    yield {"contentBlockStart": {"start": start}}
                    yield {"contentBlockDelta": {"delta": {"toolUse": {"input": self.args}}}}
                    yield {"contentBlockStop": {}}
                    await asyncio.sleep(0)
                    yield {"messageStop": {"stopReason": "tool_use"}}

        self.Fake = Fake

    async def _stream(self, agent: Any, hold: asyncio.Event | None = None) -> int:
        seen = 0
        async for event in agent.stream_async("go"):
            if "data" in event:
                seen += 1
                if hold is not None and seen == HOLD:
                    hold.set()
        return seen

    async def stream(self, deltas: int) -> int:
        return await self._stream(self.Agent(model=self.Fake(deltas), callback_handler=None))

    def tool_run(self, sleep: float = 0.0) -> Callable[[], Awaitable[str]]:
        @self.tool
        async def add(a: int, b: int) -> int:
            """Add two integers."""
            if sleep:
                await asyncio.sleep(sleep)
            return a + b

        agent = self.Agent(model=self.Fake(), tools=[add], callback_handler=None)

        async def one() -> str:
            return str(await agent.invoke_async("1 + 2?"))

        return one

    def nap_run(self, started: asyncio.Event) -> Callable[[], Awaitable[Any]]:
        @self.tool
        async def nap() -> str:
            """Sleep for an hour."""
            started.set()
            await asyncio.sleep(3600)
            return "rested"

        agent = self.Agent(
            model=self.Fake(tool="nap", args="{}"), tools=[nap], callback_handler=None
        )
        return lambda: agent.invoke_async("go")

    def hold_run(self, started: asyncio.Event) -> Callable[[], Awaitable[Any]]:
        agent = self.Agent(model=self.Fake(HOLD, hold=started), callback_handler=None)
        return lambda: self._stream(agent, started)


# ------------------------------------------------------------------ Google ADK


class ADK(Peer):
    name = "adk"

    def __init__(self) -> None:
        import logging

        from google.adk.agents import LlmAgent
        from google.adk.agents.run_config import RunConfig, StreamingMode
        from google.adk.models.base_llm import BaseLlm
        from google.adk.models.llm_response import LlmResponse
        from google.adk.runners import InMemoryRunner
        from google.genai import types

        logging.disable(logging.WARNING)  # "Skipping missing token usage" per call
        self.LlmAgent, self.InMemoryRunner, self.types = LlmAgent, InMemoryRunner, types
        self.sse = RunConfig(streaming_mode=StreamingMode.SSE)

        class Fake(BaseLlm):
            model: str = "fake"
            deltas: int = 0
            tool: str = "add"
            args: dict[str, Any] = {"a": 1, "b": 2}  # noqa: RUF012 (a pydantic field)
            hold: bool = False

            async def generate_content_async(self, llm_request: Any, stream: bool = False) -> Any:
                last = llm_request.contents[-1]
                results = [p.function_response for p in (last.parts or []) if p.function_response]
                await asyncio.sleep(0)
                if results:
                    text = str(results[0].response["result"])
                    yield LlmResponse(
                        content=types.Content(role="model", parts=[types.Part(text=text)])
                    )
                elif self.deltas:
                    for _ in range(self.deltas):
                        await asyncio.sleep(0)
                        part = types.Part(text="x")
                        yield LlmResponse(
                            content=types.Content(role="model", parts=[part]), partial=True
                        )
                    if self.hold:
                        await asyncio.sleep(3600)
                    whole = types.Part(text="x" * self.deltas)
                    yield LlmResponse(content=types.Content(role="model", parts=[whole]))
                else:
                    call = types.FunctionCall(name=self.tool, args=self.args)
                    yield LlmResponse(
                        content=types.Content(role="model", parts=[types.Part(function_call=call)])
                    )

        self.Fake = Fake

    def _runner(self, agent: Any) -> Callable[..., Awaitable[Any]]:
        runner = self.InMemoryRunner(agent=agent, app_name="bench")
        types = self.types

        async def one(text: str, stream: bool = False, hold: asyncio.Event | None = None) -> Any:
            session = await runner.session_service.create_session(app_name="bench", user_id="u")
            message = types.Content(role="user", parts=[types.Part(text=text)])
            last, seen = None, 0
            options = {"run_config": self.sse} if stream else {}
            async for event in runner.run_async(
                user_id="u", session_id=session.id, new_message=message, **options
            ):
                if event.partial:
                    seen += 1
                    if hold is not None and seen == HOLD:
                        hold.set()
                last = event
            return seen if stream else last.content.parts[0].text

        return one

    async def stream(self, deltas: int) -> int:
        one = self._runner(self.LlmAgent(name="b1", model=self.Fake(deltas=deltas)))
        return int(await one("go", stream=True))

    def tool_run(self, sleep: float = 0.0) -> Callable[[], Awaitable[str]]:
        async def add(a: int, b: int) -> int:
            """Add two integers."""
            if sleep:
                await asyncio.sleep(sleep)
            return a + b

        one = self._runner(self.LlmAgent(name="b2", model=self.Fake(), tools=[add]))
        return lambda: one("1 + 2?")

    def nap_run(self, started: asyncio.Event) -> Callable[[], Awaitable[Any]]:
        async def nap() -> str:
            """Sleep for an hour."""
            started.set()
            await asyncio.sleep(3600)
            return "rested"

        one = self._runner(
            self.LlmAgent(name="b4", model=self.Fake(tool="nap", args={}), tools=[nap])
        )
        return lambda: one("go")

    def hold_run(self, started: asyncio.Event) -> Callable[[], Awaitable[Any]]:
        one = self._runner(self.LlmAgent(name="b5", model=self.Fake(deltas=HOLD, hold=True)))
        return lambda: one("go", stream=True, hold=started)


PEERS: dict[str, type[Peer]] = {
    "pydantic-ai": PydanticAI,
    "openai-agents": OpenAIAgents,
    "strands": Strands,
    "adk": ADK,
}


def _write(name: str) -> None:
    path = HERE / "results.jsonl"
    kept: list[str] = []
    if path.exists():
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "environment" in row or row.get("framework") in (name, "asyncio floor"):
                continue
            kept.append(line)
    env = {"environment": {"python": platform.python_version(), "date": time.strftime("%Y-%m-%d")}}
    with path.open("w") as out:
        out.write(json.dumps(env) + "\n")
        for line in kept:
            out.write(line + "\n")
        for row in ROWS:
            out.write(json.dumps(row) + "\n")


async def main(name: str) -> None:
    peer = PEERS[name]()
    await floor()
    await shapes(peer)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in PEERS:
        raise SystemExit(f"usage: run_peers.py {{{','.join(PEERS)}}}")
    os.environ.setdefault("OTEL_SDK_DISABLED", "true")
    asyncio.run(main(sys.argv[1]))
    _write(sys.argv[1])
