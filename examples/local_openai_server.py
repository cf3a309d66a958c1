"""Point a run at a local OpenAI-compatible server (vLLM, Ollama, llama.cpp, LiteLLM).

With ``OPENAI_BASE_URL`` set (and ``MODEL``, default ``llama3.1:8b``), this talks to
your server. Without it, the script starts a tiny stand-in on 127.0.0.1 that speaks the
Chat Completions streaming wire format, so the example runs offline; the run, the
HTTP client and the SSE parsing are the real ones either way.

Run: ``python examples/local_openai_server.py``
"""

from __future__ import annotations

import json
import os
from functools import partial

import trio

import trio_agents as ta
from trio_agents.models import OpenAIChatModel


def chunk(**delta: str) -> bytes:
    body = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    return f"data: {json.dumps(body)}\n\n".encode()


async def stand_in_server(stream: trio.SocketStream) -> None:
    """One HTTP/1.1 exchange: read the request, stream an SSE answer, close."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some()
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += await stream.receive_some()
    question = json.loads(body)["messages"][-1]["content"]
    await stream.send_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
    )
    for word in ["(stand-in server) ", "You ", "asked: ", question]:
        await stream.send_all(chunk(content=word))
        await trio.sleep(0.02)
    await stream.send_all(b"data: [DONE]\n\n")
    await stream.aclose()


async def ask(base_url: str, model_name: str) -> None:
    model = OpenAIChatModel(model_name, base_url=base_url)
    agent = ta.Agent(name="local", instructions="Answer briefly.", model=model)
    async with ta.open_run(agent, "What is structured concurrency?") as run:
        async for event in run.events():
            if isinstance(event, ta.ResponseTextDelta):
                print(event.text, end="", flush=True)
    print()
    assert run.result is not None
    print(f"status: {run.result.status.value}, usage: {run.result.usage}")


async def main() -> None:
    base_url = os.environ.get("OPENAI_BASE_URL")
    if base_url:
        await ask(base_url, os.environ.get("MODEL", "llama3.1:8b"))
        return
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, stand_in_server, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        await ask(f"http://127.0.0.1:{port}/v1", "stand-in")
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
