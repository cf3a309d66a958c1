"""The run state: what one run knows, and the few operations every step of it needs.

This is the bottom layer of the run core. The turn engine (``_turns.py``), the tool
runner (``_toolcalls.py``) and the repair (``_repair.py``) are functions over one
:class:`RunState`; the handle (``_run.py``) owns it. Everything here runs on the run's
Trio thread only, so nothing here takes a lock; what other threads touch (the inbox,
approvals, the cancel request) lives in its own lock-guarded object.

The three operations every step needs:

- :meth:`RunState.commit` — an item entered the conversation: append it, emit
  ``run.item``, queue it for the session.
- :meth:`RunState.emit_status` — a ``run.updated`` event.
- :meth:`RunState.persist` — write what was committed so far to the session (each tool
  result is persisted as its tool finishes, so a crash loses at most the item in
  flight). A write that raised may have stored its items: the next one first reads
  what the session holds, so nothing is ever written twice.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, TypeVar, final

import attrs
import trio

from ._agent import Agent
from ._error_text import summarize
from ._events import ModelRequestEvent, RunItemEvent, RunStatus, RunUpdated
from ._inbox import Parking
from ._items import AssistantMessage, ConversationChecker, Item, ToolCall, UserMessage
from ._limits import Budget, charge_all, estimate_cost
from ._log import EventLog
from ._model import ModelRequest, Usage, model_name, usage_served_by
from ._options import RunOptions
from ._tools import ChildStarter, ToolContext
from .sessions._base import Session

__all__ = [
    "CallSoon",
    "Hold",
    "HookError",
    "OpenCall",
    "RunState",
    "SessionError",
    "Spans",
    "call_hook",
    "stored_rows",
]

logger = logging.getLogger("trio_agents")

T = TypeVar("T")

# The detail of most status updates: one shared empty mapping, not a dict per event.
_NO_DETAIL: Mapping[str, Any] = MappingProxyType({})
SpanEnd = Callable[[], Awaitable[None]]
CallSoon = Callable[[Callable[[], None]], None]
"""Runs a callback on the run's Trio thread (now, or soon from another thread)."""


