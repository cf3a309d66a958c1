"""One attempt of a run, in the worker's Trio thread: the ordinary trio_agents run.

The attempt loads the agent by name from the worker's agents, opens the run's session
from the worker's session factory (SQLite shared by every worker on one disk today;
a ``PostgresSession`` factory is the goal: nothing here is SQLite-specific), runs
:func:`trio_agents.open_run`, and returns a JSON-able :class:`RunOutcome`. A run that
fails or is cancelled is a *result*, never an exception: only a lost attempt is
retried by Temporal.

Steering ops reach a running attempt in this thread from two sides: pushed by a
workflow update (:mod:`._push`), and a cancel from Temporal delivered through the
activity's heartbeat (:mod:`._worker`). Both go through :meth:`Attempt.apply`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, TypeAlias, final

import attrs
import trio

from .._agent import Agent
from .._events import ResponseTextDelta, RunItemEvent, RunStatus, RunUpdated
from .._exceptions import InboxFullError, RunClosedError, UnknownCallError
from .._items import AssistantMessage, Item, ToolCall, ToolResult, coerce_items
from .._resume import Resume
from .._run import CancelMode, InjectWhen, Run
from ..hosting import RunInfo
from ..hosting._policies import effective_limits
from ..sessions import Session
from ._event_writer import EventWriter
from ._fenced_session import FencedSession
from ._shared_store import SharedRunStore
from ._types import PARKED, OpAnswer, RunOutcome, RunRequest, SteeringOp

__all__ = [
    "Attempt",
    "AttemptError",
    "AttemptFenced",
    "SessionFactory",
    "decisions",
    "run_attempt",
    "sqlite_sessions",
]

SessionFactory: TypeAlias = Callable[[str, str], Session]
"""``factory(principal, session_id) -> Session``: the session a run continues. Every
worker must reach the same store (a SQLite file on one shared disk, or PostgreSQL)."""

CallBarrier: TypeAlias = Callable[[str, int], Awaitable[None]]
"""``await barrier(call_id, last_seq)``: record durably that a call starts, before its
tool runs (the run's ``before_tool`` option); raising keeps the tool from running."""


# How long a decision for a resumed child waits for the child to ask again (below the
# push's own bound).
_SETTLE_BOUND: Final = 3.0
_WHEN: Final[dict[str, InjectWhen]] = {
    "next_turn": "next_turn",
    "now": "now",
    "when_idle": "when_idle",
}


class AttemptError(Exception):
    """The attempt could not run at all (unknown agent, bad request): never retried."""


class AttemptFenced(Exception):
    """A later attempt of the run claimed it before this one began: this one must not
    run (Temporal already gave up on it)."""


async def _claim(
    store: SharedRunStore, request: RunRequest, number: int, next_seq: int, address: str | None
) -> tuple[int, tuple[str, ...]]:
    """Claim the run's writes for attempt ``number``: the seq its next event takes, and
    the tool calls earlier attempts recorded as started."""
    claim = await store.claim_attempt(
        request.run_id,
        request.principal,
        request.session_id,
        number,
        RunInfo(
            run_id=request.run_id,
            agent=request.agent,
            session_id=request.session_id,
            status=RunStatus.QUEUED,
            reason=None,
            seq=0,
        ),
        address=address,
    )
    if not claim.owned:
        raise AttemptFenced(f"a later attempt of run {request.run_id} claimed it")
    return max(next_seq, claim.next_seq), claim.started


def sqlite_sessions(path: str) -> SessionFactory:
    """A session factory over one SQLite file shared by every worker (one disk).

    The stored session id is ``json.dumps([principal, session_id])``, the control
    server's own convention, so a server over the same file sees the same sessions.
    """
    from ..sessions import SQLiteSession

    def factory(principal: str, session_id: str) -> Session:
        return SQLiteSession(path, json.dumps([principal, session_id]))

    return factory


@final
@attrs.define(eq=False)
class Attempt:
    """An attempt running in this worker's Trio thread; ops wait here until its run
    exists, so one pushed right after the attempt announced itself is not lost."""

    run_id: str
    _run: Run | None = attrs.field(init=False, default=None)
    _cancel_reason: str | None = attrs.field(init=False, default=None)
    _ready: trio.Event = attrs.field(init=False, factory=trio.Event)
    _ended: bool = attrs.field(init=False, default=False)
    _parked: bool = attrs.field(init=False, default=False)
    # A resumed run's decisions wait for this: set once the run has asked for its
    # left-open calls' approvals again (or moved on to the model, or ended).
    _settled: trio.Event | None = attrs.field(init=False, default=None)
    # The ids of the children a resumed tree makes again (Resume.children).
    _resumed_nodes: frozenset[str] = attrs.field(init=False, default=frozenset())
    handover: bool = attrs.field(init=False, default=False)
    """The attempt stops because its worker shuts down: its run goes on in the next
    attempt, so its terminal update is not the run's (not written to the store)."""
    # The answers to the recorded ops applied here, by the op's index in the workflow:
    # an update whose workflow task was lost after its push (the op reaches the
    # history only when that task completes, after the push) runs again on another
    # worker and pushes the same op, with the same index, again. Applied once.
    _answered: dict[int, tuple[SteeringOp, OpAnswer] | trio.Event] = attrs.field(
        init=False, factory=dict
    )

    def cancel(self, reason: str, *, mode: CancelMode = "immediate") -> None:
        """Cancel the run (now, or as soon as it exists). Trio thread only."""
        if self._cancel_reason is None and mode == "immediate":
            self._cancel_reason = reason
        if self._run is not None:
            self._run.cancel(reason, mode=mode)

    def started(self, run: Run) -> None:
        self._run = run
        if self._cancel_reason is not None:
            # A cancel that came before the run existed: applied before any model call.
            run.cancel(self._cancel_reason)
        self._ready.set()

    def resuming(self, nodes: frozenset[str] = frozenset()) -> trio.Event:
        """The run resumes from its session: decisions pushed to it wait until it has
        asked for its left-open calls' approvals again (the returned event, set by
        :func:`_settle`). Sooner, ``approve`` would answer ``not_found`` for a call
        that is about to wait for it, and the decision would be lost. A decision for
        one of the children ``nodes`` the resumed tree makes again waits likewise for
        that child (:func:`_settle_node`)."""
        self._settled = trio.Event()
        self._resumed_nodes = nodes
        return self._settled

    @property
    def parked(self) -> bool:
        """Whether the run parked at its approval wait (this attempt ended so)."""
        return self._parked

    def ended(self, *, parked: bool = False) -> None:
        if self._settled is not None:
            self._settled.set()
        self._ended = True
        self._parked = self._parked or parked  # the finally's ended() keeps it
        if self._parked:
            self._run = None  # kept a while to answer late pushes: not with the run
        self._ready.set()

    async def apply(self, op: SteeringOp) -> OpAnswer:
        """Apply a steering op and answer as the run does (the §10 answer); ``op.node``
        names the run of the tree it is for (None: the root). An op the workflow
        recorded (``op.index`` set) pushed here again gets its first answer, and is not
        applied twice."""
        if op.index < 0:
            return await self._apply(op)
        entry = self._answered.get(op.index)
        while isinstance(entry, trio.Event):  # an op of that index being applied
            await entry.wait()
            entry = self._answered.get(op.index)
        if entry is not None and entry[0] == op:
            return entry[1]  # the same op again (an index alone could be reused by
            # another op if the re-run workflow task ordered its updates otherwise)
        applying = self._answered[op.index] = trio.Event()
        answer: OpAnswer | None = None
        try:
            answer = await self._apply(op)
        finally:
            if answer is not None and not answer.pending:
                self._answered[op.index] = (op, answer)
            else:  # not applied here: a later push may apply it
                del self._answered[op.index]
            applying.set()
        return answer

    async def _apply(self, op: SteeringOp) -> OpAnswer:
        await self._ready.wait()
        run = self._run
        if self._parked:
            return _parked_answer()
        if run is None or self._ended:
            return OpAnswer(ok=False, code="run_closed", message="the attempt has ended")
        if op.node is not None and op.node != run.id:
            node = run.find(op.node)
            if (
                op.op in ("approve", "reject")
                and op.node in self._resumed_nodes
                and (node is None or op.target not in node.statistics().pending_approvals)
            ):
                # Bounded: a decision for a call the child no longer waits for (a
                # second click, an id already decided) must not wait for the child's
                # next event, which a long tool call delays; answered from the
                # child's state then (not_found).
                with trio.move_on_after(_SETTLE_BOUND):
                    await _settle_node(run, op.node)
                node = run.find(op.node)
            if node is None:
                return OpAnswer(ok=False, code="not_found", message=f"no run {op.node!r} here")
            run = node
        elif op.op == "cancel":
            self.cancel(op.reason or "cancelled", mode=_mode(op.mode))
            return OpAnswer(ok=True)
        if op.op == "cancel":
            if run.status.is_terminal:
                return OpAnswer(ok=False, code="run_closed", message="the run has ended")
            run.cancel(op.reason or "cancelled", mode=_mode(op.mode))
            return OpAnswer(ok=True)
        if op.op in ("approve", "reject") and self._settled is not None:
            await self._settled.wait()
        if op.op == "inject":
            if op.when not in _WHEN:
                return OpAnswer(ok=False, code="invalid_request", message=f"bad when {op.when!r}")
            try:
                injection_id = run.inject(op.items or [], when=_WHEN[op.when])
            except RunClosedError as exc:
                if exc.status == PARKED:
                    return _parked_answer()
                return OpAnswer(ok=False, code="run_closed", message=str(exc))
            except InboxFullError as exc:
                return OpAnswer(ok=False, code="inbox_full", message=str(exc))
            except (TypeError, ValueError) as exc:
                return OpAnswer(ok=False, code="invalid_request", message=str(exc))
            return OpAnswer(ok=True, injection_id=str(injection_id))
        return _decide(run, op)


def _mode(mode: str) -> CancelMode:
    return "after_turn" if mode == "after_turn" else "immediate"


def _decide(run: Run, op: SteeringOp) -> OpAnswer:
    """Apply a withdraw, an approve or a reject to ``run``; the run's answer."""
    target = op.target or ""
    try:
        if op.op == "withdraw":
            return OpAnswer(ok=True, withdrawn=run.withdraw(target))
        if op.op == "approve":
            run.approve(target, content=op.content)
            return OpAnswer(ok=True)
        if op.op == "reject":
            run.reject(target, message=op.reason)
            return OpAnswer(ok=True)
    except RunClosedError as exc:
        if exc.status == PARKED:
            return _parked_answer()
        return OpAnswer(ok=False, code="run_closed", message=str(exc))
    except UnknownCallError as exc:
        return OpAnswer(ok=False, code="not_found", message=str(exc))
    except (TypeError, ValueError) as exc:  # an approve's content refused: nothing decided
        return OpAnswer(ok=False, code="invalid_request", message=str(exc))
    return OpAnswer(ok=False, code="unknown_op", message=f"unknown op {op.op!r}")


def _parked_answer() -> OpAnswer:
    """The answer to an op that reached an attempt whose run has just parked: recorded in
    the history and not applied here, so the next attempt applies it (from its catch-up;
    a decision through its ``Resume``). Never ``run_closed``: the run goes on."""
    return OpAnswer(
        ok=True, pending=True, message="recorded; the run parked: the next attempt applies it"
    )


def decisions(ops: Sequence[SteeringOp]) -> tuple[frozenset[str], dict[str, str | None]]:
    """The approvals and rejections among a catch-up's ``ops``, for a resumed attempt's
    :class:`Resume`: the run applies each when its call asks for approval again —
    however early the op came (pushed to a run that had not reached its approval wait
    yet, ``approve`` would answer ``not_found`` and the decision would be lost). The
    first decision on a call wins, as on a live run (a second one is refused there)."""
    approved: set[str] = set()
    rejected: dict[str, str | None] = {}
    for op in ops:
        target = op.target
        if op.op not in ("approve", "reject") or not target or op.node is not None:
            continue  # a descendant's decision is applied to it by the catch-up, live
        if target in approved or target in rejected:
            continue
        if op.op == "approve":
            approved.add(target)
        else:
            rejected[target] = op.reason
    return frozenset(approved), rejected


def _resume(
    attempt: int,
    started_calls: list[str],
    next_seq: int,
    decided: Sequence[SteeringOp] = (),
    children: Mapping[tuple[str, str], tuple[str, int]] | None = None,
) -> Resume | None:
    if attempt < 2:
        return None
    approved, rejected = decisions(decided)
    return Resume(
        attempt=attempt,
        next_seq=max(next_seq, 1),
        started=frozenset(started_calls),
        reason="the worker running this call was lost",
        approved=approved,
        rejected=rejected,
        children=children or {},
    )


async def _tree_children(
    store: SharedRunStore, root_id: str
) -> dict[tuple[str, str], tuple[str, int]]:
    """The unfinished child runs earlier attempts started in the tree, from the
    ``run.child`` events in the store: ``(parent id, call id) -> (child id, its next
    seq)`` (``Resume.children``). A child the resumed tree resumes keeps its id and its
    seqs go on, so its record ends once and the ops sent to it by id still find it."""
    started: dict[tuple[str, str], list[str]] = {}
    last: dict[str, int] = {}
    ended: set[str] = set()
    after = 0
    while True:
        events, scanned = await store.events_after(root_id, after, None)
        for stored in events:
            event = stored.event
            last[stored.run_id] = max(last.get(stored.run_id, 0), stored.seq)
            if event.get("type") == "run.child" and event.get("status") == "queued":
                started.setdefault((stored.run_id, event["call_id"]), []).append(event["child_id"])
            elif event.get("type") == "run.updated" and RunStatus(event["status"]).is_terminal:
                ended.add(stored.run_id)
        if scanned == after:
            break
        after = scanned
    found = {}
    for key, ids in started.items():
        live = [child for child in ids if child not in ended]
        if live:  # (several children of one call: the latest goes on)
            found[key] = (live[-1], last.get(live[-1], 0) + 1)
    return found


def _options(
    request: RunRequest, barrier: CallBarrier | None, resume: Resume | None, holder: list[Run]
) -> dict[str, Any]:
    """The run options: the request's, the ``before_tool`` barrier (which reads the
    run's last seq from ``holder``, filled once the run exists) and the resume."""
    options = dict(request.options)
    if barrier is not None:

        async def before_tool(call: ToolCall) -> None:
            last_seq = holder[0].statistics().last_seq if holder else 0
            await barrier(call.call_id, last_seq)

        options["before_tool"] = before_tool
    if resume is not None:
        options["resume"] = resume
    if request.park_after is not None:
        options["park_after"] = request.park_after
    if request.session_id is None:
        # Only a run with a session parks (its open calls live on there): a host's
        # run_options={"park_after": ...} leaves its sessionless runs on their worker.
        options.pop("park_after", None)
    return options


async def run_attempt(
    request: RunRequest,
    *,
    attempt: Attempt,
    number: int,
    agents: Mapping[str, Agent],
    sessions: SessionFactory | None,
    barrier: CallBarrier | None = None,
    started_calls: list[str] | None = None,
    next_seq: int = 1,
    decided: Sequence[SteeringOp] = (),
    store: SharedRunStore | None = None,
    address: str | None = None,
) -> RunOutcome:
    """Run one attempt of ``request`` to its terminal update (or its park); its outcome
    as plain data. ``decided``: the catch-up's ops, whose approvals and rejections a
    resumed attempt applies through its ``Resume`` (:func:`decisions`).

    With a ``store``, the attempt first claims the run's writes there (its next seq is
    the last one written plus one; the calls recorded as started there count as started;
    ``address``, where it takes pushed ops, is recorded with the claim), and its events
    are written there as they come; it returns once the terminal update is written.

    Raises:
        AttemptError: the agent is unknown, the request is malformed, or a session was
            named but the worker has no session factory.
        AttemptFenced: a later attempt of the run already claimed it.
    """
    try:
        agent = agents.get(request.agent)
        if agent is None:
            raise AttemptError(f"no agent named {request.agent!r} on this worker")
        if store is not None:
            next_seq, stored = await _claim(store, request, number, next_seq, address)
            started_calls = [*(started_calls or []), *stored]
        if number > 1 and request.session_id is None and started_calls:
            # Nothing of the lost attempt was persisted, and one of its tools had started:
            # running the run again from its input would run that tool twice.
            return RunOutcome(
                run_id=request.run_id,
                status="failed",
                reason="interrupted: the worker running the run was lost, and a run"
                " without a session cannot resume after a tool call started",
                final_output=None,
                attempt=number,
            )
        # A run with a session resumes from it (with no input of its own); one without
        # starts again from its input (no tool had started: nothing runs twice).
        children = None
        if number > 1 and request.session_id is not None and store is not None:
            children = await _tree_children(store, request.run_id)
        resume = (
            _resume(number, started_calls or [], next_seq, decided, children)
            if request.session_id
            else None
        )
        items = [] if resume is not None else coerce_items(request.input)
        holder: list[Run] = []
        options = _options(request, barrier, resume, holder)
        session: Session | None = None
        if request.session_id is not None:
            if sessions is None:
                raise AttemptError("the run names a session but the worker has no sessions")
            session = sessions(request.principal, request.session_id)
            if store is not None:
                # A fenced attempt writes nothing more to the session either.
                session = FencedSession(session, partial(store.owns, request.run_id, number))
        if request.limits:
            options["limits"] = effective_limits(request.limits, None)
        writer = None
        if store is not None:
            writer = partial(
                EventWriter,
                store,
                attempt=number,
                principal=request.principal,
                agent_name=request.agent,
                agents=agents,
                session_id=request.session_id,
                handover=lambda: attempt.handover,
            )
        try:
            result = await _run(
                agent, items, session, request.run_id, options, attempt, holder, writer
            )
            result.attempt = number
            if result.status == PARKED:
                attempt.ended(parked=True)
        finally:
            aclose = getattr(session, "aclose", None)
            if aclose is not None:
                with trio.CancelScope(shield=True):
                    await aclose()
    finally:
        attempt.ended()
    return result


async def _run(
    agent: Agent,
    items: list[Any],
    session: Session | None,
    run_id: str,
    options: dict[str, Any],
    attempt: Attempt,
    holder: list[Run],
    writer: Callable[[Run], EventWriter] | None,
) -> RunOutcome:
    from .._entry import open_run

    resume = options.get("resume")
    settled = None
    if isinstance(resume, Resume):
        nodes = frozenset(child for child, _ in resume.children.values())
        settled = attempt.resuming(nodes)
    written: EventWriter | None = None
    async with (
        trio.open_nursery() as nursery,
        open_run(agent, items, session=session, run_id=run_id, **options) as run,
    ):
        holder.append(run)
        if writer is not None:
            written = writer(run)
            nursery.start_soon(written.run)
        attempt.started(run)
        if settled is not None:
            await _settle(run, settled)
    # open_run's block waits for the terminal update, then the nursery for the writer:
    # the outcome is returned only once the terminal update is in the store.
    if written is not None and written.fenced:
        raise AttemptFenced(f"a later attempt of run {run_id} took it over")
    result = run.result
    assert result is not None  # open_run's block waits for the terminal update
    return RunOutcome(
        run_id=run_id,
        status=PARKED if result.parked else str(result.status),
        reason=result.reason,
        final_output=_jsonable(result.final_output),
        attempt=resume.attempt if isinstance(resume, Resume) else 1,  # the caller sets it
        new_items=[item.to_json() for item in result.new_items],
        first_seq=resume.next_seq if isinstance(resume, Resume) else 1,
        pending=_open_calls(result.conversation) if result.parked else [],
        last_seq=run.statistics().last_seq,
    )


async def _settle(run: Run, settled: trio.Event) -> None:
    """Set ``settled`` once the resumed ``run`` has settled the calls its earlier attempt
    left open: it awaits approval for some (their ``approve`` now finds them), or the
    model produced something (none of them waits), or it ended. A resumed run settles
    those calls before its first model call (``_turns._start``)."""
    try:
        async for event in run.events():
            if isinstance(event, RunUpdated) and event.status is not RunStatus.RUNNING:
                if event.status is RunStatus.AWAITING_APPROVAL or event.status.is_terminal:
                    return
            elif isinstance(event, ResponseTextDelta) or (
                isinstance(event, RunItemEvent)
                and isinstance(event.item, AssistantMessage | ToolCall)
            ):
                return
    finally:
        settled.set()


async def _settle_node(root: Run, node_id: str) -> None:
    """Return once the resumed tree's child ``node_id`` has settled the calls its
    earlier attempt left open (as :func:`_settle` for the root: it awaits approval, its
    model produced something, or it ended), or the tree ended without it."""
    async for event in root.events(tree=True):
        if event.run_id != node_id:
            continue
        if isinstance(event, RunUpdated):
            if event.status is RunStatus.AWAITING_APPROVAL or event.status.is_terminal:
                return
        elif isinstance(event, ResponseTextDelta) or (
            isinstance(event, RunItemEvent) and isinstance(event.item, AssistantMessage | ToolCall)
        ):
            return


def _open_calls(conversation: Sequence[Item]) -> list[str]:
    """The ids of the calls without a result: a parked run's, awaiting approval."""
    answered = {item.call_id for item in conversation if isinstance(item, ToolResult)}
    return [
        item.call_id
        for item in conversation
        if isinstance(item, ToolCall) and item.call_id not in answered
    ]


def _jsonable(value: Any) -> Any:
    """The final output as JSON: as is when it already is, else its ``str``."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value
