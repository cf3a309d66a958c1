"""Child runs (DESIGN §17): what ``ctx.run`` / ``ctx.open_run`` (and so ``Agent.as_tool``)
start, as :data:`CHILDREN`, the :class:`~trio_agents._tools.ChildStarter` every run hands
its tool calls.

A child run is an ordinary :class:`~trio_agents.Run` whose task lives inside one of its
parent's tool calls: in the call's own task (``ctx.run``, ``as_tool``) or in a nursery
the call opens (``ctx.open_run``). So Trio's rule holds for the tree by construction:
a cancel of the parent's scope reaches the child at once; the child's bounded repair
runs and its terminal update is emitted before the call (and so the parent) can end;
nothing outlives the call. Cancelling the child alone ends only its subtree: the call
gets the child's ``cancelled`` result and the parent goes on.
"""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, Final, final

import trio

from ._exceptions import MaxDepthExceeded
from ._handoffs import agent_after
from ._hold import hold
from ._items import ToolCall, ToolResult
from ._options import make_options
from ._result import RunResult
from ._resume import Resume
from ._run import Run
from ._tools import ToolContext
from .sessions._base import Session

if TYPE_CHECKING:
    from ._agent import Agent

logger = logging.getLogger("trio_agents")

__all__ = [
    "CHILDREN",
    "ChildRuns",
    "child_session",
    "make_child",
    "open_child",
    "serve_child",
]

# The options a child takes from its parent unless given (the others are its own:
# max_turns is its agent's; on_busy and resume concern one session's run). The
# before_tool barrier covers the whole tree: a resumed tree then knows which of its
# descendants' calls had started (_resume_for).
_INHERITED = (
    "before_tool",
    "cleanup_timeout",
    "max_concurrent_tools",
    "inbox_capacity",
    "event_retention",
    "on_tool_error",
    "hooks",
    "thread_limiter",
    "context",
    "max_depth",
    "max_handoffs",
    "record_requests",
    "record_requests_max_bytes",
)
# Python frames a child must have left below the recursion limit when it starts: a
# level of ctx.run / as_tool costs about six, a model stream over HTTP and a tool's own
# code a few dozen more. Below this, another level is refused (check_depth).
_STACK_HEADROOM = 250


def child_session(parent: Run, call_id: str) -> Session | None:
    """The session of a child run started in ``call_id``: the parent's store, under
    ``"<parent session id>/<call id>"`` (``.2``, ``.3``, … for further children of one
    call). None when the parent has no session or its store cannot open another id
    (a session without ``with_id``)."""
    session = parent.session
    with_id = getattr(session, "with_id", None)
    if session is None or with_id is None:
        return None
    base = f"{session.session_id}/{call_id}"
    earlier = sum(1 for c in parent.children if c.call_id == call_id)
    child = with_id(base if earlier == 0 else f"{base}.{earlier + 1}")
    if not isinstance(child, Session):
        raise TypeError(f"{type(session).__name__}.with_id() returned {type(child).__name__}")
    return child


async def make_child(
    ctx: ToolContext,
    agent: Agent,
    input: Any,
    *,
    session: Session | str | None,
    run_id: str | None,
    options: Mapping[str, Any],
) -> Run:
    """Build a child run of the run making ``ctx``'s call (it is ``queued`` and
    announced by a ``run.child`` event in the parent's log)."""
    parent = ctx.parent
    if ctx.call_id not in parent._state.open_calls:
        raise RuntimeError(
            f"tool call {ctx.call_id!r} of run {parent.id} has ended: a child run can only"
            " start while the call that owns it runs"
        )
    check_depth(parent, agent)
    base = parent._options
    merged = {name: getattr(base, name) for name in _INHERITED}
    merged.update(options)
    made = session == "inherit"
    if made:
        chosen = child_session(parent, ctx.call_id)
    elif session is None or isinstance(session, Session):
        chosen = session
    else:
        raise TypeError(
            f"session must be 'inherit', None or a Session, not {type(session).__name__}"
        )
    resume = await _resume_for(parent, ctx.call_id, chosen, agent) if made else None
    if resume is not None:
        merged["resume"] = resume
        input = ()  # the child's session holds its input
        # The id an earlier attempt gave it, if known: its log and the ops sent to it
        # by id go on (Resume.children).
        known = resume.children.get((parent.id, ctx.call_id))
        if run_id is None and known is not None:
            run_id = known[0]
    child = Run(
        agent,
        input,
        session=chosen,
        run_id=run_id,
        options=make_options(merged),
        _parent=parent,
        _call_id=ctx.call_id,
        _child_starter=CHILDREN,
    )
    child._session_made = made and chosen is not None
    child._claim_session()  # raises SessionBusyError for on_busy="reject": not adopted
    parent._adopt(child)
    return child


