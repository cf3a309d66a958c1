"""``trio-agents serve``: a server until Ctrl-C or SIGTERM.

A server is faces over a host (DESIGN §20): the command builds the host first — a
:class:`~trio_agents.hosting.LocalHost` (sessions in ``--db``), with ``--cluster DSN``
this node's host of a :class:`~trio_agents.cluster.PostgresCluster`, or with
``--temporal HOST:PORT`` a :class:`~trio_agents.temporal.TemporalHost` (the runs run on
``trio-agents worker`` processes; their events and records are read from the run store
beside ``--db``, which must be the workers' ``--db``) — then its faces, and serves them
with :func:`trio_agents.hosting.serve`.

Two ports: the websocket channel's (``--port``, trio-websocket owns its listener and
handshake: :class:`~trio_agents.control.WebsocketFace`) and the HTTP faces'
(``--http-port``, Hypercorn's: :class:`~trio_agents.faces.HttpFaces`, REST + SSE and the
faces built on the same plumbing). One port would mean terminating the websocket
handshake in Hypercorn and re-implementing the channel over ASGI websockets: its
slow-client and half-frame guards (``control/_stream.py``) live on the raw byte stream
trio-websocket reads. Both faces are clients of the same host: a run started on one is
seen, and steered, on the other.

Both signals mean the same graceful shutdown (DESIGN §10): the scope around
:func:`~trio_agents.hosting.serve` is cancelled, so every run is cancelled with reason
``"server shutdown"``, its session is written, every socket is closed with 1001, all
within ``--shutdown-timeout``; then the command prints one line and exits 0. With
``--cluster DSN`` the server is one node of a :class:`~trio_agents.cluster.PostgresCluster`
and the shutdown hands its runs over to the other nodes instead of cancelling them;
with ``--temporal`` the shutdown stops this server only: the runs go on on the workers.

The tokens file (``--tokens FILE``) maps bearer tokens to principals, one
``TOKEN PRINCIPAL`` pair per line; blank lines and lines starting with ``#`` are
skipped; a token has no whitespace, the principal is the rest of the line. A file that
other users may read or write is refused (like ssh's private keys): ``chmod 600``.
"""

from __future__ import annotations

import argparse
import errno
import gc
import importlib
import os
import secrets
import signal
import socket
import stat
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, TextIO

import trio

from .._agent import Agent
from .._exception_groups import leaves

if TYPE_CHECKING:
    from ..hosting import Limits, LocalHost, RunHost
    from ..temporal import SessionFactory, SharedRunStore

    TemporalStorage = tuple[SharedRunStore, SessionFactory, str]
from ._errors import EXIT_USAGE, CLIError

__all__ = [
    "DEFAULT_PRINCIPAL",
    "is_postgres_url",
    "load_app",
    "read_tokens",
    "serve_command",
    "store_failed",
    "temporal_storage",
]

DEFAULT_PRINCIPAL: Final = "cli"
"""The principal of the single ``--token`` (or ``$TRIO_AGENTS_TOKEN``)."""


