"""Smoke test of the TEMPORAL benchmark (T1-T4, benchmarks/temporal.py): it runs with
tiny sizes against its own dev server, workers and PostgreSQL, and reports each figure
as a number. No timing is asserted (figures live in benchmarks/RESULTS.md)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from benchmarks.__main__ import collect

if TYPE_CHECKING:
    from tests.support.pg_support import PostgresServer


async def test_the_temporal_benchmark_runs_with_tiny_sizes(
    postgres_server: PostgresServer,  # only to skip (or fail under CI) without PostgreSQL
) -> None:
    figures = await collect(("TEMPORAL",), quick=True, echo=False)
    ours = {figure.bench: figure for figure in figures if figure.bench.startswith("TEMPORAL.")}
    assert set(ours) == {
        "TEMPORAL.T1_start_to_running_seen.temporal",
        "TEMPORAL.T1_start_to_running_seen.local",
        "TEMPORAL.T1_start_to_running_seen.cluster",
        "TEMPORAL.T2_cancel_face",
        "TEMPORAL.T2_cancel_temporal_cli",
        "TEMPORAL.T2_inject_answered",
        "TEMPORAL.T2_inject_delivered",
        "TEMPORAL.T3_runs_per_s",
        "TEMPORAL.T3_memory_per_in_flight_run",
        "TEMPORAL.T4_worker_kill_to_running",
    }
    for figure in ours.values():
        assert not math.isnan(figure.value), figure
        assert figure.to_json()["bench"] == figure.bench
    assert ours["TEMPORAL.T4_worker_kill_to_running"].extra["n"] == 1
    assert ours["TEMPORAL.T3_runs_per_s"].extra["runs"] == 10
