"""``_push.serve_ops``: the listener on a worker that applies pushed steering ops. It
shares its nursery with every attempt the worker runs, so an op whose application
raises must be answered (``internal``), never take the listener, or the worker, down."""

from __future__ import annotations

import asyncio
import socket
from types import SimpleNamespace

import pytest
import trio

from trio_agents.temporal import _trio_worker
from trio_agents.temporal._push import push_op_here, serve_ops
from trio_agents.temporal._types import OpAnswer, SteeringOp


class Attempt:
    """A run's attempt whose ``apply`` raises for an approve (as a bug or a schema an
    approve's content check could not read once did), and answers everything else."""

    def __init__(self) -> None:
        self.applied: list[str] = []

    async def apply(self, op: SteeringOp) -> OpAnswer:
        self.applied.append(op.op)
        if op.op == "approve":
            raise AttributeError("'str' object has no attribute 'get'")
        return OpAnswer(ok=True, injection_id="inj-1")


async def test_an_op_that_raises_is_answered_internal_and_the_listener_stays() -> None:
    attempt = Attempt()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_ops, lambda run_id: attempt, "127.0.0.1")
        answer = await push_op_here(address, "r1", SteeringOp(op="approve", target="c1"))
        assert not answer.ok
        assert answer.code == "internal"
        assert answer.message is not None
        assert "AttributeError" in answer.message
        # The listener (and so the worker's nursery) is still there.
        answer = await push_op_here(address, "r1", SteeringOp(op="inject", items=[]))
        assert answer.ok
        assert answer.injection_id == "inj-1"
        assert attempt.applied == ["approve", "inject"]
        nursery.cancel_scope.cancel()


async def test_an_op_without_the_workers_key_steers_nothing() -> None:
    """The listener is reachable from other machines: only a push with the key its
    address holds (kept in the workflow's history and the shared store) is applied;
    anything else is answered as if no attempt of the run were here."""
    attempt = Attempt()
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_ops, lambda run_id: attempt, "127.0.0.1")
        key, _, place = address.rpartition("@")
        assert len(key) >= 32
        inject = SteeringOp(op="inject", items=[])
        for forged in (place, f"wrong{key}@{place}", f"@{place}", f"{key[:-1]}@{place}"):
            answer = await push_op_here(forged, "r1", inject)
            assert answer.ok
            assert answer.pending
        # A request that is no JSON object, or one with no key field at all.
        host, _, port = place.rpartition(":")
        for line in (b"[1, 2]\n", b'{"run_id": "r1", "op": {"op": "inject"}}\n'):
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                await stream.send_all(line)
                said = await stream.receive_some()
            assert b'"pending": true' in said
        assert attempt.applied == []
        assert (await push_op_here(address, "r1", inject)).injection_id == "inj-1"
        assert attempt.applied == ["inject"]
        nursery.cancel_scope.cancel()


def test_a_push_to_a_frozen_worker_answers_pending_within_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A frozen worker's kernel still completes the connection (its listen backlog) but
    nothing answers: the update's push gives up within its bound, below the local
    activity's timeout, and answers pending (the op stays recorded for where the run
    goes next) rather than failing the update."""
    monkeypatch.setattr(_trio_worker, "_PUSH_BOUND", 0.2)
    frozen = socket.socket()
    frozen.bind(("127.0.0.1", 0))
    frozen.listen(8)  # never accepted, never answered
    port = frozen.getsockname()[1]
    activities = _trio_worker._Activities({}, None, SimpleNamespace(address="k@elsewhere:1"), None)  # type: ignore[arg-type]
    try:
        answer = asyncio.run(
            activities.push(f"key@127.0.0.1:{port}", "r1", SteeringOp(op="inject", items=[]))
        )
    finally:
        frozen.close()
    assert answer.ok
    assert answer.pending
    assert "unreachable" in (answer.message or "")
