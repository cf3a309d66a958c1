"""Chaos on a cluster of real node processes (issue 30, "Done when"): runs with shared
sessions (``on_busy="enqueue"``), tools behind gates, approvals and random cancels on
random nodes, while nodes are killed (``SIGKILL``, then replaced), frozen
(``SIGSTOP`` for up to twice the lease, then ``SIGCONT``) and PostgreSQL is restarted
(stopped for up to longer than the lease), with ``lease_ttl=3``. Then the faults stop,
every gate opens, every pending approval is given, and:

- every run ends, with exactly one terminal event (the last of its log, seqs from 1
  with no gap): ``cancelled`` if a cancel of it was acked, ``completed`` if none was
  sent, either if one was sent but its answer was lost to a fault (then the cancel may
  or may not have been applied: at-most-once answers, not effects);
- no call of a non-idempotent tool (``charge``, ``delete``) ran twice;
- every session as stored is a valid conversation; every subscriber's view (it
  reconnects elsewhere when its node dies) is the log's, exactly;
- every node still runs that was not killed (none crashed on its own).

Seeded (``CHAOS_SEED``; the seed and every fault are printed: the reproduction) and
bounded. CI runs a small one (``CHAOS_RUNS``, default 12); ``make fuzz`` runs 100.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

import trio_agents as ta
from tests.support.cluster_app import TOOLS
from tests.support.process_cluster import (
    POLL,
    Cluster,
    Follower,
    Node,
    assert_contiguous,
    assert_same_events,
    items_of,
    open_cluster,
    replay,
    stored_items,
)
from trio_agents.control import ControlConnectionError, ControlError

if TYPE_CHECKING:
    from tests.support.pg_support import PostgresServer

LEASE: Final = 3.0
NODES: Final = 3
RUNS: Final = int(os.environ.get("CHAOS_RUNS", "12"))
SEED: Final = int(os.environ.get("CHAOS_SEED", "30"))
SESSIONS: Final = max(2, RUNS // 4)  # so runs queue for their sessions
FAULTS: Final = max(4, RUNS // 8)  # at least
SCENARIOS: Final = ("charge", "lookup", "delete", "stream", "charge delete", "lookup delete")
BOUND: Final = 120.0 + 6.0 * RUNS  # a hang guard for the whole test
SETTLE: Final = 90.0 + 1.5 * RUNS  # a hang guard for the runs to end once faults stop


@attrs.define
class Planned:
    run_id: str
    scenario: str
    tag: str
    session: str
    cancel_acked: bool = False
    # A cancel was sent (acked or not): one whose answer was lost to a fault (a frozen
    # node, PostgreSQL down) may still have been applied.
    cancel_sent: bool = False

    def approvals(self) -> list[str]:
        wanted = [word for word in self.scenario.split() if word in TOOLS]
        return [
            f"call_{name}_{n}_{self.tag}" for n, name in enumerate(wanted, 1) if name == "delete"
        ]


@attrs.define
class Chaos:
    cluster: Cluster
    server: PostgresServer
    nursery: trio.Nursery
    rng: random.Random
    runs: list[Planned] = attrs.field(factory=list)
    followers: list[Follower] = attrs.field(factory=list)
    frozen: set[str] = attrs.field(factory=set)
    killed: set[str] = attrs.field(factory=set)
    faults: list[str] = attrs.field(factory=list)
    database_up: bool = True

    def usable(self) -> list[Node]:
        return [n for n in self.cluster.alive() if n.url and n.node_id not in self.frozen]

    def pick(self) -> Node:
        return self.rng.choice(self.usable())

    async def attempt(self, op: Any) -> Any:
        """Send an op to usable nodes until one answers (a node killed or the database
        away meanwhile: try again); None if it is refused for good."""
        while True:
            node = self.pick()
            try:
                async with self.cluster.client(node) as client:
                    return await op(client)
            except ControlConnectionError:
                pass
            except ControlError as exc:
                if exc.code != "internal":
                    raise
            await trio.sleep(0.2)  # a retry's pause (the database may be away)

    async def start(self, number: int) -> None:
        scenario = self.rng.choice(SCENARIOS)
        session = f"s{self.rng.randrange(SESSIONS)}"
        tags: list[str] = []

        async def start(client: Any) -> Any:
            # Each try has its own tag: a start whose answer was lost to a fault may
            # still have started its run (an orphan, in the same session), and the
            # model's call ids are per tag (``unique``): a retry with the same tag
            # would call ``call_NAME_N_TAG`` again in that session.
            tag = f"c{number}" if not tags else f"c{number}r{len(tags)}"
            tags.append(tag)
            return await client.start(
                "worker", f"{scenario} unique #{tag}", session_id=session, on_busy="enqueue"
            )

        run = await self.attempt(start)
        self.runs.append(Planned(run.id, scenario, tags[-1], session))
        if self.rng.random() < 0.25:
            follower = Follower(self.cluster, run.id)
            self.followers.append(follower)
            self.nursery.start_soon(follower.follow, self.pick())

    async def poke(self) -> None:
        """A random cancel, or approval, or gate opening, of a random run."""
        planned = self.rng.choice(self.runs)
        roll = self.rng.random()
        if roll < 0.15:

            async def cancel(client: Any) -> None:
                planned.cancel_sent = True
                with contextlib.suppress(ta.RunClosedError):
                    await client.attach(planned.run_id).cancel("chaos")
                    planned.cancel_acked = True

            await self.attempt(cancel)
        elif roll < 0.5:
            await self.approve(planned)
        else:
            self.open_gates(planned)

    async def approve(self, planned: Planned) -> None:
        async def approve(client: Any) -> None:
            for call_id in planned.approvals():
                with contextlib.suppress(ta.RunClosedError, ControlError):
                    await client.attach(planned.run_id).approve(call_id)

        await self.attempt(approve)

    def open_gates(self, planned: Planned) -> None:
        for gate in ("charge", "lookup"):
            self.cluster.open_gate(gate, planned.run_id)
        self.cluster.open_gate("stream", planned.tag)

    async def fault(self) -> None:
        """One fault, at random: kill a node (and start another), freeze one for a
        while, or restart PostgreSQL."""
        roll = self.rng.random()
        if roll < 0.35 and len(self.usable()) > 1:
            victim = self.pick()
            self.faults.append(f"kill {victim.node_id}")
            self.killed.add(victim.node_id)
            await self.cluster.kill(victim)
            await self.cluster.start_node()
        elif roll < 0.7 and len(self.usable()) > 1:
            victim = self.pick()
            pause = self.rng.uniform(0.5, 2 * LEASE)
            self.faults.append(f"freeze {victim.node_id} {pause:.1f}s")
            self.frozen.add(victim.node_id)
            self.cluster.freeze(victim)
            await trio.sleep(pause)  # the fault's length, not a synchronisation
            self.cluster.thaw(victim)
            self.frozen.discard(victim.node_id)
        elif self.database_up:
            outage = self.rng.uniform(0.2, 1.5 * LEASE)
            self.faults.append(f"postgres down {outage:.1f}s")
            self.database_up = False
            await trio.to_thread.run_sync(self.server.stop_server, "immediate")
            await trio.sleep(outage)  # the fault's length
            await trio.to_thread.run_sync(self.server.start_server)
            self.database_up = True

    async def faults_until(self, done: trio.Event) -> None:
        while not done.is_set():
            with trio.move_on_after(self.rng.uniform(0.5, 2.0)):  # between faults
                await done.wait()
            if not done.is_set():
                await self.fault()

    async def settle(self) -> None:
        """Open every gate and give every pending approval, on every pass over the
        unfinished runs (a run may wait for its session behind one that waits for
        approval), until every run ended."""
        for gate in ("charge", "lookup", "stream"):
            self.cluster.open_gate(gate)
        left = list(self.runs)
        report = trio.current_time() + 10.0
        while left:
            await self.settle_orphans()
            for planned in list(left):

                async def look(client: Any, planned: Planned = planned) -> Any:
                    return await client.attach(planned.run_id).get()

                info = await self.attempt(look)
                if info.status.is_terminal:
                    left.remove(planned)
                elif info.pending_approvals:
                    await self.approve(planned)
            if trio.current_time() > report:
                report = trio.current_time() + 10.0
                print("waiting for", left)
            await trio.sleep(POLL)

    async def settle_orphans(self) -> None:
        """Approve what the runs no test start answered (orphans: their start's answer
        was lost, and it was tried again) wait for: they may hold a session the planned
        runs wait for. Nothing else is checked of them."""
        planned = {p.run_id for p in self.runs}

        async def orphans(client: Any) -> list[Any]:
            runs = await client.list_runs()
            return [r for r in runs if r.run_id not in planned and not r.status.is_terminal]

        for info in await self.attempt(orphans):

            async def approve(client: Any, info: Any = info) -> None:
                for call_id in info.pending_approvals:
                    with contextlib.suppress(ta.RunClosedError, ControlError):
                        await client.attach(info.run_id).approve(call_id)

            await self.attempt(approve)


def ended(follower: Follower) -> bool:
    return follower.terminal is not None


async def chaos(server: PostgresServer, dsn: str) -> None:
    rng = random.Random(SEED)
    print(f"chaos: seed {SEED}, {RUNS} runs, {SESSIONS} sessions")
    async with (
        open_cluster(dsn, NODES, lease_ttl=LEASE) as cluster,
        trio.open_nursery() as nursery,
    ):
        with trio.fail_after(BOUND):
            state = Chaos(cluster, server, nursery, rng)
            done = trio.Event()
            async with trio.open_nursery() as faults:
                faults.start_soon(state.faults_until, done)
                for number in range(RUNS):
                    await state.start(number)
                    for _ in range(rng.randrange(3)):
                        await state.poke()
                while len(state.faults) < FAULTS:  # faults go on meanwhile
                    await state.poke()
                    await trio.sleep(0.2)  # between pokes
                done.set()
            print("faults:", state.faults)
            while len(cluster.alive()) < NODES:
                await cluster.start_node()
            with trio.fail_after(SETTLE):
                await state.settle()
            survivor = state.usable()[0]
            logs = {p.run_id: await replay(cluster, survivor, p.run_id) for p in state.runs}
            for follower in state.followers:
                with trio.fail_after(SETTLE):
                    await follower.wait_until(functools.partial(ended, follower))
            stored = {
                session: await trio.to_thread.run_sync(stored_items, dsn, session)
                for session in {p.session for p in state.runs}
            }
            crashed = [
                node.node_id
                for node in cluster.nodes.values()
                if not node.running and node.node_id not in state.killed
            ]
            nursery.cancel_scope.cancel()

    assert crashed == [], crashed
    for planned in state.runs:
        log = logs[planned.run_id]
        assert_contiguous(event.seq for event in log)
        terminals = [e for e in log if isinstance(e, ta.RunUpdated) and e.status.is_terminal]
        assert terminals == [log[-1]], (planned, terminals)
        if planned.cancel_acked:
            expected = {ta.RunStatus.CANCELLED}
        elif planned.cancel_sent:  # its answer lost to a fault: applied or not
            expected = {ta.RunStatus.CANCELLED, ta.RunStatus.COMPLETED}
        else:
            expected = {ta.RunStatus.COMPLETED}
        assert terminals[0].status in expected, (planned, terminals[0])
        if terminals[0].status is ta.RunStatus.CANCELLED:
            assert terminals[0].reason == "chaos", (planned, terminals[0])
        assert ta.conversation_problems(items_of(log)) == [], planned
    for session, items in stored.items():
        assert ta.conversation_problems(items) == [], (session, items)
    for follower in state.followers:
        follower.check()
        assert_same_events(follower.events, logs[follower.run_id])
    executed = Counter(
        (r["run_id"], r["call_id"])
        for r in cluster.executions()
        if r["tool"] in ("charge", "delete")
    )
    assert all(count == 1 for count in executed.values()), executed


def test_chaos_on_three_nodes(crashable_postgres: PostgresServer) -> None:
    dsn = crashable_postgres.create_database()
    trio.run(chaos, crashable_postgres, dsn)
