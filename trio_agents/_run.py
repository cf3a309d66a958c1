"""The run handle, :class:`Run` (its entry points, ``open_run``, ``serve_run`` and
``run``, are in ``_entry.py``).

A run is one task (:meth:`Run._serve`, in the caller's nursery) inside one cancel scope:

- the **model-stream task** — :func:`~trio_agents._turns.drive`, the turn loop, which
  opens a child nursery for the **tool tasks** of each turn (``_toolcalls.py``);
- the **inbox** — :meth:`Run._on_injected`, a callback on the run's thread (not a task:
  issue 18), which announces injections as they are accepted and interrupts a
  streaming response for ``when="now"``. It acts only while the turn loop runs;
  before, the loop's start announces what was queued; after, what is left is
  ``unconsumed``.

The whole cancel path, in order: ``Run.cancel()`` (any thread) records one frozen
:class:`CancelRequest` under a lock (first reason wins) and, on the run's thread,
cancels :attr:`Run._scope` with that reason; every await in the run raises
``trio.Cancelled``; the scope catches it (``cancelled_caught``: our own cancel) or lets
it through (an outer cancellation: ``"parent cancelled"``); :meth:`Run._serve` turns
what happened into a :class:`~trio_agents._repair.Verdict`; the shielded, bounded
:func:`~trio_agents._repair.repair` persists; only then the terminal ``run.updated``.
``mode="after_turn"`` is read at the turn loop's one safe point instead.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from typing import Any, Literal, TypeAlias, final, overload

import attrs
import trio

from ._agent import Agent
from ._error_text import summarize
from ._events import RunChild, RunStatus
from ._exception_groups import leaves, only_cancelled
from ._exceptions import InboxFullError, RunClosedError, UsageLimitExceeded
from ._feed import TreeCursor, TreeFeed
from ._guardrails import needs_side_tasks
from ._handoffs import agent_named
from ._inbox import (
    INJECT_WHENS,
    Approval,
    Approvals,
    Inbox,
    InjectionId,
    InjectWhen,
    Parking,
    check_injection,
)
from ._items import Item, coerce_items, conversation_problems
from ._limits import WRAP_UP_MESSAGE, Budget
from ._log import EventCursor, EventLog, UpdatedStream
from ._model import Usage
from ._options import RunOptions
from ._repair import Verdict, build_result, repair
from ._result import RunResult, RunStatistics
from ._session_lock import SessionClaim, session_lock_key
from ._state import RunState
from ._text_cleaning import clean_text
from ._timeline import Timeline, timeline
from ._tools import ChildStarter
from ._turns import Completed, Failed, Outcome, Stopped, announce, drive, failure
from .sessions._base import Session

__all__ = [
    "CancelMode",
    "CancelRequest",
    "InjectWhen",
    "InjectionId",
    "Run",
    "RunInput",
]

CancelMode: TypeAlias = Literal["immediate", "after_turn"]
_CANCEL_MODES = ("immediate", "after_turn")
logger = logging.getLogger("trio_agents")
# Reasons that already name the part that failed.
_NAMED = ("tool error:", "hook error:", "session error:", "invalid conversation:")
RunInput: TypeAlias = str | Item | Mapping[str, Any] | Iterable[Any]


@final
@attrs.frozen
class CancelRequest:
    """What ``Run.cancel`` asked for: the first call's reason, the strongest mode."""

    reason: str
    mode: CancelMode