class SessionError(Exception):
    """The session raised while the run loaded or wrote it (reason ``session error: …``)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(summarize(error))
        self.error = error


class HookError(Exception):
    """A hook raised during the run (reason ``hook error: <hook> raised …``)."""

    def __init__(self, hook: str, error: BaseException) -> None:
        super().__init__(f"{hook} raised {summarize(error)}")
        self.hook = hook
        self.error = error


async def call_hook(name: str, hook: Awaitable[None]) -> None:
    """Await a hook call; an exception from it — a stray ``trio.Cancelled`` (one that
    nothing around it asked for) included — becomes a :class:`HookError` naming it."""
    try:
        await hook
    except Exception as exc:
        raise HookError(name, exc) from exc
    except trio.Cancelled as exc:
        if trio.current_effective_deadline() != -math.inf:
            raise HookError(name, exc) from exc
        raise


@final
@attrs.define(eq=False, slots=True)
class OpenCall:
    """A committed tool call that has no result yet."""

    call: ToolCall
    started: bool = False
    ctx: ToolContext | None = None


@final
@attrs.define(eq=False, slots=True)
class Hold:
    """Items of the conversation that guardrails have not passed yet (DESIGN §18).

    ``start`` is the conversation index of the first; ``only`` the indices held, or
    None for everything from ``start`` on — fresh user input holds the rest of the run
    with it, since all of it answers that input. ``waiting`` names the guardrails still
    to pass them (a multiset: two guardrails may share a name). A hold still in
    :attr:`RunState.holds` when the run ends marks its items rejected
    (:meth:`RunState.mark_held`): fail closed, whether the guardrail tripped, raised, or
    never finished because the run ended first. ``blocking``: every guardrail is
    awaited before the model call, none beside it (a resumed run's stored input,
    ``recheck_stored_input``).
    """

    start: int
    waiting: list[str]
    only: tuple[int, ...] | None = None
    blocking: bool = False


@final
@attrs.define(eq=False, slots=True)
class Spans:
    """Hook "spans": every start hook that was called gets exactly one end call.

    The end is registered *before* the start hook is awaited, so a start interrupted by
    a cancellation still gets its end. Whoever finishes a span normally pops it and
    calls the end itself; the repair calls whatever is left.
    """

    _open: dict[str, SpanEnd] | None = None  # made at the first start (runs with hooks)

    async def start(self, key: str, start: Awaitable[None], end: SpanEnd) -> None:
        if self._open is None:
            self._open = {}
        self._open[key] = end
        await start

    def rebind(self, key: str, end: SpanEnd) -> None:
        """Replace the end of an open span (the repair knows the real outcome)."""
        if self._open is not None and key in self._open:
            self._open[key] = end

    def pop(self, key: str) -> SpanEnd | None:
        return None if self._open is None else self._open.pop(key, None)

    def pop_all(self) -> list[SpanEnd]:
        if self._open is None:
            return []
        ends = list(self._open.values())
        self._open.clear()
        return ends

    def __contains__(self, key: str) -> bool:
        return self._open is not None and key in self._open


@final
class RunState:
    """The conversation, event log, session writer, open calls and usage of one run.

    One object that the run's steps share, so its attributes are set in groups (see
    ``__init__``), each saying which modules write it; everything else only reads.

    ============== ========================================= ==========================
    group          attributes                                written by
    ============== ========================================= ==========================
    the run        ``run_id``, ``options``, ``hooks``,       ``_run.py`` before the run
                   ``max_turns``, ``input``, ``handle``,     starts; ``agent`` by a
                   ``interruptible``, ``agent``, ``log``     handoff (``_handoffs.py``);
                                                             ``log`` appended by every
                                                             step
    conversation   ``conversation``, ``new_items``,          :meth:`commit` (here);
    and session    ``call_ids``, ``history_loaded``,         ``_session_load.py`` and
                   ``input_committed``, ``session``,         ``_repair.py``
                   ``session_dropped``, ``summaries``        (``input_committed``);
                                                             ``_window.py`` caches
                                                             ``summaries``
    the turn       ``turn``, ``status``, ``partial_text``,   ``_turns.py`` (``usage``
                   ``stream_scope``, ``finish_reason``,      also ``_window.py``;
                   ``usage``, ``turn_usage``,                ``handoff_to`` also
                   ``undelivered``, ``handoff_to``           ``_toolcalls.py`` and
                                                             ``_handoffs.py``)
    open calls     ``open_calls``                            ``_turns.py`` and
                                                             ``_session_load.py`` open,
                                                             ``_toolcalls.py`` closes
    what the       ``run_span_open``, ``spans``              ``_turns.py`` and
    repair needs                                             ``_toolcalls.py`` open,
                                                             ``_repair.py`` ends
    the run tree   ``child_starter``, ``usage_below``,       ``_run.py``
    and limits     ``waiting_below``, ``on_waiting``,
                   ``budgets``
    guardrails     ``fresh_input``, ``side``,                ``_session_load.py`` and
                   ``guardrails_running``,                   ``_turns.py``
                   ``guardrails_idle``                       (``fresh_input``),
                                                             ``_run.py`` (``side``),
                                                             ``_guardrails.py``
    ============== ========================================= ==========================

    The repair (``_repair.py``) reads the turn's ``partial_text``, the ``open_calls``
    and ``undelivered`` to close what a run left open.
    """

    # Slots: one per run in flight, and an instance dict of this size is about 1 KB.
    # Sorted here (ruff RUF023); __init__ sets them group by group.
    __slots__ = (
        "_checker",
        "_in_doubt",
        "_limiter",
        "_new_count",
        "_rewrite",
        "_stored",
        "_unpersisted",
        "_write_lock",
        "agent",
        "budgets",
        "call_ids",
        "child_starter",
        "conversation",
        "finish_reason",
        "fresh_hold",
        "fresh_input",
        "guardrails_idle",
        "guardrails_running",
        "handle",
        "handoff_to",
        "handoffs_made",
        "history_loaded",
        "holds",
        "hooks",
        "input",
        "input_committed",
        "interruptible",
        "log",
        "max_turns",
        "on_waiting",
        "open_calls",
        "options",
        "parking",
        "partial_text",
        "rejected",
        "run_id",
        "run_span_open",
        "session",
        "session_dropped",
        "side",
        "spans",
        "status",
        "stream_scope",
        "summaries",
        "throttled",
        "turn",
        "turn_usage",
        "undelivered",
        "usage",
        "usage_below",
        "waiting_below",
    )

    def __init__(
        self,
        *,
        run_id: str,
        agent: Agent,
        options: RunOptions,
        log: EventLog,
        session: Session | None,
        handle: Any,
        input: tuple[Item, ...],
    ) -> None:
        # -- the run: set before it starts, read by every step. A handoff switches
        # `agent` (_handoffs.py); every step appends to `log`.
        self.run_id = run_id
        self.agent = agent
        self.options = options
        self.hooks = options.hooks
        self.max_turns = options.max_turns or agent.max_turns
        self.log = log
        self.handle = handle  # the public Run, handed to hooks
        self.input = input
        # Whether a when="now" injection can reach the run (it needs a cancel scope per
        # model call): False only for a run that nobody holds the handle of (Run._serve).
        self.interruptible = True
        # -- the conversation and the session it is written to: commit() and persist()
        # (here); _session_load.py loads the history; _repair.py commits the input of a
        # run that never started.
        # History (as loaded and repaired) + new items, the last _new_count (W3 memory).
        self.conversation: list[Item] = []
        self._new_count = 0
        self.history_loaded = False
        self.input_committed = False
        # Every call id in the conversation; read (never iterated) by inject() from
        # other threads to refuse an injected call that reuses one.
        self.call_ids: set[str] = set()
        self.session = session
        self.session_dropped = False
        # Summarize's summaries (per policy: (cut index, summary message)), from the first.
        self.summaries: dict[int, tuple[int, Item]] | None = None
        self._checker = ConversationChecker()
        self._unpersisted: list[Item] = []
        # How many items the session holds, as this run knows it (the rows it loaded,
        # plus every write it saw return; None until the load), and how many items at
        # the head of _unpersisted were in a write that raised (0: none): see persist().
        self._stored: int | None = None
        self._in_doubt = 0
        self._limiter: trio.CapacityLimiter | None = None
        self._write_lock: trio.Lock | None = None  # made at the first write to a session
        # How many items of the conversation are marked rejected (the request is sent
        # without them; zero, the common case, costs nothing), and whether marks were
        # put on items already written, which the next write must rewrite.
        self.rejected = 0
        self._rewrite = False
        # -- the turn: written by _turns.py as a model call goes (the status by
        # emit_status; a summary's call adds to usage in _window.py, not turn_usage).
        self.status = RunStatus.QUEUED
        self.turn = 0
        # Text streamed in the current model turn and not committed yet: the repair
        # keeps it as an incomplete assistant message, whatever ended the turn.
        self.partial_text: list[str] | None = None
        self.stream_scope: trio.CancelScope | None = None
        self.usage: Usage | None = None
        self.turn_usage: Usage | None = None
        self.finish_reason: str | None = None
        # Injections taken from the inbox that could not be delivered (unconsumed).
        self.undelivered: tuple[Any, ...] = ()
        # Whom a transfer_to_<name> call of this turn hands to (_toolcalls, _handoffs).
        self.handoff_to: Agent | None = None
        self.handoffs_made = 0  # switches so far, bounded by options.max_handoffs
        # -- the open calls: _turns.py opens one per tool call of a response (and
        # _session_load.py those a resumed run finds), _toolcalls.py closes it with its
        # result; the repair answers the rest.
        self.open_calls: dict[str, OpenCall] = {}
        # -- what the repair needs to end: the spans _turns.py and _toolcalls.py
        # opened, and whether the run's span is (_repair.py ends them).
        self.spans = Spans()
        self.run_span_open = False
        # -- set by _run.py: the run tree (§17) — what its calls start child runs with,
        # the finished descendants' usage, the approvals waiting below it ({"run_id",
        # "call_id", "name", "arguments"}), the parent's callback when they change —, the
        # limits it charges (its own, then each ancestor's: _limits.py), park_after's watch.
        self.child_starter: ChildStarter | None = None
        self.usage_below: Usage | None = None
        self.waiting_below: tuple[Mapping[str, Any], ...] = ()
        self.on_waiting: Callable[[], None] | None = None
        self.budgets: tuple[Budget, ...] = ()
        self.parking: Parking | None = None  # _inbox.Parking; _toolcalls.py runs it
        self.throttled = False  # a `running` update shows a rate limit's wait (§21)
        # -- guardrails (_guardrails.py): the user items no input guardrail has seen yet
        # (_session_load.py, _turns.py), the nursery of the run's side tasks (when its
        # agents have guardrails that run beside the turn loop; _run.py), and the input
        # guardrails still running.
        self.fresh_input: list[Item] | None = None  # made by the first such item
        # The hold on the fresh input (and all after it) until its guardrails pass it,
        # and every hold not yet passed: input batches, and an answer being checked.
        self.fresh_hold: Hold | None = None
        self.holds: list[Hold] | None = None  # made by the first hold
        self.side: trio.Nursery | None = None
        self.guardrails_running = 0
        self.guardrails_idle: trio.Event | None = None

    # -- events -----------------------------------------------------------------------

    def charge(self, usage: Usage) -> None:
        """Add a model call's reported ``usage`` to the run's own (its turns', a
        ``Summarize`` history's call, a tool's ``ctx.model`` call: every request the run
        makes); the one place :attr:`usage` grows."""
        self.usage = usage if self.usage is None else self.usage + usage

    def emit_status(
        self, status: RunStatus, reason: str | None = None, detail: Mapping[str, Any] | None = None
    ) -> None:
        self.status = status
        self.log.append(
            RunUpdated(
                run_id=self.run_id,
                seq=self.log.next_seq,
                status=status,
                reason=reason,
                turn=self.turn,
                at=time.time(),
                detail=detail or _NO_DETAIL,
            )
        )

    def show_throttled(self, reason: str | None) -> None:
        """A model request of the run waits for its rate limit (``reason``, e.g.
        ``"rate limit"``) or went out after waiting (``None``): a ``running`` update
        says so (``detail={"throttled": reason}``, DESIGN §21), then one without it.

        The model calls it (``ModelRequest.on_wait``) on the Trio thread while the run
        waits for its stream to open, so the update takes its place in the seq order
        like any other event of the run.
        """
        if self.status is not RunStatus.RUNNING or (reason is not None) == self.throttled:
            return
        self.throttled = reason is not None
        self.emit_status(RunStatus.RUNNING, detail={"throttled": reason} if reason else None)

    def show_approvals(
        self,
        pending: tuple[str, ...] | list[str],
        questions: tuple[Mapping[str, Any], ...] = (),
    ) -> None:
        """Show the calls waiting for approval in the status: this run's own
        (``pending``) and its descendants' (:attr:`waiting_below`).

        ``awaiting_approval`` while any waits (``detail["pending"]``: its own ids, the
        questions' among them, with what those ask, ``questions``, in
        ``detail["questions"]``: only its running calls ask, so none at a turn's start;
        ``detail["waiting"]``: those below, when there are any), ``running`` again once
        none does; re-emitted when the set changes. Then the parent is told.
        """
        below = self.waiting_below
        if self.status.is_terminal or self.status is RunStatus.QUEUED:
            return
        if pending or below:
            detail: dict[str, Any] = {"pending": list(pending)}
            if questions:
                detail["questions"] = [dict(q) for q in questions]
            if below:
                detail["waiting"] = [dict(w) for w in below]
            if self.status is not RunStatus.AWAITING_APPROVAL or (
                self.log.last_status.detail != detail
            ):
                self.emit_status(RunStatus.AWAITING_APPROVAL, detail=detail)
        elif self.status is RunStatus.AWAITING_APPROVAL:
            self.emit_status(RunStatus.RUNNING)
        if self.on_waiting is not None:
            self.on_waiting()

    def spend(self, name: str, count: int = 1) -> bool:
        """Count requests or tool calls against every budget the run charges; True if
        that passed a limit (its run's scope is then cancelled: the caller must not go
        on, and its next checkpoint raises)."""
        return charge_all(self.budgets, lambda budget: budget.charge(name, count))

    def refuse_estimate(self, model: object, request: ModelRequest) -> bool:
        """Before a request: True if its model's estimate of its cost would pass a cost
        budget the run charges (that budget's run is then failed, as by :meth:`spend`)."""
        if not any(budget.limits.cost is not None for budget in self.budgets):
            return False  # no budget to check: not even estimated
        cost = estimate_cost(model, request)
        if cost is None:
            return False
        return charge_all(self.budgets, lambda budget: budget.check_estimate(cost))

    def commit(self, item: Item, usage: Usage | None = None) -> None:
        """An item entered the conversation: record it, emit it, queue it for the session.
        ``usage``: the first item of a model response carries its request's usage in
        its ``run.item`` event (DESIGN §23)."""
        self.conversation.append(item)
        self._new_count += 1
        self._unpersisted.append(item)
        if type(item) is ToolCall:
            self.call_ids.add(item.call_id)
        if item.rejected_by is not None:
            self.rejected += 1
        self.log.append(
            RunItemEvent(
                run_id=self.run_id,
                seq=self.log.next_seq,
                turn=self.turn,
                item=item,
                usage=usage,
                index=len(self.conversation) - 1,
            )
        )

    @property
    def new_items(self) -> list[Item]:
        """The items this run committed (its input included), in order: the end of
        the conversation (a slice of it, not a second list per run: W3 memory)."""
        conversation = self.conversation
        return conversation[len(conversation) - self._new_count :]

    def response_usage(self) -> Usage | None:
        """The usage the current call's response carries in its ``run.item`` (DESIGN
        §23): what its model reported, naming the model that served it — the model's
        own word when it gave one (a FallbackModel's member), else the agent's model."""
        usage = self.turn_usage
        if usage is None or usage.model is not None:
            return usage
        return usage_served_by(usage, model_name(self.agent.model))

    def record_request(self, request: ModelRequest, model: object) -> None:
        """Keep ``request`` in the log as a ``model.request`` event (the run option
        ``record_requests``), or, past ``record_requests_max_bytes`` or not JSON, say
        so with its size: a request holds the whole conversation, so an unbounded record
        would grow the log by the conversation's size at every turn."""
        omitted: str | None = None
        try:
            size = len(json.dumps(request.to_json(), ensure_ascii=False).encode())
        except (TypeError, ValueError) as exc:  # a setting that is no JSON value
            size, omitted = 0, f"not JSON: {exc}"
        if omitted is None and size > self.options.record_requests_max_bytes:
            omitted = "too large"
        self.log.append(
            ModelRequestEvent(
                run_id=self.run_id,
                seq=self.log.next_seq,
                turn=self.turn,
                model=model_name(model),
                request=request if omitted is None else None,
                size=size,
                omitted=omitted,
            )
        )

    def take_input(self, item: Item) -> None:
        """Commit an item of the run's input or of an injection; a user message is
        fresh input, for the next turn's input guardrails, and is held from the model
        (with everything after it) until they pass it."""
        self.commit(item)
        if type(item) is not UserMessage or item.rejected_by is not None:
            return
        if self.fresh_input is None:
            self.fresh_input = []
        self.fresh_input.append(item)
        guardrails = self.agent.input_guardrails
        if guardrails and self.fresh_hold is None:
            self.fresh_hold = self.hold(len(self.conversation) - 1, [g.name for g in guardrails])

    def hold(self, start: int, waiting: list[str], only: tuple[int, ...] | None = None) -> Hold:
        """Hold items from the model until the ``waiting`` guardrails pass them."""
        hold = Hold(start, waiting, only)
        if self.holds is None:
            self.holds = []
        self.holds.append(hold)
        return hold

    def passed(self, hold: Hold, name: str) -> None:
        """The guardrail ``name`` passed what ``hold`` holds."""
        if name in hold.waiting:  # named when the hold was made, by the same agent
            hold.waiting.remove(name)
        if not hold.waiting:
            self.release(hold)

    def release(self, hold: Hold) -> None:
        """Nothing holds these items any more."""
        if self.holds is not None and hold in self.holds:
            self.holds.remove(hold)

    def mark_held(self, tripped: str | None) -> None:
        """The run ended: mark every item still held as rejected — by ``tripped`` (the
        guardrail that tripped) where it waited for it, else by the first guardrail it
        waited for. Marks on items already written are rewritten by the next
        :meth:`persist`."""
        holds, self.holds = self.holds or (), None
        self.fresh_hold = None
        conversation = self.conversation
        unpersisted = {id(item): i for i, item in enumerate(self._unpersisted)}
        for hold in holds:
            name = tripped if tripped in hold.waiting else hold.waiting[0]
            indices = range(hold.start, len(conversation)) if hold.only is None else hold.only
            for index in indices:
                item = conversation[index]
                if item.rejected_by is not None:
                    continue
                marked = attrs.evolve(item, rejected_by=name)
                conversation[index] = marked
                self.rejected += 1
                at = unpersisted.get(id(item))
                if at is None:
                    self._rewrite = True  # already written: the write must replace it
                else:
                    self._unpersisted[at] = marked

    def keep_partial_text(self) -> None:
        """Commit text streamed in an unfinished turn as an incomplete message."""
        partial, self.partial_text = self.partial_text, None
        if partial:
            partial_text = AssistantMessage("".join(partial), status="incomplete")
            self.commit(partial_text, self.response_usage())

    def conversation_problems(self, *, allow_open_calls: bool = False) -> list[str]:
        """Check what was added to the conversation since the last check (the whole
        conversation, over the checks): the validity invariant, checked not assumed."""
        checker = self._checker
        problems = checker.feed(self.conversation[checker.checked :])
        if not allow_open_calls:
            problems += checker.open_problems()
        return problems

    def tool_limiter(self) -> trio.CapacityLimiter:
        """The run's tool limiter (``max_concurrent_tools``), made on first use: most
        runs never have two calls in one turn, and a lone call needs none."""
        if self._limiter is None:
            self._limiter = trio.CapacityLimiter(self.options.max_concurrent_tools)
        return self._limiter

    # -- the session ------------------------------------------------------------------

    def drop_session(self) -> None:
        """Stop using a session that failed to load or to take a repair: what it holds
        is left as it was (it is repaired again at its next load)."""
        self.session = None
        self.session_dropped = True

    def load_history(self, items: list[Item]) -> None:
        self.conversation[:0] = items
        for item in items:
            if type(item) is ToolCall:
                self.call_ids.add(item.call_id)
            if item.rejected_by is not None:
                self.rejected += 1
        self.history_loaded = True

    def session_holds(self, count: int) -> None:
        """The load's word on how many items the session holds (the rows it read, or
        the repair it wrote back): where :meth:`persist`'s count starts."""
        self._stored = count

    async def persist(self) -> None:
        """Write every committed item not written yet, in commit order.

        Writers are serialised (tools finish concurrently). A write that raised — an
        error, a stray ``trio.Cancelled``, or the run's own cancellation — may still
        have stored its batch: a session may commit and then raise (at a checkpoint
        after the commit, or because the commit's answer was lost). So the batch is not
        simply written again (it would be stored twice: a result twice, a call after its
        own result): the next persist first asks the session what it holds
        (:meth:`_settle_doubt`), and writes again only what is not there. This never
        trusts a session's promise about when it raises, so it holds for users'
        sessions as for ours.

        Raises:
            SessionError: the session raised, or its rows cannot say what a write that
                raised stored (it is then used no more).
        """
        if self.session is None:
            self._unpersisted.clear()
            return
        lock = self._write_lock
        if lock is None:
            lock = self._write_lock = trio.Lock()
        async with lock:
            await self._write_unpersisted()

    async def _write_unpersisted(self) -> None:
        """:meth:`persist`'s work, under its lock."""
        session = self.session  # read again: a writer before us may have dropped it
        if session is None:
            self._unpersisted.clear()
            return
        if self._rewrite:
            # The rewrite replaces every row: it settles a write in doubt too.
            await self._rewrite_marks(session)
        elif self._in_doubt:
            await self._settle_doubt(session)
        while self._unpersisted:
            batch = list(self._unpersisted)
            # In doubt from here until the write returns, whatever interrupts it.
            self._in_doubt = len(batch)
            await _guard_session(partial(session.add_items, batch))
            self._in_doubt = 0
            if self._stored is not None:
                self._stored += len(batch)
            del self._unpersisted[: len(batch)]

    async def _rewrite_marks(self, session: Session) -> None:
        """Write marks put on items already stored (:meth:`mark_held`): the whole
        conversation, in one atomic ``replace_items`` — the stored rows are the loaded
        history and the items written since, so the conversation is what they must
        become. A replace is idempotent, so one that raised (whether or not it stored)
        is simply done again by the next write, and it settles any earlier write in
        doubt. A session without ``replace_items`` cannot change a row it holds: its
        written rows stay unmarked (logged); the unwritten ones are appended marked."""
        replace = getattr(session, "replace_items", None)
        if replace is None:
            self._rewrite = False
            logger.warning(
                "session %r has no replace_items: items a guardrail rejected after they"
                " were written stay unmarked in it",
                session.session_id,
            )
            if self._in_doubt:
                await self._settle_doubt(session)
            return
        # The unwritten items are in the snapshot; any committed while it is written
        # are appended after it.
        items, written = list(self.conversation), len(self._unpersisted)
        await _guard_session(partial(replace, items))  # on error, _rewrite stays: retried
        self._rewrite = False
        self._in_doubt = 0
        self._stored = len(items)
        del self._unpersisted[:written]

    async def _settle_doubt(self, session: Session) -> None:
        """Find out, from the rows, how much of what the run has yet to write is stored.

        One run holds the session at a time, so the rows are those this run knew of,
        followed by a first part of what it has yet to write: nothing (the write that
        raised stored nothing: it is written again), the batch of that write, or more
        (a session that writes committed items by itself, as the cluster's writes them
        with their events). That part is taken as written, never written twice.
        Anything else — a session whose ``get_items`` gives something other than its
        rows, or that another writer changed — cannot tell: nothing more is written (a
        duplicate would make the stored conversation invalid for good, where a missing
        tail is what a crash leaves and every load repairs), the session is dropped and
        the run fails with a session error.
        """
        rows = await _guard_session(partial(stored_rows, session))
        known = self._stored
        extra = len(rows) - known if known is not None else -1
        if (
            known is None
            or not 0 <= extra <= len(self._unpersisted)
            or (rows[known:] != self._unpersisted[:extra])
        ):
            self.drop_session()
            raise SessionError(
                RuntimeError(
                    f"cannot tell what an interrupted write of {self._in_doubt} item(s)"
                    f" stored: the session holds {len(rows)} item(s), where the run knew"
                    f" of {known} and has {len(self._unpersisted)} to write; nothing more"
                    " is written to it"
                )
            )
        del self._unpersisted[:extra]  # stored: never write them twice
        self._stored = len(rows)
        self._in_doubt = 0


async def stored_rows(session: Session) -> list[Item]:
    """The session's items as stored: ``get_stored_items()`` where the session has it
    (the shipped stored sessions repair in ``get_items``, and write the repair back),
    else ``get_items()``.

    Raises:
        TypeError: ``get_stored_items`` returned something other than a list.
    """
    raw = getattr(session, "get_stored_items", None)
    if raw is None:
        return await session.get_items()
    items = await raw()
    if not isinstance(items, list):
        raise TypeError(f"get_stored_items returned {type(items).__name__}, not a list")
    return items


async def _guard_session(call: Callable[[], Awaitable[T]]) -> T:
    """Await a session call, made inside the ``try`` (one that raises before it returns
    an awaitable is the session's fault too). An exception — a stray ``trio.Cancelled``
    (one that nothing around it asked for) included — becomes a :class:`SessionError`."""
    try:
        return await call()
    except Exception as exc:
        raise SessionError(exc) from exc
    except trio.Cancelled as exc:
        if trio.current_effective_deadline() != -math.inf:
            raise SessionError(exc) from exc  # a stray one: a session fault
        raise
