"""PostgresCluster's arguments, its schema, and the event writer's batching (no
database round trip per streamed delta)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import psycopg
import pytest
import trio

import trio_agents as ta
from tests.support.cluster_nodes import agents
from tests.support.cluster_support import Client, Node, client, node
from tests.support.control_support import TOKENS
from trio_agents._exception_groups import leaves
from trio_agents.cluster import PostgresCluster
from trio_agents.control import ControlServer
from trio_agents.models import ScriptedModel, Turn


@asynccontextmanager
async def node_after_a_run(dsn: str) -> AsyncIterator[tuple[Node, Client, str]]:
    """Node A and a client of it, once a run (answered ``hello``) ended: yields the
    node, the client and the run's id."""
    async with trio.open_nursery() as nursery:
        served = agents(ScriptedModel([], default="hello"))
        async with node(nursery, served, dsn, "A") as a, client(a.url) as c:
            run_id = await c.start_run(agent="a", input="hi", subscribe="all")
            await c.wait_terminal(run_id)
            yield a, c, run_id
        nursery.cancel_scope.cancel()


async def start_and_stop(dsn: str, node_id: str) -> None:
    """Start a node (its schema checked, migrated or created) and stop it at once."""
    served = agents(ScriptedModel([], default="hello"))
    async with trio.open_nursery() as nursery, node(nursery, served, dsn, node_id):
        nursery.cancel_scope.cancel()


def execute(dsn: str, *statements: str) -> None:
    """Run ``statements`` on the database, each committed at once."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def test_arguments_are_checked() -> None:
    cluster = PostgresCluster("host=localhost dbname=x", node_id="n1", lease_ttl=2, max_runs=3)
    assert (cluster.node_id, cluster.lease_ttl, cluster.max_runs) == ("n1", 2.0, 3)
    assert cluster.dsn == "host=localhost dbname=x"
    assert PostgresCluster("host=localhost").node_id  # a generated id
    with pytest.raises(TypeError):
        PostgresCluster(b"dsn")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lease_ttl"):
        PostgresCluster("host=x", lease_ttl=0)
    with pytest.raises(ValueError, match="max_runs"):
        PostgresCluster("host=x", max_runs=0)
    with pytest.raises(TypeError, match="max_runs"):
        PostgresCluster("host=x", max_runs=True)
    agent = ta.Agent(name="a", instructions="", model=ScriptedModel(["x"]))
    with pytest.raises(ValueError, match="sessions"):
        ControlServer({"a": agent}, auth=TOKENS, cluster=cluster, sessions="x.db")
    with pytest.raises(TypeError, match="cluster"):
        ControlServer({"a": agent}, auth=TOKENS, cluster="dsn")  # type: ignore[arg-type]
    assert ControlServer({"a": agent}, auth=TOKENS, cluster=cluster).cluster is cluster


async def test_the_schema_is_created_and_versioned(pg_dsn: str) -> None:
    async with node_after_a_run(pg_dsn):
        pass  # one run, then a graceful stop
    with psycopg.connect(pg_dsn) as conn:
        versions: dict[str, int] = dict(
            conn.execute("SELECT component, version FROM trio_agents_schema").fetchall()
        )
        assert versions == {"sessions": 1, "cluster": 5}
        (nodes,) = conn.execute("SELECT count(*) FROM trio_agents_nodes").fetchone() or (None,)
        assert nodes == 0  # a node that stopped gracefully removed its row
        row = conn.execute(
            "SELECT status, finished, active_key, attempt FROM trio_agents_runs"
        ).fetchone()
        assert row == ("completed", True, None, 1)


async def test_streamed_deltas_are_written_in_batches(pg_dsn: str) -> None:
    chunks = [f"w{i} " for i in range(300)]
    model = ScriptedModel([Turn(text=chunks)])
    served = agents(model)
    async with trio.open_nursery() as nursery:
        async with (
            node(nursery, served, pg_dsn, "A") as a,
            node(nursery, served, pg_dsn, "B") as b,
            client(a.url) as ca,
            client(b.url) as cb,
        ):
            before = a.cluster.statistics().flushes
            run_id = await ca.start_run(agent="a", input="talk", subscribe="all")
            await ca.wait_terminal(run_id)
            await cb.ok("run.subscribe", run_id=run_id, from_seq=1)
            await cb.wait_terminal(run_id)
            assert cb.events[run_id] == ca.events[run_id]
            deltas = [f for f in cb.events[run_id] if f["event"]["type"] == "response.text.delta"]
            assert len(deltas) == 300
            # Far fewer writes than events: batches, flushed at items and statuses.
            assert a.cluster.statistics().flushes - before < 30
        nursery.cancel_scope.cancel()


async def test_finished_runs_are_forgotten_after_retention(pg_dsn: str) -> None:
    async with node_after_a_run(pg_dsn) as (a, c, run_id):
        execute(pg_dsn, "UPDATE trio_agents_runs SET updated_at = now() - interval '1 day'")
        await a.cluster._node.leases.cleanup()
        gone = await c.request("run.get", run_id=run_id)
        assert gone["type"] == "ack"  # still retained in the node's memory
    with psycopg.connect(pg_dsn) as conn:
        for table in ("runs", "events"):
            count = conn.execute(f"SELECT count(*) FROM trio_agents_{table}").fetchone()
            assert count == (0,)


async def test_a_node_refuses_tables_of_a_newer_version(pg_dsn: str) -> None:
    from trio_agents.cluster._db import ClusterSchemaError

    await start_and_stop(pg_dsn, "A")
    execute(pg_dsn, "UPDATE trio_agents_schema SET version = 99 WHERE component = 'cluster'")
    with pytest.raises(BaseExceptionGroup) as caught:
        await start_and_stop(pg_dsn, "B")
    matched, rest = caught.value.split(ClusterSchemaError)
    assert rest is None
    assert matched is not None
    assert "newer than this trio_agents supports" in str(leaves(matched)[0])


async def test_version_1_tables_are_migrated(pg_dsn: str) -> None:
    # Version 2 adds the index of queued runs (their order for a session, cluster-wide);
    # version 3 the runs' usage and the table of child runs; version 4 the runs' own
    # usage and version 5 their status's detail (their records' on every node).
    await start_and_stop(pg_dsn, "A")
    execute(
        pg_dsn,
        "DROP INDEX trio_agents_runs_queued",
        "ALTER TABLE trio_agents_runs DROP COLUMN usage",
        "ALTER TABLE trio_agents_runs DROP COLUMN run_usage",
        "ALTER TABLE trio_agents_runs DROP COLUMN detail",
        "DROP TABLE trio_agents_children",
        "UPDATE trio_agents_schema SET version = 1 WHERE component = 'cluster'",
    )
    await start_and_stop(pg_dsn, "B")
    with psycopg.connect(pg_dsn) as conn:
        (version,) = conn.execute(
            "SELECT version FROM trio_agents_schema WHERE component = 'cluster'"
        ).fetchone() or (None,)
        assert version == 5
        columns = {
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns"
                " WHERE table_name IN ('trio_agents_runs', 'trio_agents_children')"
            ).fetchall()
        }
        assert {"usage", "run_usage", "detail", "root_id", "cancel"} <= columns
        indexes = {
            row[0]
            for row in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'trio_agents_runs'"
            ).fetchall()
        }
        assert "trio_agents_runs_queued" in indexes
