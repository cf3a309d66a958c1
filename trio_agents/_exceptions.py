"""The exception tree of trio_agents.

Every exception the library raises on purpose derives from :class:`TrioAgentsError`::

    TrioAgentsError
    ├── RunClosedError            the run has ended; it takes no more input
    ├── RunFailedError            RunResult.raise_for_status() of a failed run
    ├── InboxFullError            inject() found the inbox full; nothing was queued
    ├── SessionBusyError          another run is active on the session (on_busy="reject")
    ├── SessionStorageError       a session database could not be opened, read or written
    ├── SessionExistsError        a fork's new session id already holds items (nothing written)
    ├── UnknownCallError          approve()/reject(): no such pending call (also a LookupError)
    ├── ModelError                a model provider failed (HTTP status, protocol error, ...)
    │   └── FallbackError         every model of a FallbackModel failed (.failures)
    ├── ModelSpecError            a model string's base URL is ambiguous (also a ValueError)
    ├── ToolArgumentsError        a call's arguments do not fit the tool (also a ValueError)
    ├── MCPToolError              an MCP tool call gave no result (error, protocol, lost link)
    ├── SubAgentFailed            an as_tool child failed (on_tool_error="fail"): result.error
    ├── MaxDepthExceeded          ctx.run/ctx.open_run: a child past a max_depth (not started)
    ├── InvalidConversationError  the conversation broke the invariant: result.error
    ├── UsageLimitExceeded        a run (or its subtree) spent past a UsageLimits limit
    ├── GuardrailTripped          a guardrail stopped the run (result.error of that run)
    ├── HostError                 a run host refused an op (.code; each face maps it)
    ├── ClusterDown               the cluster's database is unreachable or failed
    ├── ClusterSchemaError        the cluster's tables are not usable by this version
    ├── RunStoreError             the shared store of Temporal runs failed (SQLite, PostgreSQL)
    └── ControlError              the control server answered with an error (.code)
        └── ControlConnectionError  the control connection was refused or lost

Where each lives: the core's in ``trio_agents`` (here, but for the two that carry a
:class:`~trio_agents.RunResult`, :class:`RunFailedError` and :class:`SubAgentFailed`,
which live beside it in ``_result.py``: this module is below every other); :class:`ModelSpecError` and
:class:`FallbackError` in ``trio_agents.models``; :class:`MCPToolError` in ``trio_agents.mcp``;
:class:`HostError` in ``trio_agents.hosting``; :class:`ClusterDown` and
:class:`ClusterSchemaError` in ``trio_agents.cluster``; :class:`RunStoreError` in
``trio_agents.temporal``; the two control errors in
``trio_agents.control``. ``tests/core/test_error_tree.py`` keeps this drawing complete.

Outside the tree on purpose: the testing kit's ``LifecycleViolation`` (an
``AssertionError``, so a broken invariant fails a test) and its fakes of foreign errors
(``InjectedFault``, ``FakeToolError``, ``BrokenStrError``). A user's own exception (from a
tool, hook, guardrail or session) reaches ``result.error`` as it was raised.

A failed or cancelled run is never raised by ``open_run``, ``run`` or ``Run.wait()``:
inspect ``result.status`` or call ``result.raise_for_status()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._text_cleaning import clean_text

if TYPE_CHECKING:
    from decimal import Decimal

__all__ = [
    "ControlConnectionError",
    "ControlError",
    "GuardrailTripped",
    "InboxFullError",
    "InvalidConversationError",
    "MaxDepthExceeded",
    "ModelError",
    "RunClosedError",
    "SessionBusyError",
    "TrioAgentsError",
    "UnknownCallError",
    "UsageLimitExceeded",
]


class TrioAgentsError(Exception):
    """Base class of every exception trio_agents raises on purpose."""


class RunClosedError(TrioAgentsError):
    """The run has reached a terminal status (or parked) and accepts no more input.

    Attributes:
        run_id: the id of the run.
        status: its terminal status (``"completed"``, ``"failed"`` or ``"cancelled"``),
            or ``"parked"`` for a run that parked at its approval wait (``park_after``):
            the decision or injection was not applied — give it to the resumed run.
    """

    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id} is closed (status {status})")
        self.run_id = run_id
        self.status = status


class InboxFullError(TrioAgentsError):
    """``inject()`` found the run's inbox full; nothing was queued.

    Attributes:
        capacity: the inbox capacity, in items.
    """

    def __init__(self, capacity: int) -> None:
        super().__init__(f"the run's inbox is full ({capacity} items); nothing was queued")
        self.capacity = capacity


class SessionBusyError(TrioAgentsError):
    """Another run is active on the session and ``on_busy="reject"`` was asked for.

    Attributes:
        session_id: the busy session.
        run_id: the id of the run that holds it.
    """

    def __init__(self, session_id: str, run_id: str) -> None:
        super().__init__(f"session {session_id!r} is busy with run {run_id}")
        self.session_id = session_id
        self.run_id = run_id


class UnknownCallError(TrioAgentsError, LookupError):
    """``approve()``/``reject()`` named a call that is not waiting for approval.

    Attributes:
        call_id: the id that was given.
    """

    def __init__(self, call_id: str) -> None:
        super().__init__(f"no tool call {call_id!r} is waiting for approval")
        self.call_id = call_id


class ModelError(TrioAgentsError):
    """A model provider failed; the run that called it ends ``failed`` with this as error.

    Attributes:
        status_code: the HTTP status code, when the failure was an HTTP response.
        retryable: whether retrying the same request could succeed.
    """

    def __init__(
        self, message: str, *, status_code: int | None = None, retryable: bool = False
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retryable = retryable


class ControlError(TrioAgentsError):
    """The control server answered a request with an ``error`` frame.

    Raised by the :mod:`trio_agents.control` client for every error code except
    ``run_closed`` (which raises :class:`RunClosedError`, as a local run would).

    Attributes:
        code: the error code (``"not_found"``, ``"session_busy"``, ``"inbox_full"``,
            ``"limit_exceeded"``, ...; see ``docs/protocol.md``).
        message: the server's explanation.
        request_id: the ``id`` of the request that failed, when there was one.
    """

    def __init__(self, code: str, message: str, *, request_id: str | int | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.request_id = request_id


class ControlConnectionError(ControlError):
    """The control connection could not be opened, or was lost.

    ``code`` is ``"rejected"`` when the server refused the handshake (then
    ``status_code`` is its HTTP status: 401 bad token, 403 bad Origin, 400 bad
    subprotocol) and ``"connection_closed"`` when an open connection ended (then
    ``close_code`` is the websocket close code, when known: 1001 server shutdown,
    1008 too slow, 1009 message too big, 1006 aborted).

    Attributes:
        status_code: the HTTP status of a refused handshake, else None.
        close_code: the websocket close code of a lost connection, else None.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status_code: int | None = None,
        close_code: int | None = None,
    ) -> None:
        super().__init__(code, message)
        self.status_code = status_code
        self.close_code = close_code


