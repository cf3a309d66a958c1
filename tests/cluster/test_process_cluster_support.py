"""The cluster tests' own infrastructure (tests/support/process_cluster.py, tests/support/cluster_app.py,
``PostgresServer.restart``), on plain single-process nodes: it must work before the
cluster runtime is there, and it must not be why a cluster test fails."""

from __future__ import annotations

import psycopg
import pytest
import trio
import trio.testing

import trio_agents as ta
from tests.support.cluster_nodes_processes import bounded_cluster
from tests.support.pg_support import PostgresServer, PostgresUnavailable, find_bin_dir
from tests.support.process_cluster import events_until_terminal, items_of, open_cluster
from trio_agents.control import ControlConnectionError, connect


async def test_nodes_start_serve_a_gated_tool_and_die_by_sigkill() -> None:
    async with open_cluster(None, 2) as cluster:
        first, second = cluster.alive()
        assert first.url != second.url
        with trio.fail_after(30):
            async with cluster.client(first) as client:
                run = await client.start("worker", "charge #t1", session_id="s1")
                (record,) = await cluster.wait_executions(1, "charge", run.id)
                assert record["node"] == first.node_id
                assert record["call_id"] == "call_charge_1"
                assert cluster.owner_of_tag("t1") == first.node_id
                await cluster.kill(first)
                with pytest.raises(ControlConnectionError):
                    await run.wait()
        assert first.process.returncode == -9
        assert second.running


async def test_a_run_finishes_once_its_gates_open_and_sigterm_stops_a_node() -> None:
    async with bounded_cluster(None, 1, bound=30) as (cluster, _):
        (node,) = cluster.alive()
        async with cluster.client(node) as client:
            run = await client.start("worker", "charge lookup stream #t2")
            await cluster.wait_executions(1, "lookup", run.id)
            await cluster.wait_executions(1, "charge", run.id)
            cluster.open_gate("lookup", run.id)
            cluster.open_gate("charge")
            events: list[ta.RunEvent] = []
            terminal = await events_until_terminal(run, 1, events)
        assert terminal.status is ta.RunStatus.COMPLETED
        items = items_of(events)
        assert ta.conversation_problems(items) == []
        final = items[-1]
        assert isinstance(final, ta.AssistantMessage)
        assert final.content == "done charge=charged lookup=looked up users=1"
        assert await cluster.terminate(node) == 0
    assert any("SIGTERM" in line for line in node.stdout), node.stdout


async def test_the_stream_scenario_blocks_on_its_gate() -> None:
    async with bounded_cluster(None, 1, bound=30) as (cluster, _):
        (node,) = cluster.alive()
        async with cluster.client(node) as client:
            run = await client.start("worker", "stream #t3")
            deltas: list[str] = []
            async for event in run.events(1):
                if isinstance(event, ta.ResponseTextDelta):
                    deltas.append(event.text)
                    if len(deltas) == 2:
                        break
            assert deltas == ["alpha ", "beta "]
            cluster.open_gate("stream", "t3")
            terminal = await run.wait()
            assert terminal.status is ta.RunStatus.COMPLETED


def test_a_postgres_server_restarts_on_its_port_with_its_data() -> None:
    try:
        server = PostgresServer(find_bin_dir(), synchronous_commit=True)
        server.start()
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    try:
        dsn = server.create_database()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("INSERT INTO t VALUES (1)")
            port = server.port
            server.restart("immediate")
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
        assert server.port == port
        with psycopg.connect(dsn, autocommit=True) as conn:
            assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    finally:
        server.stop()


async def test_connect_fails_when_the_server_dies_during_the_handshake() -> None:
    async def accept_then_die(stream: trio.SocketStream) -> None:
        await stream.receive_some()  # the handshake request: then the "process" dies
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, accept_then_die, 0)
        port = listeners[0].socket.getsockname()[1]
        with trio.fail_after(3), pytest.raises(ControlConnectionError, match="closed the"):
            async with connect(f"ws://127.0.0.1:{port}/", token="t"):
                pass
        nursery.cancel_scope.cancel()


async def test_connect_gives_up_on_a_server_that_never_answers_the_handshake(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def accept_and_stall(stream: trio.SocketStream) -> None:
        await stream.receive_some()  # the handshake request, never answered
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, accept_and_stall, 0)
        port = listeners[0].socket.getsockname()[1]
        with pytest.raises(ControlConnectionError, match="did not finish within 7 s") as caught:
            async with connect(f"ws://127.0.0.1:{port}/", token="t", connect_timeout=7):
                pass
        assert caught.value.code == "connect_failed"
        nursery.cancel_scope.cancel()
