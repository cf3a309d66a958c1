"""The cluster under hostile input (issue 30): no client frame can take a node down,
wedge its writer, or leave another run stuck.

Real node processes (tests/process_cluster.py) on the suite's real PostgreSQL, driven
by a raw JSON client (tests/cluster_support.py), so every frame is exactly what an
attacker could send: NUL and lone surrogates (valid JSON, ``"\\u0000"``,
``"\\ud800"``) in every string field of every op, directly on a run's owner and routed
through another node; 1 MB strings; deep JSON. The policy (docs/protocol.md): a string
holding NUL or a lone surrogate is refused with ``invalid_request`` wherever it is in a
request (PostgreSQL can store neither in text), anything else is stored faithfully,
and the node, its writer and every other run go on.
"""

from __future__ import annotations

import json
from typing import Any, Final

import trio

from .cluster_support import Client, client
from .process_cluster import Cluster, open_cluster, poll_until

BOUND: Final = 90.0  # a hang guard per test
BAD: Final = ("a\x00b", "a\ud800b", "\udfff", "\x00")


def _text(event: dict[str, Any]) -> str:
    return str(event.get("text", ""))


async def _start_held(c: Client, tag: str, **fields: Any) -> str:
    """A streaming run that blocks (after ``alpha beta``) until the ``stream`` gate."""
    answer = await c.ok("run.start", agent="worker", input=f"stream #{tag}", **fields)
    run_id = str(answer["run_id"])
    await c.ok("run.subscribe", run_id=run_id)
    await c.wait_event(run_id, lambda e: _text(e) == "beta ")
    return run_id


async def _refused(c: Client, op: str, **fields: Any) -> None:
    answer = await c.request(op, **fields)
    assert answer["type"] == "error", (op, fields, answer)
    assert answer["code"] == "invalid_request", (op, fields, answer)


async def _hostile_frames(c: Client, run_id: str, awaiting: str) -> None:
    """Every string field of every op, with each bad string."""
    for bad in BAD:
        await _refused(c, "run.cancel", run_id=run_id, reason=bad)
        await _refused(c, "run.cancel", run_id=bad)
        await _refused(c, "session.cancel", session_id=bad)
        await _refused(c, "session.cancel", session_id="s-held", reason=bad)
        await _refused(c, "run.start", agent="worker", input=bad)
        await _refused(c, "run.start", agent="worker", input=[{"type": "user", "content": bad}])
        await _refused(c, "run.start", agent=bad, input="hi")
        await _refused(c, "run.start", agent="worker", input="hi", session_id=bad)
        await _refused(c, "run.inject", run_id=run_id, items=bad)
        await _refused(c, "run.inject", run_id=bad, items="note x")
        await _refused(c, "run.withdraw", run_id=run_id, injection_id=bad)
        await _refused(c, "run.approve", run_id=awaiting, call_id=bad)
        await _refused(c, "run.approve", run_id=awaiting, call_id="call_delete_1", message=bad)
        await _refused(c, "run.reject", run_id=awaiting, call_id="call_delete_1", message=bad)
        await _refused(c, "run.reject", run_id=bad, call_id="call_delete_1")
        await _refused(c, "run.subscribe", run_id=bad)
        await _refused(c, "run.unsubscribe", run_id=bad)
        await _refused(c, "run.get", run_id=bad)
        answer = await c.request("runs.list", **{bad: 1})
        assert answer["code"] == "invalid_request", answer
    # A request id holding one is refused too (echoed as sent: JSON escapes it).
    await c.ws.send_message(json.dumps({"id": "x\ud800", "op": "runs.list"}))
    await poll_until(lambda: "x\ud800" in c.answers)
    assert c.answers.pop("x\ud800")["code"] == "invalid_request"
    # Deep JSON: too deep for the parser, or deep where a string or items are due.
    await c.ws.send_message("[" * 100_000 + "]" * 100_000)
    await c.ws.send_message('{"id": "deep", "op": "runs.list", "x": ' + "[" * 100_000)
    await poll_until(lambda: None in c.answers)
    assert c.answers.pop(None)["code"] == "invalid_json"
    deep: Any = "hi"
    for _ in range(900):
        deep = [deep]
    await _refused(c, "run.inject", run_id=run_id, items=deep)
    await _refused(c, "run.cancel", run_id=run_id, reason=deep)


async def test_hostile_strings_are_refused_and_every_run_goes_on(pg_dsn: str) -> None:
    """NUL and lone surrogates in every field, sent to the runs' owner and to another
    node (routed), are refused with ``invalid_request``: the owner stays up (a reason
    with a lone surrogate used to make its writer raise and shut it down; one with NUL
    wedged every later flush of the node; the same in a run's input made approvals
    answer ``internal``), and its runs, held meanwhile, all complete and are persisted."""
    async with open_cluster(pg_dsn, 2, lease_ttl=2.0) as cluster:
        with trio.fail_after(BOUND):
            owner, other = cluster.alive()
            async with client(owner.url, cluster.token) as a, client(other.url, cluster.token) as b:
                bystander = await _start_held(a, "by")
                victim = await _start_held(a, "vi", session_id="s-held")
                answer = await a.ok("run.start", agent="worker", input="delete #ap")
                awaiting = str(answer["run_id"])
                await a.ok("run.subscribe", run_id=awaiting)
                await a.wait_status(awaiting, "awaiting_approval")
                await _hostile_frames(a, victim, awaiting)  # on the owner
                await _hostile_frames(b, victim, awaiting)  # routed through another node
                # A 1 MB string is stored faithfully, routed (its command's args and
                # its event are too big for a NOTIFY payload: read from the table).
                big = "note " + ("\u00e9\U0001f600" + "x" * 82) * 10_000  # 1 MB as JSON
                await b.ok("run.inject", run_id=bystander, items=big)
                assert owner.running, owner.output()
                # Both nodes still serve and persist: the approval is applied, the
                # held runs finish, and the other node reads every run's end.
                await b.ok("run.approve", run_id=awaiting, call_id="call_delete_1")
                await a.ok("run.cancel", run_id=victim, reason="plain")
                cluster.open_gate("stream")
                for run_id in (bystander, awaiting):
                    terminal = await a.wait_terminal(run_id)
                    assert terminal["event"]["status"] == "completed", terminal
                await a.wait_terminal(victim)
                for run_id, status in (
                    (bystander, "completed"),
                    (awaiting, "completed"),
                    (victim, "cancelled"),
                ):
                    await b.ok("run.subscribe", run_id=run_id, from_seq=1)
                    terminal = await b.wait_terminal(run_id)
                    assert terminal["event"]["status"] == status, terminal
                    assert b.seqs(run_id) == list(range(1, len(b.seqs(run_id)) + 1))
                injected = [
                    frame["event"]
                    for frame in b.events[bystander]
                    if frame["event"]["type"] == "inbox.injected"
                ]
                assert [event["items"][0]["content"] for event in injected] == [big]
            assert owner.running and other.running, cluster.output()
    _no_tracebacks(cluster)


def _no_tracebacks(cluster: Cluster) -> None:
    for node in cluster.nodes.values():
        assert not [line for line in node.stderr if "Traceback" in line], node.output()
