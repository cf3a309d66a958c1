"""The run's inbox: injected items waiting for a safe point, and tool-call approvals.

Both are touched from any thread (``Run.inject``, ``Run.approve``), so each has its
own lock; the run's Trio thread takes from them at its safe points. Each can be
*closed*: afterwards every call from outside raises :class:`RunClosedError`. The inbox
is closed atomically with the decision that ends a run (see :meth:`Inbox.close_if_empty`),
so an ``inject`` racing a final answer is either delivered or refused, never lost.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, NewType, TypeAlias, final

import attrs
import trio

from ._exceptions import InboxFullError, RunClosedError, UnknownCallError
from ._items import Item, ToolCall, conversation_problems
from ._question_schema import content_problems

__all__ = [
    "PARKED",
    "Approval",
    "Approvals",
    "Inbox",
    "InjectWhen",
    "Injection",
    "InjectionId",
    "Parking",
    "check_content",
]

InjectionId = NewType("InjectionId", str)
"""The id ``Run.inject`` returns; echoed by ``inbox.injected`` / ``inbox.delivered``."""

InjectWhen: TypeAlias = Literal["next_turn", "now", "when_idle"]
INJECT_WHENS = ("next_turn", "now", "when_idle")

_ids = itertools.count(1)
PARKED = "parked"
"""The status a parked run's inbox and approvals are closed with (``RunClosedError.status``)."""


@final
@attrs.define(eq=False, slots=True)
class Injection:
    id: InjectionId
    items: tuple[Item, ...]
    when: InjectWhen
    announced: bool = False


def check_injection(items: Sequence[Item]) -> None:
    """Refuse a batch that is not valid on its own: a result before its call, a message
    between a call and its result, a call with no result or a result with no call.

    Raises:
        ValueError: naming the first problem.
    """
    problems = conversation_problems(items)
    if problems:
        raise ValueError(
            "injected items would make the conversation invalid (tool calls and results"
            f" must come as complete pairs, each result right after its calls): {problems[0]}"
        )


@final
class Inbox:
    """Injected items, in order, until a safe point delivers them (thread-safe)."""

    __slots__ = ("_closed", "_lock", "_queue", "_queued_call_ids", "_size", "capacity", "run_id")

    def __init__(self, run_id: str, capacity: int) -> None:
        self.run_id = run_id
        self.capacity = capacity
        self._lock = threading.Lock()
        # Made by the first injection: most runs get none (W3 memory).
        self._queue: list[Injection] | None = None
        self._size = 0
        # The call ids of queued injected calls; made by the first such injection (most
        # runs get none: an empty set is 216 bytes per run, W3).
        self._queued_call_ids: set[str] | None = None
        self._closed: str | None = None  # the terminal status, once closed

    @property
    def size(self) -> int:
        return self._size

    @property
    def lock(self) -> threading.Lock:
        """The inbox's lock, shared with the run's approvals and cancel request."""
        return self._lock

    def put(
        self, items: tuple[Item, ...], when: InjectWhen, known_call_ids: Collection[str]
    ) -> Injection:
        """Queue a validated batch (see :func:`check_injection`).

        Raises:
            RunClosedError, InboxFullError: nothing queued.
            ValueError: a call id is already in the conversation or queued.
        """
        ids = [item.call_id for item in items if type(item) is ToolCall]
        with self._lock:
            if self._closed is not None:
                raise RunClosedError(self.run_id, self._closed)
            if self._size + len(items) > self.capacity:
                raise InboxFullError(self.capacity)
            queued = self._queued_call_ids
            for call_id in ids:
                if call_id in known_call_ids or (queued is not None and call_id in queued):
                    raise ValueError(f"call id {call_id!r} is already in the conversation")
            injection = Injection(InjectionId(f"inj_{next(_ids)}"), items, when)
            if self._queue is None:
                self._queue = []
            self._queue.append(injection)
            self._size += len(items)
            if ids:
                if queued is None:
                    queued = self._queued_call_ids = set()
                queued.update(ids)
        return injection

    def withdraw(self, injection_id: str) -> bool:
        with self._lock:
            queue = self._queue or []
            for index, injection in enumerate(queue):
                if injection.id == injection_id:
                    del queue[index]
                    self._forget(injection)
                    return True
        return False

    def _forget(self, injection: Injection) -> None:
        self._size -= len(injection.items)
        queued = self._queued_call_ids
        if queued is not None:
            for item in injection.items:
                if type(item) is ToolCall:
                    queued.discard(item.call_id)

    def announce(self) -> list[Injection]:
        """The injections not announced yet (now marked announced)."""
        with self._lock:
            fresh = [inj for inj in self._queue or () if not inj.announced]
            for injection in fresh:
                injection.announced = True
        return fresh

    def wants_interrupt(self) -> bool:
        """Whether a ``when="now"`` injection is waiting."""
        with self._lock:
            return self._queue is not None and any(inj.when == "now" for inj in self._queue)

    def take(self, *, idle: bool) -> list[Injection]:
        """Remove and return what this safe point delivers: the steering injections
        (``now``/``next_turn``), or, once the model is idle and there is no steering,
        everything (the ``when_idle`` follow-ups too)."""
        with self._lock:
            queue = self._queue
            if not queue:
                return []
            steering = [inj for inj in queue if inj.when != "when_idle"]
            taken = steering if steering or not idle else list(queue)
            for injection in taken:
                queue.remove(injection)
                self._forget(injection)
        return taken

    def close_if_empty(self, status: str) -> bool:
        """Close the inbox if nothing waits in it (the run may then complete)."""
        with self._lock:
            return self.close_if_empty_held(status)

    def close_if_empty_held(self, status: str) -> bool:
        """:meth:`close_if_empty` for a caller that already holds :attr:`lock` (the
        run's approvals, parking: ``Approvals.close_to_park``)."""
        if self._queue or self._closed is not None:
            return False
        self._closed = status
        return True

    def close(self, status: str) -> list[Injection]:
        """Close the inbox; return what nobody consumed."""
        with self._lock:
            if self._closed is None:
                self._closed = status
            leftovers, self._queue = self._queue or [], None
            self._size = 0
            self._queued_call_ids = None
        return leftovers


