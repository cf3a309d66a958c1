"""Sessions: where conversations live between runs.

:class:`SQLiteSession` is the embedded default (a file, many sessions per file);
:class:`MemorySession` is for tests and short-lived programs; write your own against
the :class:`Session` protocol.
"""

from ._base import Session as Session
from ._memory import MemorySession as MemorySession
from ._repair import repair_loaded as repair_loaded
from ._sqlite import SCHEMA_VERSION as SCHEMA_VERSION
from ._storage import SessionStorageError as SessionStorageError
from ._sqlite import SQLiteSession as SQLiteSession

__all__ = [
    "SCHEMA_VERSION",
    "MemorySession",
    "SQLiteSession",
    "Session",
    "SessionStorageError",
    "repair_loaded",
]