def check_depth(parent: Run, agent: Agent) -> None:
    """Refuse a child of ``parent`` (raise :class:`MaxDepthExceeded`) that would be more
    levels below ``parent`` or one of its ancestors than that run's ``max_depth``, or
    for which the Python stack has too little room left.

    A child of ``ctx.run`` / ``as_tool`` runs in its parent's tool call, on that call's
    stack: left alone, a tree that recurses without end fails deep down with a
    ``RecursionError`` (wherever the limit happens to strike, in our code or a
    library's). Refusing the call that would go too deep gives a reason instead.
    """
    levels = 1  # the child is one level below `parent`
    node: Run | None = parent
    while node is not None:
        limit = node._options.max_depth
        if levels > limit:
            raise MaxDepthExceeded(
                agent.name, _depth(parent) + 1, limit, f"max_depth {limit} reached"
            )
        levels += 1
        node = node.parent
    # max_depth set above what the stack holds (or a tool that recursed on its own):
    # a RecursionError is still never the answer.
    room = sys.getrecursionlimit() - _frames_in_use()
    if room < _STACK_HEADROOM:
        raise MaxDepthExceeded(
            agent.name,
            _depth(parent) + 1,
            None,
            f"the Python stack has room for {room} more frames, too few for another level"
            " (lower max_depth, or raise sys.setrecursionlimit())",
        )


def _depth(run: Run) -> int:
    """How many levels ``run`` is below its root (the root is 0)."""
    depth = 0
    node = run.parent
    while node is not None:
        depth += 1
        node = node.parent
    return depth


def _frames_in_use() -> int:
    """Python frames on this thread's stack (what ``sys.getrecursionlimit()`` bounds):
    in a Trio task, its whole chain of awaits plus the scheduler's few."""
    count = 0
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        count += 1
        frame = frame.f_back
    return count


async def _resume_for(
    parent: Run, call_id: str, session: Session | None, agent: Agent
) -> Resume | None:
    """How to resume the child a resumed parent's call had started, from the child's
    session; None for a fresh child (the parent is not resumed, the call had not
    started, or the child had stored nothing).

    The children inherit the ``before_tool`` barrier, so when the resumed tree has one
    (a cluster, a Temporal worker) the earlier attempt recorded each descendant's call
    before its tool started, in ``earlier.started`` with the root's: a call the child
    left open that is not there never started (one awaiting approval asks for it
    again). Without a barrier nothing says which of them had started, so every call it
    left open counts as started: it runs again only if its tool is idempotent, and is
    otherwise answered ``interrupted`` — a tool is never run twice unless declared
    idempotent (§12). The child's session holds only its own items, so the agent it had
    handed off to is found by following its transfers from ``agent``.
    """
    options = parent._options
    earlier = options.resume
    if earlier is None or session is None or call_id not in earlier.started:
        return None
    read = getattr(session, "get_stored_items", None) or session.get_items
    stored = await read()
    if not stored:
        return None
    answered = {i.call_id for i in stored if isinstance(i, ToolResult)}
    left_open = {i.call_id for i in stored if isinstance(i, ToolCall)} - answered
    known = earlier.children.get((parent.id, call_id))
    # With a barrier, the calls recorded anywhere in the tree, handed down for the
    # child's own descendants too (a call id another run shares counts as started).
    started = earlier.started if options.before_tool is not None else left_open
    return Resume(
        attempt=earlier.attempt,
        next_seq=1 if known is None else known[1],
        started=started,
        reason=earlier.reason,
        agent=agent_after(agent, stored).name,
        children=earlier.children,
    )