class UsageLimitExceeded(TrioAgentsError):
    """A run's :class:`~trio_agents.UsageLimits` were exceeded (by the run or any of its
    descendants): the run whose limit it was ends ``failed`` with this as
    ``result.error``; its reason is ``"usage limit: <name> <used>/<limit>"`` (or
    ``"timeout"`` for the ``deadline``), with ``" (estimated before the request)"`` after
    it when a request was refused on its model's estimate of its cost (``estimated``).

    Attributes:
        name: the limit (``"requests"``, ``"tool_calls"``, ``"input_tokens"``,
            ``"output_tokens"``, ``"total_tokens"``, ``"cost"`` or ``"deadline"``).
        used: what was used, counting the step that crossed the limit (an estimate from
            the streamed text while a response streams without usage); for ``"cost"``
            a :class:`~decimal.Decimal` of USD, as is ``limit``.
        limit: the limit.
        run_id: the id of the run whose limit it was.
        estimated: ``used`` counts a request not sent, at its estimated cost.
    """

    def __init__(
        self,
        name: str,
        used: float | Decimal,
        limit: float | Decimal,
        run_id: str,
        *,
        estimated: bool = False,
    ) -> None:
        message = "timeout" if name == "deadline" else f"usage limit: {name} {used:g}/{limit:g}"
        if estimated:
            message += " (estimated before the request)"
        super().__init__(message)
        self.name = name
        self.used = used
        self.limit = limit
        self.run_id = run_id
        self.estimated = estimated


class GuardrailTripped(TrioAgentsError):
    """A guardrail tripped: the run ends ``failed`` with this as ``result.error`` and
    the reason ``"guardrail <name>: <info>"``.

    Attributes:
        name: the guardrail's name.
        info: what it returned as ``GuardrailResult.info`` (None for a bare ``True``).
    """

    def __init__(self, name: str, info: object) -> None:
        try:
            text = " ".join(str(info).split())
        except Exception:  # an info whose __str__ raises still trips, named by type
            text = f"<{type(info).__name__}>"
        if len(text) > 400:
            text = text[:397] + "..."
        # The message is the run's failure reason: user text (the guardrail's name and
        # info), cleaned as every reason is where it enters.
        super().__init__(clean_text(f"guardrail {name}: {text}"))
        self.name = name
        self.info = info


class InvalidConversationError(TrioAgentsError):
    """The conversation broke the validity invariant (see
    :func:`~trio_agents.conversation_problems`) before it was sent or stored: the run
    ends ``failed`` with this as ``result.error`` and the reason ``"invalid
    conversation: <problem>"``, before any model call sees it.

    Raised for an input that does not fit the stored conversation, an injection whose
    call id is already in it, or a history policy's invalid result.
    """


class MaxDepthExceeded(TrioAgentsError):
    """A child run was not started: it would be deeper in the tree than a ``max_depth``
    allows (the run option of its parent or of an ancestor: how many levels of child
    runs may grow below that run), or than the Python stack has room for.

    ``ctx.run`` and ``ctx.open_run`` raise it, before anything of the child exists (no
    handle, no session, no event); an :meth:`Agent.as_tool` call gets it as its error
    result, ``"sub-agent <name> not started: max_depth <n> reached"``, which the
    calling model reads (with ``on_tool_error="fail"``, the calling run fails instead).

    Attributes:
        agent: the name of the child's agent.
        depth: the depth the child would have had (the root is at depth 0).
        max_depth: the ``max_depth`` it met; None when the stack was the bound.
    """

    def __init__(self, agent: str, depth: int, max_depth: int | None, why: str) -> None:
        super().__init__(f"sub-agent {agent} not started: {why}")
        self.agent = agent
        self.depth = depth
        self.max_depth = max_depth
