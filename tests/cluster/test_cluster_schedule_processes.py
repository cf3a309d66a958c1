"""A Hypothesis schedule over a small cluster of real node processes (issue 17): ops
(start, cancel, inject, approve, subscribe), each sent to a node drawn at random,
interleaved with ``kill -9`` of nodes; then every gate opens and every pending
approval is given, and the cluster must have kept its promises:

- every run reaches exactly one terminal status (the last event of its log), the one
  asked for: ``cancelled`` when a cancel was acked, else ``completed``;
- every log, and every subscriber's view (reconnecting from last seq + 1 when its node
  dies), has each seq once, from 1, with no gap;
- no non-idempotent tool call executed twice, no injection delivered twice;
- every session as stored is a valid conversation, and the items of the run's log are
  in it, in order; ``runs.list`` shows each run once.

Seeded and few examples (each one starts a cluster: seconds); ``CLUSTER_EXAMPLES``
raises the count for a longer search. One trio.run per example, its own database.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st

import trio_agents as ta
from tests.support.cluster_app import TOOLS
from tests.support.process_cluster import (
    POLL,
    Cluster,
    Follower,
    Node,
    assert_contiguous,
    items_of,
    open_cluster,
    replay,
    stored_items,
)
from trio_agents.control import ControlError

if TYPE_CHECKING:
    from tests.support.pg_support import PostgresServer

NODES: Final = 3
BOUND: Final = 60.0  # a hang guard per example
SCENARIOS: Final = ("delete", "charge", "lookup", "stream", "charge delete", "lookup delete")

node_index = st.integers(0, NODES - 1)
run_index = st.integers(0, 7)
OPS = st.one_of(
    st.tuples(st.just("start"), st.sampled_from(SCENARIOS), node_index),
    st.tuples(st.just("cancel"), run_index, node_index),
    st.tuples(st.just("inject"), run_index, node_index),
    st.tuples(st.just("approve"), run_index, node_index),
    st.tuples(st.just("subscribe"), run_index, node_index),
    st.tuples(st.just("kill"), node_index),
)


@attrs.define
class Planned:
    run_id: str
    scenario: str
    tag: str
    cancel_acked: bool = False
    injections: list[str] = attrs.field(factory=list)

    def approval_ids(self) -> list[str]:
        wanted = [word for word in self.scenario.split() if word in TOOLS]
        return [f"call_{name}_{n}" for n, name in enumerate(wanted, 1) if name == "delete"]


@attrs.define
class Schedule:
    cluster: Cluster
    nursery: trio.Nursery
    runs: list[Planned] = attrs.field(factory=list)
    followers: list[Follower] = attrs.field(factory=list)
    notes: int = 0

    def node(self, index: int) -> Node:
        alive = self.cluster.alive()
        return alive[index % len(alive)]

    async def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "kill":
            if len(self.cluster.alive()) > 1:
                await self.cluster.kill(self.node(op[1]))
            return
        if kind == "start":
            _, scenario, index = op
            tag = f"r{len(self.runs)}"
            async with self.cluster.client(self.node(index)) as client:
                run = await client.start(
                    "worker", f"{scenario} #{tag}", session_id=tag, subscribe=None
                )
            self.runs.append(Planned(run.id, scenario, tag))
            return
        if not self.runs:
            return
        _, which, index = op
        planned = self.runs[which % len(self.runs)]
        node = self.node(index)
        if kind == "subscribe":
            follower = Follower(self.cluster, planned.run_id)
            self.followers.append(follower)
            self.nursery.start_soon(follower.follow, node)
            return
        async with self.cluster.client(node) as client:
            run = client.attach(planned.run_id)
            try:
                if kind == "cancel":
                    await run.cancel("schedule")
                    planned.cancel_acked = True
                elif kind == "inject":
                    self.notes += 1
                    note = f"note {self.notes}"
                    await run.inject(note)
                    planned.injections.append(note)
                elif kind == "approve":
                    for call_id in planned.approval_ids():
                        try:
                            await run.approve(call_id)
                        except ControlError as exc:
                            # Not waiting (yet, or any more): allowed, changes nothing.
                            if exc.code != "not_found":
                                raise
            except ta.RunClosedError:
                pass  # it had ended: allowed, changes nothing

    async def finish(self) -> ta.RunStatus | None:
        """Open every gate, give every pending approval, until every run ended."""
        for gate in ("charge", "lookup", "stream"):
            self.cluster.open_gate(gate)
        async with self.cluster.client(self.cluster.alive()[0]) as client:
            for planned in self.runs:
                run = client.attach(planned.run_id)
                while True:
                    info = await run.get()
                    if info.status.is_terminal:
                        break
                    for call_id in info.pending_approvals:
                        # A race with the run's own progress: look again.
                        with contextlib.suppress(ControlError, ta.RunClosedError):
                            await run.approve(call_id)
                    await trio.sleep(POLL)
        return None


def settled(follower: Follower, end: int) -> bool:
    return follower.terminal is not None or follower.next_seq > end


async def run_schedule(dsn: str, ops: list[tuple[Any, ...]]) -> None:
    async with open_cluster(dsn, NODES, lease_ttl=1.0) as cluster, trio.open_nursery() as nursery:
        with trio.fail_after(BOUND):
            schedule = Schedule(cluster, nursery)
            for op in [("start", "delete", 0), *ops]:
                print("op", op, "alive", [n.node_id for n in cluster.alive()])
                await schedule.apply(op)
            print("finishing", schedule.runs)
            await schedule.finish()
            survivor = cluster.alive()[0]
            logs = {p.run_id: await replay(cluster, survivor, p.run_id) for p in schedule.runs}
            for follower in schedule.followers:
                # Its terminal update, or (the reported gap, see below) nothing more
                # can come: it asked for seqs past the log's end.
                end = logs[follower.run_id][-1].seq
                with trio.move_on_after(BOUND / 2) as stuck:
                    await follower.wait_until(functools.partial(settled, follower, end))
                assert not stuck.cancelled_caught, (
                    f"subscriber of {follower.run_id} stuck: connections"
                    f" {follower.connections}, seqs {[e.seq for e in follower.events]},"
                    f" log ends at {end}"
                )
            async with cluster.client(survivor) as client:
                listed = Counter(info.run_id for info in await client.list_runs())
            stored = {
                p.tag: await trio.to_thread.run_sync(stored_items, dsn, p.tag)
                for p in schedule.runs
            }
            nursery.cancel_scope.cancel()  # the followers still waiting

    assert listed == Counter(p.run_id for p in schedule.runs), listed
    for planned in schedule.runs:
        log = logs[planned.run_id]
        assert_contiguous(event.seq for event in log)
        assert not [e for e in log if isinstance(e, ta.EventsDropped)]
        terminals = [e for e in log if isinstance(e, ta.RunUpdated) and e.status.is_terminal]
        assert terminals == [log[-1]], terminals
        expected = ta.RunStatus.CANCELLED if planned.cancel_acked else ta.RunStatus.COMPLETED
        assert terminals[0].status is expected, (planned, terminals[0])
        items = stored[planned.tag]
        assert ta.conversation_problems(items) == [], items
        # The log's items are the session's, in order (a subsequence: an item the
        # session got just before its node died may miss its run.item event, which
        # was not flushed yet — reported; the session is the record).
        logged = [item.to_json() for item in items_of(log)]
        kept = iter(item.to_json() for item in items)
        assert all(item in kept for item in logged), (logged, items)
        notes = Counter(
            item.content
            for item in items
            if isinstance(item, ta.UserMessage) and item.content.startswith("note")
        )
        assert set(notes) <= set(planned.injections), (notes, planned.injections)
        assert all(count == 1 for count in notes.values()), notes
    for follower in schedule.followers:
        log = logs[follower.run_id]
        by_seq = {event.seq: event.to_json() for event in log}
        if any(by_seq.get(event.seq) != event.to_json() for event in follower.events):
            # The reported gap (test_cluster_processes.py tests it on its own): a
            # subscriber on the owner saw events that were never persisted, the owner
            # died, and the next attempt reused their seqs; this subscriber's view is
            # not the log's, and it may even wait past the log's end.
            print(f"subscriber of {follower.run_id} hit the owner-subscriber gap")
            continue
        # Otherwise: each seq once, from 1, to the terminal update, as in the log.
        follower.check()
    charged = Counter(
        (r["run_id"], r["call_id"]) for r in cluster.executions() if r["tool"] == "charge"
    )
    assert all(count == 1 for count in charged.values()), charged
    deleted = Counter(
        (r["run_id"], r["call_id"]) for r in cluster.executions() if r["tool"] == "delete"
    )
    assert all(count == 1 for count in deleted.values()), deleted


@settings(
    max_examples=int(os.environ.get("CLUSTER_EXAMPLES", "6")),
    derandomize=True,
    database=None,
    deadline=None,
    # An example takes seconds; shrinking one would take many minutes: the printed
    # ops of the failing example are the reproduction.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    print_blob=True,
)
@given(ops=st.lists(OPS, min_size=2, max_size=9))
@example(  # the owner of a run mid-tool and awaiting approval dies under a subscriber
    ops=[
        ("start", "charge delete", 1),
        ("subscribe", 1, 2),
        ("inject", 1, 0),
        ("kill", 1),
        ("approve", 1, 2),
        ("subscribe", 0, 1),
        ("cancel", 0, 0),
    ]
)
def test_ops_and_node_kills_on_a_small_cluster(
    postgres_server: PostgresServer, ops: list[tuple[Any, ...]]
) -> None:
    dsn = postgres_server.create_database()
    try:
        trio.run(run_schedule, dsn, ops)
    finally:
        postgres_server.drop_database(dsn)
