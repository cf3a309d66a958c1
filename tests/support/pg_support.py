"""A throwaway PostgreSQL server for the tests that need one.

:class:`PostgresServer` runs ``initdb`` and ``pg_ctl`` from the machine's PostgreSQL
(``initdb`` on ``PATH``, else Debian's ``/usr/lib/postgresql/<version>/bin``) into a
fresh temporary directory, listening on 127.0.0.1 only (no Unix socket) on a free port,
with trust authentication (it is reachable only from this machine, for the length of
the test session) and durability switched off (``fsync=off``: the machine never
crashes under a test; ``synchronous_commit=off`` unless the server is made to be
crashed and restarted, :meth:`PostgresServer.restart`). PostgreSQL refuses to run as
root, so as root the binaries run as the ``postgres`` user through ``runuser`` and the
directory is handed to that user.

The pytest fixtures (``postgres_server``, ``pg_dsn``) live in ``conftest.py``; each
test gets a database of its own, created from an empty template.

When no PostgreSQL is installed, the fixture fails under ``CI=true`` (CI installs it:
``.ci/postgres.sh``) and skips with the reason elsewhere.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Final

import attrs
import psycopg

__all__ = ["PostgresServer", "PostgresUnavailable", "find_bin_dir", "postgres_url"]

UNPRIVILEGED_USER: Final = "postgres"
TEMPLATE: Final = "trio_agents_test_template"
_database_numbers = itertools.count()


class PostgresUnavailable(Exception):
    """No PostgreSQL server can be started on this machine (the message says why)."""


def find_bin_dir() -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``."""
    on_path = shutil.which("initdb")
    if on_path is not None:
        return Path(os.path.realpath(on_path)).parent
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: (
            int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0
        ),
    )
    if found:
        return Path(found[-1]).parent
    raise PostgresUnavailable(
        "PostgreSQL is not installed: no initdb on PATH or in /usr/lib/postgresql/*/bin"
        " (Debian: apt-get install postgresql; `make test` does it when run as root)"
    )


def postgres_url(dsn: str) -> str:
    """The server's ``host=... dbname=...`` DSN as a ``postgresql://`` URI (what
    ``trio-agents worker --db`` and ``trio_agents.temporal.shared_storage`` take)."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    return f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@attrs.define
class PostgresServer:
    """One throwaway PostgreSQL server: :meth:`start`, then :meth:`stop`."""

    bin_dir: Path
    synchronous_commit: bool = False
    """True for a server that may be crashed (:meth:`restart` in ``immediate`` mode)
    without losing a commit: ``synchronous_commit=off`` loses the last ~200 ms of
    commits when the server processes die."""
    directory: Path = attrs.field(init=False)
    port: int = attrs.field(init=False, default=0)
    started_in: float = attrs.field(init=False, default=0.0)
    _as_user: list[str] = attrs.field(init=False, factory=list)
    _running: bool = attrs.field(init=False, default=False)

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def start(self) -> None:
        """initdb + pg_ctl start; retries on another port if the chosen one was taken."""
        begun = time.monotonic()
        self.directory = Path(tempfile.mkdtemp(prefix="trio-agents-pg-"))
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam(UNPRIVILEGED_USER)
            except KeyError:
                raise PostgresUnavailable(
                    f"running as root, and there is no {UNPRIVILEGED_USER!r} user to run"
                    " PostgreSQL as (PostgreSQL refuses to run as root)"
                ) from None
            runuser = shutil.which("runuser")
            if runuser is None:
                raise PostgresUnavailable("running as root, and runuser is not installed")
            os.chown(self.directory, user.pw_uid, user.pw_gid)
            self._as_user = [runuser, "-u", UNPRIVILEGED_USER, "--"]
        self._run(
            "initdb",
            "--pgdata",
            str(self.data_dir),
            "--username",
            "postgres",
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--locale",
            "C",
            "--no-sync",  # a throwaway cluster
        )
        for attempt in range(3):
            self.port = _free_port()
            try:
                self._pg_ctl_start()
            except PostgresUnavailable:
                if attempt == 2:
                    raise
                continue  # most likely the port was taken meanwhile
            break
        self._running = True
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {TEMPLATE} TEMPLATE template0 IS_TEMPLATE true")
        self.started_in = time.monotonic() - begun

    def _pg_ctl_start(self) -> None:
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-c port={self.port}",
                "-c unix_socket_directories=''",  # TCP on loopback only
                "-c fsync=off",
                f"-c synchronous_commit={'on' if self.synchronous_commit else 'off'}",
                "-c full_page_writes=off",
                "-c max_connections=200",
            ]
        )
        self._run(
            "pg_ctl",
            "start",
            "--pgdata",
            str(self.data_dir),
            "--wait",
            "--timeout",
            "60",
            "--log",
            str(self.directory / "server.log"),
            "-o",
            options,
        )

    def restart(self, mode: str = "fast") -> None:
        """Stop the server (``pg_ctl stop -m MODE``: ``fast`` a clean shutdown, clients
        disconnected; ``immediate`` a crash of the server processes, for a server with
        ``synchronous_commit=True``) and start it again on the same port, with the same
        options and data. Blocks until it accepts connections again."""
        self.stop_server(mode)
        self.start_server()

    def stop_server(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data for :meth:`start_server`."""
        if mode not in ("immediate", "fast", "smart"):
            raise ValueError(f"unknown pg_ctl stop mode {mode!r}")
        self._running = False
        self._run("pg_ctl", "stop", "--pgdata", str(self.data_dir), "-m", mode, "--wait")

    def start_server(self) -> None:
        """Start a server stopped by :meth:`stop_server`, on the same port."""
        self._pg_ctl_start()
        self._running = True

    def create_database(self) -> str:
        """A new, empty database; returns its DSN."""
        name = f"t{os.getpid()}_{next(_database_numbers)}"
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE}")
        return self.dsn(name)

    def drop_database(self, dsn: str) -> None:
        name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        """Stop the server at once (``-m immediate``) and remove its directory."""
        try:
            if self._running:
                self._running = False
                with contextlib.suppress(PostgresUnavailable):
                    self._run("pg_ctl", "stop", "--pgdata", str(self.data_dir), "-m", "immediate")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def log(self) -> str:
        try:
            return (self.directory / "server.log").read_text(errors="replace")
        except OSError:
            return ""

    def _run(self, program: str, *args: str) -> None:
        command = [*self._as_user, str(self.bin_dir / program), *args]
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            cwd=self.directory,  # readable by the unprivileged user
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise PostgresUnavailable(
                f"{program} failed ({done.returncode}): {done.stderr.strip()[-2000:]}"
                f"\n{self.log()[-2000:]}"
            )
