"""A run tree's SSE stream on a node that does not run it (DESIGN §17, §19): ``GET
/runs/{id}/events?tree=1`` on node 2 streams the tree node 1 runs — the root's events
and its child's, from the cluster's log — and ends with the root's terminal update.

Real ``trio-agents serve --cluster`` processes (tests/support/process_cluster.py) on the
suite's PostgreSQL; the agent is tests/support/cluster_app.py's ``worker``, delegating: its
``helper`` child calls ``charge``, which blocks on a gate until the test opens it.
``trio.fail_after`` (in ``faces_cluster``) is a hang guard only.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.faces_cluster import faces_cluster

pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)\._[^']*' was garbage collected:ResourceWarning"
)

_TERMINAL = ("completed", "failed", "cancelled")


def _terminal(event: dict[str, Any]) -> bool:
    return event["type"] == "run.updated" and event["status"] in _TERMINAL


async def test_sse_tree_stream_on_another_node(pg_dsn: str) -> None:
    # Before: node 2 answered the tree stream with an error (tree events were served
    # by the node running the tree only).
    async with faces_cluster(pg_dsn, 2) as nodes:
        cluster, (one, two) = nodes.cluster, nodes.urls
        async with nodes.client() as http:
            started = await http.post(
                f"{one}/runs", json={"agent": "worker", "input": "delegate charge #sse"}
            )
            assert started.status_code == 201, started.text
            root_id = started.json()["run_id"]
            (charged,) = await cluster.wait_executions(1, "charge")
            child_id = str(charged["run_id"])
            assert child_id != root_id
            frames: list[dict[str, Any]] = []
            url = f"{two}/runs/{root_id}/events?tree=1"
            async with http.stream("GET", url) as response:
                assert response.status_code == 200, await response.aread()
                lines = response.aiter_lines()
                try:
                    async for line in lines:
                        if not line.startswith("data: "):
                            continue
                        frames.append(json.loads(line[6:]))
                        event = frames[-1]["event"]
                        if frames[-1]["run_id"] == child_id and event["type"] == "tool.started":
                            cluster.open_gate("charge")
                        if frames[-1]["run_id"] == root_id and _terminal(event):
                            break
                finally:
                    await lines.aclose()  # type: ignore[attr-defined]
            # The child's record asked on node 2 comes from node 1, which runs the tree:
            # with the child's own usage, exactly as node 1 reports it.
            here = (await http.get(f"{one}/runs/{child_id}")).json()["run"]
            there = (await http.get(f"{two}/runs/{child_id}")).json()["run"]
            assert here["usage"]["input_tokens"] > 0
            assert there["usage"] == here["usage"]
    by_run: dict[str, list[int]] = {}
    for frame in frames:
        by_run.setdefault(frame["run_id"], []).append(frame["seq"])
    assert set(by_run) == {root_id, child_id}
    for seqs in by_run.values():
        assert seqs == list(range(1, len(seqs) + 1))
    last = frames[-1]
    assert (last["run_id"], last["event"]["status"]) == (root_id, "completed")
    child_end = [f for f in frames if f["run_id"] == child_id][-1]["event"]
    assert (child_end["type"], child_end["status"]) == ("run.updated", "completed")
