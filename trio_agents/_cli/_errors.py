"""What the command line says when something goes wrong: one line, an exit status.

A user's mistake (a bad flag value, a module that does not import, a port in use, a
server that refuses the token) and a signal are never shown as a traceback:
:func:`explain` turns the exception into one line for stderr and an exit status. An
exception it does not recognise is a bug in trio_agents, and keeps its traceback.

Exit statuses: 0 success; 1 the command failed; 2 the command line is wrong
(argparse's own convention); 130 interrupted (Ctrl-C, 128 + SIGINT); 141 the reader
of the output went away (``| head``, 128 + SIGPIPE), silently.
"""

from __future__ import annotations

from typing import Final

import trio

from .._exception_groups import leaves
from .._exceptions import (
    ControlConnectionError,
    ControlError,
    RunClosedError,
    UnknownCallError,
)

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "CLIError",
    "explain",
]

EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141  # 128 + SIGPIPE, what a shell reports for `cmd | head`


class CLIError(Exception):
    """A failure the user can act on; printed as one line, never as a traceback.

    Attributes:
        status: the process exit status (1: the command failed, 2: bad command line).
    """

    def __init__(self, message: str, *, status: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.status = status


_REJECTED: Final = {
    401: "the server refused the token (HTTP 401): check --token or $TRIO_AGENTS_TOKEN",
    403: "the server refused this client's Origin (HTTP 403)",
    400: "the server refused the handshake (HTTP 400): is this a trio-agents control server?",
}


def _connection_message(exc: ControlConnectionError) -> str:
    if exc.code == "rejected":
        known = _REJECTED.get(exc.status_code or 0)
        return known or f"the server refused the handshake (HTTP {exc.status_code})"
    if exc.code == "connect_failed":
        return f"{exc.message} (is `trio-agents serve` running there?)"
    if exc.close_code == 1001:
        return "the server shut down (websocket close 1001)"
    return exc.message


def explain(exc: BaseException) -> tuple[str, int] | None:
    """The one line and the exit status for ``exc``; None for an unexpected error.

    An exception group (a nursery wraps even one error) is explained by its only
    error besides ``trio.Cancelled``; a group holding several is not unwrapped.
    """
    if isinstance(exc, BaseExceptionGroup):
        real = [leaf for leaf in leaves(exc) if not isinstance(leaf, trio.Cancelled)]
        if any(isinstance(leaf, KeyboardInterrupt) for leaf in real):
            return "interrupted", EXIT_INTERRUPTED
        if len(real) == 1:
            return explain(real[0])
        return None
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted", EXIT_INTERRUPTED
    if isinstance(exc, BrokenPipeError):
        return "", EXIT_BROKEN_PIPE  # the reader left (`| head`): say nothing
    if isinstance(exc, CLIError):
        return str(exc), exc.status
    if isinstance(exc, ControlConnectionError):
        return _connection_message(exc), EXIT_FAILED
    if isinstance(exc, ControlError):
        return f"the server refused the request: {exc}", EXIT_FAILED
    if isinstance(exc, RunClosedError):
        return f"run {exc.run_id} has already ended ({exc.status})", EXIT_FAILED
    if isinstance(exc, UnknownCallError):
        return str(exc), EXIT_FAILED
    return None
