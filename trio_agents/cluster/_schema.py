"""The cluster's tables (component ``cluster``, schema version :data:`SCHEMA_VERSION`).

Created or migrated like the session tables (see
:mod:`trio_agents.sessions._postgres`): in one transaction, under the same advisory
lock, with the version in the shared ``trio_agents_schema`` table. Migrations:
``MIGRATIONS[v]`` upgrades version ``v`` to ``v + 1``: 1 to 2 adds the index of queued
runs (``_QUEUED``); 2 to 3 adds the runs' ``usage`` (what their limits counted so far,
kept across a takeover) and the table of child runs (``_CHILDREN``); 3 to 4 adds the
runs' ``run_usage`` (``_RUN_USAGE``); 4 to 5 the runs' ``detail`` (``_DETAIL``). The
tables are described in the docstring of :mod:`trio_agents.cluster`.
"""

from __future__ import annotations

import json
from typing import Any, Final

import psycopg

from ..sessions._postgres import _SCHEMA_LOCK, _SCHEMA_TABLE, Migration

__all__ = [
    "CHANNEL",
    "COMPONENT",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "prepare_cluster_schema",
    "session_key",
]

SCHEMA_VERSION: Final = 5
COMPONENT: Final = "cluster"
CHANNEL: Final = "trio_agents_cluster"
"""The one LISTEN/NOTIFY channel of the cluster (payloads are small JSON objects)."""

_QUEUED: Final = (
    "CREATE INDEX trio_agents_runs_queued ON trio_agents_runs (session_key, created_at)"
    " WHERE NOT finished AND active_key IS NULL"
)
"""Unfinished runs not holding a session (queued for it, or without one): a queued
run claims its session only once no run queued before it waits (``_claims.py``)."""


def _add_queued_index(conn: psycopg.Connection[Any]) -> None:
    conn.execute(_QUEUED)


_USAGE: Final = "ALTER TABLE trio_agents_runs ADD COLUMN usage TEXT"
"""What a run's limits counted so far (JSON ``{name: used}``; NULL: no limits, or
nothing flushed yet): a takeover's attempt starts its budget from it."""