@final
class Run:
    """The handle of a running agent: watch it, steer it, stop it.

    Get one from :func:`open_run` or ``await nursery.start(serve_run, ...)``. Every
    method except :meth:`wait` is synchronous; :meth:`cancel`, :meth:`inject`,
    :meth:`withdraw`, :meth:`approve` and :meth:`reject` are also safe to call from
    any other thread.
    """

    # Slots: one handle per run in flight, and an instance dict of this size is about
    # 100 bytes more (W3 memory). Sorted here (ruff RUF023).
    __slots__ = (
        "_approvals",
        "_cancel",
        "_children",
        "_claim",
        "_done",
        "_failure",
        "_feed",
        "_inbox",
        "_live",
        "_lock",
        "_log",
        "_options",
        "_parent",
        "_parked",
        "_result",
        "_scope",
        "_session_made",
        "_side_tasks",
        "_state",
        "_thread_id",
        "_token",
        "call_id",
        "id",
        "parent_id",
        "root_id",
        "session",
    )

    def __init__(
        self,
        agent: Agent,
        input: RunInput,
        *,
        session: Session | None = None,
        run_id: str | None = None,
        options: RunOptions,
        _parent: Run | None = None,
        _call_id: str | None = None,
        _child_starter: ChildStarter | None = None,
    ) -> None:
        if not isinstance(agent, Agent):
            raise TypeError(f"agent must be an Agent, not {type(agent).__name__}")
        # Walks every agent the run can hand off to, resolving lazy targets: one that
        # cannot be resolved raises here, to the caller, before anything starts.
        self._side_tasks = needs_side_tasks(agent)
        items = _checked_start(input, session, run_id, options, _parent)
        resume = options.resume
        self.id: str = run_id or f"run_{_uuid4_hex()}"
        self.session = session
        # The run tree (§17): a child run lives inside one of its parent's tool calls.
        self._parent = _parent
        self.parent_id: str | None = None if _parent is None else _parent.id
        self.root_id: str = self.id if _parent is None else _parent.root_id
        self.call_id: str | None = _call_id
        self._children: list[Run] | None = None  # made at the first child
        self._session_made = False  # a child's session opened for it (closed after it)
        self._options = options
        start = resume.next_seq if resume is not None else 1
        self._log = EventLog(self.id, options.event_retention, start)
        # The tree's merged stream once this run is part of a tree (its log feeds it).
        self._feed: TreeFeed | None = None
        self._state = RunState(
            run_id=self.id,
            agent=agent,
            options=options,
            log=self._log,
            session=None,  # attached once the run holds it: see _attach_session
            handle=self,
            input=items,
        )
        self._inbox = Inbox(self.id, options.inbox_capacity)
        # One lock for the inbox, the approvals and the cancel request: each holds it
        # only for a few lines, never across another's.
        self._approvals = Approvals(self.id, self._inbox.lock)
        self._parked: tuple[str, ...] | None = None  # the calls it left waiting, parked
        if options.park_after is not None:
            self._state.parking = Parking(options.park_after, self._try_park)
        self._scope = trio.CancelScope()
        # Made by the first wait() before the end (most runs are never waited on: ta.run()
        # awaits the run's task itself); "done" is the log's closed flag (W3 memory).
        self._done: trio.Event | None = None
        self._result: RunResult | None = None
        self._lock = self._inbox.lock  # guards _cancel
        self._cancel: CancelRequest | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread_id: int | None = None
        self._live = False  # the turn loop runs: injections are announced at once
        self._claim: SessionClaim | None = None
        if session is not None:
            self._claim = SessionClaim(session_lock_key(session), session.session_id, self)
        # What starts the children of its calls: given by the layer above
        # (_children.py, which the run's own modules never import).
        self._state.child_starter = _child_starter
        if _parent is not None:
            self._state.on_waiting = _parent._waiting_changed
        # Usage limits (_limits.py): this run's own budget, then every ancestor's.
        # A limit passed or a guardrail tripped: the run fails with this (reason, error).
        self._failure: tuple[str, BaseException] | None = None
        inherited = () if _parent is None else _parent._state.budgets
        if options.limits is not None:
            budget = Budget(options.limits, self)
            if resume is not None:  # what the earlier attempts spent stays spent
                budget.restore(resume.spent)
            self._state.budgets = (budget, *inherited)
        else:
            self._state.budgets = inherited
        if resume is not None and resume.usage is not None:
            # The earlier attempts' calls stay the run's: its usage and cost count them.
            self._state.usage = resume.usage
        if resume is not None and resume.agent is not None and resume.agent != agent.name:
            # After a handoff the earlier attempt worked as another agent: continue as
            # it (max_turns stays the starting agent's, as in an unbroken run).
            self._state.agent = agent_named(agent, resume.agent)
        self._state.emit_status(RunStatus.QUEUED)

    # ------------------------------------------------------------------ public API

    @property
    def status(self) -> RunStatus:
        """The current status."""
        return self._state.status

    @property
    def agent(self) -> Agent:
        """The agent the run is working as: the one it started with, or the target of
        its latest handoff (``run.handoff``)."""
        return self._state.agent

    @property
    def context(self) -> Any:
        """The ``context=`` object the run was started with (inherited by child runs
        unless they were given their own); None when none was given."""
        return self._options.context

    @property
    def parent(self) -> Run | None:
        """The run this run is a child of (None at the root of a tree)."""
        return self._parent

    @property
    def children(self) -> tuple[Run, ...]:
        """The child runs this run started, live and finished, in start order."""
        return () if self._children is None else tuple(self._children)

    def find(self, run_id: str) -> Run | None:
        """The descendant run with ``run_id`` (at any depth); None for this run itself,
        an ancestor, or an id not in the subtree."""
        pending = list(self._children or ())
        while pending:
            child = pending.pop()
            if child.id == run_id:
                return child
            pending.extend(child._children or ())
        return None

    @property
    def result(self) -> RunResult | None:
        """The :class:`RunResult`, once the run is terminal; None before."""
        return self._result

    @property
    def turn(self) -> int:
        """The number of model calls started so far."""
        return self._state.turn

    @property
    def usage(self) -> Usage | None:
        """The run's own token usage and cost so far: the sum of what its model calls
        reported (its descendants' not included), equal to :attr:`RunResult.usage`
        once it is terminal; None while no model call reported any."""
        return self._state.usage

    @property
    def tree_usage(self) -> Usage | None:
        """:attr:`usage` plus every descendant run's so far, live ones included: equal
        to :attr:`RunResult.tree_usage` once the run is terminal; None while no run of
        the subtree reported any."""
        if self._result is not None:
            return self._result.tree_usage
        state = self._state
        # Ended children are in usage_below (added in the same step that set their
        # result, so none is counted twice or missed); live ones are asked.
        total = _sum_known(state.usage, state.usage_below)
        for child in self._children or ():
            if child.result is None:
                total = _sum_known(total, child.tree_usage)
        return total

    @property
    def turn_usage(self) -> Usage | None:
        """What the model call of the current turn (:attr:`turn`) reported: its tokens,
        cost and the model that answered (:attr:`Usage.model`). Read in
        :meth:`RunHooks.on_model_end <trio_agents.RunHooks.on_model_end>` it is that
        call's usage (what ``OpenTelemetryHooks`` puts on the ``chat`` span). None
        before the call reported any (a cancelled call may never); a summary's model
        call (history windows) is not included."""
        return self._state.turn_usage

    @property
    def holds_session(self) -> bool:
        """Whether this run is the active run of its session: True from when it claimed
        the session (at once, or once the run it queued behind with ``on_busy=
        "enqueue"``/``"interrupt"`` released it) until its repair is persisted, just
        before its terminal update. False for a run without a session, and while it
        waits in the session's queue."""
        return self._claim is not None and self._claim.owned

    @property
    def updated(self) -> UpdatedStream:
        """Status updates: ``async for update in run.updated``.

        Each ``async for`` is an independent subscriber: it first receives the current
        status, then every change, and ends after the terminal one. A subscriber that
        never reads never slows the run.
        """
        return UpdatedStream(self._log)

    @overload
    def events(
        self, from_seq: int | None = None, *, tree: Literal[False] = False
    ) -> EventCursor: ...

    @overload
    def events(self, from_seq: None = None, *, tree: Literal[True]) -> TreeCursor: ...

    def events(
        self, from_seq: int | None = None, *, tree: bool = False
    ) -> EventCursor | TreeCursor:
        """Every event of the run, replayable from the run's bounded log.

        ``from_seq`` is inclusive; None means the oldest retained event. The iterator
        ends after the terminal ``run.updated``; one that falls behind retention gets an
        ``events.dropped`` marker instead of the missing events. Each event is one
        checkpoint; ``run.events().batches()`` (:meth:`EventCursor.batches`) takes every
        event that is ready in one.

        ``tree=True`` yields the events of this run and of every descendant, merged in
        the order they happened, each with its own ``run_id`` and per-run ``seq``
        (:class:`~trio_agents._feed.TreeCursor`; no ``from_seq``). It ends after this
        run's own terminal update, which comes after every descendant's.
        """
        if tree:
            if from_seq is not None:
                raise ValueError("events(tree=True) replays from the oldest retained event")
            return TreeCursor(self._tree_feed(), self._log)
        return EventCursor(self._log, from_seq)

    def timeline(self) -> Timeline:
        """The :class:`Timeline` of this run's subtree as of now: a span for every model
        call, tool call and child run (start, end, status, tokens, cost, which model),
        derived from the retained events of the run and its descendants by
        :func:`~trio_agents.timeline` (DESIGN §23). Sync, a snapshot: a live run's
        running calls are open spans; a finished tree's spans are all closed."""
        feed = self._feed
        events: list[Any]
        if feed is None:
            events = self._log.retained()  # no child ever started: its log is its tree
        else:
            # The tree's merged stream, this run's subtree of it (what events(tree=True)
            # replays).
            events = [feed.get(p) for p in range(feed.first, feed.end)]
            events = [e for e in events if feed.below(e.run_id, self.id)]
        names: dict[str, str] = {}
        stack: list[Run] = [self]
        while stack:
            node = stack.pop()
            names[node.id] = node.agent.name
            stack.extend(node.children)
        return timeline(events, names=names)

    async def wait(self) -> RunResult:
        """Wait for the run to end and return its result (never raises for a failed or
        cancelled run: see ``result.status``)."""
        if self._log.closed:
            await trio.lowlevel.checkpoint()
        else:
            if self._done is None:
                self._done = trio.Event()
            await self._done.wait()
        assert self._result is not None
        return self._result

    def cancel(self, reason: str | None = None, *, mode: CancelMode = "immediate") -> None:
        """Cancel the run. Sync, idempotent, never blocks, safe from any thread.

        ``mode="immediate"`` cancels the run's scope: every await in the run is
        cancelled at once, then the bounded repair runs. ``mode="after_turn"`` lets the
        current turn (model and tools) finish and stops before the next model call. The
        first call's reason is kept; a later immediate cancel escalates an after_turn one.
        The reason is cleaned as items are (a lone surrogate becomes U+FFFD): it goes
        into the run's terminal update and result, which every face sends as UTF-8.
        """
        if mode not in _CANCEL_MODES:
            raise ValueError(f"mode must be 'immediate' or 'after_turn', not {mode!r}")
        if reason is not None and not isinstance(reason, str):
            raise TypeError(f"reason must be a str or None, not {type(reason).__name__}")
        with self._lock:
            current = self._cancel
            if current is not None and (current.mode == "immediate" or mode == "after_turn"):
                return
            # Cleaned here, where it enters (a lone surrogate would fail every answer
            # that reports the run: its terminal update, GET /runs, A2A GetTask, ...).
            kept = current.reason if current is not None else clean_text(reason or "cancelled")
            self._cancel = CancelRequest(kept, mode)
        if mode == "immediate":
            self._call_soon(self._apply_cancel)

    def inject(self, items: RunInput, *, when: InjectWhen = "next_turn") -> InjectionId:
        """Add items to the running conversation. Sync, safe from any thread.

        ``when="next_turn"`` delivers them at the next safe point (before the next model
        call, after every result of the current turn); ``"now"`` also interrupts a
        streaming model response; ``"when_idle"`` waits until the model gives a final
        answer. Items are validated before anything is queued, on their own and against
        the conversation (complete call/result pairs, call ids not already used).

        Raises:
            TypeError, ValueError: an item is malformed or would make the conversation
                invalid (nothing queued).
            RunClosedError: the run is terminal (nothing queued).
            InboxFullError: the inbox is full (nothing queued).
        """
        if when not in INJECT_WHENS:
            raise ValueError(f"when must be one of {', '.join(INJECT_WHENS)}; got {when!r}")
        converted = tuple(coerce_items(items))
        if not converted:
            raise ValueError("inject() needs at least one item")
        check_injection(converted)
        injection = self._inbox.put(converted, when, self._state.call_ids)
        self._call_soon(self._on_injected)
        return injection.id

    def withdraw(self, injection_id: InjectionId | str) -> bool:
        """Take back an injection that was not delivered yet. Returns True if it was."""
        return self._inbox.withdraw(injection_id)

    def approve(self, call_id: str, *, content: Mapping[str, Any] | None = None) -> None:
        """Let a tool call that waits for approval run, or answer yes to a question a
        running call asks (``ToolContext.request_approval``: its id is pending like a
        call's). Sync, safe from any thread.

        Args:
            call_id: the pending call's or question's id (``detail["pending"]``).
            content: for a question that asked for some (its ``schema``): the answer's
                content, a JSON object matching that schema (an MCP elicitation's form:
                docs/mcp.md). None for a tool call.

        Raises:
            UnknownCallError: no call with this id is waiting for approval.
            RunClosedError: the run is terminal.
            TypeError: ``content`` is not a JSON object.
            ValueError: ``content`` given where none is taken, or not matching the
                question's schema (the question stays pending).
        """
        if content is not None:
            if not isinstance(content, Mapping):
                raise TypeError(f"content must be a mapping or None, not {type(content).__name__}")
            try:
                content = json.loads(json.dumps(dict(content), allow_nan=False))
            except (TypeError, ValueError) as exc:
                raise TypeError(f"content must be JSON-serialisable: {exc}") from None
        event = self._approvals.decide(call_id, approved=True, message=None, content=content)
        self._call_soon(event.set)

    def reject(self, call_id: str, *, message: str | None = None) -> None:
        """Refuse a tool call that waits for approval; the model reads ``message``.

        Raises:
            UnknownCallError: no call with this id is waiting for approval.
            RunClosedError: the run is terminal.
        """
        if message is not None and not isinstance(message, str):
            raise TypeError(f"message must be a str or None, not {type(message).__name__}")
        event = self._approvals.decide(call_id, approved=False, message=message)
        self._call_soon(event.set)

    def statistics(self) -> RunStatistics:
        """A snapshot of the run's internals, for monitoring."""
        return RunStatistics(
            status=self._state.status,
            turn=self._state.turn,
            last_seq=self._log.next_seq - 1,
            open_tool_calls=len(self._state.open_calls),
            inbox_items=self._inbox.size,
            pending_approvals=self._approvals.pending_ids(),
        )

    def __repr__(self) -> str:
        return f"<Run {self.id} {self._state.status.value} turn={self._state.turn}>"

    # ------------------------------------------------------------------ the tree

    def _tree_feed(self) -> TreeFeed:
        """The tree's merged stream, made (at the root) on first use, seeded with what
        the root's log retains."""
        feed = self._feed
        if feed is None:
            assert self._parent is None  # a child joins its parent's feed when made
            feed = TreeFeed(self._options.event_retention)
            feed.join(self.id, None)
            for event in self._log.retained():
                feed.add(event)
            self._feed = self._log.feed = feed
        return feed

    def _adopt(self, child: Run) -> None:
        """A child run made in one of this run's calls (its session claimed): keep it,
        join it to the tree's stream, announce it (``run.child``, ``queued``)."""
        feed = self._tree_feed()
        if self._children is None:
            self._children = []
        self._children.append(child)
        # The announcement first, then the child's own events (its queued update, made
        # with the handle): a reader of the tree learns who a run is before it hears it.
        self._child_event(child, RunStatus.QUEUED)
        feed.join(child.id, self.id)
        for event in child._log.retained():
            feed.add(event)
        child._feed = child._log.feed = feed

    def _child_ended(self, child: Run, result: RunResult) -> None:
        """A child run reached its terminal update (inside this run's tool call)."""
        state = self._state
        usage = result.tree_usage
        if usage is not None:
            below = state.usage_below
            state.usage_below = usage if below is None else below + usage
        self._child_event(child, result.status)
        # Every change of a descendant's waiting calls reaches this run at once
        # (show_approvals -> on_waiting), so with nothing waiting below, the ended child
        # had nothing waiting and recomputing would find and emit nothing; skipping it
        # saves ~8 % of the Python calls of cancelling a 13-run tree (benchmark B8).
        if state.waiting_below:
            self._waiting_changed()

    def _child_event(self, child: Run, status: RunStatus) -> None:
        log = self._log
        if log.closed:  # pragma: no cover - a child lives inside one of our calls
            return
        log.append(
            RunChild(
                run_id=self.id,
                seq=log.next_seq,
                child_id=child.id,
                agent=child._state.agent.name,
                call_id=child.call_id or "",
                status=status,
            )
        )

    def _waiting_changed(self) -> None:
        """The calls awaiting approval below this run changed: recompute them and show
        them in this run's status (and so on up the tree). On the run's thread."""
        state = self._state
        if self._log.closed:
            return
        below: list[Mapping[str, Any]] = []
        for child in self._children or ():
            if child._log.closed:
                continue
            # Each with the call's tool name and arguments (and a question's text):
            # whoever approves from an ancestor (a face showing only the root) sees
            # what it approves.
            for pending_id, approval in child._approvals.pending_entries():
                call = approval.call
                entry: dict[str, Any] = {
                    "run_id": child.id,
                    "call_id": pending_id,
                    "name": call.name,
                    "arguments": call.arguments,
                }
                if approval.question is not None:
                    entry["question"] = approval.question
                below.append(entry)
            below.extend(child._state.waiting_below)
        state.waiting_below = tuple(below)
        state.show_approvals(self._approvals.pending_ids(), self._approvals.questions())

    async def _ask(
        self,
        call_id: str,
        message: str,
        data: Mapping[str, Any] | None,
        schema: Mapping[str, Any] | None,
    ) -> Approval:
        """``ToolContext.request_approval``: a question of the running call
        ``call_id``, pending (and shown, here and above) until ``approve``/``reject``
        answers it or the wait is cancelled; the decision. On the run's thread, from
        any task (an MCP elicitation waits in its connection's task)."""
        state = self._state
        open_call = state.open_calls.get(call_id)
        if open_call is None or self._log.closed:
            raise RuntimeError(
                f"run {self.id!r}: call {call_id!r} is not running; only a running call"
                " can ask for approval"
            )
        question_id = self._approvals.ask(open_call.call, message, data, schema)
        self._questions_changed()
        try:
            approval = await self._approvals.wait_answer(question_id)
        finally:
            self._approvals.forget(question_id)
            # A run being cancelled goes to its terminal update from here (as with a
            # call cancelled while it waits for approval); otherwise (answered, or
            # the call timed out) the status shows what still waits, if anything.
            if not self._scope.cancel_called:
                self._questions_changed()
        return approval

    def _questions_changed(self) -> None:
        self._state.show_approvals(self._approvals.pending_ids(), self._approvals.questions())

    def _limit_exceeded(self, error: UsageLimitExceeded) -> None:
        """One of this run's limits was passed (by it or a descendant, on the run's
        thread): the run fails with ``error``; its scope is cancelled at once."""
        self._fail_now(str(error), error)

    def _fail_now(self, reason: str, error: BaseException) -> None:
        """End the run ``failed`` with ``reason`` at once (a limit, a guardrail): its
        scope is cancelled, and the verdict reads the reason back. On the run's thread;
        the first failure wins."""
        request = self._cancel
        if request is not None and request.mode == "immediate":
            return  # cancelled first: the cancel is what ends the run
        if self._failure is None and not self._log.closed:
            reason = clean_text(reason)  # a guardrail's name or info: user text
            self._failure = (reason, error)
            self._scope.cancel(reason=reason)

    def _timed_out(self) -> bool:
        """Whether the run's ``limits.deadline`` passed (its scope's own deadline)."""
        limits = self._options.limits
        return (
            limits is not None
            and limits.deadline is not None
            and self._scope.deadline <= trio.current_time()
        )

    def _stopped_because(self) -> str | None:
        """Why this run stopped its subtree, if it did: a cancel, a limit, its deadline."""
        request = self._cancel
        if request is not None and request.mode == "immediate":
            return request.reason
        if self._failure is not None:
            return self._failure[0]
        if self._timed_out():
            return "timeout"
        return None

    def _cancelled_by(self) -> dict[str, Any]:
        """Who cancelled this child run from above: the nearest ancestor that was asked
        to cancel (or passed a limit or its deadline), else its parent (a tool timeout,
        a sibling's failure, the caller's scope)."""
        ancestor = self._parent
        while ancestor is not None:
            reason = ancestor._stopped_because()
            if reason is not None:
                return {"by": ancestor.id, "reason": reason}
            ancestor = ancestor._parent
        assert self._parent is not None
        return {"by": self._parent.id, "reason": "parent cancelled"}

    # ------------------------------------------------------------ thread plumbing

    def _call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the run's Trio thread: now if we're on it, else soon."""
        if self._token is None or threading.get_ident() == self._thread_id:
            fn()
            return
        with suppress(trio.RunFinishedError):
            self._token.run_sync_soon(fn)

    def _apply_cancel(self) -> None:
        request = self._cancel
        if request is not None and not self._log.closed:
            self._scope.cancel(reason=request.reason)

    def _try_park(self) -> bool:
        """Park the run if it can (``park_after``; on the run's thread): every open call
        waits for its approval, no decision or injection is on its way in, no cancel or
        failure is pending, no input guardrail is still checking. Its approvals and
        inbox are closed (``"parked"``) and its scope cancelled: the run ends without a
        cancel repair (:meth:`_verdict`). Returns whether it parked."""
        state = self._state
        if self._cancel is not None or self._failure is not None or state.guardrails_running:
            return False
        parked = self._approvals.close_to_park(state.open_calls.keys(), self._inbox)
        if parked is None:
            return False
        self._parked = parked
        self._scope.cancel(reason="parked")
        return True

    def _stop_requested(self) -> bool:
        """The turn loop's safe point asks: did ``cancel(mode="after_turn")`` happen?"""
        return self._cancel is not None  # one attribute read: atomic, no lock needed

    def _attach_session(self) -> None:
        """Let the run use its session, if it holds it (never one it only queued for)."""
        if (self._claim is None or self._claim.held) and not self._state.session_dropped:
            self._state.session = self.session

    def _claim_session(self) -> None:
        """Claim the session before the run starts (raises for ``on_busy="reject"``)."""
        if self._claim is not None:
            self._claim.claim_now(self._options.on_busy)

    def _on_injected(self) -> None:
        """Announce accepted injections (``inbox.injected``); interrupt for ``now``.

        On the run's thread. A callback rather than a task that waits for injections: a
        task per run costs a spawn, two task steps and a nursery, and this work never
        blocks. Outside the turn loop it does nothing: the loop announces what was queued
        when it starts, and the repair reports what is left as ``unconsumed``, so the
        terminal update stays last.
        """
        if not self._live:
            return
        state = self._state
        fresh = self._inbox.announce()
        announce(state, fresh)
        if state.stream_scope is not None and any(i.when == "now" for i in fresh):
            state.stream_scope.cancel(reason="interrupted by injection")

    # ---------------------------------------------------------------- lifecycle

    async def _serve(
        self,
        go: trio.Event | None = None,
        *,
        task_status: trio.TaskStatus[Run] = trio.TASK_STATUS_IGNORED,
        direct: bool = False,
    ) -> None:
        """The run's task. With ``go``, the run stays queued until ``go`` is set;
        ``direct``: awaited by ``run()`` in its own task, where no one holds the handle
        before it starts (so no start-up checkpoints are owed to a caller's cancel)."""
        self._token = trio.lowlevel.current_trio_token()
        self._thread_id = threading.get_ident()
        if direct and self._state.hooks is None and self._parent is None:
            # run(): nobody holds this handle and no hook is handed it, so nothing can
            # inject(when="now"): the turns need no stream scope to interrupt.
            self._state.interruptible = False
        task_status.started(self)
        outcome: Outcome | None = None
        escaped: BaseException | None = None
        limits = self._options.limits
        wrap_up_at: float | None = None
        if limits is not None and limits.deadline is not None:
            # A resumed run's deadline counts from its original start.
            elapsed = 0.0 if self._options.resume is None else self._options.resume.elapsed
            self._scope.deadline = trio.current_time() + limits.deadline - elapsed
            if limits.wrap_up is not None:
                wrap_up_at = self._scope.deadline - limits.wrap_up
        try:
            with self._scope:
                if go is not None:
                    await go.wait()
                elif not direct:
                    # serve_run: let the starter's next line (say, run.cancel()) run
                    # before any model call. Its task resumes in the batch our first
                    # checkpoint joins; the second one puts us behind it.
                    await trio.lowlevel.checkpoint()
                    await trio.lowlevel.checkpoint()
                if self._claim is not None:
                    await self._claim.wait()  # queued behind the session's active run
                self._attach_session()
                self._live = True
                self._on_injected()  # what was injected while the run was queued
                if wrap_up_at is None and not self._side_tasks:
                    outcome = await drive(
                        self._state,
                        self._inbox,
                        self._approvals,
                        self._stop_requested,
                        self._call_soon,
                    )
                else:
                    outcome = await self._drive_with_tasks(wrap_up_at)
        except BaseException as exc:
            escaped = exc
        # Not in a finally around the turns: nothing runs between the scope's exit and
        # here, and on CPython 3.11 every exception handler a trio.Cancelled enters costs
        # two Python calls (its class's ABCMeta.__subclasscheck__, as the exception is
        # normalized), per run of a cancelled tree (B8).
        self._live = False
        deadline = trio.current_time() + self._options.cleanup_timeout
        await self._finish(self._verdict(outcome, escaped), deadline)
        # What must propagate is raised from a list, not a local: the traceback holds
        # this frame, and a frame holding its own exception is a reference cycle, left
        # (with the run's frames and everything they hold) to the garbage collector
        # (B8); a try/finally dropping the local would be two more handlers entered.
        signals = _signals(escaped)
        escaped = None
        if signals:
            raise signals.pop()  # an outer Cancelled, KeyboardInterrupt, ...: never swallowed

    async def _drive_with_tasks(self, wrap_up_at: float | None) -> Outcome:
        """The turn loop in a nursery for the run's side tasks: guardrails that run
        beside it (``_guardrails.py``), and a timer that asks for the final answer at
        ``wrap_up_at``. They end with the loop."""
        state = self._state
        async with trio.open_nursery() as nursery:
            state.side = nursery
            if wrap_up_at is not None:
                nursery.start_soon(self._wrap_up, wrap_up_at)
            try:
                outcome = await drive(
                    state, self._inbox, self._approvals, self._stop_requested, self._call_soon
                )
            finally:
                state.side = None
                nursery.cancel_scope.cancel()
        return outcome

    async def _wrap_up(self, at: float) -> None:
        await trio.sleep_until(at)
        with suppress(RunClosedError, InboxFullError):
            self.inject([{"role": "user", "content": WRAP_UP_MESSAGE}], when="now")

    def _verdict(self, outcome: Outcome | None, escaped: BaseException | None) -> Verdict:
        """What ended the run, as a verdict for the repair."""
        if escaped is not None and not only_cancelled(escaped):
            real = [e for e in leaves(escaped) if not isinstance(e, trio.Cancelled)]
            errors = [e for e in real if isinstance(e, Exception)]
            if len(errors) == len(real):
                # A hook, tool or session error met an outer cancellation on its way
                # out (or a bug of ours): a failed run, named by what raised.
                failed = failure(ExceptionGroup("run", errors))
                if not failed.reason.startswith(_NAMED):
                    return Verdict(RunStatus.FAILED, f"internal error: {failed.reason}", escaped)
                return Verdict(RunStatus.FAILED, failed.reason, failed.error)
            # KeyboardInterrupt, SystemExit, ...: recorded, then re-raised.
            return Verdict(RunStatus.CANCELLED, summarize(escaped), escaped)
        if type(outcome) is Completed:
            return Verdict(RunStatus.COMPLETED, None, final_output=outcome.output)
        if type(outcome) is Failed:
            return Verdict(RunStatus.FAILED, outcome.reason, outcome.error)
        if escaped is not None:
            if self._failure is not None:
                # Failed (a limit, a guardrail) as it was being cancelled from above.
                return Verdict(RunStatus.FAILED, *self._failure)
            if self._parent is not None:
                return Verdict(RunStatus.CANCELLED, "parent cancelled", detail=self._cancelled_by())
            return Verdict(RunStatus.CANCELLED, "parent cancelled")
        # Our own scope caught the cancellation, or after_turn stopped the run.
        assert outcome is None or type(outcome) is Stopped
        if self._parked is not None and self._cancel is None and self._failure is None:
            # Parked (a cancel asked for since wins: nothing executes, the calls are
            # closed as cancelled like any): the calls stay open, awaiting approval.
            detail = {"pending": list(self._parked), "parked": True}
            return Verdict(RunStatus.AWAITING_APPROVAL, "parked", detail=detail)
        if self._failure is not None:
            # A limit of ours was passed (by us or a descendant) or a guardrail tripped,
            # before any cancel (_fail_now): the run fails.
            return Verdict(RunStatus.FAILED, *self._failure)
        if outcome is None and self._cancel is None and self._timed_out():  # our deadline
            limits = self._options.limits
            assert limits is not None
            assert limits.deadline is not None
            error = UsageLimitExceeded("deadline", limits.deadline, limits.deadline, self.id)
            return Verdict(RunStatus.FAILED, str(error), error)
        request = self._cancel
        return Verdict(RunStatus.CANCELLED, request.reason if request else "cancelled")

    async def _finish(self, verdict: Verdict, deadline: float) -> None:
        """Repair, publish the result, release the session, emit the terminal update.

        Nothing may stop the terminal update: the repair guards each of its steps, and
        should the repair itself raise, the run still ends (``failed``) right here.
        """
        state = self._state
        if not state.input_committed:
            self._attach_session()  # stopped before it began: it still records its input
        ended = verdict.status.value  # an enum's .value is a Python property: read once
        self._approvals.close(ended)
        leftovers = self._inbox.close(ended)
        budgets = state.budgets
        if budgets and budgets[0].owner is self:
            verdict.detail["limits"] = budgets[0].report()  # for a budget bar
        result: RunResult | None = None
        try:
            result = await repair(state, verdict, leftovers, deadline)
        except Exception as exc:
            logger.exception("the repair of run %s raised", self.id)
            verdict = Verdict(RunStatus.FAILED, f"internal error: {summarize(exc)}", exc)
        finally:
            if result is None:
                if verdict.status is not RunStatus.FAILED:
                    verdict = Verdict(RunStatus.FAILED, "internal error", verdict.error)
                result = build_result(state, verdict, leftovers)
            self._result = result
            if self._claim is not None:
                # After the repair is persisted, before the terminal update: whoever
                # sees the update can start the next run on the session at once.
                self._claim.release()
            # A parked run's last update is not terminal: its calls await approval
            # still, from a run resumed later (RunResult.parked).
            reason = None if result.parked else result.reason
            state.emit_status(result.status, reason, verdict.detail)
            self._log.close()
            if self._done is not None:
                self._done.set()
            if self._parent is not None:
                self._parent._child_ended(self, result)
            # The state's only reference back to us was for the hooks, which are done:
            # without the cycle, a finished run is freed by reference counting as soon
            # as its holder drops it, not by the garbage collector's next full pass.
            state.handle = None
        if verdict.interrupt is not None:
            raise verdict.interrupt


# A random (version 4) UUID's hex, as uuid.uuid4().hex, at half the cost.
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def _checked_start(
    input: RunInput,
    session: Session | None,
    run_id: str | None,
    options: RunOptions,
    parent: Run | None,
) -> tuple[Item, ...]:
    """The run's input items, once what it starts with is checked (its id, session,
    input, resume and park options); raises ``TypeError``/``ValueError`` to the caller,
    before anything starts."""
    if run_id is not None and (not isinstance(run_id, str) or not run_id):
        raise ValueError(f"run_id must be a non-empty str, not {run_id!r}")
    if run_id is not None and clean_text(run_id) is not run_id:
        # An id is not repaired (the caller would look for one that is not there):
        # with a lone surrogate, every event and record of the run could not be sent.
        raise ValueError(f"run_id must be encodable as UTF-8 (no lone surrogate): {run_id!r}")
    if session is not None and not isinstance(session, Session):
        raise TypeError(
            f"session must implement the Session protocol, not {type(session).__name__}"
        )
    items = tuple(coerce_items(input))
    problems = conversation_problems(items, allow_open_calls=False)
    if problems:
        raise ValueError(f"the input is not a valid conversation: {problems[0]}")
    if options.resume is not None and (session is None or items):
        raise ValueError("resume= continues a run from its session: give a session and no input")
    _check_parkable(options, session, parent)
    return items


def _check_parkable(options: RunOptions, session: Session | None, parent: Run | None) -> None:
    """``park_after`` needs a session and a root run: a parked run's calls live on in
    its session only, and a child's call belongs to its parent's turn, which cannot
    park around it."""
    if options.park_after is not None and (session is None or parent is not None):
        raise ValueError("park_after needs a session and a root run (not a child run)")


def _sum_known(a: Usage | None, b: Usage | None) -> Usage | None:
    """The sum of the usages known (None when neither is)."""
    if a is None:
        return b
    return a if b is None else a + b


def _uuid4_hex() -> str:
    return f"{int.from_bytes(os.urandom(16)) & _UUID4_CLEAR | _UUID4_SET:032x}"


def _signals(exc: BaseException | None) -> list[BaseException]:
    """What of ``exc`` must propagate (in a list: empty, or the one exception to raise):
    its Cancelled (which, having escaped the run's scope, belongs to an outer one) and
    KeyboardInterrupt-like parts. Its real errors are the run's failure, reported in
    the result, never raised."""
    if exc is None:
        return []
    if type(exc) is trio.Cancelled:  # type(), not isinstance(): Cancelled is final
        return [exc]
    if isinstance(exc, Exception):
        return []
    if isinstance(exc, BaseExceptionGroup):
        rest = exc.split(Exception)[1]
        return [] if rest is None else [rest]
    return [exc]
