"""Peer frameworks on the B1/B2/B4 shapes, with fake in-process models.

Run by ``make bench-peers`` inside ``benchmarks/peers/.venv-peers`` (see install.sh);
never part of ``make bench`` or CI. Writes ``benchmarks/peers/results.jsonl``, which
``make bench`` folds into RESULTS.md. Each peer runs on asyncio, its native loop.

Implemented: pydantic-ai (B1 stream, B2 tool turn, B4 cancel mid-async-tool), the
OpenAI Agents SDK (B2 tool turn). Installed but not yet driven: Strands Agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import platform
import statistics
import sys
import time
from collections.abc import AsyncIterator
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROWS: list[dict[str, Any]] = []


def record(framework: str, bench: str, value: float, unit: str, note: str) -> None:
    dist = {"pydantic-ai": "pydantic-ai-slim", "openai-agents": "openai-agents"}[framework]
    row = {
        "framework": framework,
        "version": metadata.version(dist),
        "bench": bench,
        "value": round(value, 4),
        "unit": unit,
        "note": note,
    }
    ROWS.append(row)
    print(json.dumps(row), flush=True)


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99 + 0.999999) - 1)]


# ------------------------------------------------------------------ pydantic-ai


async def pydantic_ai() -> None:
    from pydantic_ai import Agent
    from pydantic_ai.messages import (
        ModelMessage,
        ModelResponse,
        TextPart,
        ToolCallPart,
        ToolReturnPart,
    )
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    deltas = 2000

    async def stream_x(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        for _ in range(deltas):
            yield "x"

    # B1: one streamed run, text deltas consumed as they come
    agent = Agent(FunctionModel(stream_function=stream_x))
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        async with agent.run_stream("go") as result:
            async for _ in result.stream_text(delta=True, debounce_by=None):
                pass
        samples.append((time.perf_counter() - start) / deltas)
    record(
        "pydantic-ai",
        "B1.run_per_delta",
        statistics.median(samples) * 1e6,
        "us",
        f"{deltas} deltas, stream_text(delta=True, debounce_by=None); model cost included",
    )

    # B2: tool call to async add, then the answer
    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        last = messages[-1].parts[-1]
        if isinstance(last, ToolReturnPart):
            return ModelResponse(parts=[TextPart(str(last.content))])
        return ModelResponse(parts=[ToolCallPart("add", {"a": 1, "b": 2})])

    agent2 = Agent(FunctionModel(answer))

    @agent2.tool_plain
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    runs = 200
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(runs):
            out = await agent2.run("1 + 2?")
            assert out.output == "3", out.output
        samples.append((time.perf_counter() - start) / runs)
    record("pydantic-ai", "B2.tool_turn_per_run", statistics.median(samples) * 1e3, "ms", "")

    # B4: cancel mid-async-tool (asyncio task.cancel -> the run's await ends)
    agent3 = Agent(FunctionModel(lambda m, i: ModelResponse(parts=[ToolCallPart("nap", {})])))
    started = asyncio.Event()

    @agent3.tool_plain
    async def nap() -> str:
        """Sleep for an hour."""
        started.set()
        await asyncio.sleep(3600)
        return "rested"

    latencies = []
    for i in range(1020):
        started.clear()
        task = asyncio.create_task(agent3.run("go"))
        await started.wait()
        t0 = time.perf_counter()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if i >= 20:
            latencies.append(time.perf_counter() - t0)
    record(
        "pydantic-ai",
        "B4.cancel_mid_async_tool",
        p99(latencies) * 1e3,
        "ms p99",
        f"task.cancel() -> the awaiting caller resumes; p50 {statistics.median(latencies) * 1e3:.3f} ms;"
        " no status/event is emitted (no run state to repair)",
    )


# ------------------------------------------------------------- OpenAI Agents SDK


async def openai_agents() -> None:
    from agents import Agent, Runner, function_tool, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import (
        ResponseFunctionToolCall,
        ResponseOutputMessage,
        ResponseOutputText,
    )

    set_tracing_disabled(True)

    class FakeModel(Model):
        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> ModelResponse:
            items = input if isinstance(input, list) else []
            last = items[-1] if items else {}
            if isinstance(last, dict) and last.get("type") == "function_call_output":
                text = ResponseOutputText(
                    type="output_text", text=str(last["output"]), annotations=[]
                )
                message = ResponseOutputMessage(
                    id="msg", type="message", role="assistant", status="completed", content=[text]
                )
                return ModelResponse(output=[message], usage=Usage(), response_id=None)
            call = ResponseFunctionToolCall(
                type="function_call",
                call_id=f"call_{len(items)}",
                name="add",
                arguments='{"a": 1, "b": 2}',
            )
            return ModelResponse(output=[call], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @function_tool
    async def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    agent = Agent(name="b2", model=FakeModel(), tools=[add])
    runs = 200
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(runs):
            result = await Runner.run(agent, "1 + 2?")
            assert result.final_output == "3", result.final_output
        samples.append((time.perf_counter() - start) / runs)
    record(
        "openai-agents",
        "B2.tool_turn_per_run",
        statistics.median(samples) * 1e3,
        "ms",
        "tracing disabled",
    )


async def main() -> None:
    failures = []
    for name, bench in (("pydantic-ai", pydantic_ai), ("openai-agents", openai_agents)):
        try:
            await bench()
        except Exception as exc:  # one peer's API drift must not hide the others
            failures.append(name)
            print(f"{name}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    with (HERE / "results.jsonl").open("w") as out:
        out.write(json.dumps({"environment": {"python": platform.python_version()}}) + "\n")
        for row in ROWS:
            out.write(json.dumps(row) + "\n")
    if failures:
        raise SystemExit(f"failed: {', '.join(failures)}")


if __name__ == "__main__":
    asyncio.run(main())
