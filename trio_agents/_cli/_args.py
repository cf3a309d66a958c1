"""The argument parser of ``trio-agents``: every argument has a help text."""

from __future__ import annotations

import argparse
import json
import os
import urllib.parse
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from .. import __version__
from ._errors import EXIT_USAGE
from ._eval import add_eval
from ._mcp_stdio import add_mcp

__all__ = ["build_parser", "parse"]

DESCRIPTION = """\
trio_agents on the command line. `demo` tours the run lifecycle; `serve` serves
agents over the websocket control channel; `ctl URL VERB` drives a server's runs;
`eval CASES --app MOD:ATTR` measures agents over a dataset of cases.
Exit status: 0 success, 1 the command failed, 2 bad command line, 130 interrupted.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and a pointer to ``--help``)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def _ws_url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme in ("ws", "wss") and parts.hostname:
        return text
    if parts.scheme in ("http", "https") and parts.hostname:
        suggestion = urllib.parse.urlunsplit(
            parts._replace(scheme=parts.scheme.replace("http", "ws"))
        )
        raise argparse.ArgumentTypeError(
            f"{text!r} is an {parts.scheme}:// URL; the control channel is a websocket:"
            f" use {suggestion}"
        )
    raise argparse.ArgumentTypeError(
        f"{text!r} is not a ws:// or wss:// URL (e.g. ws://127.0.0.1:8765/)"
    )


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (0-65535; 0: any free)")
    return port


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number >= 0")
    return value


def _seq(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a seq (an int >= 0)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not a seq (an int >= 0)")
    return value


def _json_object(text: str) -> dict[str, Any]:
    """``--content``: a JSON object (a question's answer), checked before connecting."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f'must be a JSON object, like \'{{"color": "red"}}\', not {text!r}'
        )
    return value


def _event_position(text: str) -> tuple[str, int]:
    run_id, colon, seq = text.rpartition(":")
    if not colon or not run_id:
        raise argparse.ArgumentTypeError(f"{text!r} is not RUN:SEQ")
    return run_id, _seq(seq)


def _add_fork(verb: Callable[[str, str], _Parser]) -> None:
    fork = verb("fork", "copy a session (or its first items) into a new session")
    fork.add_argument("session_id", metavar="SESSION", help="the session to fork")
    fork.add_argument("new_session_id", metavar="NEW", help="the new session's id")
    where = fork.add_mutually_exclusive_group()
    where.add_argument(
        "--at",
        metavar="INDEX",
        type=_seq,
        default=None,
        help="keep the items before this index (default: all), rounded down so that no"
        " tool call is split from its result",
    )
    where.add_argument(
        "--at-event",
        metavar="RUN:SEQ",
        type=_event_position,
        default=None,
        help="keep what the session held once event SEQ of run RUN (ended) was applied",
    )


def _add_demo(commands: argparse._SubParsersAction[_Parser]) -> None:
    demo = commands.add_parser(
        "demo",
        help="a terminal tour of the run lifecycle (offline by default)",
        description="Stream a run, inject a follow-up, cancel a slow tool mid-call, and"
        " show the conversation the session kept.",
    )
    demo.add_argument(
        "--db",
        metavar="PATH",
        default=None,
        help="SQLite file for the demo's session (default: a fresh temporary file)",
    )
    demo.add_argument(
        "--model",
        metavar="SPEC",
        default="demo",
        help='the model: "demo" (default, the offline DemoModel), "openai:NAME",'
        ' "openai:NAME@http://HOST:PORT/v1" (a local server) or "anthropic:NAME";'
        " a remote model's API key and reachability are checked first",
    )
    demo.add_argument(
        "--delay",
        metavar="SECONDS",
        type=_seconds,
        default=0.03,
        help="seconds between streamed chunks of the DemoModel (default 0.03)",
    )


