"""The face :class:`SQLiteSession` and :class:`PostgresSession` share, written once.

Both keep a conversation as rows in a database reached from worker threads, and both
answer the :class:`~trio_agents.sessions.Session` protocol the same way: encode the
items, hand one function to the backend's ``_call``, and let it run that function on a
connection, bounded and never abandoned. What the public methods promise, and the
logic that does not depend on the database (when a loaded conversation is repaired and
written back, when the schema is created or migrated), lives here; each backend
supplies what differs:

- ``_call``: how a function reaches a connection (a worker thread, under a limiter, in
  the backend's bounds), and ``close`` (what closing frees);
- the statements, each run on the connection ``_call`` hands it: ``_read_sync``,
  ``_add_items_sync`` (one transaction of its own), ``_write_all_sync`` (inside the
  write lock), ``_clear_sync``; for :meth:`~StoredSession.fork`, ``_fork_transaction``,
  ``_fork_scan_sync`` (the number of items, the type and call id of those that
  have one, and the descendants' ids, read in the database), ``_fork_write_sync``
  (check the new ids hold nothing, copy the rows in the database) and
  ``_below_sync``;
- the locks: ``_write_lock`` (what keeps the session's writers apart) and
  ``_schema_lock`` (what keeps two connections from creating or migrating the schema
  at once);
- the schema: its version, ``_inspect``, ``_create_schema``, the migration steps
  (run here, in order) and how a new version is recorded;
- how its errors name the store (``_where``, ``_error``).

What is the backend's own (SQLite's file lock, PostgreSQL's row lock, what a cancelled
call waits for) is said in its class docstring.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Generic, Self, TypeVar

import attrs
import trio

from .._items import Item
from ._dangling_calls import repair_loaded
from ._fork import ForkAt, Marked, check_at, check_new_id, fork_plan, kept_items
from ._storage import SessionStorageError, encode_items

__all__ = ["MigrationTexts", "StoredSession"]

C = TypeVar("C")
T = TypeVar("T")


class StoredSession(abc.ABC, Generic[C]):
    """A session stored in a database through connections of type ``C``: the public
    methods, over what a backend supplies (see the module docstring)."""

    __slots__ = ()

    _session_id: str
    _closed: bool
    _migration_texts: ClassVar[MigrationTexts]
    """How :meth:`_migrate`'s errors name what is migrated."""

    @property
    def session_id(self) -> str:
        """The id of the conversation this session stores."""
        return self._session_id

    # -- the Session protocol ---------------------------------------------------------

    async def get_items(self) -> list[Item]:
        """Return the stored conversation, oldest first, repaired.

        Dangling tool calls are answered with a ``cancelled`` result and orphan results
        dropped (see :func:`~trio_agents.sessions.repair_loaded`), and the repair is
        written back in one transaction, under the session's write lock (see the
        class), so the stored rows are valid again.

        Raises:
            SessionStorageError: a stored item cannot be read (names its position).
        """
        return await self._call(self._get_items_sync)

    async def add_items(self, items: Sequence[Item]) -> None:
        """Append ``items`` in one transaction: all of them or, on any error, none.

        Cancellation never leaves half a batch: cancelled while waiting for its turn
        (see the class), nothing is written; once the write has started in its thread,
        it is not abandoned: the caller waits for the (bounded) commit, returns, and
        sees the cancellation at its next checkpoint.

        Raises:
            TypeError: an element of ``items`` is not an item (nothing is written).
        """
        encoded = encode_items(items)
        if not encoded:
            # Nothing to write, but a closed session still refuses, and the call is
            # still a checkpoint.
            if self._closed:
                raise trio.ClosedResourceError(f"this {type(self).__name__} is closed")
            await trio.lowlevel.checkpoint()
            return
        await self._call(lambda conn: self._add_items_sync(conn, encoded))

    async def clear(self) -> None:
        """Delete the stored conversation of this session (other sessions are untouched)."""
        await self._call(self._clear_sync)

    async def replace_items(self, items: Sequence[Item]) -> None:
        """Replace the stored conversation with ``items`` in one transaction (how a run
        writes back a repair that is not just an append).

        Raises:
            TypeError: an element of ``items`` is not an item (nothing is written).
        """
        encoded = encode_items(items)
        await self._call(lambda conn: self._replace_sync(conn, encoded))

    async def get_stored_items(self) -> list[Item]:
        """Return the stored conversation as it is: not repaired, nothing written.

        What a resumed run (the ``resume`` run option) loads: it decides the calls a
        dead process left open itself (run again, ask for approval, or answer
        ``interrupted``), where :meth:`get_items` would close them as ``cancelled``.

        Raises:
            SessionStorageError: a stored item cannot be read (names its position).
        """
        return await self._call(self._read_sync)

    async def fork(self, new_session_id: str, *, at: ForkAt = None) -> Self:
        """Fork this conversation (DESIGN §23) into a new session of the same store
        (``self.with_id(new_session_id)``, which is returned; close it like any other).

        The new session holds ``items[:at]`` (all for None), rounded down so that no
        tool call is kept without its result (the kept items are repaired like a load
        if the stored rows held orphan results), with items marked ``rejected_by``
        copied as they are. The child sessions of the tree (``"<id>/<call id>"``, and
        theirs, DESIGN §17) whose call is kept are copied whole under ``"<new
        id>/<call id>"``. This session is never written.

        One transaction: the rows are read in one snapshot and the copies written
        before it commits, so a fork taken while a run appends here holds every item
        that run had committed up to some point, never half an append.

        Raises:
            TypeError, ValueError: a bad ``new_session_id`` or ``at`` (an event position
                ``(run_id, seq)`` included: sessions store items, not the events that
                added them).
            SessionExistsError: the new session, or one of its child sessions, already
                holds items (nothing is written).
            SessionStorageError: the database failed.
        """
        new_session_id = check_new_id(self._session_id, new_session_id)
        index = check_at(at)
        fork = self.with_id(new_session_id)  # validates the id as a session id
        try:
            await self._call(lambda conn: self._fork_sync(conn, new_session_id, index))
        except BaseException:
            await fork.aclose()
            raise
        return fork

    async def child_session_ids(self) -> list[str]:
        """The ids of this session's descendants that hold items (``"<id>/..."``: the
        sessions of child runs, DESIGN §17), sorted by code point."""
        return sorted(await self._call(self._below_sync))

    @abc.abstractmethod
    def with_id(self, session_id: str) -> Self:
        """A new session object for ``session_id`` in the same store."""

    # -- closing ----------------------------------------------------------------------

    async def aclose(self) -> None:
        """Close the session, as :meth:`close` does, without blocking Trio. Idempotent.

        Waits for this session's calls in flight to finish first. The close is
        shielded from cancellation (it is quick); a cancelled caller sees the
        cancellation after the close.
        """
        if self._closed:
            await trio.lowlevel.checkpoint()
            return
        await self._close_shielded()
        await trio.lowlevel.checkpoint_if_cancelled()

    async def __aexit__(self, *exc_info: object) -> None:
        """Close (see :meth:`aclose`)."""
        await self.aclose()

    async def _close_shielded(self) -> None:
        """:meth:`close` in a worker thread, shielded, without a checkpoint after."""
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(self.close, limiter=self._close_limiter())

    def _close_limiter(self) -> trio.CapacityLimiter | None:
        """The limiter :meth:`close`'s thread runs under (``None``: Trio's default)."""
        return None

    @abc.abstractmethod
    def close(self) -> None:
        """Close from synchronous code. Idempotent."""

    # -- what the backend supplies: the calls -----------------------------------------

    @abc.abstractmethod
    async def _call(self, fn: Callable[[C], T]) -> T:
        """Run ``fn(connection)`` in a worker thread, bounded, never abandoned.

        Raises:
            trio.ClosedResourceError: the session is closed.
            SessionStorageError: the database failed.
        """

    @property
    @abc.abstractmethod
    def _where(self) -> str:
        """Where the session is stored, as errors name it (``'x.db'``, ``database
        host:port/dbname``)."""

    @abc.abstractmethod
    def _error(self, message: str, **data: Any) -> SessionStorageError:
        """A :class:`SessionStorageError` about this store (its file or database)."""

    def _failed(self, exc: Exception) -> SessionStorageError:
        """The error of a call whose database statement failed with ``exc``."""
        return self._error(
            f"session {self._session_id!r} in {self._where}: {exc}", session_id=self._session_id
        )

    @abc.abstractmethod
    def _read_sync(self, conn: C) -> list[Item]:
        """This session's items as stored, oldest first."""

    @abc.abstractmethod
    def _add_items_sync(self, conn: C, encoded: list[str]) -> None:
        """Append the encoded items after the stored ones, in one transaction."""

    @abc.abstractmethod
    def _write_all_sync(self, conn: C, encoded: list[str]) -> None:
        """Replace this session's rows; the caller holds :meth:`_write_lock`."""

    @abc.abstractmethod
    def _clear_sync(self, conn: C) -> None:
        """Delete this session's rows."""

    @abc.abstractmethod
    def _write_lock(self, conn: C) -> AbstractContextManager[None]:
        """Hold the session's write lock (in a transaction) for the ``with`` block."""

    @abc.abstractmethod
    def _fork_transaction(self, conn: C) -> AbstractContextManager[None]:
        """The one transaction a fork reads and writes in, for the ``with`` block."""

    @abc.abstractmethod
    def _below_sync(self, conn: C) -> list[str]:
        """The ids starting ``"<id>/"`` that hold rows."""

    @abc.abstractmethod
    def _fork_scan_sync(self, conn: C) -> tuple[int, list[Marked], list[str]]:
        """How many items this session stores, those that have a call id (``(index,
        type, call_id)``, read in the database, in order: see :data:`Marked`), and the
        ids starting ``"<id>/"`` that hold rows; inside the fork's transaction, with no
        write to this session in between."""

    @abc.abstractmethod
    def _fork_write_sync(
        self,
        conn: C,
        copies: list[tuple[str, str, int | None]],
        written: dict[str, list[str]],
    ) -> None:
        """Lock the new sessions (``copies``' first ids and ``written``'s keys) and,
        unless one of them holds rows (:class:`SessionExistsError`, nothing written),
        fill them: a copy ``(new, old, count)`` copies the first ``count`` rows of
        ``old`` (all for None) in the database, ``written`` stores encoded items."""

    # -- the statements shared by both ------------------------------------------------

    def _get_items_sync(self, conn: C) -> list[Item]:
        items = self._read_sync(conn)
        repaired = repair_loaded(items)
        if repaired == items:
            return items
        # Write the repair back: re-read under the write lock (another writer may have
        # appended or repaired meanwhile) and replace the rows in the same transaction.
        with self._write_lock(conn):
            repaired = repair_loaded(self._read_sync(conn))
            self._write_all_sync(conn, encode_items(repaired))
        return repaired

    def _fork_sync(self, conn: C, new_session_id: str, index: int | None) -> None:
        with self._fork_transaction(conn):
            # Only the rows that hold a call id, and only their type and call id, are
            # read (in the database): they alone decide the cut. The kept rows are
            # copied there too, never decoded (a 10,000-item fork moves no item
            # through Python), unless they need a repair.
            count, marked, below = self._fork_scan_sync(conn)
            plan = fork_plan(self._session_id, new_session_id, count, marked, index, below)
            copies: list[tuple[str, str, int | None]] = [
                (new, old, None) for old, new in plan.children.items()
            ]
            if plan.clean:
                copies.append((new_session_id, self._session_id, plan.kept))
                written: dict[str, list[str]] = {}
            else:
                items = self._read_sync(conn)
                written = {new_session_id: encode_items(kept_items(items, plan))}
            self._fork_write_sync(conn, copies, written)

    def _replace_sync(self, conn: C, encoded: list[str]) -> None:
        with self._write_lock(conn):
            self._write_all_sync(conn, encoded)

    # -- the schema -------------------------------------------------------------------

    def _prepare(self, conn: C) -> None:
        """Check the schema is ours and current; create or migrate it if not."""
        target = self._schema_version()
        # Read-only checks first: a foreign or future store must not be touched.
        if self._inspect(conn) == target:
            return
        # Another connection may be creating or migrating it right now: take turns,
        # then look again.
        with self._schema_lock(conn):
            version = self._inspect(conn)
            if version is None:
                self._create_schema(conn)
            elif version < target:
                self._migrate(conn, version, target)

    def _migrate(self, conn: C, version: int, target: int) -> None:
        """Run the migrations from ``version`` up to ``target``, one step at a time, all
        inside the schema lock's transaction (so a failed step leaves the stored rows as
        they were), then record the new version.

        Raises:
            SessionStorageError: a step is missing, fails, or ends the transaction.
        """
        steps = self._migration_steps()
        texts = self._migration_texts
        for step_from in range(version, target):
            step = steps.get(step_from)
            if step is None:
                raise self._error(
                    f"{texts.no_step.format(where=self._where)}"
                    f" from schema version {step_from} to {step_from + 1}"
                )
            try:
                step(conn)
            except Exception as exc:
                raise self._error(
                    f"{texts.migrating.format(where=self._where)}"
                    f" from schema version {step_from} to {step_from + 1} failed: {exc}"
                ) from exc
            if not self._in_transaction(conn):
                raise self._error(
                    f"the migration from schema version {step_from} ended the transaction;"
                    f" migrations must not {texts.must_not}"
                )
        self._record_version(conn, target)

    # -- what the backend supplies: the schema ----------------------------------------

    @abc.abstractmethod
    def _schema_version(self) -> int:
        """The schema version this code reads and writes (the backend module's
        ``SCHEMA_VERSION``)."""

    @abc.abstractmethod
    def _schema_lock(self, conn: C) -> AbstractContextManager[None]:
        """Hold the lock under which the schema is created or migrated (in a
        transaction) for the ``with`` block."""

    @abc.abstractmethod
    def _inspect(self, conn: C) -> int | None:
        """Return the schema version, or ``None`` when there is no schema yet.

        Raises:
            SessionStorageError: the store is foreign, corrupt or newer than this code.
        """

    @abc.abstractmethod
    def _create_schema(self, conn: C) -> None:
        """Create the current schema (inside :meth:`_schema_lock`)."""

    @abc.abstractmethod
    def _migration_steps(self) -> Mapping[int, Callable[[C], object]]:
        """The registered migrations: ``steps[v]`` upgrades version ``v`` to ``v + 1``
        (the backend's ``MIGRATIONS``)."""

    @abc.abstractmethod
    def _in_transaction(self, conn: C) -> bool:
        """Whether the migrations left the transaction open (they must)."""

    @abc.abstractmethod
    def _record_version(self, conn: C, version: int) -> None:
        """Record ``version`` as the schema's, after the migrations."""


@attrs.frozen
class MigrationTexts:
    """How a backend names what is migrated, in :meth:`StoredSession._migrate`'s errors;
    ``{where}`` stands for the session's :attr:`StoredSession._where`.

    Attributes:
        no_step: the start of "there is no migration" (``"cannot open session database
            {where}: no migration"``), followed by ``" from schema version N to N+1"``.
        migrating: the start of "a migration failed" (``"migrating session database
            {where}"``), followed by ``" from schema version N to N+1 failed: ..."``.
        must_not: what a migration must not do to the transaction (``"commit"``).
    """

    no_step: str
    migrating: str
    must_not: str
