"""``hosting.serve``: any faces over any host, through public API only (DESIGN §20).

Every face (the websocket channel, REST + SSE, A2A, AG-UI, the web UI) over one
``LocalHost``, each seeing the runs the others start; a clustered server with no
websocket face at all (the cluster's host, the REST face only); a face that cannot
listen stops the server with its own error. Real loopback sockets, a real PostgreSQL;
``trio.fail_after`` is a hang guard only.
"""

from __future__ import annotations

import errno
import json
import socket

import httpx
import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.http_support import AGENTS, TOKENS, bearer
from trio_agents.cluster import PostgresCluster
from trio_agents.control import WebsocketFace, connect
from trio_agents.faces import HttpFaces
from trio_agents.hosting import Limits, LocalHost, ServedFace, open_server, serve

HANG_GUARD = 60


async def _wait_status(http: httpx.AsyncClient, run_id: str, status: str) -> dict[str, object]:
    """Poll ``GET /runs/{id}`` until the run has ``status`` (a hang guard bounds it)."""
    while True:
        answer = await http.get(f"/runs/{run_id}")
        assert answer.status_code == 200, answer.text
        run: dict[str, object] = answer.json()["run"]
        if run["status"] == status:
            return run
        await trio.sleep(0.01)


async def test_serve_composes_every_face_over_a_local_host() -> None:
    host = LocalHost(AGENTS, limits=Limits(ping_interval=None))
    faces: list[ServedFace] = [WebsocketFace(auth=TOKENS), HttpFaces(auth=TOKENS)]
    with trio.fail_after(HANG_GUARD):
        async with open_server(host, faces) as (ws_port, http_port):
            base = f"http://127.0.0.1:{http_port}"
            async with httpx.AsyncClient(base_url=base, headers=bearer("tok-alice")) as http:
                # REST starts a run...
                started = await http.post("/runs", json={"agent": "blocker", "input": "hi"})
                assert started.status_code == 201, started.text
                run_id = started.json()["run_id"]
                await _wait_status(http, run_id, "running")
                # ... the websocket channel of the same host sees it and cancels it ...
                async with connect(f"ws://127.0.0.1:{ws_port}/", token="tok-alice") as client:
                    remote = client.attach(run_id)
                    assert (await remote.get()).agent == "blocker"
                    await remote.cancel("enough")
                # ... and REST reports the cancel.
                run = await _wait_status(http, run_id, "cancelled")
                assert run["reason"] == "enough"
                # A2A (its public card, an authenticated JSON-RPC call), AG-UI and the
                # web UI answer on the same port, over the same host.
                card = await http.get("/.well-known/agent-card.json")
                assert card.status_code == 200, card.text
                listed = await http.post(
                    "/a2a",
                    json={"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}},
                    headers={"A2A-Version": "1.0"},
                )
                assert listed.status_code == 200, listed.text
                task_ids = [task["id"] for task in listed.json()["result"]["tasks"]]
                assert run_id in task_ids
                agui = await http.post(
                    "/ag-ui/talker",
                    json={
                        "threadId": "t1",
                        "runId": "r1",
                        "state": {},
                        "messages": [{"id": "m1", "role": "user", "content": "hi"}],
                        "tools": [],
                        "context": [],
                        "forwardedProps": {},
                    },
                )
                assert agui.status_code == 200, agui.text
                assert '"type":"RUN_FINISHED"' in agui.text.replace(" ", "")
                page = await http.get("/ui/")
                assert page.status_code == 200
                # A run left running when the server stops...
                left = await http.post("/runs", json={"agent": "blocker", "input": "again"})
                left_id = left.json()["run_id"]
                await _wait_status(http, left_id, "running")
    # ... is cancelled by the shutdown, its repair done before serve returned.
    info = await host.get("alice", left_id)
    assert info.status is ta.RunStatus.CANCELLED
    assert info.reason == "server shutdown"


async def test_a_clustered_server_with_no_websocket_face_answers_over_rest(
    pg_dsn: str,
) -> None:
    cluster = PostgresCluster(pg_dsn, node_id="A")
    host = cluster.host(AGENTS)
    rest = HttpFaces(auth=TOKENS, faces=("rest",))
    with trio.fail_after(HANG_GUARD):
        async with trio.open_nursery() as nursery:
            (port,) = await nursery.start(serve, host, [rest])
            base = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=base, headers=bearer("tok-alice")) as http:
                started = await http.post("/runs", json={"agent": "talker", "input": "hi"})
                assert started.status_code == 201, started.text
                run_id = started.json()["run_id"]
                run = await _wait_status(http, run_id, "completed")
                assert run["agent"] == "talker"
                # The run is the cluster's: its row is in the cluster's database (its
                # status there follows at the event writer's next flush).
                with psycopg.connect(pg_dsn) as conn:
                    row = conn.execute(
                        "SELECT principal, agent FROM trio_agents_runs WHERE run_id = %s",
                        (run_id,),
                    ).fetchone()
                assert row == ("alice", "talker")
                # Only the REST face is served: no A2A route on this server.
                assert (await http.post("/a2a", json={})).status_code == 404
                # The events of the run replay over SSE from the persisted log.
                async with http.stream("GET", f"/runs/{run_id}/events") as sse:
                    seen = []
                    async for line in sse.aiter_lines():
                        if line.startswith("data: "):
                            seen.append(json.loads(line[6:])["event"]["type"])
                assert seen[0] == "run.updated"
                assert "response.text.delta" in seen
            nursery.cancel_scope.cancel()


async def test_a_face_that_cannot_listen_stops_the_server_with_its_own_error() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        host = LocalHost(AGENTS)
        ws = WebsocketFace(auth=TOKENS)
        with trio.fail_after(HANG_GUARD):
            async with trio.open_nursery() as nursery:
                # The websocket face opens (first); the HTTP face's port is in use: the
                # error is the OSError itself, not a group, and the opened face and the
                # host are shut down on the way out.
                with pytest.raises(OSError, match="in use") as caught:
                    await nursery.start(serve, host, [ws, HttpFaces(auth=TOKENS, port=port)])
        assert caught.value.errno == errno.EADDRINUSE
        assert host.closing
        assert ws.connections == 0
    finally:
        taken.close()
