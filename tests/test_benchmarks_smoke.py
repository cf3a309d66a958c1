"""Smoke test: every benchmark workload runs with tiny sizes. No timing is asserted."""

from __future__ import annotations

import math

from benchmarks.__main__ import ALL, collect


async def test_every_workload_runs_with_tiny_sizes() -> None:
    figures = await collect(ALL, quick=True, echo=False)
    names = {figure.bench.split(".", 1)[0] for figure in figures}
    assert names == {"baseline", *ALL}
    for figure in figures:
        assert not math.isnan(figure.value), figure
        assert figure.to_json()["bench"] == figure.bench
