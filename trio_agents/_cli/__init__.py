"""The ``trio-agents`` command line.

``trio-agents demo`` tours the run lifecycle; ``trio-agents serve`` runs a control
server (websocket, loopback by default); ``trio-agents mcp --app MOD:ATTR`` serves
agents as MCP tools over stdio; ``trio-agents ctl URL VERB`` drives a server; ``trio-agents eval CASES --app
MOD:ATTR`` runs a dataset of cases against agents (the evals extra).
``python -m trio_agents`` is the same command. See ``docs/cli.md``.

A user's mistake or a signal never shows a traceback: one line on stderr
(``trio-agents: error: ...``) and a non-zero exit status (see :mod:`._errors`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from ._args import build_parser, parse
from ._errors import EXIT_BROKEN_PIPE, EXIT_INTERRUPTED, CLIError, explain

__all__ = ["CLIError", "build_parser", "main"]


def _dispatch(argv: Sequence[str] | None) -> int:
    args = parse(argv)
    out = sys.stdout
    if args.command == "demo":
        from ._tour import demo_command

        return demo_command(args, out)
    if args.command == "serve":
        from ._serve import serve_command

        return serve_command(args, out)
    if args.command == "mcp":
        from ._mcp_stdio import mcp_command

        return mcp_command(args, out)
    if args.command == "eval":
        from ._eval import eval_command

        return eval_command(args, out)
    if args.command == "worker":
        from ._worker import worker_command

        return worker_command(args, out)
    from ._ctl import ctl_command

    return ctl_command(args, out)


def _silence_stdout() -> None:
    """After a broken pipe (``trio-agents ctl ... | head``), send the rest of the
    output nowhere, so the interpreter's final flush does not complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


# The native core of temporalio (its Rust threads), once a command has loaded it.
_TEMPORAL_CORE = "temporalio.bridge.temporal_sdk_bridge"


def entry() -> NoReturn:
    """The ``trio-agents`` console script (and ``python -m trio_agents``): :func:`main`,
    then exit with its status. A command that loaded temporalio's native core (``serve
    --temporal``, ``worker``) leaves without the interpreter's finalization, which that
    core's threads can abort ("PyGILState_Release ... must be current",
    temporalio/sdk-python#300), turning a clean exit or a one-line error into SIGABRT."""
    status = main()
    if _TEMPORAL_CORE in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``trio-agents`` command; returns the exit status."""
    try:
        return _dispatch(argv)
    except BaseException as exc:
        explained = explain(exc)
        if explained is None:
            raise  # SystemExit from argparse, or a bug in trio_agents: keep the traceback
        message, status = explained
        if status == EXIT_BROKEN_PIPE:
            _silence_stdout()
        elif status == EXIT_INTERRUPTED:
            print(f"trio-agents: {message}", file=sys.stderr, flush=True)
        else:
            print(f"trio-agents: error: {message}", file=sys.stderr, flush=True)
        return status
