"""Property test: random scripts x random schedules of cancels and subscribers.

An op-list drives each example (Hypothesis's stateful machines don't drive async
code): one ``trio.run`` per example on ``MockClock(autojump_threshold=0)``, so
thousands of virtual seconds cost nothing and every example replays exactly.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import attrs
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn

from .helpers import check_common_invariants

LEGAL_NEXT = {
    "queued": {"running", "cancelled", "failed"},
    "running": {"awaiting_approval", "completed", "failed", "cancelled"},
    "awaiting_approval": {"running", "failed", "cancelled"},
}


@ta.function_tool
async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@ta.function_tool
async def sleeper(seconds: float) -> str:
    """Sleep for a while."""
    await trio.sleep(seconds)
    return f"slept {seconds}"


@ta.function_tool
async def broken() -> str:
    """Always fails."""
    raise RuntimeError("broken tool")


@ta.function_tool(needs_approval=True)
async def guarded(x: int) -> int:
    """Needs a human's approval."""
    return x * 2


def tool_call() -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    return st.one_of(
        st.tuples(
            st.just("add"),
            st.fixed_dictionaries({"a": st.integers(-5, 5), "b": st.integers(-5, 5)}),
        ),
        st.tuples(
            st.just("sleeper"),
            st.fixed_dictionaries({"seconds": st.sampled_from([0.0, 0.5, 2.0, 50.0])}),
        ),
        st.tuples(st.just("broken"), st.just({})),
        st.tuples(st.just("missing"), st.just({})),
        st.tuples(st.just("guarded"), st.fixed_dictionaries({"x": st.integers(0, 9)})),
    )


@st.composite
def turns(draw: st.DrawFn) -> Turn:
    chunks = draw(st.lists(st.sampled_from(["a ", "b ", "c ", "dd "]), max_size=4))
    calls = draw(st.lists(tool_call(), max_size=3))
    delay = draw(st.sampled_from([0.0, 0.25, 1.0]))
    fail = draw(st.sampled_from([None, None, None, None, "model fell over"]))
    fail_after = draw(st.integers(0, max(len(chunks), 0))) if fail else None
    return Turn(text=chunks, tool_calls=calls, delay=delay, fail=fail, fail_after=fail_after)


OP_KINDS = [
    "cancel",
    "after_turn",
    "subscribe",
    "status_subscribe",
    "outer_cancel",
    "inject",
    "withdraw",
    "approve",
    "reject",
]


@attrs.frozen
class Op:
    at: float
    kind: str  # one of OP_KINDS
    reason: str = ""
    when: str = "next_turn"


ops = st.lists(
    st.builds(
        Op,
        at=st.sampled_from([0.0, 0.1, 0.3, 0.5, 1.0, 1.6, 2.5, 4.0, 8.0, 30.0]),
        kind=st.sampled_from(OP_KINDS),
        reason=st.sampled_from(["r1", "r2", "r3"]),
        when=st.sampled_from(["next_turn", "now", "when_idle"]),
    ),
    max_size=8,
)


def live_run_tasks(run_id: str) -> list[str]:
    names: list[str] = []

    def walk(task: trio.lowlevel.Task) -> None:
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                if child.name.startswith(run_id):
                    names.append(child.name)
                walk(child)

    walk(trio.lowlevel.current_root_task())  # type: ignore[arg-type]
    return names


