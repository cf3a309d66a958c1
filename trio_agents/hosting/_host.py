"""The interface every face of the server is a client of: :class:`RunHost`.

A host owns the run registry, the sessions, the principals and their limits, and the
ops (start, get, list, subscribe, cancel, inject, withdraw, approve, reject, cancel a
session). The websocket control channel, HTTP + SSE, A2A and AG-UI are faces: each
turns its wire format into calls of a host and the host's answers (and
:class:`HostError`) back into its wire format. No face knows whether the host is one
process (:class:`LocalHost`) or a node of a cluster.

Every method takes the asking principal explicitly: a run of another principal is
``not_found`` on every method, exactly as an unknown id is.

Changes since the first draft of this interface: the cancel ``mode`` is the core's
(``"immediate"`` | ``"after_turn"``, default ``"immediate"``; the draft's ``"now"`` is
no mode of ``Run.cancel``), and ``inject``'s ``when`` is typed as the core's. A
``StartRequest.context`` is refused (``invalid_request``): a run's context comes from the
host's context hook only (§18: contexts never travel). ``events``' ``from_seq`` may be
None: from the oldest event retained, without an ``events.dropped`` marker (what the
websocket's ``run.subscribe`` without ``from_seq`` does).

A host also has a lifecycle (:meth:`RunHost.open`, :meth:`~RunHost.begin_shutdown`,
:meth:`~RunHost.stop_runs`, :meth:`~RunHost.wait_runs`, :meth:`~RunHost.force_stop`):
what :func:`~trio_agents.hosting.serve` calls to start a host and to shut it down in step
with its faces. A face never calls them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

import attrs
import trio

from .._agent import Agent
from .._exceptions import TrioAgentsError
from .._items import Item
from .._limits import UsageLimits
from ._run_info import RunInfo
from ._server_limits import Limits

__all__ = ["HostError", "HostedEvent", "Origin", "RunHost", "StartRequest"]

HostErrorCode = Literal[
    "not_found",
    "run_closed",
    "invalid_request",
    "unauthorized",
    "limit_exceeded",
    "rate_limited",
    "inbox_full",
    "session_busy",
    "no_active_run",
    "internal",
]


class HostError(TrioAgentsError):
    """A host refused an op; ``code`` is one of DESIGN §10's error codes, which each
    face maps to its own wire (a websocket ``error`` frame, an HTTP status and JSON
    body, a JSON-RPC error).

    Attributes:
        code: the §10 error code.
        message: a human-readable explanation (safe to show the client).
    """

    def __init__(self, code: HostErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code: HostErrorCode = code
        self.message = message


@attrs.frozen(kw_only=True)
class StartRequest:
    """What starting a run asks for (``run.start``, ``POST /runs``, A2A ``SendMessage``,
    AG-UI ``RunAgentInput``).

    Attributes:
        agent: the name the agent is registered under.
        input: the items the run starts with.
        session_id: the session to run in (None: a fresh conversation).
        on_disconnect: what the owner's going away does (``"cancel"`` or
            ``"continue"``); applies only when the start names an owner.
        on_busy: ``"reject"``, ``"enqueue"`` or ``"interrupt"`` when the session is busy.
        limits: the run's usage limits: a :class:`UsageLimits`, or ``run.start``'s
            ``"limits"`` mapping. Merged with the host's ``max_run_limits`` (capped by
            it, the limits left out taken from it) before they are checked together,
            so a mapping may be valid only once merged (``{"wrap_up": 5}`` under a
            server deadline): faces pass what the client sent, not a UsageLimits
            built from it alone.
        context: must be None: a run's context comes from the host's context hook
            (contexts never travel, §18); a host refuses one with ``invalid_request``.
        input_overlap: the run option: ``"skip"`` drops the input's first user
            messages when the session already holds them at its tail (a client that
            re-sends its whole message list, as AG-UI's do); ``"keep"`` stores them again.
    """

    agent: str
    input: tuple[Item, ...]
    session_id: str | None = None
    on_disconnect: Literal["cancel", "continue"] = "cancel"
    on_busy: Literal["reject", "enqueue", "interrupt"] = "reject"
    limits: UsageLimits | Mapping[str, float] | None = None
    context: Mapping[str, Any] | None = None
    input_overlap: Literal["keep", "skip"] = "keep"


@attrs.frozen(kw_only=True)
class Origin:
    """Who asks, as explicit values (never context variables).

    Attributes:
        principal: the authenticated principal.
        owner: the client connection (or stream) whose going away applies the runs'
            ``on_disconnect``; None for a request that outlives nothing (a REST call).
        node: the cluster node an op was routed from (None: asked on this node).
        run_id: the id a routed start must use (None: the host picks one).
        command: the routed command's id (its durable answer; None when not routed).
    """

    principal: str
    owner: object | None = None
    node: str | None = None
    run_id: str | None = None
    command: int | None = None


@attrs.frozen
class HostedEvent:
    """One event of a subscription: the run's event JSON (``RunEvent.to_json()``), its
    run and seq (a tree subscription carries its descendants' events, each with their
    own run id and seq)."""

    run_id: str
    seq: int
    event: Mapping[str, Any]


class RunHost(Protocol):
    """The ops of a server's runs; see the module docstring."""

    @property
    def agents(self) -> Mapping[str, Agent]:
        """The agents runs may be started with, by name."""
        ...

    async def start(self, origin: Origin, request: StartRequest) -> str:
        """Start a run; returns its id once it exists (it may still be queued)."""
        ...

    @property
    def limits(self) -> Limits:
        """The host's :class:`~trio_agents.hosting.Limits` (the websocket channel reads
        its frame, ping and send bounds there)."""
        ...

    async def get(self, principal: str, run_id: str) -> RunInfo:
        """The run's :class:`~trio_agents.hosting.RunInfo` (any node of a tree)."""
        ...

    async def list(self, principal: str, *, all: bool = False) -> list[RunInfo]:
        """The principal's runs (roots; every node of every tree with ``all``)."""
        ...

    async def cancel(
        self,
        principal: str,
        run_id: str,
        reason: str | None = None,
        mode: Literal["immediate", "after_turn"] = "immediate",
    ) -> None:
        """Cancel a run; returns once the cancel is applied (durable in a cluster)."""
        ...

    async def wait_terminal(self, principal: str, run_id: str) -> RunInfo:
        """Wait until the run's terminal update was emitted; returns its RunInfo."""
        ...

    async def inject(
        self,
        principal: str,
        run_id: str,
        items: tuple[Item, ...],
        when: Literal["next_turn", "now", "when_idle"] = "next_turn",
    ) -> str:
        """Queue items into a live run; returns the injection id."""
        ...

    async def withdraw(self, principal: str, run_id: str, injection_id: str) -> bool:
        """Withdraw an injection not yet delivered; False when it already was."""
        ...

    async def approve(
        self,
        principal: str,
        run_id: str,
        call_id: str,
        content: Mapping[str, Any] | None = None,
    ) -> None:
        """Approve a tool call waiting for approval, or answer yes to a question a
        running call asks (its id is pending like a call's); ``content``: the answer
        to a question that asks for some (a JSON object matching its ``schema``;
        ``invalid_request``, with nothing decided, when it does not)."""
        ...

    async def reject(
        self, principal: str, run_id: str, call_id: str, message: str | None = None
    ) -> None:
        """Reject a tool call waiting for approval."""
        ...

    async def cancel_session(
        self,
        principal: str,
        session_id: str,
        reason: str | None = None,
        mode: Literal["immediate", "after_turn"] = "immediate",
    ) -> str:
        """Cancel the session's active run; returns its id (``no_active_run`` if none)."""
        ...

    async def fork_session(
        self,
        principal: str,
        session_id: str,
        new_session_id: str,
        at: int | tuple[str, int] | None = None,
    ) -> int:
        """Fork the principal's session into ``new_session_id`` (DESIGN §23): its items
        up to ``at`` (an item index; an event position ``(run_id, seq)`` where the host
        can resolve it; None: all), rounded down so that no tool call is split from its
        result, with the child sessions of its tree whose call is kept. Returns the
        number of items the fork holds. ``not_found`` for a session of another
        principal, as for one that holds nothing."""
        ...

    def events(
        self,
        principal: str,
        run_id: str,
        *,
        from_seq: int | None = 1,
        tree: bool = False,
        status_only: bool = False,
    ) -> AbstractAsyncContextManager[AsyncIterator[HostedEvent]]:
        """Subscribe to a run's events from ``from_seq`` (its whole subtree with
        ``tree``), in order, each once; an ``events.dropped`` event says what retention
        lost. The iterator ends after the run's terminal update (the tree's root's with
        ``tree``)."""
        ...

    def disconnected(self, owner: object) -> None:
        """The owner went away: apply its runs' ``on_disconnect``."""
        ...

    # ------------------------------------------------------------------ lifecycle
    # What hosting.serve calls, in this order; a face never does.

    async def open(self, nursery: trio.Nursery) -> Callable[[], None]:
        """Host runs in ``nursery`` (a host's own tasks too: a cluster node's event
        writer, router and leases) and start forgetting finished runs; returns what
        stops the host's own tasks once the shutdown is over. A host opens once."""
        ...

    @property
    def closing(self) -> bool:
        """Whether the shutdown began (no new run starts; a face refuses new clients)."""
        ...

    def begin_shutdown(self) -> float:
        """From now on no new run starts; returns the shutdown's deadline
        (``trio.current_time()`` plus ``limits.shutdown_timeout``)."""
        ...

    async def stop_runs(self, deadline: float) -> None:
        """Stop every run: cancelled with reason ``"server shutdown"`` on one process;
        a cluster node hands its runs over to the other nodes instead (the owners'
        ``on_disconnect="cancel"`` runs are cancelled first)."""
        ...

    async def wait_runs(self, deadline: float) -> None:
        """Wait, until ``deadline`` at most, for every stopped run to finish (its
        repair persisted, its terminal update emitted)."""
        ...

    def force_stop(self) -> None:
        """Past the deadline: cancel whatever run is left, without waiting."""
        ...
