"""A loopback Chat Completions SSE server for B4/B5, run as a subprocess.

``python -m benchmarks._server`` listens on ``127.0.0.1`` (a free port, printed as the
first line of stdout) and answers ``POST /chat/completions`` by the request's ``model``:

* ``hold:N`` — stream ``N`` text deltas, then keep the response open until the client
  closes the connection; but if the last message is a user message starting with
  ``steer``, answer ``ok`` and end the stream (the turn after an injection).
* ``text:N`` — stream ``N`` one-character text deltas, each its own chunk, then finish
  (W1 over HTTP: the client reads many deltas per socket read when it is slower).
* ``tool:NAME`` — a tool call to ``NAME`` (``{}``), or ``done`` once the last message is a
  tool result.

It records, on ``time.monotonic()`` (``CLOCK_MONOTONIC``: the same clock in every
process of the machine), when each request had fully arrived (with the first and last
message contents as markers) and when the client closed each connection; ``GET
/stats`` returns those records as JSON. It is its own process so that its work never
shares the benchmarked process's scheduler or GIL; ideas from ``tests/support/sse_server.py``.
"""

from __future__ import annotations

import json
import sys
import time
from contextlib import suppress
from functools import partial
from typing import Any

import trio

__all__ = ["main"]


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _sse(payload: Any) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return _chunk(f"data: {text}\n\n".encode())


def _delta(content: str) -> bytes:
    return _sse({"choices": [{"index": 0, "delta": {"content": content}}]})


_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"
)
_FINISH_STOP = _sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
_FINISH_TOOLS = _sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
_USAGE = _sse({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 2}})
_DONE = _sse("[DONE]") + b"0\r\n\r\n"


class Server:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.closed: dict[int, float] = {}
        self._connections = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        self._connections += 1
        conn = self._connections
        buffer = bytearray()
        try:
            while True:
                head_end = buffer.find(b"\r\n\r\n")
                while head_end < 0:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                    head_end = buffer.find(b"\r\n\r\n")
                head = bytes(buffer[:head_end]).decode("latin-1")
                del buffer[: head_end + 4]
                request_line, *lines = head.split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                length = 0
                for line in lines:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                while len(buffer) < length:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                body = bytes(buffer[:length])
                del buffer[:length]
                if method == "GET" and path == "/stats":
                    payload = json.dumps({"requests": self.requests, "closed": self.closed})
                    data = payload.encode()
                    await stream.send_all(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(data), data)
                    )
                    continue
                arrived = time.monotonic()
                request = json.loads(body)
                messages = request["messages"]
                first = next((m["content"] for m in messages if m["role"] == "user"), "")
                last = messages[-1]
                self.requests.append(
                    {"t": arrived, "conn": conn, "first": first, "last": last.get("content")}
                )
                model: str = request["model"]
                if model.startswith("hold:"):
                    content = last.get("content") or ""
                    if last["role"] == "user" and content.startswith("steer"):
                        await stream.send_all(_HEAD + _delta("ok") + _FINISH_STOP + _USAGE + _DONE)
                        continue
                    count = int(model.split(":", 1)[1])
                    await stream.send_all(_HEAD + b"".join(_delta("x") for _ in range(count)))
                    # hold: wait for the client to go away
                    while await stream.receive_some(65536):
                        pass
                    return
                if model.startswith("text:"):
                    count = int(model.split(":", 1)[1])
                    deltas = b"".join(_delta("x") for _ in range(count))
                    await stream.send_all(_HEAD + deltas + _FINISH_STOP + _USAGE + _DONE)
                    continue
                name = model.split(":", 1)[1]
                if last["role"] == "tool":
                    await stream.send_all(_HEAD + _delta("done") + _FINISH_STOP + _USAGE + _DONE)
                    continue
                call = {
                    "index": 0,
                    "id": f"call_{conn}_{len(self.requests)}",
                    "type": "function",
                    "function": {"name": name, "arguments": "{}"},
                }
                chunk = _sse({"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
                await stream.send_all(_HEAD + chunk + _FINISH_TOOLS + _USAGE + _DONE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.closed[conn] = time.monotonic()
            # the close time is per connection; the request list says which run used it
            with suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.aclose()


async def main() -> None:
    server = Server()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        print(port, flush=True)
        # run until the parent closes our stdin
        await trio.to_thread.run_sync(sys.stdin.read)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main)