def _run_limits(text: str) -> Any:
    """``NAME=VALUE[,NAME=VALUE...]``: a ``UsageLimits`` (the server's maximum)."""
    from ..hosting._error_codes import ProtocolError
    from ..hosting._policies import effective_limits, limits_from_wire

    asked: dict[str, Any] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        try:
            if not sep:
                raise ValueError
            asked[name.strip()] = float(value) if "." in value else int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected NAME=NUMBER, not {part!r}") from None
    try:
        return effective_limits(limits_from_wire("--max-run-limits", asked), None)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except ProtocolError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _add_serve_http(serve: argparse.ArgumentParser) -> None:
    """``serve``'s options of the HTTP faces."""
    serve.add_argument(
        "--http-port",
        type=_port,
        default=None,
        help="port of the HTTP faces (REST + SSE; needs the serve extra) on the same"
        " --host (default: --port + 1, or any free port with --port 0)",
    )
    serve.add_argument(
        "--no-http",
        action="store_true",
        help="serve the websocket channel only",
    )


def _temporal_target(text: str) -> str:
    """``HOST:PORT`` of a Temporal frontend (what ``Client.connect`` takes)."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:7233, the dev server's default)"
        )
    return text


def _heartbeat_timeout(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds > 0")
    return value


def _add_serve_temporal(serve: argparse.ArgumentParser) -> None:
    """``serve``'s options of the Temporal host (DESIGN §20)."""
    temporal = serve.add_argument_group(
        "temporal",
        "serve the runs of Temporal workers (`trio-agents worker`; needs the temporal"
        " extra): runs start as workflows and run on the workers; their events and records"
        " come from --db, the workers' storage (a SQLite file on one disk, or a"
        " postgresql:// database); Ctrl-C or SIGTERM stops this server only, the runs go on",
    )
    temporal.add_argument(
        "--temporal",
        metavar="HOST:PORT",
        type=_temporal_target,
        default=None,
        help="the Temporal frontend (not with --cluster); --db must be the workers' --db",
    )
    temporal.add_argument(
        "--task-queue",
        metavar="Q",
        default="trio-agents",
        help="the workers' task queue (default trio-agents)",
    )
    temporal.add_argument(
        "--namespace",
        metavar="N",
        default="default",
        help="the Temporal namespace (default: default)",
    )
    temporal.add_argument(
        "--heartbeat-timeout",
        metavar="SECONDS",
        type=_heartbeat_timeout,
        default=2.0,
        help="seconds without a heartbeat after which a run's attempt is deemed lost and"
        " retried on another worker; a cancel from Temporal's CLI or UI reaches a run"
        " within about 0.8 x this (default 2)",
    )


def _add_serve_cluster(serve: argparse.ArgumentParser) -> None:
    cluster = serve.add_argument_group(
        "cluster",
        "serve as one node of a cluster on PostgreSQL (needs the postgres extra): any"
        " node answers for every run; on Ctrl-C or SIGTERM the runs are handed over to"
        " the other nodes instead of cancelled",
    )
    cluster.add_argument(
        "--cluster",
        metavar="DSN",
        default=None,
        help="the cluster's PostgreSQL database (a libpq connection string or URI);"
        " sessions live there (--db is not used)",
    )
    cluster.add_argument(
        "--node-id",
        metavar="ID",
        default=None,
        help="this node's id, unique in the cluster (default: host-pid-random)",
    )
    cluster.add_argument(
        "--lease-ttl",
        metavar="SECONDS",
        type=_seconds,
        default=10.0,
        help="seconds before another node takes over the runs of a node that stopped"
        " heartbeating (default 10)",
    )
    cluster.add_argument(
        "--max-runs",
        metavar="N",
        type=_count,
        default=100,
        help="runs this node runs at most; more are placed on other nodes (default 100)",
    )


