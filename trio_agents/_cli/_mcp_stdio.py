"""``trio-agents mcp --app MODULE:ATTR``: the agents as MCP tools over stdio.

For desktop clients (Claude Desktop, IDEs) that start an MCP server as a child process
and talk JSON-RPC over its stdin and stdout. The tools are the MCP face's
(``faces/_mcp.py``, DESIGN §22) over a :class:`~trio_agents.hosting.LocalHost` of this
process, with SQLite sessions (``--db``). stdout carries the protocol only; anything
else (logs, errors) goes to stderr.

The client closing the pipe (or its process ending) applies ``--on-disconnect`` to the
calls still running (default ``cancel``: their runs end ``cancelled`` with reason
``"client disconnected"``, repaired and written); then every run left is cancelled with
``"server shutdown"`` within ``--shutdown-timeout``, and the command exits 0.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, TextIO

import trio

from .._agent import Agent
from ._errors import CLIError

__all__ = ["add_mcp", "mcp_command"]


def add_mcp(commands: argparse._SubParsersAction[Any], seconds: Any) -> None:
    """The ``mcp`` subcommand's arguments (``seconds``: the parser's type of a
    duration)."""
    mcp = commands.add_parser(
        "mcp",
        help="serve agents as MCP tools over stdio (for desktop clients)",
        description="Serve agents as Model Context Protocol tools over stdin/stdout,"
        " one tool per agent, until the client closes the pipe. Needs the serve extra.",
    )
    mcp.add_argument(
        "--app",
        metavar="MODULE:ATTR",
        required=True,
        help="your agents: a mapping of name -> Agent, an Agent, or a function returning"
        " either, imported from MODULE (the current directory is on the path)",
    )
    mcp.add_argument(
        "--db",
        metavar="PATH",
        default="trio-agents-sessions.sqlite3",
        help="SQLite file for the sessions (default trio-agents-sessions.sqlite3)",
    )
    mcp.add_argument(
        "--principal",
        default="cli",
        help="the principal the calls run as (default cli: the runs and sessions of"
        " `trio-agents serve --token`'s single user)",
    )
    mcp.add_argument(
        "--on-disconnect",
        choices=("cancel", "continue"),
        default="cancel",
        help="what the client closing the pipe does to the runs of its calls still"
        " running (default cancel)",
    )
    mcp.add_argument(
        "--shutdown-timeout",
        metavar="SECONDS",
        type=seconds,
        default=10.0,
        help="bound on cancelling and saving the runs left at exit (default 10)",
    )


async def _serve(args: argparse.Namespace, agents: Mapping[str, Agent]) -> None:
    from mcp.server.stdio import stdio_server

    from ..faces._mcp import McpTools, mcp_server
    from ..hosting import Limits, LocalHost

    host = LocalHost(
        agents, sessions=args.db, limits=Limits(shutdown_timeout=args.shutdown_timeout)
    )
    async with host.running():
        tools = McpTools(
            host,
            principal=args.principal,
            on_disconnect=args.on_disconnect,
            cleanup_timeout=args.shutdown_timeout,
        )
        server = mcp_server(tools)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())


def mcp_command(args: argparse.Namespace, _out: TextIO) -> int:
    """Run ``trio-agents mcp``."""
    from ._serve import _check_db, load_app

    try:
        # The MCP face lives with the HTTP faces (the serve extra, which holds mcp).
        from ..faces import _mcp  # noqa: F401
    except ImportError:
        raise CLIError(
            "trio-agents mcp needs the serve extra: pip install 'trio-agents[serve]'"
        ) from None
    agents = load_app(args.app)
    _check_db(args.db)
    trio.run(_serve, args, agents)
    return 0
