"""The A2A face on every node of a cluster (issue 27 item 5): a task started over A2A
on node 1, followed over SSE there, re-subscribed on node 3 mid-run, cancelled with
``CancelTask`` on node 2 — each node answers for the run another node runs.

Real ``trio-agents serve --cluster`` processes (tests/support/process_cluster.py) on the
suite's PostgreSQL; the agent is tests/support/cluster_app.py's ``worker``, whose
``charge`` tool records its execution and then blocks on a gate the test never opens.
Waits are on observable facts, bounded by ``trio.fail_after`` as a hang guard only.
"""

from __future__ import annotations

from typing import Any

import httpx
import trio

from tests.support.a2a_support import sse, text_message
from tests.support.faces_cluster import BOUND, FacesCluster, faces_cluster


async def _rpc(url: str, token: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(BOUND)) as client:
        answer = await client.post(
            f"{url}/a2a",
            json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
            headers={"Authorization": f"Bearer {token}"},
        )
    return dict(answer.json())


def _seq(result: dict[str, Any]) -> int:
    for key in ("task", "statusUpdate", "artifactUpdate"):
        if key in result:
            return int(result[key]["metadata"]["seq"])
    raise AssertionError(result)


async def test_start_on_one_node_cancel_on_another_resubscribe_on_a_third(pg_dsn: str) -> None:
    async with faces_cluster(pg_dsn, 3) as nodes:
        await _scenario(nodes)


async def _scenario(nodes: FacesCluster) -> None:
    cluster, (one, two, three), auth = nodes.cluster, nodes.urls, nodes.auth
    params = {"message": text_message("charge #a2a"), "metadata": {"agent": "worker"}}
    # Node 1: start the task with a stream, and leave once the tool runs.
    async with sse(one, "SendStreamingMessage", params, headers=auth) as stream:
        first = await stream.next()
        assert first is not None
        task_id = first["result"]["task"]["id"]
        seen = [first["result"]]
        while (message := await stream.next()) is not None:
            seen.append(message["result"])
            update = message["result"].get("statusUpdate")
            if update and update["metadata"]["type"] == "tool.started":
                break
    await cluster.wait_executions(1, "charge", task_id)

    # Node 3: re-subscribe mid-run; node 2: cancel while node 3 streams.
    answers: list[dict[str, Any]] = []
    async with sse(three, "SubscribeToTask", {"id": task_id}, headers=auth) as stream:
        snapshot = await stream.next()
        assert snapshot is not None
        task = snapshot["result"]["task"]
        assert task["status"]["state"] == "TASK_STATE_WORKING"
        assert _seq(snapshot["result"]) >= _seq(seen[-1])
        async with trio.open_nursery() as nursery:

            async def cancel() -> None:
                answers.append(
                    await _rpc(
                        two,
                        cluster.token,
                        "CancelTask",
                        {"id": task_id, "metadata": {"reason": "stopped on node 2"}},
                    )
                )

            nursery.start_soon(cancel)
            later = await stream.rest()

    # CancelTask on node 2 answered once the run (on node 1) had stopped.
    canceled = answers[0]["result"]
    assert canceled["id"] == task_id
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED"
    assert canceled["status"]["message"]["parts"][0]["text"] == "stopped on node 2"
    # Node 3's stream: every event after the snapshot, once, ending canceled.
    seqs = [_seq(m["result"]) for m in later]
    assert seqs == list(range(_seq(snapshot["result"]) + 1, seqs[-1] + 1))
    last = later[-1]["result"]["statusUpdate"]
    assert last["status"]["state"] == "TASK_STATE_CANCELED"
    # Every node tells the same story; a finished task is not cancelable anywhere.
    for url in (one, two, three):
        got = await _rpc(url, cluster.token, "GetTask", {"id": task_id})
        assert got["result"]["status"]["state"] == "TASK_STATE_CANCELED"
        again = await _rpc(url, cluster.token, "CancelTask", {"id": task_id})
        assert again["error"]["code"] == -32002
        listed = await _rpc(url, cluster.token, "ListTasks", {})
        assert [t["id"] for t in listed["result"]["tasks"]] == [task_id]