@settings(max_examples=250)
@given(script=st.lists(turns(), min_size=1, max_size=4), schedule=ops, max_turns=st.integers(1, 5))
def test_any_schedule_keeps_the_lifecycle_rules(
    script: list[Turn], schedule: list[Op], max_turns: int
) -> None:
    model = ScriptedModel(script, default="the end")
    agent = ta.Agent(
        name="p", model=model, tools=[add, sleeper, broken, guarded], max_turns=max_turns
    )
    seen_by_subscribers: list[list[ta.RunEvent]] = []
    seen_statuses: list[list[ta.RunUpdated]] = []
    first_cancel: list[Op] = []
    outer_at: list[float] = []
    accepted: dict[str, tuple[str, tuple[ta.Item, ...]]] = {}  # id -> (when, items)
    withdrawn: set[str] = set()

    async def subscriber(run: ta.Run) -> None:
        seen_by_subscribers.append([e async for e in run.events()])

    async def status_subscriber(run: ta.Run) -> None:
        seen_statuses.append([u async for u in run.updated])

    async def approve_the_rest(run: ta.Run) -> None:
        async for update in run.updated:
            if update.status == ta.RunStatus.AWAITING_APPROVAL:
                for call_id in run.statistics().pending_approvals:
                    with contextlib.suppress(ta.UnknownCallError, ta.RunClosedError):
                        run.approve(call_id)

    async def main() -> ta.Run:
        handle: list[ta.Run] = []
        with trio.CancelScope() as outer:
            async with ta.open_run(agent, "go") as run, trio.open_nursery() as nursery:
                handle.append(run)
                for op in sorted(schedule, key=lambda o: o.at):
                    await trio.sleep_until(op.at)
                    if op.kind in ("cancel", "after_turn"):
                        if run.result is None and not first_cancel:
                            first_cancel.append(op)
                        run.cancel(
                            op.reason, mode="immediate" if op.kind == "cancel" else "after_turn"
                        )
                    elif op.kind == "subscribe":
                        nursery.start_soon(subscriber, run)
                    elif op.kind == "status_subscribe":
                        nursery.start_soon(status_subscriber, run)
                    elif op.kind == "inject":
                        text = f"injected {len(accepted)}"
                        try:
                            injection = run.inject(text, when=op.when)  # type: ignore[arg-type]
                        except ta.RunClosedError:
                            assert run.status.is_terminal or run.result is None
                        else:
                            accepted[injection] = (op.when, (ta.UserMessage(text),))
                    elif op.kind == "withdraw":
                        if accepted:
                            last = list(accepted)[-1]
                            if run.withdraw(last):
                                withdrawn.add(last)
                    elif op.kind in ("approve", "reject"):
                        pending = run.statistics().pending_approvals
                        if pending:
                            if op.kind == "approve":
                                run.approve(pending[0])
                            else:
                                run.reject(pending[0], message=op.reason)
                    else:
                        outer_at.append(trio.current_time())
                        outer.cancel()
                # Nobody else will answer approvals now: grant what still waits, or a
                # guarded call would hold the run open forever.
                nursery.start_soon(approve_the_rest, run)
        run = handle[0]
        await run.wait()
        assert live_run_tasks(run.id) == []
        return run

    run = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    result = run.result
    assert result is not None
    events = [e for e in trio.run(_collect, run)]
    check_common_invariants(result, events)
    updates = [e.status.value for e in events if isinstance(e, ta.RunUpdated)]
    assert updates[0] == "queued"
    for before, after in itertools.pairwise(updates):
        assert after in LEGAL_NEXT[before], updates
    for seen in seen_by_subscribers:
        assert seen == events[-len(seen) :] if seen else True
        assert seen[-1] == events[-1]
    for statuses in seen_statuses:
        assert statuses[-1] == events[-1]
    if result.status == "cancelled":
        allowed = {"parent cancelled"} | {op.reason for op in first_cancel}
        assert result.reason in allowed, (result.reason, allowed)
        if result.reason == "parent cancelled":
            assert outer_at
    if result.status == "completed":
        assert result.final_output is not None
    assert model.open_streams == 0
    check_injection_accounting(result, events, accepted, withdrawn)


def check_injection_accounting(
    result: ta.RunResult,
    events: list[ta.RunEvent],
    accepted: dict[str, tuple[str, tuple[ta.Item, ...]]],
    withdrawn: set[str],
) -> None:
    """Every accepted injection is delivered once or unconsumed, never both or neither."""
    delivered = [e.injection_id for e in events if isinstance(e, ta.InboxDelivered)]
    assert len(delivered) == len(set(delivered)), "an injection was delivered twice"
    assert not set(delivered) & withdrawn, "a withdrawn injection was delivered"
    expected_unconsumed = [
        item
        for injection_id, (_, items) in accepted.items()
        if injection_id not in withdrawn and injection_id not in delivered
        for item in items
    ]
    assert list(result.unconsumed) == expected_unconsumed
    for injection_id in delivered:
        for item in accepted[injection_id][1]:
            assert result.new_items.count(item) == 1
    # order is preserved within each mode (steering, follow-ups)
    order = list(accepted)
    for steering in (True, False):
        ids = [i for i in delivered if (accepted[i][0] != "when_idle") == steering]
        assert ids == sorted(ids, key=order.index)


async def _collect(run: ta.Run) -> list[ta.RunEvent]:
    return [e async for e in run.events()]
