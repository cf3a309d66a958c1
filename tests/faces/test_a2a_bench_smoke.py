"""The A2A part of B10 runs (tiny sizes): it is code, and code rots unless run."""

from __future__ import annotations

from benchmarks._common import measure_baselines
from benchmarks.a2a import bench_a2a_cancel


async def test_the_a2a_cancel_workload_runs_with_tiny_sizes() -> None:
    base = await measure_baselines(n=200, repeats=1)
    (figure,) = await bench_a2a_cancel(base, cancels=3)
    assert figure.bench == "B10.a2a_cancel_answered"
    assert figure.extra["n"] == 3
    assert figure.value > 0