_CHILDREN: Final = (
    """CREATE TABLE trio_agents_children (
        run_id TEXT PRIMARY KEY,
        root_id TEXT NOT NULL,
        parent_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        agent TEXT NOT NULL,
        last_seq BIGINT NOT NULL DEFAULT 0,
        finished BOOLEAN NOT NULL DEFAULT false,
        cancel TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    "CREATE INDEX trio_agents_children_root ON trio_agents_children (root_id)",
)
"""A child run of a tree (DESIGN §17): its events are in ``trio_agents_events`` under
its own id, written by the node running its tree (fenced by its root's row), so any
node follows it; its principal and owner are its root's. ``cancel`` (JSON ``{"reason",
"mode"}``) is a cancel of it acked before its node died: the takeover that resumes it
cancels it at once."""


def _add_usage_and_children(conn: psycopg.Connection[Any]) -> None:
    conn.execute(_USAGE)
    for statement in _CHILDREN:
        conn.execute(statement)


_RUN_USAGE: Final = "ALTER TABLE trio_agents_runs ADD COLUMN run_usage TEXT"
"""A root run's own token usage and cost so far (its ``Usage.to_json()``; NULL: no
model call reported any yet), written with its events by the node running it: the
``usage`` of its record on every node, not only on that one (``usage`` above is what
its limits counted, rounded for the budget, not its usage)."""


def _add_run_usage(conn: psycopg.Connection[Any]) -> None:
    conn.execute(_RUN_USAGE)


_DETAIL: Final = "ALTER TABLE trio_agents_runs ADD COLUMN detail TEXT"
"""The ``detail`` of a root run's current status (its last persisted ``run.updated``'s,
as JSON; NULL: none yet, or empty), written with that event by the node running it:
the ``detail`` of its record on every node (the question asked, ``resumed`` and
``attempt`` after a takeover, ``throttled``, ...), as ``pending`` and ``status`` are."""


def _add_detail(conn: psycopg.Connection[Any]) -> None:
    conn.execute(_DETAIL)


MIGRATIONS: dict[int, Migration] = {
    1: _add_queued_index,
    2: _add_usage_and_children,
    3: _add_run_usage,
    4: _add_detail,
}

_DDL: Final = (
    """CREATE TABLE trio_agents_nodes (
        node_id TEXT PRIMARY KEY,
        lease_expires_at TIMESTAMPTZ NOT NULL,
        max_runs INTEGER NOT NULL,
        running INTEGER NOT NULL DEFAULT 0,
        draining BOOLEAN NOT NULL DEFAULT false,
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    """CREATE TABLE trio_agents_runs (
        run_id TEXT PRIMARY KEY,
        principal TEXT NOT NULL,
        session_id TEXT,
        session_key TEXT NOT NULL,
        active_key TEXT,
        agent TEXT NOT NULL,
        options TEXT NOT NULL DEFAULT '{}',
        status TEXT NOT NULL,
        reason TEXT,
        turn INTEGER NOT NULL DEFAULT 0,
        pending TEXT NOT NULL DEFAULT '[]',
        finished BOOLEAN NOT NULL DEFAULT false,
        owner TEXT,
        released BOOLEAN NOT NULL DEFAULT false,
        lease_expires_at TIMESTAMPTZ NOT NULL,
        attempt INTEGER NOT NULL DEFAULT 1,
        last_seq BIGINT NOT NULL DEFAULT 0,
        usage TEXT,
        run_usage TEXT,
        detail TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        updated_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    "CREATE UNIQUE INDEX trio_agents_runs_active_session ON trio_agents_runs (active_key)"
    " WHERE active_key IS NOT NULL",
    "CREATE INDEX trio_agents_runs_unfinished ON trio_agents_runs (owner) WHERE NOT finished",
    "CREATE INDEX trio_agents_runs_principal ON trio_agents_runs (principal, created_at)",
    _QUEUED,
    """CREATE TABLE trio_agents_events (
        run_id TEXT NOT NULL,
        seq BIGINT NOT NULL,
        type TEXT NOT NULL,
        data TEXT NOT NULL,
        PRIMARY KEY (run_id, seq))""",
    """CREATE TABLE trio_agents_tool_starts (
        run_id TEXT NOT NULL,
        call_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        PRIMARY KEY (run_id, call_id))""",
    """CREATE TABLE trio_agents_withdrawals (
        run_id TEXT NOT NULL,
        injection_id TEXT NOT NULL,
        PRIMARY KEY (run_id, injection_id))""",
    """CREATE TABLE trio_agents_commands (
        command_id BIGSERIAL PRIMARY KEY,
        run_id TEXT,
        target_node TEXT,
        origin_node TEXT NOT NULL,
        principal TEXT NOT NULL,
        op TEXT NOT NULL,
        args TEXT NOT NULL,
        reply TEXT,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now())""",
    "CREATE INDEX trio_agents_commands_open ON trio_agents_commands (run_id) WHERE reply IS NULL",
    *_CHILDREN,
)


def _version(conn: psycopg.Connection[Any]) -> int | None:
    row = conn.execute(
        f"SELECT version FROM {_SCHEMA_TABLE} WHERE component = %s", (COMPONENT,)
    ).fetchone()
    return None if row is None else int(row[0])


def prepare_cluster_schema(conn: psycopg.Connection[Any]) -> None:
    """Create or migrate the cluster's tables (inside the caller's transaction, after
    the session component, so ``trio_agents_schema`` exists)."""
    if _version(conn) == SCHEMA_VERSION:
        return
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
    version = _version(conn)
    if version is None:
        for statement in _DDL:
            conn.execute(statement)
        conn.execute(
            f"INSERT INTO {_SCHEMA_TABLE} (component, version) VALUES (%s, %s)",
            (COMPONENT, SCHEMA_VERSION),
        )
        return
    if version > SCHEMA_VERSION:
        raise psycopg.DataError(
            f"the cluster tables have schema version {version}, newer than this"
            f" trio_agents supports ({SCHEMA_VERSION}); upgrade trio_agents"
        )
    for step_from in range(version, SCHEMA_VERSION):
        step = MIGRATIONS.get(step_from)
        if step is None:
            raise psycopg.DataError(f"no migration of the cluster tables from {step_from}")
        step(conn)
    conn.execute(
        f"UPDATE {_SCHEMA_TABLE} SET version = %s, updated_at = now() WHERE component = %s",
        (SCHEMA_VERSION, COMPONENT),
    )


def session_key(principal: str, session_id: str | None, run_id: str) -> str:
    """The stored session id of a run's session (and the runs table's ``session_key``):
    the principal's session, or, without a session id, one of the run's own."""
    return json.dumps([principal, session_id if session_id is not None else f"run:{run_id}"])