def load_app(spec: str) -> dict[str, Agent]:
    """The agents ``--app MODULE:ATTR`` names: a mapping of name -> Agent, one Agent
    (served under its name), or a callable returning either.

    Raises:
        CLIError: the spec is malformed, the module does not import, or the
            attribute is not agents; the message says which and what to do.
    """
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise CLIError(
            f"--app must look like MODULE:ATTR (e.g. myagents:AGENTS), got {spec!r}",
            status=EXIT_USAGE,
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise CLIError(
                f"--app {spec}: no module named {exc.name!r} (run from the directory that"
                " holds it, or add that directory to PYTHONPATH)"
            ) from None
        raise CLIError(
            f"--app {spec}: importing {module_name!r} failed: {exc}"
            " (is a dependency of your module not installed?)"
        ) from None
    except Exception as exc:
        raise CLIError(
            f"--app {spec}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
            f" (python -c 'import {module_name}' shows the traceback)"
        ) from None
    try:
        value: Any = getattr(module, attr)
    except AttributeError:
        raise CLIError(f"--app {spec}: module {module_name!r} has no {attr!r}") from None
    if callable(value) and not isinstance(value, Mapping | Agent):
        try:
            value = value()
        except Exception as exc:
            raise CLIError(
                f"--app {spec}: calling {attr}() raised {type(exc).__name__}: {exc}"
            ) from None
    if isinstance(value, Agent):
        return {value.name: value}
    if not isinstance(value, Mapping):
        raise CLIError(
            f"--app {spec} is {type(value).__name__}; it must be a mapping of agent name"
            " -> Agent, an Agent, or a function returning one of these"
        )
    agents: dict[str, Agent] = {}
    for name, agent in value.items():
        if not isinstance(name, str) or not isinstance(agent, Agent):
            raise CLIError(
                f"--app {spec}: entry {name!r} maps to {type(agent).__name__};"
                " it must map agent names (str) to Agent objects"
            )
        agents[name] = agent
    if not agents:
        raise CLIError(f"--app {spec} holds no agents")
    return agents


def read_tokens(path: str) -> dict[str, str]:
    """Read a tokens file (see the module docstring): token -> principal.

    Raises:
        CLIError: the file cannot be read, other users may read or write it, or a
            line is malformed or repeats a token (the line number is given).
    """
    try:
        with open(path, encoding="utf-8") as file:
            mode = os.fstat(file.fileno()).st_mode
            if os.name == "posix" and mode & (stat.S_IROTH | stat.S_IWOTH):
                raise CLIError(
                    f"--tokens {path}: other users may read or write this file"
                    f" (mode {stat.filemode(mode)}); run: chmod 600 {path}"
                )
            text = file.read()
    except OSError as exc:
        raise CLIError(f"--tokens {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise CLIError(f"--tokens {path}: not UTF-8 text: {exc}") from None
    tokens: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2:
            raise CLIError(
                f"--tokens {path}, line {number}: expected 'TOKEN PRINCIPAL', got one word"
            )
        token, principal = parts[0], parts[1].strip()
        if token in tokens:
            raise CLIError(f"--tokens {path}, line {number}: this token is already on a line")
        tokens[token] = principal
    if not tokens:
        raise CLIError(f"--tokens {path}: no 'TOKEN PRINCIPAL' lines")
    return tokens


def _auth(args: argparse.Namespace, out: TextIO) -> dict[str, str]:
    if args.tokens is not None:
        tokens = read_tokens(args.tokens)
        principals = sorted(set(tokens.values()))
        out.write(f"tokens: {len(tokens)} from {args.tokens} ({', '.join(principals)})\n")
        return tokens
    token = args.token or os.environ.get("TRIO_AGENTS_TOKEN")
    if not token:
        token = secrets.token_urlsafe(24)
        out.write(f"token (shown once): {token}\n")
    return {token: DEFAULT_PRINCIPAL}


def _listen_error(exc: OSError, host: str, port: int, flag: str = "--port") -> CLIError:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return CLIError(
            f"cannot listen on {where}: the address is already in use (another server?);"
            f" choose another {flag}, or {flag} 0 for any free one"
        )
    if exc.errno == errno.EACCES:
        return CLIError(f"cannot listen on {where}: permission denied (ports below 1024?)")
    if isinstance(exc, socket.gaierror):
        return CLIError(f"cannot listen on {where}: unknown --host {host!r} ({exc.strerror})")
    return CLIError(f"cannot listen on {where}: {exc.strerror or exc}")


def _url(host: str, port: int) -> str:
    return f"ws://[{host}]:{port}/" if ":" in host else f"ws://{host}:{port}/"


def _http_url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"


def _host(
    args: argparse.Namespace,
    agents: Mapping[str, Agent],
    limits: Limits,
    storage: TemporalStorage | None,
) -> tuple[RunHost, LocalHost | None, str]:
    """The server's host, the host whose runs a shutdown stops here (None with Temporal:
    the runs live on the workers and go on without this server), and where runs live
    (``storage``: the Temporal workers' storage, from :func:`temporal_storage`)."""
    from ..hosting import LocalHost

    host: RunHost
    counted: LocalHost | None = None
    if storage is not None:
        from ..temporal import TemporalHost

        # The workers' storage, as `trio-agents worker --db` keeps it: the sessions in
        # the SQLite file and the runs' events and records beside it (FILE.runs), or
        # both in the PostgreSQL database. The host reads the sessions only to fork one
        # (POST /sessions/{id}/fork).
        store, sessions, stored = storage
        host = TemporalHost(
            args.temporal,
            agents,
            store=store,
            sessions=sessions,
            task_queue=args.task_queue,
            namespace=args.namespace,
            limits=limits,
            heartbeat_timeout=args.heartbeat_timeout,
        )
        where = (
            f"runs on the Temporal workers of task queue {args.task_queue!r} at"
            f" {args.temporal}, {stored}"
        )
    elif args.cluster is not None:
        from ..cluster import PostgresCluster

        cluster = PostgresCluster(
            args.cluster,
            node_id=args.node_id,
            lease_ttl=args.lease_ttl,
            max_runs=args.max_runs,
        )
        host = counted = cluster.host(agents, limits=limits)
        where = f"cluster node {cluster.node_id}, sessions in PostgreSQL"
    else:
        host = counted = LocalHost(agents, sessions=args.db, limits=limits)
        where = f"sessions in {args.db}"
    return host, counted, where


async def _serve(
    args: argparse.Namespace,
    agents: Mapping[str, Agent],
    auth: dict[str, str],
    out: TextIO,
    storage: TemporalStorage | None,
) -> tuple[str, int]:
    """Serve until SIGINT or SIGTERM, shut down; return the signal's name and how many
    runs the shutdown cancelled (or handed over)."""
    from ..control import WebsocketFace
    from ..hosting import Limits, ServedFace
    from ..hosting import serve as serve_faces

    # First the host (where the runs live), then its faces (how clients reach them).
    limits = Limits(shutdown_timeout=args.shutdown_timeout, max_run_limits=args.max_run_limits)
    host, counted, where = _host(args, agents, limits, storage)
    websocket = WebsocketFace(auth=auth, host=args.host, port=args.port)
    faces: list[ServedFace] = [websocket]
    http: Any = None
    ui_path = ""
    http_off = "--no-http"
    if not args.no_http:
        try:
            from ..faces import HttpFaces, HttpLimits
            from ..faces._ui import UI_PATH
        except ImportError:
            if args.http_port is not None:
                raise CLIError(
                    "--http-port needs the serve extra: pip install 'trio-agents[serve]'"
                ) from None
            http_off = "the serve extra is not installed: pip install 'trio-agents[serve]'"
        else:
            http_port = args.http_port
            if http_port is None:
                http_port = 0 if args.port == 0 else min(args.port + 1, 65535)
            http = HttpFaces(
                auth=auth,
                host=args.host,
                port=http_port,
                limits=HttpLimits(shutdown_timeout=args.shutdown_timeout),
            )
            faces.append(http)
            ui_path = UI_PATH
    received, active = "?", 0
    # Both signals go to this receiver from here on; before it, Ctrl-C is a plain
    # KeyboardInterrupt (nothing is served yet) and SIGTERM the default exit.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            try:
                ports = await nursery.start(serve_faces, host, faces)
            except OSError as exc:
                # The faces open in order: an HTTP face that built its app got as far
                # as its own listener.
                if http is not None and http.app is not None:
                    raise _listen_error(exc, args.host, http.port, "--http-port") from None
                raise _listen_error(exc, args.host, args.port) from None
            if args.gc_freeze:
                _freeze_start_up()
            # The "serving" line comes last: it says everything is listening.
            if http is not None:
                base = _http_url(args.host, ports[1])
                out.write(f"http: {base} (REST + SSE)\n")
                # the page asks for the token: it never goes in this URL
                out.write(f"web UI: {base}{ui_path.lstrip('/')} (sign in with the token)\n")
            else:
                out.write(f"http: off ({http_off})\n")
            out.write(
                f"serving {', '.join(agents)} on {_url(args.host, ports[0])}"
                f" ({where}; Ctrl-C or SIGTERM to stop)\n"
            )
            out.flush()
            async for signum in signals:
                received = signal.Signals(signum).name
                active = 0 if counted is None else counted.statistics().active_runs
                nursery.cancel_scope.cancel()
                break
    return received, active


def _freeze_start_up() -> None:
    """Move what start-up made (the modules, the app, the host and its faces: ~120,000
    objects the collector tracks) out of the collector's full passes, for the life of
    the server: a full pass walks every tracked object, so each one paid for all of
    them (hundreds of milliseconds on a loaded machine, in the tail of whichever run's
    cancel or stream it fell in; benchmarks/RESULTS.md, issue 43). Collected first, so
    no garbage is frozen with them. Only the command does this, never the library: an
    application embedding the library decides for its own process."""
    gc.collect()
    gc.freeze()


def _check_db(path: str) -> None:
    import sqlite3

    try:
        sqlite3.connect(path).close()
    except sqlite3.Error as exc:
        raise CLIError(f"--db {path}: cannot open it as a SQLite file: {exc}") from None


def is_postgres_url(db: str) -> bool:
    """Whether ``--db`` names a PostgreSQL database rather than a SQLite file."""
    return db.lower().startswith(("postgresql://", "postgres://"))


def temporal_storage(db: str) -> TemporalStorage:
    """The Temporal workers' storage named by ``--db`` (``shared_storage``): the run
    store, the session factory, and where they are (for the banner, never a password).
    A PostgreSQL database is reached once here, so a wrong URI, host or password is
    one line, not a traceback from the first run."""
    from ..temporal import shared_storage

    if not is_postgres_url(db):
        store, sessions = shared_storage(db)
        return store, sessions, f"sessions in {db}, runs in {db}.runs"
    try:
        import psycopg
    except ImportError:
        raise CLIError(
            "--db: a PostgreSQL database needs the postgres extra:"
            " pip install 'trio-agents[postgres]'"
        ) from None
    try:
        store, sessions = shared_storage(db)
    except ValueError as exc:
        raise CLIError(f"--db: {exc}") from None
    params = psycopg.conninfo.conninfo_to_dict(db)
    database = (
        f"{params.get('host') or 'localhost'}:{params.get('port') or 5432}"
        f"/{params.get('dbname') or '(default)'}"
    )
    try:
        psycopg.connect(db, connect_timeout=10).close()
    except psycopg.Error as exc:
        raise CLIError(
            f"--db: cannot connect to PostgreSQL at {database}: {' '.join(str(exc).split())}"
        ) from None
    return store, sessions, f"sessions and runs in PostgreSQL {database}"


def store_failed(group: BaseExceptionGroup[Any]) -> CLIError | None:
    """The one line for a Temporal run store that failed (its PostgreSQL tables are
    not usable, the database went away), or None for anything else."""
    from ..temporal import RunStoreError

    real = [leaf for leaf in leaves(group) if not isinstance(leaf, trio.Cancelled)]
    if len(real) != 1 or not isinstance(real[0], RunStoreError):
        return None
    return CLIError(f"--db: {' '.join(str(real[0]).split())}")


def _check_cluster(dsn: str) -> None:
    try:
        import psycopg.conninfo
    except ImportError:
        raise CLIError(
            "--cluster needs the postgres extra: pip install 'trio-agents[postgres]'"
        ) from None
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise CLIError(
            f"--cluster: not a valid connection string: {' '.join(str(exc).split())}"
        ) from None


def _check_temporal(args: argparse.Namespace) -> None:
    if args.cluster is not None:
        raise CLIError(
            "--temporal and --cluster are exclusive: a server's runs live on Temporal"
            " workers or on the cluster's nodes, not both",
            status=EXIT_USAGE,
        )
    try:
        import temporalio.client  # noqa: F401  (only whether it imports)
    except ImportError:
        raise CLIError(
            "--temporal needs the temporal extra: pip install 'trio-agents[temporal]'"
        ) from None


def _temporal_down(args: argparse.Namespace, group: BaseExceptionGroup[Any]) -> CLIError | None:
    """The one line for a TemporalHost that could not open (Temporal unreachable: the
    SDK's ``RuntimeError("Failed client connect: ...")``), or None for anything else."""
    real = [leaf for leaf in leaves(group) if not isinstance(leaf, trio.Cancelled)]
    if len(real) != 1 or not isinstance(real[0], RuntimeError):
        return None
    message = " ".join(str(real[0]).split())
    if "connect" not in message.lower():
        return None
    return CLIError(
        f"--temporal: cannot reach Temporal at {args.temporal}: {message}"
        " (is `temporal server start-dev` or your Temporal cluster running there?)"
    )


def serve_command(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``trio-agents serve``."""
    if args.temporal is not None:
        _check_temporal(args)
    if args.app:
        agents = load_app(args.app)
    else:
        from ..models import DemoModel
        from ._tour import demo_agent

        agents = {"demo": demo_agent(DemoModel())}
    if args.cluster is not None:
        _check_cluster(args.cluster)
    elif not is_postgres_url(args.db):
        _check_db(args.db)
    elif args.temporal is None:
        raise CLIError(
            "--db: a PostgreSQL database keeps the runs of Temporal workers"
            " (--temporal) or of a cluster (--cluster DSN); this server's own runs"
            " keep their sessions in a SQLite file",
            status=EXIT_USAGE,
        )
    storage = temporal_storage(args.db) if args.temporal is not None else None
    auth = _auth(args, out)  # after the checks: a token is shown only to a server that starts
    try:
        received, cancelled = trio.run(_serve, args, agents, auth, out, storage)
    except BaseExceptionGroup as group:
        if args.temporal is not None:
            down = _temporal_down(args, group) or store_failed(group)
            if down is None:
                raise
            raise down from None
        if args.cluster is None:
            raise
        from ..cluster._db import ClusterDown, ClusterSchemaError

        matched, _ = group.split((ClusterDown, ClusterSchemaError))
        if matched is None:
            raise
        first: BaseException = matched
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise CLIError(f"--cluster: {' '.join(str(first).split())}") from None
    runs = f"{cancelled} run{'' if cancelled == 1 else 's'}"
    if args.temporal is not None:
        out.write(f"{received}: server stopped (the runs go on on the Temporal workers)\n")
    elif args.cluster is None:
        out.write(f"{received}: server stopped ({runs} cancelled with reason 'server shutdown')\n")
    else:
        out.write(f"{received}: node stopped ({runs} handed over to the other nodes)\n")
    out.flush()
    return 0
