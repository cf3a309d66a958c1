"""The REST + SSE face on every node of a cluster (issue 27 item 5): a run started with
``POST /runs`` on node 1 and followed there, its event stream re-attached on node 3
with ``Last-Event-ID``, cancelled with ``?wait=1`` on node 2 — no gap, no duplicate;
a session's run cancelled with ``POST /sessions/{id}/cancel`` on a node that does not
run it.

Real ``trio-agents serve --cluster`` processes (tests/support/process_cluster.py) on the
suite's PostgreSQL; the agent is tests/support/cluster_app.py's ``worker``, whose
``charge`` tool blocks on a gate the test never opens. ``trio.fail_after`` is a hang
guard only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio

from tests.support.faces_cluster import FacesCluster, faces_cluster

# Leaving an SSE stream mid-way abandons httpx's nested body generators (CONVENTIONS,
# "httpx aiter_lines()"): exactly those warnings, nothing else.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:Async generator 'http(core|x)\._[^']*' was garbage collected:ResourceWarning"
)


class _Stream:
    def __init__(self, lines: AsyncIterator[str]) -> None:
        self._lines = lines

    async def next(self) -> tuple[str | None, dict[str, Any]] | None:
        event_id: str | None = None
        data: list[str] = []
        async for line in self._lines:
            if line == "":
                if data:
                    return event_id, json.loads("\n".join(data))
                event_id = None
            elif line.startswith("id: "):
                event_id = line[4:]
            elif line.startswith("data: "):
                data.append(line[6:])
        return None


@asynccontextmanager
async def _events(
    http: httpx.AsyncClient, url: str, run_id: str, last: str | None = None
) -> AsyncIterator[_Stream]:
    headers = {} if last is None else {"Last-Event-ID": last}
    async with http.stream("GET", f"{url}/runs/{run_id}/events", headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        lines = response.aiter_lines()
        try:
            yield _Stream(lines)
        finally:
            await lines.aclose()  # type: ignore[attr-defined]


async def test_rest_start_cancel_and_reattach_on_three_nodes(pg_dsn: str) -> None:
    async with faces_cluster(pg_dsn, 3) as nodes:
        await _scenario(nodes)


async def _scenario(nodes: FacesCluster) -> None:
    cluster, (one, two, three) = nodes.cluster, nodes.urls
    async with nodes.client() as http:
        started = await http.post(
            f"{one}/runs", json={"agent": "worker", "input": "charge #rest", "session_id": "s1"}
        )
        assert started.status_code == 201, started.text
        run_id = started.json()["run_id"]
        # Node 1: follow until the tool runs, then leave.
        last_id = None
        async with _events(http, one, run_id) as stream:
            while (got := await stream.next()) is not None:
                last_id, data = got
                if data["event"]["type"] == "tool.started":
                    break
        assert last_id is not None
        await cluster.wait_executions(1, "charge", run_id)
        # Every node knows the run, owned by the same principal.
        for url in (one, two, three):
            answer = await http.get(f"{url}/runs/{run_id}")
            assert answer.status_code == 200, (url, answer.text)
            assert answer.json()["run"]["status"] == "running"
        # Node 3: re-attach after the last event seen; node 2: cancel with ?wait=1.
        answers: list[httpx.Response] = []
        later: list[dict[str, Any]] = []

        async def cancel() -> None:
            answers.append(
                await http.post(
                    f"{two}/runs/{run_id}/cancel?wait=1", json={"reason": "from node 2"}
                )
            )

        async with _events(http, three, run_id, last_id) as stream, trio.open_nursery() as nursery:
            nursery.start_soon(cancel)
            while (got := await stream.next()) is not None:
                event_id, data = got
                assert event_id == str(data["seq"])
                later.append(data)
        assert answers[0].status_code == 200, answers[0].text
        assert answers[0].json()["run"]["status"] == "cancelled"
        seqs = [data["seq"] for data in later]
        assert seqs == list(range(int(last_id) + 1, seqs[-1] + 1))
        final = later[-1]["event"]
        assert (final["type"], final["status"]) == ("run.updated", "cancelled")
        for url in (one, two, three):
            answer = await http.get(f"{url}/runs/{run_id}")
            assert answer.json()["run"]["status"] == "cancelled"

        # A session's run, cancelled over REST on another node (and waited for there).
        second = await http.post(
            f"{three}/runs",
            json={"agent": "worker", "input": "charge #session", "session_id": "s2"},
        )
        assert second.status_code == 201, second.text
        second_id = second.json()["run_id"]
        await cluster.wait_executions(1, "charge", second_id)
        for url in (one, two):
            answer = await http.post(
                f"{url}/sessions/s2/cancel?wait=1", json={"reason": "session stop"}
            )
            if answer.status_code == 200:
                assert answer.json()["run"]["run_id"] == second_id
                assert answer.json()["run"]["status"] == "cancelled"
            else:  # cancelled already by the first node asked
                assert answer.json()["error"]["code"] == "no_active_run", answer.text
        for url in (one, two, three):
            answer = await http.get(f"{url}/runs/{second_id}")
            assert answer.json()["run"]["status"] == "cancelled"


async def test_hostile_run_ids_are_not_found_on_every_node(pg_dsn: str) -> None:
    # Path ids reach the host unvalidated by the request frames' checks: a NUL (which
    # PostgreSQL text refuses), a lone surrogate's escape, a huge id.
    async with faces_cluster(pg_dsn, 2) as nodes, nodes.client() as http:
        for url in nodes.urls:
            for run_id in ("a%00b", "%ED%A0%80", "x" * 5000, "..%2F..%2Fetc"):
                for method, path in [
                    ("GET", "/runs/{id}"),
                    ("GET", "/runs/{id}/events"),
                    ("POST", "/runs/{id}/cancel"),
                    ("POST", "/runs/{id}/approve"),
                ]:
                    body = {"call_id": "c1"} if path.endswith("approve") else {}
                    answer = await http.request(
                        method, url + path.replace("{id}", run_id), json=body
                    )
                    assert answer.status_code in (400, 404), (
                        method,
                        path,
                        run_id[:20],
                        answer.status_code,
                        answer.text[:300],
                    )
            answer = await http.post(f"{url}/sessions/a%00b/cancel", json={})
            assert answer.status_code in (400, 409), answer.text[:300]
