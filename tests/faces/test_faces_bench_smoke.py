"""B11 runs (tiny sizes): every face's cancel, MCP's included, and the raw-socket
fan-out, in one run."""

from __future__ import annotations

import pytest

from benchmarks._common import measure_baselines
from benchmarks.faces import bench_b11

# The MCP client's HTTP transport (httpx2 over httpcore2) leaves response-body async
# generators to the collector (as in tests/faces/test_mcp_http.py): only that warning.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)2\.[^']*' was garbage collected:ResourceWarning"
)


async def test_b11_runs_every_face_with_tiny_sizes() -> None:
    base = await measure_baselines(n=200, repeats=1)
    figures = {figure.bench: figure for figure in await bench_b11(base, samples=2, deltas=5)}
    for face in ("websocket", "sse", "a2a", "agui", "mcp"):
        figure = figures[f"B11.cancel_to_terminal.{face}"]
        assert figure.extra["n"] == 2
        assert figure.value > 0
    fanout = figures["B11.sse_deltas_per_s.s100"]
    assert fanout.extra["deliveries"] == 5 * 100  # every delta to every subscriber