@final
@attrs.define(eq=False, slots=True)
class Approval:
    """A pending decision: a tool call waiting to run, or a question a running call asks
    (``ToolContext.request_approval``: ``question`` holds what a face shows of it)."""

    call: ToolCall
    event: trio.Event = attrs.field(factory=trio.Event)
    decided: bool = False
    approved: bool = False
    message: str | None = None
    question: Mapping[str, Any] | None = None
    # A question's: the schema an approval's content must match (None: it takes none),
    # and the content it was approved with.
    schema: Mapping[str, Any] | None = None
    content: Mapping[str, Any] | None = None


@final
class Approvals:
    """Tool calls waiting for ``approve``/``reject`` (thread-safe).

    It shares its lock with the run's inbox (``lock``): both are touched only briefly,
    and most runs never wait for an approval, so its dict is made on first use.
    """

    __slots__ = ("_asked", "_closed", "_lock", "_pending", "run_id")

    def __init__(self, run_id: str, lock: threading.Lock | None = None) -> None:
        self.run_id = run_id
        self._lock = threading.Lock() if lock is None else lock
        self._pending: dict[str, Approval] | None = None
        self._closed: str | None = None
        self._asked = 0  # questions asked so far (what numbers their ids)

    def open(self, calls: Sequence[ToolCall]) -> None:
        with self._lock:
            if self._pending is None:
                self._pending = {}
            for call in calls:
                self._pending[call.call_id] = Approval(call)

    def __contains__(self, call_id: str) -> bool:
        pending = self._pending  # one read: made once, never unset
        if pending is None:
            return False
        with self._lock:
            return call_id in pending

    def pending_ids(self) -> tuple[str, ...]:
        with self._lock:
            if self._pending is None:
                return ()
            return tuple(c for c, a in self._pending.items() if not a.decided)

    def pending_entries(self) -> tuple[tuple[str, Approval], ...]:
        """The undecided entries with their ids (what an ancestor shows of them: the
        calls' names and arguments, the questions' texts, §17's ``detail["waiting"]``)."""
        with self._lock:
            if self._pending is None:
                return ()
            return tuple((i, a) for i, a in self._pending.items() if not a.decided)

    def questions(self) -> tuple[Mapping[str, Any], ...]:
        """What the undecided questions ask (``detail["questions"]``)."""
        with self._lock:
            if self._pending is None:
                return ()
            return tuple(
                a.question
                for a in self._pending.values()
                if a.question is not None and not a.decided
            )

    def ask(
        self,
        call: ToolCall,
        message: str,
        data: Mapping[str, Any] | None,
        schema: Mapping[str, Any] | None = None,
    ) -> str:
        """Open a question that the running ``call`` asks; return its id, which
        ``decide`` answers like a call's.

        Raises:
            RunClosedError: the run is terminal (or parked).
        """
        with self._lock:
            if self._closed is not None:
                raise RunClosedError(self.run_id, self._closed)
            if self._pending is None:
                self._pending = {}
            while True:
                # Unique among the pending ids: a model could name a call like this.
                self._asked += 1
                question_id = f"{call.call_id}:ask-{self._asked}"
                if question_id not in self._pending:
                    break
            question = {
                "id": question_id,
                "call_id": call.call_id,
                "name": call.name,
                "message": message,
                "data": data,
                # What a face builds its form from (None: approving takes no content).
                "schema": schema,
            }
            self._pending[question_id] = Approval(call, question=question, schema=schema)
        return question_id

    async def wait_answer(self, question_id: str) -> Approval:
        """Wait for the decision on a question (see :meth:`ask`); it stays pending
        until :meth:`forget`."""
        with self._lock:
            assert self._pending is not None
            approval = self._pending[question_id]
        await approval.event.wait()
        return approval

    def forget(self, question_id: str) -> None:
        """The question is over (answered, or its wait was cancelled): no longer
        pending, and no longer answerable (a late answer raises ``UnknownCallError``)."""
        with self._lock:
            if self._pending is not None:
                self._pending.pop(question_id, None)

    def decide(
        self,
        call_id: str,
        *,
        approved: bool,
        message: str | None,
        content: Mapping[str, Any] | None = None,
    ) -> trio.Event:
        """Record a decision; return the event to set on the run's thread.

        ``content`` (plain JSON, from ``approve``) answers a question that asked for it
        (see :meth:`ask`): checked against its schema here, under the lock, so a
        refused content leaves the question pending.

        Raises:
            RunClosedError: the run is terminal.
            UnknownCallError: no call with this id waits for a decision.
            ValueError: ``content`` for a tool call, a question that takes none, or
                content that does not match the question's schema (nothing decided).
        """
        with self._lock:
            if self._closed is not None:
                raise RunClosedError(self.run_id, self._closed)
            approval = self._undecided(call_id)
            if content is not None:
                check_content(
                    call_id, approval.schema, content, question=approval.question is not None
                )
            approval.decided = True
            approval.approved = approved
            approval.message = message
            approval.content = content
        return approval.event

    def _undecided(self, call_id: str) -> Approval:
        # Under the lock.
        approval = None if self._pending is None else self._pending.get(call_id)
        if approval is None or approval.decided:
            raise UnknownCallError(call_id)
        return approval

    async def wait(self, call_id: str) -> tuple[Approval, bool]:
        """Wait for the decision on ``call_id``; return it and whether any call is still
        undecided."""
        with self._lock:
            assert self._pending is not None
            approval = self._pending[call_id]
        await approval.event.wait()
        with self._lock:
            self._pending.pop(call_id, None)
            undecided = any(not a.decided for a in self._pending.values())
        return approval, undecided

    def close_to_park(self, open_calls: Collection[str], inbox: Inbox) -> tuple[str, ...] | None:
        """Close the approvals and ``inbox`` with status ``"parked"`` if the run can
        park (DESIGN §20: ``park_after``): every open call of the run (``open_calls``)
        waits here undecided — nothing executes, no decision is on its way to its call —
        and no injection waits in the inbox. Atomic with ``approve``/``reject`` and
        ``inject`` (one lock): each either came first (and the run does not park: the
        decision runs, the injection is delivered) or raises :class:`RunClosedError`
        with status ``"parked"``, never lost. Returns the parked call ids, or None."""
        assert inbox.lock is self._lock  # one lock for both: the check and the close
        with self._lock:
            pending = self._pending
            if (
                self._closed is not None
                or not pending
                or pending.keys() != set(open_calls)
                or any(approval.decided for approval in pending.values())
                or not inbox.close_if_empty_held(PARKED)
            ):
                return None
            # Closed, yet still listed as pending (``pending_ids``, the run's
            # statistics): the parked calls await their decisions, from a resumed run.
            self._closed = PARKED
            return tuple(pending)

    def close(self, status: str) -> None:
        with self._lock:
            if self._closed == PARKED:
                return  # parked: nothing is decided here any more, the calls still wait
            if self._closed is None:
                self._closed = status
            if self._pending is not None:
                for approval in self._pending.values():
                    approval.decided = True
                self._pending.clear()


