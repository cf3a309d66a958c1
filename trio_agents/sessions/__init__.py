"""Sessions: where conversations live between runs.

:class:`SQLiteSession` is the embedded default (a file, many sessions per file);
:class:`PostgresSession` keeps conversations in PostgreSQL, shared by many processes
(needs the ``postgres`` extra); :class:`MemorySession` is for tests and short-lived
programs; write your own against the :class:`Session` protocol.
"""

from typing import TYPE_CHECKING, Any

from ._base import Session as Session
from ._dangling_calls import repair_loaded as repair_loaded
from ._fork import ForkAt as ForkAt
from ._fork import SessionExistsError as SessionExistsError
from ._fork import fork_point as fork_point
from ._fork import fork_session as fork_session
from ._memory import MemorySession as MemorySession
from ._sqlite import SCHEMA_VERSION as SCHEMA_VERSION
from ._sqlite import SQLiteSession as SQLiteSession
from ._storage import SessionStorageError as SessionStorageError

if TYPE_CHECKING:
    from ._postgres import PostgresSession as PostgresSession
    from ._postgres import PostgresSessionStatistics as PostgresSessionStatistics

__all__ = [
    "SCHEMA_VERSION",
    "ForkAt",
    "MemorySession",
    "PostgresSession",
    "PostgresSessionStatistics",
    "SQLiteSession",
    "Session",
    "SessionExistsError",
    "SessionStorageError",
    "fork_point",
    "fork_session",
    "repair_loaded",
]

_POSTGRES = ("PostgresSession", "PostgresSessionStatistics")


def __getattr__(name: str) -> Any:
    # Imported on first use, so that the package works without the `postgres` extra.
    if name in _POSTGRES:
        from . import _postgres

        return getattr(_postgres, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The lazy names too, so that dir() and the API docs (autodoc) list them; only when
    # they can be imported, or every tool that getattr()s what dir() lists
    # (inspect.getmembers, pydoc) would fail without the extra.
    try:
        from . import _postgres  # noqa: F401
    except ImportError:
        return sorted(globals())
    return sorted({*globals(), *_POSTGRES})
