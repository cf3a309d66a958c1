"""The AG-UI face on a host that cannot give a run's tree, or stops giving it (a
cluster node that does not run the tree; a tree taken over by another node): the
stream follows the root's own log, so the AG-UI run still ends with its outcome —
steps and the root's events, nothing twice, never a stream cut short as a success."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio_agents as ta
from tests.support.agui_support import ours, whole_run
from trio_agents.hosting import HostedEvent, HostError, LocalHost
from trio_agents.models import ScriptedModel, Turn


class _Host:
    """A LocalHost whose tree subscriptions are refused (``refuse``) or end after
    ``cut`` events; everything else is the host's."""

    def __init__(self, inner: LocalHost, *, refuse: bool = False, cut: int | None = None):
        self._inner = inner
        self._refuse = refuse
        self._cut = cut
        self.follows: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @asynccontextmanager
    async def events(
        self, principal: str, run_id: str, *, from_seq: int = 1, tree: bool = False, **kw: Any
    ) -> AsyncIterator[AsyncIterator[HostedEvent]]:
        if tree and self._refuse:
            raise HostError("invalid_request", "the tree runs on another node")
        if not tree:
            self.follows.append(from_seq)
        async with self._inner.events(
            principal, run_id, from_seq=from_seq, tree=tree, **kw
        ) as events:
            if tree and self._cut is not None:
                yield _Cut(events, self._cut)
            else:
                yield events


class _Cut:
    def __init__(self, events: AsyncIterator[HostedEvent], left: int) -> None:
        self._events = events
        self._left = left

    def __aiter__(self) -> _Cut:
        return self

    async def __anext__(self) -> HostedEvent:
        if self._left <= 0:
            raise StopAsyncIteration
        self._left -= 1
        return await self._events.__anext__()


def _tree() -> ta.Agent:
    helper = ta.Agent(
        name="helper", instructions="t", model=ScriptedModel([], default=Turn(text="deep"))
    )
    return ta.Agent(
        name="root",
        instructions="t",
        model=ScriptedModel(
            [Turn(text="asking", tool_calls=[("helper", {"input": "x"})]), "root done"]
        ),
        tools=[helper.as_tool()],
    )


async def _follow_tree(**proxy: Any) -> tuple[list[dict[str, Any]], _Host]:
    """Stream the tree's AG-UI run from a face given a ``_Host(host, **proxy)``: the
    events (checked for AG-UI's ordering, by ``whole_run``) and the proxy."""
    wrapped: list[_Host] = []

    def wrap(host: LocalHost) -> Any:
        wrapped.append(_Host(host, **proxy))
        return wrapped[-1]

    events, _ = await whole_run({"root": _tree()}, "root", wrap=wrap)
    return events, wrapped[0]


async def test_a_refused_tree_is_followed_on_the_roots_log() -> None:
    events, host = await _follow_tree(refuse=True)
    assert events[-1]["outcome"] == {"type": "success"}
    assert host.follows == [1]
    assert [e["type"] for e in events].count("STEP_STARTED") == 1
    text = "".join(e["delta"] for e in events if e["type"] == "TEXT_MESSAGE_CONTENT")
    assert text == "askingroot done"  # the child's own text stays on its node


async def test_a_tree_stream_that_ends_early_is_followed_without_repeats() -> None:
    for cut in range(1, 12):
        events, host = await _follow_tree(cut=cut)
        assert events[-1]["outcome"] == {"type": "success"}, cut
        assert len(host.follows) == 1, cut
        calls = [e["toolCallId"] for e in events if e["type"] == "TOOL_CALL_START"]
        assert calls == ["call_1_0"], (cut, calls)
        root_text = "".join(
            e["delta"]
            for e in events
            if e["type"] == "TEXT_MESSAGE_CONTENT"
            and e["messageId"].endswith((".1", ".2"))
            and e["messageId"].startswith(ours(events[0])["run_id"])
        )
        assert root_text == "askingroot done", (cut, root_text)


async def test_a_call_waiting_below_is_named_where_only_the_roots_log_is_followed() -> None:
    """The tree is refused (the root's own log only, as on a cluster node that does not
    run it), and a child's call waits for approval: the interrupt still names the call
    and its arguments, from the root's status, for the approver to see."""

    @ta.function_tool(needs_approval=True)
    async def launch(target: str) -> str:
        """Launch towards ``target``, once approved."""
        return f"launched to {target}"

    child = ta.Agent(
        name="child",
        instructions="t",
        model=ScriptedModel([Turn(tool_calls=[("launch", {"target": "moon"})]), "child done"]),
        tools=[launch],
    )
    root = ta.Agent(
        name="root",
        instructions="t",
        model=ScriptedModel([Turn(tool_calls=[("child", {"input": "x"})]), "root done"]),
        tools=[child.as_tool()],
    )

    def wrap(host: LocalHost) -> Any:
        return _Host(host, refuse=True)

    events, _ = await whole_run({"root": root}, "root", wrap=wrap)
    (interrupt,) = events[-1]["outcome"]["interrupts"]
    assert interrupt["message"] == 'approve the call launch({"target": "moon"})?'
    assert ours(interrupt)["tool"] == "launch"