def _add_serve(commands: argparse._SubParsersAction[_Parser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve agents over the websocket control channel and HTTP (REST + SSE)",
        description="Serve agents over the control channel until Ctrl-C or SIGTERM, which"
        " shut down gracefully: every run is cancelled with reason 'server shutdown', its"
        " session saved, every socket closed with 1001; then exit 0.",
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)"
    )
    serve.add_argument(
        "--port",
        type=_port,
        default=8765,
        help="port to listen on (default 8765; 0: any free port, printed)",
    )
    _add_serve_http(serve)
    serve.add_argument(
        "--db",
        metavar="PATH|URL",
        default="trio-agents-sessions.sqlite3",
        help="SQLite file for the sessions (default trio-agents-sessions.sqlite3); with"
        " --temporal, the workers' --db (a postgresql:// URI too)",
    )
    serve.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        help="your agents: a mapping of name -> Agent, an Agent, or a function returning"
        " either, imported from MODULE (the current directory is on the path);"
        " default: the demo agent on the offline DemoModel",
    )
    serve.add_argument(
        "--shutdown-timeout",
        metavar="SECONDS",
        type=_seconds,
        default=10.0,
        help="bound on the graceful shutdown after Ctrl-C or SIGTERM (default 10)",
    )
    serve.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="keep the objects made at start-up in the garbage collector's full passes"
        " (by default they are frozen once the server listens: gc.freeze())",
    )
    serve.add_argument(
        "--max-run-limits",
        metavar="NAME=VALUE,...",
        type=_run_limits,
        default=None,
        help="the most a client may ask for in run.start's limits, and the limits of a"
        " run that asks none: requests, tool_calls, input_tokens, output_tokens,"
        " total_tokens, cost (USD), deadline, wrap_up (say requests=50,deadline=300)",
    )
    _add_serve_cluster(serve)
    _add_serve_temporal(serve)
    auth = serve.add_mutually_exclusive_group()
    auth.add_argument(
        "--token",
        default=None,
        help="the one bearer token, for principal 'cli' (default $TRIO_AGENTS_TOKEN,"
        " else a generated one, printed once)",
    )
    auth.add_argument(
        "--tokens",
        metavar="FILE",
        default=None,
        help="a file of 'TOKEN PRINCIPAL' lines (# comments and blank lines allowed);"
        " refused if other users may read it (chmod 600 FILE)",
    )


def _ctl_options(*, top: bool) -> _Parser:
    """--token and --json, accepted before and after the verb."""
    parser = _Parser(add_help=False)
    parser.add_argument(
        "--token",
        default=os.environ.get("TRIO_AGENTS_TOKEN") if top else argparse.SUPPRESS,
        help="bearer token (default $TRIO_AGENTS_TOKEN)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="machine-readable output: one JSON object per line",
    )
    return parser


