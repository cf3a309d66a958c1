"""``_push.serve_ops``: the listener on a worker that applies pushed steering ops. It
shares its nursery with every attempt the worker runs, so an op whose application
raises must be answered (``internal``), never take the listener, or the worker, down."""

from __future__ import annotations

import trio

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
        host, port = await nursery.start(serve_ops, lambda run_id: attempt, "127.0.0.1")
        address = f"{host}:{port}"
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
