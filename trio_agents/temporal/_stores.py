"""Where a Temporal deployment keeps its runs and sessions, chosen from one string:
:func:`shared_storage` (what ``trio-agents worker --db`` and ``serve --temporal --db``
take), :func:`postgres_sessions`.

- A ``postgresql://`` (or ``postgres://``) URI: one PostgreSQL database holds both, the
  runs in a :class:`~._pg_run_store.PostgresRunStore` and the sessions as
  :class:`~trio_agents.sessions.PostgresSession` — workers and servers on any number of
  machines.
- Anything else is a path: the sessions in that SQLite file, the runs in the file beside
  it (:meth:`RunStore.beside <trio_agents.temporal.RunStore.beside>`) — every worker and
  server on one disk.
"""

from __future__ import annotations

import json
import os

from ..sessions import Session
from ._activity import SessionFactory, sqlite_sessions
from ._run_store import RunStore
from ._shared_store import IDLE_IN_TRANSACTION, SharedRunStore

__all__ = ["is_postgres_url", "postgres_sessions", "run_store_at", "shared_storage"]

_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(where: str | os.PathLike[str]) -> bool:
    """Whether ``where`` names a PostgreSQL database (a ``postgresql://`` or
    ``postgres://`` URI) rather than a file."""
    return isinstance(where, str) and where.lower().startswith(_SCHEMES)


def postgres_sessions(dsn: str) -> SessionFactory:
    """A session factory over one PostgreSQL database shared by every worker (any
    number of machines): :class:`~trio_agents.sessions.PostgresSession`, stored under
    ``json.dumps([principal, session_id])`` as the control server and the cluster
    store them.

    Raises:
        ValueError: ``dsn`` is not a connection string (checked here, not at the first
            run).
        ImportError: the ``postgres`` extra is not installed.
    """
    from ..sessions import PostgresSession

    PostgresSession(dsn)  # validates the DSN now; opens nothing (the pool is lazy)

    def factory(principal: str, session_id: str) -> Session:
        # A worker frozen mid-write must not hold the session's lock for the attempt
        # that takes its run over (DESIGN §20: a frozen worker is fenced).
        return PostgresSession(
            dsn, json.dumps([principal, session_id]), idle_timeout=IDLE_IN_TRANSACTION
        )

    return factory


def run_store_at(where: str | os.PathLike[str]) -> SharedRunStore:
    """The run store itself at ``where``: a :class:`PostgresRunStore` for a
    ``postgresql://`` URI, else a :class:`RunStore` in that very file (what
    ``TemporalHost(store=...)`` takes)."""
    if is_postgres_url(where):
        from ._pg_run_store import PostgresRunStore

        return PostgresRunStore(os.fspath(where))
    return RunStore(where)


def shared_storage(where: str | os.PathLike[str]) -> tuple[SharedRunStore, SessionFactory]:
    """The run store and the session factory that the workers and servers of one
    deployment share, from one string (see the module docstring): a ``postgresql://``
    URI (a :class:`PostgresRunStore` and :func:`postgres_sessions` in that database), or
    the path of a SQLite file (:func:`sqlite_sessions` in it, a :class:`RunStore` beside
    it: ``FILE.runs``).

    Raises:
        ValueError: a URI that is not a valid connection string.
        ImportError: a URI, and the ``postgres`` extra is not installed.
    """
    if is_postgres_url(where):
        from ._pg_run_store import PostgresRunStore

        dsn = os.fspath(where)
        return PostgresRunStore(dsn), postgres_sessions(dsn)
    return RunStore.beside(where), sqlite_sessions(os.fspath(where))
