"""Smoke test: every benchmark workload runs with tiny sizes. No timing is asserted."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from benchmarks.__main__ import ALL, collect

if TYPE_CHECKING:
    from .pg_support import PostgresServer

# B7 (a cluster of node processes) needs PostgreSQL: its own test, below.
LOCAL = tuple(name for name in ALL if name != "B7")


async def test_every_workload_runs_with_tiny_sizes() -> None:
    figures = await collect(LOCAL, quick=True, echo=False)
    names = {figure.bench.split(".", 1)[0] for figure in figures}
    assert names == {"baseline", *LOCAL}
    for figure in figures:
        assert not math.isnan(figure.value), figure
        assert figure.to_json()["bench"] == figure.bench


async def test_the_cluster_workload_runs_with_tiny_sizes(
    postgres_server: PostgresServer,  # only to skip (or fail under CI) without PostgreSQL
) -> None:
    figures = await collect(("B7",), quick=True, echo=False)
    names = {figure.bench for figure in figures if figure.bench.startswith("B7.")}
    assert names == {
        "B7.runs_per_s.nodes1",
        "B7.runs_per_s.nodes3",
        "B7.statements_per_run.nodes1",
        "B7.statements_per_run.nodes3",
        "B7.cancel_to_terminal.same_node.nodes1",
        "B7.cancel_to_terminal.same_node.nodes3",
        "B7.cancel_to_terminal.routed",
        "B7.takeover_after_kill",
    }
    for figure in figures:
        assert not math.isnan(figure.value), figure


async def test_the_policies_instruction_workload_runs_with_tiny_sizes() -> None:
    # What the PI callgrind children run (valgrind itself is too slow for the suite).
    from benchmarks import policies

    for mode in ("plain", "gate"):
        await policies._workload(mode, 5)
    assert await policies.parallel_guardrail_duration(0.0, 0.0) >= 0.0
