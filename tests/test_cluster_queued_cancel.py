"""A run taken over while queued for its session, cancelled as the session frees
(issue 30, item 2): the node that took it over stays up.

The nodes are ControlServers in one Trio process on the suite's real PostgreSQL
(tests/cluster_support.py). One window is widened deterministically, as
test_cluster_review.py does: the claim of the queued run's session, on the node that
took it over, completes only once the run was cancelled and its task ended — the
order in which a cancel arriving as the session frees lands on a loaded node.
"""

from __future__ import annotations

from typing import Any, Final

import pytest
import trio

import trio_agents as ta
from trio_agents.models import ScriptedModel, Turn

from .cluster_support import client, node

BOUND: Final = 60.0  # a hang guard


def _agents() -> dict[str, ta.Agent]:
    @ta.function_tool(needs_approval=True)
    async def delete() -> str:
        """Delete something once approved."""
        await trio.lowlevel.checkpoint()
        return "deleted"

    model = ScriptedModel([], default=Turn(tool_calls=[("delete", {})]))
    return {"a": ta.Agent(name="a", instructions="", model=model, tools=[delete])}


async def _until(predicate: Any) -> None:
    """Poll state nothing signals (another node's rows, a session's closing)."""
    while not predicate():  # noqa: ASYNC110 (no event to wait for)
        await trio.sleep(0.02)


async def test_a_taken_over_queued_run_cancelled_as_its_session_frees(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node used to crash: the takeover's input was written to the session of a
    run that had ended (``ClosedResourceError: this PostgresSession is closed``
    escaped into the server's nursery)."""
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, _agents(), pg_dsn, "A", lease_ttl=0.5) as a,
            node(nursery, _agents(), pg_dsn, "B", lease_ttl=0.5) as b,
            client(a.url) as ca,
            client(b.url) as cb,
        ):
            with trio.fail_after(BOUND):
                # The holder waits for an approval on A; a second run is queued
                # behind it for the session, on A too.
                holder = str(
                    (await ca.ok("run.start", agent="a", input="x", session_id="s"))["run_id"]
                )
                await cb.ok("run.subscribe", run_id=holder)
                queued = str(
                    (
                        await ca.ok(
                            "run.start", agent="a", input="y", session_id="s", on_busy="enqueue"
                        )
                    )["run_id"]
                )
                await cb.wait_status(holder, "awaiting_approval")
                await cb.ok("run.subscribe", run_id=queued)
                await cb.wait_status(queued, "queued")

                registry = b.server._registry
                real_claim = b.cluster.claim_queued

                async def claim_queued(**kwargs: Any) -> bool:
                    claimed = await real_claim(**kwargs)
                    if kwargs["run_id"] == queued and claimed:
                        # The run is cancelled as its session frees: it ends (and its
                        # session is closed) before the claim's next step.
                        entry = registry.runs[queued]
                        assert entry.run is not None
                        entry.run.cancel("cancelled as the session freed")
                        await entry.run.wait()
                        await _until(lambda: entry.log.session.inner._closed)
                    return claimed

                monkeypatch.setattr(b.cluster, "claim_queued", claim_queued)
                a.crash()  # B takes both over once A's lease expires
                await _until(lambda: queued in registry.runs and holder in registry.runs)
                resumed = await cb.wait_event(
                    holder, lambda e: (e.get("detail") or {}).get("resumed") is True
                )
                await cb.wait_event(
                    holder,
                    lambda e: (
                        e["type"] == "run.updated"
                        and e["status"] == "awaiting_approval"
                        and e["seq"] > resumed["seq"]
                    ),
                )
                await cb.ok("run.cancel", run_id=holder, reason="free the session")
                assert (await cb.wait_terminal(holder))["event"]["status"] == "cancelled"
                ended = (await cb.wait_terminal(queued))["event"]
                assert ended["status"] == "cancelled", ended
                # B is still up and serving.
                info = (await cb.ok("run.get", run_id=queued))["run"]
                assert info["status"] == "cancelled"
                again = str(
                    (await cb.ok("run.start", agent="a", input="z", session_id="t"))["run_id"]
                )
                await cb.ok("run.subscribe", run_id=again)
                await cb.wait_status(again, "awaiting_approval")
                await cb.ok("run.cancel", run_id=again)
                await cb.wait_terminal(again)
        nursery.cancel_scope.cancel()