@final
class Parking:
    """The ``park_after`` option's watch over a turn's approval wait (DESIGN §20).

    :meth:`watch` runs beside the calls of a turn that has calls waiting for approval:
    once ``after`` seconds have passed it asks the run to park (``try_park``: the run
    parks only if nothing executes, see :meth:`Approvals.close_to_park`), and again
    after each call of the turn ends, until the run parks or the turn's calls are done
    (then its task is cancelled with them). On the run's thread only.
    """

    __slots__ = ("_ended", "after", "try_park")

    def __init__(self, after: float, try_park: Callable[[], bool]) -> None:
        self.after = after
        self.try_park = try_park
        self._ended = trio.lowlevel.ParkingLot()

    def call_ended(self) -> None:
        """A call of the turn has its result: what executed may have been the last."""
        self._ended.unpark_all()

    async def watch(self) -> None:
        await trio.sleep(self.after)
        while not self.try_park():
            await self._ended.park()


def check_content(
    call_id: str, schema: Mapping[str, Any] | None, content: Mapping[str, Any], *, question: bool
) -> None:
    """Refuse ``content`` as the approval of ``call_id`` (a question when ``question``)
    that takes none (``schema`` None) or whose ``schema`` it does not match.

    Raises:
        ValueError: naming the problems (the run's ``approve`` raises the same).
    """
    if schema is None:
        what = "question" if question else "tool call"
        raise ValueError(f"the {what} {call_id!r} takes no content")
    try:
        problems = content_problems(schema, content)
    except Exception as exc:  # a schema the check cannot read: refused, never a crash
        raise ValueError(
            f"the {call_id!r} schema cannot check content ({type(exc).__name__}: {exc})"
        ) from None
    if problems:
        raise ValueError(
            f"content does not match the question {call_id!r}'s schema: " + "; ".join(problems)
        )