def _add_ctl(commands: argparse._SubParsersAction[_Parser]) -> None:
    ctl = commands.add_parser(
        "ctl",
        parents=[_ctl_options(top=True)],
        help="drive the runs of a control server",
        description="Talk to a control server (`trio-agents serve`). Output is for people"
        " by default; --json prints one JSON object per line for scripts.",
    )
    ctl.add_argument(
        "url", metavar="URL", type=_ws_url, help="the server's URL, e.g. ws://127.0.0.1:8765/"
    )
    verbs = ctl.add_subparsers(
        dest="verb",
        required=True,
        metavar="VERB",
        help="what to do (trio-agents ctl URL VERB --help for its arguments)",
    )
    options = [_ctl_options(top=False)]

    def verb(name: str, help: str) -> _Parser:
        return verbs.add_parser(name, parents=options, help=help, description=help)

    verb("list", "list your runs")
    get = verb("get", "show one run")
    get.add_argument("run_id", metavar="RUN", help="the run's id")
    watch = verb("watch", "print a run's events until it ends")
    watch.add_argument("run_id", metavar="RUN", help="the run's id")
    watch.add_argument(
        "--from-seq",
        metavar="SEQ",
        type=_seq,
        default=None,
        help="first event to print (default: the oldest the server retains)",
    )
    start = verb("start", "start a run and print its events until it ends")
    start.add_argument("agent", metavar="AGENT", help="the agent's name on the server")
    start.add_argument("input", metavar="TEXT", help="the user message")
    start.add_argument(
        "--session", metavar="ID", default=None, help="session id (default: no session)"
    )
    start.add_argument(
        "--detach",
        action="store_true",
        help="print only the run id and leave; the run goes on (RID=$(... --detach))",
    )
    start.add_argument(
        "--on-disconnect",
        choices=["continue", "cancel"],
        default="continue",
        help="what happens to the run when this command leaves early (default continue)",
    )
    cancel = verb("cancel", "cancel a run")
    cancel.add_argument("run_id", metavar="RUN", help="the run's id")
    cancel.add_argument("--reason", default=None, help="the reason the run records")
    cancel.add_argument(
        "--after-turn",
        action="store_true",
        help="let the current turn finish first (mode after_turn)",
    )
    inject = verb("inject", "inject a user message into a run; prints the injection id")
    inject.add_argument("run_id", metavar="RUN", help="the run's id")
    inject.add_argument("text", metavar="TEXT", help="the user message")
    inject.add_argument(
        "--when",
        default="next_turn",
        choices=["next_turn", "now", "when_idle"],
        help="next_turn (default): before the next model call; now: also interrupt a"
        " streaming response; when_idle: once the run would otherwise end",
    )
    withdraw = verb("withdraw", "take back an injection not yet delivered")
    withdraw.add_argument("run_id", metavar="RUN", help="the run's id")
    withdraw.add_argument("injection_id", metavar="INJECTION", help="the id `ctl inject` printed")
    approve = verb("approve", "let a tool call waiting for approval run")
    approve.add_argument("run_id", metavar="RUN", help="the run's id")
    approve.add_argument("call_id", metavar="CALL", help="the tool call's (or question's) id")
    approve.add_argument(
        "--content",
        metavar="JSON",
        type=_json_object,
        default=None,
        help="answer a question that asks for content (a tool's request_approval with a"
        " schema) with this JSON object; the server refuses one not matching the schema",
    )
    reject = verb("reject", "refuse a tool call waiting for approval")
    reject.add_argument("run_id", metavar="RUN", help="the run's id")
    reject.add_argument("call_id", metavar="CALL", help="the tool call's id")
    reject.add_argument(
        "--message", default=None, help="what the model reads as the call's error result"
    )
    _add_fork(verb)


def _add_worker(commands: argparse._SubParsersAction[_Parser]) -> None:
    worker = commands.add_parser(
        "worker",
        help="run the agents' runs as a worker of a Temporal cluster (the temporal extra)",
        description="Poll a Temporal task queue and run the attempts of the runs started"
        " there, until Ctrl-C or SIGTERM (docs/temporal.md).",
    )
    worker.add_argument(
        "--temporal",
        metavar="HOST:PORT",
        type=_temporal_target,
        required=True,
        help="the Temporal frontend",
    )
    worker.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        required=True,
        help="your agents, as for serve: a mapping of name -> Agent, an Agent, or a"
        " function returning either",
    )
    worker.add_argument(
        "--task-queue", metavar="Q", default="trio-agents", help="default trio-agents"
    )
    worker.add_argument("--namespace", default="default", help="default: default")
    worker.add_argument(
        "--db",
        metavar="PATH|URL",
        default="trio-agents-sessions.sqlite3",
        help="where the runs' sessions, events and records live, shared by every worker"
        " and server: a SQLite file (all on one disk; the runs in FILE.runs beside it) or"
        " a postgresql://USER@HOST:PORT/DB database (any number of machines; the postgres"
        " extra) (default trio-agents-sessions.sqlite3)",
    )
    worker.add_argument(
        "--host",
        default="127.0.0.1",
        help="interface on which ops are pushed to this worker's runs (default 127.0.0.1)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``trio-agents`` parser."""
    parser = _Parser(prog="trio-agents", description=DESCRIPTION)
    parser.add_argument(
        "--version",
        action="version",
        version=f"trio-agents {__version__}",
        help="print the version and exit",
    )
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="what to do (trio-agents COMMAND --help for its arguments)",
    )
    _add_demo(commands)
    _add_serve(commands)
    add_mcp(commands, _seconds)
    add_eval(commands, _seconds, _count)
    _add_ctl(commands)
    _add_worker(commands)
    return parser


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse a command line (exits 2 with one line on a mistake)."""
    return build_parser().parse_args(argv)
