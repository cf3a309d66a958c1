"""B12 "flood": authenticated HTTP requests answered while a flood of connections that
never finish a request holds more sockets than the server has file descriptors.

The server runs in its own process (``python -m benchmarks.flood serve NOFILE LIMITS``)
with ``RLIMIT_NOFILE`` lowered to ``NOFILE`` (256 here): the HTTP faces of a
``LocalHost`` served by :func:`~trio_agents.faces.serve_http`, with the
:class:`~trio_agents.faces.HttpLimits` given as JSON. The flood, from this process:
``idle`` connections that send nothing and ``half_sent`` ones that send the start of a
request head and stop, each reopened as soon as the server closes it (a flood that
keeps up). While it goes on, an authenticated client (from another loopback address)
sends requests (``GET /runs``),
each on a new connection (``Connection: close``, what the flood competes with for the
accept queue and the descriptors), and as many on one keep-alive connection. The
figures: how many were answered and their latency (p50/p99), and how many flood
connections the server closed meanwhile.

``python -m benchmarks.flood`` prints the figures for the default limits (the
per-address cap binds first: the flood comes from one address) and for caps set out of
reach (the server runs out of descriptors and sheds on ``EMFILE``).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

import trio_agents as ta
from trio_agents.faces import HttpLimits, http_app, serve_http
from trio_agents.hosting import LocalHost
from trio_agents.models import ScriptedModel, Turn

from ._common import Figure, percentile

__all__ = [
    "FloodServer",
    "FloodStats",
    "authenticated_requests",
    "bench_b12",
    "flood_server",
    "flooding",
]

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "flood-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}
# The authenticated client's address; the flood comes from 127.0.0.1 (an attacker has
# an address of its own: the per-address cap is what keeps it from crowding out others).
CLIENT_ADDRESS = "127.0.0.2"
# What a half-sent connection sends: a request head that never ends.
HALF_HEAD = b"GET /runs HTTP/1.1\r\nHost: flood\r\nAuthorization: Bear"


# --------------------------------------------------------------------- the server


async def _serve(limits: HttpLimits) -> None:
    agent = ta.Agent(name="echo", model=ScriptedModel([], default=Turn(text="ok")))
    host = LocalHost({"echo": agent})
    async with host.running(), trio.open_nursery() as nursery:
        app = http_app(host, auth={TOKEN: "bench"}, limits=limits)
        port = await nursery.start(serve_http, app, "127.0.0.1", 0)
        print(port, flush=True)


def serve_main(nofile: int, limits: Mapping[str, Any]) -> None:
    """The server process: ``RLIMIT_NOFILE`` lowered to ``nofile``, then serve until
    killed (the port is the first line of stdout)."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard))
    trio.run(_serve, HttpLimits(**limits))


@attrs.define
class FloodServer:
    """The server process: its port, and (once the block ended) what it wrote to
    stderr (its log)."""

    port: int
    log: str = ""


