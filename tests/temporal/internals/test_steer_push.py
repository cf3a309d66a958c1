"""The path of a steering op from the ``steer`` update's local activity to the attempt
(``temporal/_trio_worker.py``, ``_push.py``, ``_types.py``: private; issue 38's T2
inject): an op for an attempt of the worker that runs the local activity is handed to
its Trio thread directly (the usual case where the server dispatches activities eagerly:
the attempt's activity goes to the worker that scheduled it, which keeps the run's
workflow tasks), and answers as the listener would; one for an attempt of another worker
goes over the loopback push, one JSON line each way. The payloads the workflow converts
carry evaluated annotations (their conversion is on that path four times). Every wait is
bounded; none measures time."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
import trio

import trio_agents as ta
from tests.support.temporal_support import GatedAgent, embedded_temporal_host, until_event
from trio_agents.hosting import Limits, Origin, StartRequest
from trio_agents.temporal import _trio_worker, _types
from trio_agents.temporal._asyncio_loop import AsyncioLoop
from trio_agents.temporal._push import push_op, serve_ops
from trio_agents.temporal._types import OpAnswer, SteeringOp

LIMITS = Limits(start_rate=1_000, start_burst=1_000, max_runs_per_principal=1_000)
ALICE = Origin(principal="alice")


@pytest.mark.temporal
async def test_an_op_for_an_attempt_of_this_worker_is_applied_without_the_loopback_push(
    temporal_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def unreachable(address: str, run_id: str, op: SteeringOp) -> OpAnswer:
        raise ConnectionRefusedError(f"the loopback push to {address} was used")

    # Were the push to go over loopback, the op would answer "recorded, the attempt is
    # unreachable" (pending) and the injection id would be the host's "pending-<n>".
    monkeypatch.setattr(_trio_worker, "push_op", unreachable)
    gated = GatedAgent()
    called, gate, model, agents = gated.called, gated.gate, gated.model, gated.agents
    start = StartRequest(agent="a", input=(ta.UserMessage("go"),))
    with trio.fail_after(90):
        async with embedded_temporal_host(
            temporal_server, tmp_path / "sessions.sqlite3", agents, LIMITS
        ) as host:
            run_id = await host.start(ALICE, start)
            await called.wait()
            injection_id = await host.inject("alice", run_id, (ta.UserMessage("psst"),))
            injected = await until_event(host, run_id, "inbox.injected")
            gate.set()
            assert (await host.wait_terminal("alice", run_id)).status == "completed"
    # The attempt's own answer: the id its run.inject gave, the one its event carries.
    assert not injection_id.startswith("pending-")
    assert injected.event["injection_id"] == injection_id
    seen = [item.to_json() for item in model.requests[-1].items]
    assert any("psst" in str(item.get("content")) for item in seen), seen


class _Attempt:
    """What the listener finds for a run: answers an inject with an id."""

    def __init__(self) -> None:
        self.ops: list[SteeringOp] = []

    async def apply(self, op: SteeringOp) -> OpAnswer:
        self.ops.append(op)
        return OpAnswer(ok=True, injection_id=f"inj-{len(self.ops)}")


async def test_an_op_for_an_attempt_of_another_worker_goes_over_the_loopback_push() -> None:
    attempt = _Attempt()
    runs: dict[str, Any] = {"run-1": attempt}
    loop = AsyncioLoop("test-push")
    await trio.to_thread.run_sync(loop.start)
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                address = await nursery.start(serve_ops, runs.get, "127.0.0.1")
                op = SteeringOp(op="inject", items=[{"role": "user", "content": "psst"}])

                async def both() -> tuple[OpAnswer, OpAnswer]:
                    # The local activity's push: asyncio, as on the worker's loop.
                    return (
                        await push_op(address, "run-1", op),
                        await push_op(address, "run-2", op),
                    )

                applied, elsewhere = await loop.call(both)
                nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(loop.stop)
    assert applied == OpAnswer(ok=True, injection_id="inj-1")
    assert attempt.ops == [op]
    # No attempt of that run there: recorded, for wherever the run is now.
    assert (elsewhere.ok, elsewhere.pending) == (True, True)


class _Broken:
    """An attempt whose ``apply`` fails as a malformed op does in the listener."""

    async def apply(self, op: SteeringOp) -> OpAnswer:
        raise ValueError(f"cannot apply {op.op}")


async def test_a_push_to_this_worker_answers_as_the_listener_would() -> None:
    loop = AsyncioLoop("test-push-here")
    await trio.to_thread.run_sync(loop.start)
    attempt = _Attempt()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                here = _trio_worker._TrioHere(nursery, "127.0.0.1")
                here.address = "127.0.0.1:1"  # where nothing listens: no TCP is used
                here.attempts.update({"run-1": attempt, "run-3": _Broken()})  # type: ignore[dict-item]
                activities = _trio_worker._Activities({}, None, here, None)
                op = SteeringOp(op="inject", items=[{"role": "user", "content": "psst"}])

                async def pushes() -> list[OpAnswer]:
                    # The update's local activity, on the worker's asyncio loop.
                    return [
                        await activities.push(here.address, run_id, op)
                        for run_id in ("run-1", "run-2", "run-3")
                    ]

                applied, gone, failed = await loop.call(pushes)
                nursery.cancel_scope.cancel()
    finally:
        await trio.to_thread.run_sync(loop.stop)
    assert applied == OpAnswer(ok=True, injection_id="inj-1")
    assert attempt.ops == [op]
    # No attempt of the run here any more: recorded, for wherever the run is now.
    assert (gone.ok, gone.pending, gone.message) == (True, True, "no attempt of the run here")
    # The attempt failed to apply it: recorded, for the next attempt (the listener closes
    # the connection without an answer then, which the push reads the same way).
    assert (failed.ok, failed.pending) == (True, True)
    assert failed.message is not None
    assert "cannot apply inject" in failed.message


@pytest.mark.parametrize(
    "payload",
    [
        _types.RunRequest,
        _types.RunOutcome,
        _types.SteeringOp,
        _types.OpAnswer,
        _types.AttemptStarted,
        _types.Catchup,
        _types.CallStarted,
    ],
)
def test_the_payload_dataclasses_carry_evaluated_annotations(payload: type[Any]) -> None:
    # Temporal's converter calls typing.get_type_hints on each payload it builds, which
    # compiles every string annotation again (``from __future__ import annotations``).
    assert dataclasses.is_dataclass(payload)
    assert not [name for name, hint in payload.__annotations__.items() if isinstance(hint, str)]
    assert typing.get_type_hints(payload) == payload.__annotations__


def test_a_payload_converts_as_before() -> None:
    from temporalio.converter import DataConverter

    converter = DataConverter.default.payload_converter
    op = SteeringOp(op="inject", items=[{"role": "user", "content": "psst"}], node="child")
    answer = OpAnswer(ok=False, code="run_closed", message="ended")
    assert converter.from_payloads(converter.to_payloads([op, answer]), [SteeringOp, OpAnswer]) == [
        op,
        answer,
    ]
