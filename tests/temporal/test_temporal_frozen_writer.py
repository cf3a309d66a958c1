"""A worker frozen in the middle of a PostgreSQL write (SIGSTOP, a paused VM) must not
hold its run's row lock: the attempt that takes the run over claims it once the
server has ended the frozen transaction (``idle_timeout``), not when the frozen
process thaws or dies (DESIGN §20: a frozen worker is fenced). The writer is a real
process that stops inside a real transaction of the store, right after its fence
check took the root's row: its writing thread sleeps there, which PostgreSQL sees as a
stopped client does (a SIGSTOP sent from that thread lets it run on into its next
statement first, a point the timeout does not cover: see docs/temporal.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import trio

from tests.support.pg_support import postgres_url
from trio_agents import RunStatus
from trio_agents.hosting import RunInfo
from trio_agents.temporal import PostgresRunStore

pytestmark = pytest.mark.trio

# The writer: attempt 1 writes an event batch and stops once its transaction holds the
# root's row lock (the store's own fence check takes it).
WRITER = textwrap.dedent(
    """
    import json, sys, time
    import trio
    import trio_agents.temporal._pg_run_store as store_module
    from trio_agents.temporal import PostgresRunStore

    checked = store_module._owns

    def owns(conn, root, attempt, *, lock):
        owned = checked(conn, root, attempt, lock=lock)
        if lock:
            print("locked", flush=True)
            time.sleep(3600)  # stopped here, between two statements of its transaction
        return owned

    store_module._owns = owns

    async def main():
        store = PostgresRunStore(sys.argv[1], idle_timeout=1.0)
        event = ("r1", 2, json.dumps({"type": "run.updated", "seq": 2}))
        await store.write_events("r1", 1, "alice", [event], [], None)

    trio.run(main)
    """
)


def _info() -> RunInfo:
    return RunInfo(
        run_id="r1", agent="a", session_id="s1", status=RunStatus.QUEUED, reason=None, seq=0
    )


async def test_a_writer_frozen_in_its_transaction_does_not_hold_the_takeover(
    pg_dsn: str,
) -> None:
    url = postgres_url(pg_dsn)
    # The claimer waits up to 30 s for the row (its lock_timeout): on a loaded machine
    # PostgreSQL may take seconds to end the frozen backend; without the writer's
    # idle_timeout the row stays held for good (the writer never thaws) and the claim
    # fails all the same.
    async with PostgresRunStore(url, lock_timeout=30.0) as store:
        assert await store.create_run(_info(), "alice", claim_session=True) is None
        assert (await store.claim_attempt("r1", "alice", "s1", 1, _info())).owned
        writer = await trio.lowlevel.open_process(
            [sys.executable, "-c", WRITER, url],
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        try:
            assert writer.stdout is not None
            with trio.fail_after(30):
                said = b""
                while not said.endswith(b"\n"):
                    chunk = await writer.stdout.receive_some()
                    assert chunk, f"the writer ended first (said {said!r})"
                    said += chunk
            assert said == b"locked\n"
            # Frozen inside the transaction, holding the root's row: the next attempt's
            # claim waits for the server to end it (1 s idle).
            with trio.fail_after(60):  # a bound only: the lock_timeout answers first
                claim = await store.claim_attempt("r1", "alice", "s1", 2, _info())
            assert claim.owned
            assert claim.next_seq == 1  # nothing of the frozen batch was written
        finally:
            writer.send_signal(signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await writer.wait()
                if writer.stdout is not None:
                    await writer.stdout.aclose()
        # Thawed or not, the frozen attempt is fenced now.
        assert not await store.owns("r1", 1)