@asynccontextmanager
async def flood_server(nofile: int, limits: Mapping[str, Any]) -> AsyncIterator[FloodServer]:
    """Start the server process; killed when the block ends."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with tempfile.TemporaryDirectory() as tmp:
        stderr = Path(tmp) / "stderr"
        with stderr.open("wb") as errors:
            process = await trio.lowlevel.open_process(
                [
                    *(sys.executable, "-m", "benchmarks.flood", "serve"),
                    *(str(nofile), json.dumps(dict(limits))),
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
            )
        assert process.stdout is not None
        try:
            line = b""
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive_some(64)
                if not chunk:
                    raise RuntimeError("the flood server exited before it served")
                line += chunk
            server = FloodServer(int(line))
            yield server
        finally:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
                await process.stdout.aclose()
        server.log = stderr.read_text(errors="replace")


# ---------------------------------------------------------------------- the flood


@attrs.define
class FloodStats:
    """What the flood saw: connections it opened, and of those, closed by the server."""

    opened: int = 0
    closed_by_server: int = 0
    # Set once every flooding task has opened its first connection.
    all_open: trio.Event = attrs.field(factory=trio.Event)
    _first: int = 0
    _tasks: int = 0

    def _opened(self, first: bool) -> None:
        self.opened += 1
        if first:
            self._first += 1
            if self._first == self._tasks:
                self.all_open.set()


async def _flooder(port: int, first_bytes: bytes, pause: float, stats: FloodStats) -> None:
    first = True
    while True:
        try:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
        except OSError:
            # The accept queue is full (the kernel refused the handshake): try again,
            # as an attacker would, after a moment.
            await trio.sleep(0.01)
            continue
        stats._opened(first)
        first = False
        async with stream:
            try:
                if first_bytes:
                    await stream.send_all(first_bytes)
                while await stream.receive_some():
                    pass  # a 408/400 the server may send before it closes
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        stats.closed_by_server += 1
        await trio.sleep(pause)


@asynccontextmanager
async def flooding(
    port: int, *, idle: int, half_sent: int, pause: float = 0.0
) -> AsyncIterator[FloodStats]:
    """Flood ``port`` with ``idle`` + ``half_sent`` connections, each reopened
    ``pause`` seconds after the server closed it, for the duration of the block."""
    stats = FloodStats()
    stats._tasks = idle + half_sent
    async with trio.open_nursery() as nursery:
        for i in range(idle + half_sent):
            nursery.start_soon(_flooder, port, b"" if i < idle else HALF_HEAD, pause, stats)
        yield stats
        nursery.cancel_scope.cancel()


# ------------------------------------------------------- the authenticated client


async def _fresh_request(port: int) -> int:
    """``GET /runs`` on a new connection (``Connection: close``); the status."""
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=CLIENT_ADDRESS)
    async with stream:
        await stream.send_all(
            b"GET /runs HTTP/1.1\r\nHost: flood\r\nConnection: close\r\n"
            b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n"
        )
        answer = bytearray()
        while data := await stream.receive_some():
            answer += data
    return int(answer.split(b" ", 2)[1])


async def authenticated_requests(port: int, n: int, *, bound: float, fresh: bool) -> list[float]:
    """``n`` authenticated requests one after the other, each within ``bound``
    seconds (``trio.TooSlowError`` past it), on new connections (``fresh``) or on one
    keep-alive connection; the latency of each (seconds)."""
    latencies: list[float] = []
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{port}",
        headers=HEADERS,
        timeout=None,
        transport=httpx.AsyncHTTPTransport(local_address=CLIENT_ADDRESS),
    ) as http:
        for _ in range(n):
            began = time.perf_counter()
            with trio.fail_after(bound):
                if fresh:
                    status = await _fresh_request(port)
                else:
                    status = (await http.get("/runs")).status_code
            latencies.append(time.perf_counter() - began)
            if status != 200:
                raise AssertionError(f"an authenticated request was answered {status}")
    return latencies


# ------------------------------------------------------------------- the benchmark

# The two configurations measured: the defaults, and caps out of reach (EMFILE).
CONFIGS: dict[str, dict[str, Any]] = {
    "default_caps": {},
    "emfile": {"max_unauthenticated_connections": 100_000, "max_unauthenticated_per_ip": 100_000},
}


async def bench_b12(
    *, nofile: int = 256, idle: int = 300, half_sent: int = 100, requests: int = 200
) -> list[Figure]:
    figures: list[Figure] = []
    for name, limits in CONFIGS.items():
        async with (
            flood_server(nofile, limits) as server,
            flooding(server.port, idle=idle, half_sent=half_sent) as stats,
        ):
            port = server.port
            await stats.all_open.wait()
            began = time.perf_counter()
            fresh = await authenticated_requests(port, requests, bound=60.0, fresh=True)
            kept = await authenticated_requests(port, requests, bound=60.0, fresh=False)
            seconds = time.perf_counter() - began
            closed = stats.closed_by_server
        for kind, latencies in (("new_connection", fresh), ("keep_alive", kept)):
            figures.append(
                Figure(
                    f"B12.flood.{name}.{kind}_p99",
                    percentile(latencies, 99) * 1e3,
                    "ms",
                    note=(
                        f"authenticated GET /runs, {kind.replace('_', ' ')}, during a flood of"
                        f" {idle} idle + {half_sent} half-sent connections,"
                        f" RLIMIT_NOFILE {nofile}, {name}"
                    ),
                    extra={
                        "answered": len(latencies),
                        "asked": requests,
                        "p50_ms": round(percentile(latencies, 50) * 1e3, 3),
                        "max_ms": round(max(latencies) * 1e3, 3),
                        "flood_closed_by_server": closed,
                        "seconds": round(seconds, 2),
                    },
                )
            )
    return figures


def main() -> None:
    if sys.argv[1:2] == ["serve"]:
        serve_main(int(sys.argv[2]), json.loads(sys.argv[3]))
        return
    for figure in trio.run(bench_b12):
        print(json.dumps(figure.to_json()), flush=True)


if __name__ == "__main__":
    main()