async def _close_session(child: Run) -> None:
    """Close the session made for the child (``with_id``), bounded, whatever happened."""
    aclose = getattr(child.session, "aclose", None)
    if not _session_to_close(child) or aclose is None:
        return
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + child._options.cleanup_timeout
        try:
            await aclose()
        except Exception:
            # The run is over and its repair persisted: a failing close is only logged.
            logger.exception("closing the session of child run %s failed", child.id)


def _session_to_close(child: Run) -> bool:
    """Whether a session was made for ``child`` (``with_id``), to close after it."""
    return child._session_made


def _ended_first() -> bool:
    """Right after a child's terminal update (no checkpoint since): was the calling run
    not cancelled yet? (-inf: some scope around this call was cancelled.)"""
    return trio.current_effective_deadline() != -math.inf


async def serve_child(child: Run) -> RunResult:
    """Run ``child`` in the calling task (the parent's tool call) to its end."""
    served = child._serve(direct=True)
    if _session_to_close(child):
        ended_first = False
        try:
            await served
            ended_first = _ended_first()
        finally:
            await _close_session(child)
    else:
        # No session to close (most children): no try/finally either, which the
        # Cancelled of a cancelled tree would enter (on CPython 3.11 each handler a
        # trio.Cancelled enters costs two Python calls, per child: benchmark B8).
        await served
        ended_first = _ended_first()
    if not ended_first:
        # The cancel came while the child's shielded repair ran (its own verdict
        # already given, so it returned rather than raising): the call still ends
        # 'cancelled', as any call running at the cancel. The child's result stays on
        # its handle.
        await trio.lowlevel.checkpoint_if_cancelled()
    # The child ended before any cancel: its result is the call's, even if the calling
    # run is cancelled while the child's session closes (a thread hop for SQLite). A
    # tool that finished keeps its result; answering the call 'cancelled' would
    # contradict the child's own handle and session. No checkpoint from here to the
    # call's commit (_toolcalls._invoke), and the repair persists what was committed.
    assert child.result is not None
    return child.result


@asynccontextmanager
async def open_child(
    ctx: ToolContext,
    agent: Agent,
    input: Any,
    *,
    session: Session | str | None,
    run_id: str | None,
    options: Mapping[str, Any],
) -> AsyncIterator[Run]:
    """``open_run`` for a child: its task in a nursery of the calling tool."""
    child = await make_child(ctx, agent, input, session=session, run_id=run_id, options=options)
    try:
        async with hold(child) as held:
            yield held
    finally:
        await _close_session(child)


@final
class ChildRuns:
    """The :class:`~trio_agents._tools.ChildStarter` of every run: ``ctx.run`` and
    ``ctx.open_run`` come here (a run hands it to each of its calls' contexts)."""

    __slots__ = ()

    async def run(
        self,
        ctx: ToolContext[Any],
        agent: Agent,
        input: Any,
        *,
        session: Any,
        run_id: str | None,
        options: Mapping[str, Any],
    ) -> RunResult:
        child = await make_child(ctx, agent, input, session=session, run_id=run_id, options=options)
        return await serve_child(child)

    def open_run(
        self,
        ctx: ToolContext[Any],
        agent: Agent,
        input: Any,
        *,
        session: Any,
        run_id: str | None,
        options: Mapping[str, Any],
    ) -> AbstractAsyncContextManager[Run]:
        return open_child(ctx, agent, input, session=session, run_id=run_id, options=options)


CHILDREN: Final = ChildRuns()
"""What every run (root or child) starts its calls' child runs with."""
