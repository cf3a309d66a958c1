"""Smoke test: every benchmark workload runs with tiny sizes. No timing is asserted."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from benchmarks.__main__ import ALL, collect
from benchmarks._common import environment
from benchmarks.models import m1_workload
from benchmarks.report import write_markdown
from benchmarks.tree import b9_workload

if TYPE_CHECKING:
    from tests.support.pg_support import PostgresServer

# B7 and B10 (clusters of node processes) and TT (forks on PostgreSQL too) need
# PostgreSQL: their own tests, below.
LOCAL = tuple(name for name in ALL if name not in ("B7", "B10", "TT"))


# B11's MCP row drives the official `mcp` client, whose HTTP transport (httpx2 over
# httpcore2) leaves response-body async generators to the collector (as in
# tests/faces/test_mcp_http.py): only that warning, only from httpx2/httpcore2.
@pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)2\.[^']*' was garbage collected:ResourceWarning"
)
async def test_every_workload_runs_with_tiny_sizes(tmp_path: Path) -> None:
    figures = await collect(LOCAL, quick=True, echo=False)
    names = {figure.bench.split(".", 1)[0] for figure in figures}
    assert names == {"baseline", *LOCAL}
    for figure in figures:
        assert not math.isnan(figure.value), figure
        assert figure.to_json()["bench"] == figure.bench
    # The run-tree workloads (issue 25): B8's trees were cancelled (each checked: every
    # node cancelled), B9 ran in-process (no callgrind in quick mode), F1 counted.
    trees = {f.bench for f in figures if f.bench.split(".", 1)[0] in ("B8", "B9", "F1")}
    assert trees == {
        "B8.tree_cancel_to_terminal",
        "B8.single_cancel_to_terminal",
        "B9.wall_per_tree",
        "F1.memory_per_child",
    }
    by_name = {figure.bench: figure for figure in figures}
    assert by_name["B8.tree_cancel_to_terminal"].extra["n"] == 3
    assert by_name["F1.memory_per_child"].extra["child_objects"] > 0
    report = tmp_path / "RESULTS.md"
    write_markdown(report, {**environment(), "duration_s": 0.0, "quick": True}, figures)
    text = report.read_text()
    assert "## Issue 25 targets (run trees)" in text
    assert "| B8 tree cancel p99 (13 runs) | not measured |" not in text
    assert "| F1 fan-out: memory per in-flight child | not measured |" not in text


@pytest.mark.parametrize("mode", ["b9_tree", "b9_separate"])
async def test_the_child_overhead_callgrind_workloads_run(mode: str) -> None:
    # What B9's callgrind children run (benchmarks.instructions --child b9_*), tiny.
    await b9_workload(mode, 2, largest=2)


@pytest.mark.parametrize("mode", ["m1_bare", "m1_fallback"])
async def test_the_fallback_callgrind_workloads_run(mode: str) -> None:
    # What M1's callgrind children run (benchmarks.instructions --child m1_*), tiny.
    await m1_workload(mode, 2)


async def test_m1_and_m2_report_their_figures_against_their_targets() -> None:
    figures = {
        figure.bench: figure for figure in await collect(("M1", "M2"), quick=True, echo=False)
    }
    # Quick mode runs no callgrind: M1's instruction figure is the full run's only.
    m1 = figures["M1.fallback_overhead_per_request"]
    assert m1.target is not None
    assert m1.extra["w2_us"] > 0
    assert figures["M2.wall_vs_ideal"].target == 1.05
    assert figures["M2.cancel_waiting_run"].target == 1.0


async def figure_names(bench: str) -> set[str]:
    """Run one benchmark with tiny sizes: the names of its figures, each a number."""
    figures = await collect((bench,), quick=True, echo=False)
    for figure in figures:
        assert not math.isnan(figure.value), figure
    return {figure.bench for figure in figures if figure.bench.startswith(f"{bench}.")}


# The workloads on clusters of node processes, and the figures each reports.
CLUSTER_WORKLOADS = [
    pytest.param(
        "B7",
        {
            "B7.runs_per_s.nodes1",
            "B7.runs_per_s.nodes3",
            "B7.statements_per_run.nodes1",
            "B7.statements_per_run.nodes3",
            "B7.cancel_to_terminal.same_node.nodes1",
            "B7.cancel_to_terminal.same_node.nodes3",
            "B7.cancel_to_terminal.routed",
            "B7.takeover_after_kill",
        },
        id="B7-cluster",
    ),
    pytest.param(
        "B10",
        {
            "B10.takeover_after_kill",
            "B10.takeover_after_freeze",
            "B10.takeover_after_freeze_in_flush",
        },
        id="B10-failover",
    ),
    pytest.param(
        "TT",
        {
            "TT.fork_200.sqlite",
            "TT.fork_200.sqlite.at_half",
            "TT.fork_200.postgres",
            "TT.fork_200.postgres.at_half",
            "TT.record_requests_off_events",
            "TT.record_requests_off_cost",
            "TT.record_requests_on_per_request",
        },
        id="TT-time-travel",
    ),
]


@pytest.mark.parametrize(("bench", "names"), CLUSTER_WORKLOADS)
async def test_the_cluster_workloads_run_with_tiny_sizes(
    postgres_server: PostgresServer,  # only to skip (or fail under CI) without PostgreSQL
    bench: str,
    names: set[str],
) -> None:
    assert await figure_names(bench) == names


async def test_the_policies_instruction_workload_runs_with_tiny_sizes() -> None:
    # What the PI callgrind children run (valgrind itself is too slow for the suite).
    import trio_agents as ta
    from benchmarks import policies
    from trio_agents.models import ScriptedModel, Turn

    for mode in policies.PI_MODES:
        await policies._workload(mode, 5)
    # The stripped mode's patch is undone: a run keeps its streamed text again (the
    # stripped stream loop keeps none).
    after = ta.Agent(name="after", model=ScriptedModel([Turn(text=["x"] * 3)]))
    assert (await ta.run(after, "go")).final_output == "xxx"
    assert await policies.parallel_guardrail_duration(0.0, 0.0) >= 0.0
